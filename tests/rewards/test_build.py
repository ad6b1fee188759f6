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
