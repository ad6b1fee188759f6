"""Rewards behind one protocol: `score(prompts, responses) -> Tensor[B]` (float32, higher is better).

`build_reward(recipe.reward)` builds the recipe's reward:

  * kind 'hf'     → `HFRewardModel` (teacli/rewards/hf.py): a sequence-classification reward model
                    (e.g. Skywork-Reward-V2); the score is its scalar logit.
  * kind 'rule'   → `RuleReward(**reward.params)` (teacli/rewards/rule.py): verifiable constraints.
  * kind 'python' → `reward.function`, a dotted path 'package.module:function' to a plain function
                    `f(prompts, responses, **reward.params) -> list[float] | Tensor[B]`
                    (or to a class with a `score` method, built with `**reward.params`).
  * kind 'lm_judge' → `LMJudgeReward` (teacli/rewards/judge.py): a frozen causal LM asked a templated
                    yes/no question; the score is log p(yes) − log p(no) at its next token.
  * kind 'remote' → `RemoteReward` (teacli/rewards/remote.py): an HTTP reward server at `reward.url`
                    with OpenRLHF's remote-RM API; `tea serve-rm` (teacli/rewards/server.py) serves
                    any of the kinds above over it.

Model libraries are imported only when a reward of that kind is built. `checked_score` is what
the trainer and `eval-bon` call: it rejects a wrong number of scores and NaN/inf with an error
that names the reward and the first bad row, instead of letting one NaN poison an update.

A python reward is the user's code: `call_user` runs each call of it. Whatever it raises, a
`sys.exit()` included, becomes one `RewardError` naming the function ("the reward function
pkg.mod:f raised KeyError: 'x'") that keeps the user's traceback (the command that met it writes it
beside the run's records: teacli.rundir.with_traceback_file); Ctrl-C stays Ctrl-C. A call still
running after TEA_PROGRESS_EVERY seconds (default 30) says so on stderr, and again at that interval;
one running past `reward.timeout_s` stops with a RewardError naming the function (measured by
SIGALRM, so only for calls made in the main thread: the trainer's and eval-bon's).
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from teacli.config import RewardConfig
    from teacli.types import Prompt


@runtime_checkable
class RewardFunction(Protocol):
    def score(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> "torch.Tensor":
        """prompts[B], responses[B] (response i answers prompt i) → rewards[B] float32."""
        ...


Reward = RewardFunction  # the name used by the first draft of this module

# Reward classes buildable from keyword parameters alone, by name ("module:Class"), imported on use.
# (A reward model needs a path, a device and a dtype: build it with build_reward / HFRewardModel.)
REWARDS: dict[str, str] = {
    "rule": "teacli.rewards.rule:RuleReward",
}


def build_reward(cfg: "RewardConfig", device: Any = None, tokenizer: Any = None) -> RewardFunction:
    """The reward named by the recipe's `reward:` section.

    `device` is where the policy lives; an 'hf' or 'lm_judge' model with `reward.device: auto` goes there.
    `tokenizer` is the policy's: a 'remote' reward renders the prompt texts it sends with it.
    """
    if cfg.kind == "hf":
        from teacli.rewards.hf import HFRewardModel

        return HFRewardModel.from_config(cfg, device=device)
    if cfg.kind == "lm_judge":
        from teacli.rewards.judge import LMJudgeReward

        return LMJudgeReward.from_config(cfg, device=device)
    if cfg.kind == "rule":
        from teacli.rewards.rule import RuleReward

        try:
            return RuleReward(**cfg.params)
        except TypeError as exc:
            raise ValueError(f"reward.params: {exc} (kind 'rule')") from None
    if cfg.kind == "python":
        return load_python_reward(cfg.function or "", cfg.params, timeout_s=cfg.timeout_s)
    if cfg.kind == "remote":
        from teacli.rewards.remote import RemoteReward

        return RemoteReward.from_config(cfg, tokenizer)
    raise ValueError(f"reward.kind: {cfg.kind!r} is not one of hf, lm_judge, rule, python, remote")


def load_python_reward(path: str, params: dict[str, Any] | None = None, timeout_s: float | None = None) -> RewardFunction:
    """'package.module:function' → a RewardFunction calling `function(prompts, responses, **params)`
    (a class: `Class(**params).score(prompts, responses)`), each call run by `call_user`."""
    target = _import_dotted(path, key="reward.function")
    params = dict(params or {})
    if isinstance(target, type):
        try:
            obj = call_user(target, (), params, name=path, what="building it")  # no limit: it may download a model
        except RewardError as exc:
            if isinstance(exc.original, TypeError):
                raise ValueError(f"reward.params: {exc.original} (building {path})") from None
            raise
        if not callable(getattr(obj, "score", None)):
            raise ValueError(f"reward.function: {path} is a class without a score(prompts, responses) method")
        return FunctionReward(obj.score, name=path, timeout_s=timeout_s)
    if not callable(target):
        raise ValueError(f"reward.function: {path} is not a function")
    return FunctionReward(target, params, name=path, timeout_s=timeout_s)


def load_reward(name: str, **params: Any) -> RewardFunction:
    """A built-in reward by name (a REWARDS key) or any 'pkg.module:Class', built with `params`."""
    target = REWARDS.get(name, name)
    if ":" not in target:
        raise ValueError(f"unknown reward {name!r}; choose one of {', '.join(REWARDS)} or give 'pkg.module:Class'")
    return _import_dotted(target, key="reward")(**params)


class FunctionReward:
    """A plain reward function `f(prompts, responses, **params)` behind the RewardFunction protocol, each
    call run by `call_user` (errors name the function; reward.timeout_s). A score too large for float32
    (which would read as inf) is an error naming it."""

    def __init__(self, fn: Callable[..., Any], params: dict[str, Any] | None = None, name: str | None = None,
                 timeout_s: float | None = None) -> None:
        self.fn = fn
        self.params = dict(params or {})
        self.name = name or getattr(fn, "__qualname__", repr(fn))
        self.timeout_s = timeout_s

    def score(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> "torch.Tensor":
        import torch

        out = call_user(self.fn, (list(prompts), list(responses)), self.params, name=self.name, timeout_s=self.timeout_s,
                        what=f"scoring {len(responses)} responses")
        if isinstance(out, torch.Tensor):
            raw = out.detach().to("cpu")
        else:
            try:
                raw = torch.tensor([float(x) for x in out], dtype=torch.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"reward.function: {self.name} must return a list of numbers or a Tensor[B]: {exc}") from None
        return _to_float32(raw, f"the reward function {self.name}", prompts)


class RewardError(ValueError):
    """The user's reward code failed: it raised, called sys.exit() or ran past reward.timeout_s. The message is
    one line naming the function; `details` is the user's traceback."""

    def __init__(self, message: str, details: str = "", original: BaseException | None = None) -> None:
        super().__init__(message)
        self.details, self.original = details, original


def user_error(exc: BaseException, who: str, what: str = "") -> RewardError:
    """A RewardError for `exc`, raised by the user's code `who` (call it inside the `except`: it takes the traceback)."""
    import traceback

    if isinstance(exc, SystemExit):
        return RewardError(f"{who} called sys.exit({exc.code!r}){f' ({what})' if what else ''}; a reward returns its scores "
                           f"or raises: the run stops here", traceback.format_exc(), exc)
    text = " ".join(str(exc).split())
    text = text if len(text) <= 300 else text[:297] + "..."
    return RewardError(f"{who} raised {type(exc).__name__}{f': {text}' if text else ''}", traceback.format_exc(), exc)


class _TimedOut(BaseException):
    """Raised into the user's code by SIGALRM; a BaseException, so that its `except Exception:` lets it through."""


def _wait_note_every() -> float:
    try:
        return max(float(os.environ.get("TEA_PROGRESS_EVERY", "30")), 0.1)
    except ValueError:
        return 30.0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def call_user(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], *, name: str, timeout_s: float | None = None,
              what: str = "") -> Any:
    """fn(*args, **kwargs) for the user's reward code `name`. Anything it raises (sys.exit too; Ctrl-C
    excepted) becomes a one-line RewardError with its traceback in `details`; every TEA_PROGRESS_EVERY
    seconds (default 30) it is still running, a line on stderr says what is waited on; past `timeout_s`
    (the main thread only) it is stopped with a RewardError."""
    import signal
    import threading
    import time
    import traceback

    t0 = time.monotonic()
    done = threading.Event()
    limit = "" if timeout_s is None else f", reward.timeout_s={timeout_s:g}"
    rank = f"rank {os.environ['RANK']}: " if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and "RANK" in os.environ else ""

    def watch() -> None:
        every = _wait_note_every()
        while not done.wait(every):
            print(f"{rank}waiting for the reward function {name} ({what}): {_duration(time.monotonic() - t0)} so far{limit}",
                  file=sys.stderr, flush=True)

    threading.Thread(target=watch, name="tea-reward-wait", daemon=True).start()
    alarm = timeout_s is not None and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if alarm:
        def on_alarm(signum: int, frame: Any) -> None:
            raise _TimedOut

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return fn(*args, **kwargs)
    except _TimedOut:
        raise RewardError(f"the reward function {name} did not return within reward.timeout_s={timeout_s:g} s ({what}); "
                          f"make it faster or raise reward.timeout_s", traceback.format_exc()) from None
    except (Exception, SystemExit) as exc:  # a user's sys.exit(0) must not end a run as if it had finished
        raise user_error(exc, f"the reward function {name}", what) from None
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        done.set()


def checked_score(
    reward: RewardFunction, prompts: Sequence["Prompt"], responses: Sequence[str], name: str | None = None
) -> "torch.Tensor":
    """reward.score(prompts, responses) → rewards[B] float32 on CPU, or a ValueError naming the reward
    and the first bad row when the result has the wrong shape or holds NaN/inf."""
    import torch

    if len(prompts) != len(responses):
        raise ValueError(f"checked_score: {len(prompts)} prompts but {len(responses)} responses")
    label = name or getattr(reward, "name", None) or type(reward).__name__
    where = f"the reward function {label}" if isinstance(reward, FunctionReward) else f"reward {label!r} (recipe key reward.kind)"
    out = reward.score(prompts, responses)
    raw = out if isinstance(out, torch.Tensor) else torch.as_tensor(list(out), dtype=torch.float64)
    raw = raw.detach().to("cpu")
    if raw.dim() != 1 or raw.shape[0] != len(responses):
        raise ValueError(
            f"{where} returned scores of shape {tuple(raw.shape)} for {len(responses)} responses; expected ({len(responses)},)"
        )
    scores = _to_float32(raw, where, prompts)
    bad = (~torch.isfinite(scores)).nonzero()
    if len(bad):
        i = int(bad[0, 0])
        value = float(scores[i])
        kind = "NaN" if math.isnan(value) else str(value)
        raise ValueError(
            f"{where} returned {kind} for prompt {prompts[i].id!r} (response {i} of the batch); "
            f"{len(bad)} of {len(responses)} scores are not finite. Response starts: {responses[i][:80]!r}"
        )
    return scores


def _to_float32(raw: "torch.Tensor", where: str, prompts: Sequence["Prompt"]) -> "torch.Tensor":
    """raw[B] → float32, or a ValueError naming a finite score too large for float32 (it would read as inf)."""
    import torch

    if raw.is_floating_point() and raw.dim() == 1:
        big = (torch.isfinite(raw) & (raw.abs() > torch.finfo(torch.float32).max)).nonzero()
        if len(big):
            i = int(big[0, 0])
            prompt = f"prompt {prompts[i].id!r} " if i < len(prompts) else ""
            raise ValueError(
                f"{where} returned {float(raw[i]):g} for {prompt}(response {i} of the batch), larger than float32 holds "
                f"(±{torch.finfo(torch.float32).max:.3g}), the type rewards are kept in; {len(big)} of {len(raw)} scores "
                f"are that large: scale the rewards down"
            )
    return raw.to(torch.float32)


def _import_dotted(path: str, key: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key}: expected a dotted path 'package.module:function', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{key}: cannot import module {module_name!r} of {path!r}: {exc}") from None
    except (Exception, SystemExit) as exc:  # the module's own code failed (or exited) while it was imported
        raise user_error(exc, f"{key}: importing module {module_name!r} of {path!r}") from None
    target = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{key}: module {module_name!r} has no attribute {attr!r}") from None
    return target
