"""build_reward for each reward kind, the dotted-path python reward, and checked_score's errors."""

from __future__ import annotations

import textwrap

import pytest
import torch

from teacli.config import RewardConfig
from teacli.rewards import FunctionReward, RewardFunction, build_reward, checked_score
from teacli.types import Prompt

PROMPTS = [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"question {i}"},)) for i in range(3)]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A user's reward module on sys.path: a function, a tensor-returning function, a class."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(
        """
        import torch

        def length(prompts, responses, scale=1.0):
            return [scale * len(r) for r in responses]

        def as_tensor(prompts, responses):
            return torch.arange(len(responses), dtype=torch.float64)

        class Exclaim:
            def __init__(self, bonus=1.0):
                self.bonus = bonus

            def score(self, prompts, responses):
                return torch.tensor([self.bonus * r.count("!") for r in responses], dtype=torch.float32)

        NOT_CALLABLE = 3
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"


def test_python_function_reward(user_module):
    reward = build_reward(RewardConfig(kind="python", function=f"{user_module}:length", params={"scale": 2.0}))
    assert isinstance(reward, FunctionReward) and isinstance(reward, RewardFunction)
    scores = checked_score(reward, PROMPTS, ["a", "bbb", ""])
    assert scores.dtype == torch.float32
    assert scores.tolist() == [2.0, 6.0, 0.0]


def test_python_tensor_and_class_rewards(user_module):
    scores = build_reward(RewardConfig(kind="python", function=f"{user_module}:as_tensor")).score(PROMPTS, ["x"] * 3)
    assert scores.dtype == torch.float32 and scores.tolist() == [0.0, 1.0, 2.0]
    cls_reward = build_reward(RewardConfig(kind="python", function=f"{user_module}:Exclaim", params={"bonus": 0.5}))
    assert checked_score(cls_reward, PROMPTS, ["!", "!!", "no"]).tolist() == [0.5, 1.0, 0.0]


@pytest.mark.parametrize(
    "function, message",
    [
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("my_rewards:missing", "has no attribute 'missing'"),
        ("my_rewards:NOT_CALLABLE", "is not a function"),
        ("my_rewards", "expected a dotted path"),
    ],
)
def test_python_reward_errors_name_the_key(user_module, function, message):
    with pytest.raises(ValueError, match="reward.function") as err:
        build_reward(RewardConfig(kind="python", function=function))
    assert message in str(err.value)


def test_rule_reward_is_built_lazily():
    reward = build_reward(RewardConfig(kind="rule"))
    assert type(reward).__name__ == "RuleReward" and callable(reward.score)


class Fixed:
    name = "fixed-test-reward"

    def __init__(self, values):
        self.values = values

    def score(self, prompts, responses):
        return torch.tensor(self.values)


def test_checked_score_passes_good_scores_as_float32():
    out = checked_score(Fixed([1.0, 2.0, 3.0]), PROMPTS, ["a", "b", "c"])
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize("bad, kind", [(float("nan"), "NaN"), (float("inf"), "inf"), (float("-inf"), "-inf")])
def test_checked_score_rejects_non_finite_naming_the_row(bad, kind):
    with pytest.raises(ValueError) as err:
        checked_score(Fixed([0.5, bad, bad]), PROMPTS, ["a", "b", "c"])
    message = str(err.value)
    assert "fixed-test-reward" in message and "reward.kind" in message
    assert f"returned {kind} for prompt 'p1' (response 1 of the batch)" in message
    assert "2 of 3 scores" in message


@pytest.mark.parametrize("values", [[1.0, 2.0], [[1.0], [2.0], [3.0]], []])
def test_checked_score_rejects_wrong_shape(values):
    with pytest.raises(ValueError, match=r"fixed-test-reward.*for 3 responses"):
        checked_score(Fixed(values), PROMPTS, ["a", "b", "c"])


def test_checked_score_names_a_python_function(user_module):
    reward = FunctionReward(lambda prompts, responses: [1.0] * (len(responses) - 1), name="pkg.mod:short")
    with pytest.raises(ValueError, match="pkg.mod:short"):
        checked_score(reward, PROMPTS, ["a", "b", "c"])


# ------------------------------------------------------------------------------------------------
# The user's reward code failing: one line naming the function, the traceback kept, sys.exit is a failure


@pytest.fixture
def bad_module(tmp_path, monkeypatch):
    (tmp_path / "bad_rewards.py").write_text(textwrap.dedent(
        """
        import json
        import sys
        import time

        def runtime(prompts, responses):
            raise RuntimeError("the scorer lost its GPU")

        def keyerror(prompts, responses):
            return [{"score": 1.0}["label"] for _ in responses]

        def badjson(prompts, responses):
            return [json.loads("{bad: 1}") for _ in responses]

        def exits(prompts, responses):
            sys.exit(0)

        def huge(prompts, responses):
            return [0.5, 1e300, 2.0]

        def slow(prompts, responses):
            time.sleep(0.45)
            return [1.0] * len(responses)

        def hangs(prompts, responses):
            try:
                time.sleep(60)
            except Exception:  # a user's catch-all does not swallow the timeout
                pass
            return [1.0] * len(responses)

        def interrupted(prompts, responses):
            raise KeyboardInterrupt

        class Broken:
            def __init__(self):
                raise OSError("no such vocabulary file")

            def score(self, prompts, responses):
                return [0.0] * len(responses)
        """
    ))
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "bad_rewards"


def python_reward(function, **kw):
    return build_reward(RewardConfig(kind="python", function=function, **kw))


@pytest.mark.parametrize("function, message, line", [
    ("runtime", "RuntimeError: the scorer lost its GPU", 'raise RuntimeError("the scorer lost its GPU")'),
    ("keyerror", "KeyError: 'label'", 'return [{"score": 1.0}["label"] for _ in responses]'),
    # A ValueError was passed on as the bare "error: Expecting property name ..." that never named the reward.
    ("badjson", "JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
     "return [json.loads(\"{bad: 1}\") for _ in responses]"),
])
def test_an_error_inside_a_python_reward_names_the_function_and_keeps_its_traceback(bad_module, tmp_path, function, message, line):
    from teacli.rewards import RewardError

    with pytest.raises(RewardError) as err:
        checked_score(python_reward(f"bad_rewards:{function}"), PROMPTS, ["a", "b", "c"])
    assert str(err.value) == f"the reward function bad_rewards:{function} raised {message}"
    assert err.value.details.startswith("Traceback") and line in err.value.details
    log = tmp_path / "run" / "reward_error.log"
    from teacli.rundir import with_traceback_file

    assert with_traceback_file(str(err.value), err.value.details, log) == f"{err.value} (its traceback: {log})"
    assert log.read_text() == err.value.details


def test_sys_exit_inside_a_python_reward_is_a_failure_naming_the_function(bad_module):
    # Before: SystemExit(0) went up through `tea train`, which exited 0 having trained nothing.
    from teacli.rewards import RewardError

    with pytest.raises(RewardError, match=r"^the reward function bad_rewards:exits called sys.exit\(0\) \(scoring 3 responses\); "
                                          r"a reward returns its scores or raises: the run stops here$"):
        checked_score(python_reward("bad_rewards:exits"), PROMPTS, ["a", "b", "c"])
    with pytest.raises(ValueError, match=r"^reward.function: importing module 'exits_on_import' of 'exits_on_import:f' "
                                         r"called sys.exit\(3\)"):
        python_reward("exits_on_import:f")
    with pytest.raises(RewardError, match=r"^the reward function bad_rewards:Broken raised OSError: no such vocabulary file"):
        python_reward("bad_rewards:Broken")


def test_ctrl_c_inside_a_python_reward_stays_ctrl_c(bad_module):
    with pytest.raises(KeyboardInterrupt):
        checked_score(python_reward("bad_rewards:interrupted"), PROMPTS, ["a", "b", "c"])


def test_a_reward_beyond_float32_is_named_as_such_not_as_inf(bad_module):
    # Before: "returned inf": 1e300 became inf in the float32 conversion, hiding what the function returned.
    with pytest.raises(ValueError) as err:
        checked_score(python_reward("bad_rewards:huge"), PROMPTS, ["a", "b", "c"])
    assert str(err.value) == ("the reward function bad_rewards:huge returned 1e+300 for prompt 'p1' (response 1 of the batch), "
                              "larger than float32 holds (±3.4e+38), the type rewards are kept in; 1 of 3 scores are that "
                              "large: scale the rewards down")


def test_a_python_reward_still_running_says_so_and_one_past_reward_timeout_s_stops(bad_module, monkeypatch, capfd):
    import time

    from teacli.rewards import RewardError

    monkeypatch.setenv("TEA_PROGRESS_EVERY", "0.2")
    assert checked_score(python_reward("bad_rewards:slow"), PROMPTS, ["a", "b", "c"]).tolist() == [1.0] * 3
    err = capfd.readouterr().err
    assert err.splitlines()[0] == ("waiting for the reward function bad_rewards:slow (scoring 3 responses): 0s so far, "
                                   "reward.timeout_s=300")
    assert len(err.splitlines()) == 2  # at 0.2 s and 0.4 s, then it returned

    t0 = time.monotonic()
    with pytest.raises(RewardError, match=r"^the reward function bad_rewards:hangs did not return within reward.timeout_s=0.5 s "
                                          r"\(scoring 3 responses\); make it faster or raise reward.timeout_s$") as info:
        checked_score(python_reward("bad_rewards:hangs", timeout_s=0.5), PROMPTS, ["a", "b", "c"])
    assert time.monotonic() - t0 < 5 and "time.sleep(60)" in info.value.details
    assert "reward.timeout_s=0.5" in capfd.readouterr().err.splitlines()[0]
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
