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
"""

from __future__ import annotations

import importlib
import math
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
        return load_python_reward(cfg.function or "", cfg.params)
    if cfg.kind == "remote":
        from teacli.rewards.remote import RemoteReward

        return RemoteReward.from_config(cfg, tokenizer)
    raise ValueError(f"reward.kind: {cfg.kind!r} is not one of hf, lm_judge, rule, python, remote")


def load_python_reward(path: str, params: dict[str, Any] | None = None) -> RewardFunction:
    """'package.module:function' → a RewardFunction calling `function(prompts, responses, **params)`."""
    target = _import_dotted(path, key="reward.function")
    params = dict(params or {})
    if isinstance(target, type):
        try:
            obj = target(**params)
        except TypeError as exc:
            raise ValueError(f"reward.params: {exc} (building {path})") from None
        if not callable(getattr(obj, "score", None)):
            raise ValueError(f"reward.function: {path} is a class without a score(prompts, responses) method")
        return obj
    if not callable(target):
        raise ValueError(f"reward.function: {path} is not a function")
    return FunctionReward(target, params, name=path)


def load_reward(name: str, **params: Any) -> RewardFunction:
    """A built-in reward by name (a REWARDS key) or any 'pkg.module:Class', built with `params`."""
    target = REWARDS.get(name, name)
    if ":" not in target:
        raise ValueError(f"unknown reward {name!r}; choose one of {', '.join(REWARDS)} or give 'pkg.module:Class'")
    return _import_dotted(target, key="reward")(**params)


class FunctionReward:
    """A plain reward function `f(prompts, responses, **params)` behind the RewardFunction protocol."""

    def __init__(self, fn: Callable[..., Any], params: dict[str, Any] | None = None, name: str | None = None) -> None:
        self.fn = fn
        self.params = dict(params or {})
        self.name = name or getattr(fn, "__qualname__", repr(fn))

    def score(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> "torch.Tensor":
        import torch

        out = self.fn(list(prompts), list(responses), **self.params)
        if isinstance(out, torch.Tensor):
            return out.detach().to("cpu", torch.float32)
        try:
            return torch.tensor([float(x) for x in out], dtype=torch.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"reward.function: {self.name} must return a list of numbers or a Tensor[B]: {exc}") from None


def checked_score(
    reward: RewardFunction, prompts: Sequence["Prompt"], responses: Sequence[str], name: str | None = None
) -> "torch.Tensor":
    """reward.score(prompts, responses) → rewards[B] float32 on CPU, or a ValueError naming the reward
    and the first bad row when the result has the wrong shape or holds NaN/inf."""
    import torch

    if len(prompts) != len(responses):
        raise ValueError(f"checked_score: {len(prompts)} prompts but {len(responses)} responses")
    label = name or getattr(reward, "name", None) or type(reward).__name__
    where = f"reward {label!r} (recipe key reward.kind)"
    out = reward.score(prompts, responses)
    scores = out if isinstance(out, torch.Tensor) else torch.as_tensor(list(out), dtype=torch.float32)
    scores = scores.detach().to("cpu", torch.float32)
    if scores.dim() != 1 or scores.shape[0] != len(responses):
        raise ValueError(
            f"{where} returned scores of shape {tuple(scores.shape)} for {len(responses)} responses; expected ({len(responses)},)"
        )
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


def _import_dotted(path: str, key: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key}: expected a dotted path 'package.module:function', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{key}: cannot import module {module_name!r} of {path!r}: {exc}") from None
    target = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{key}: module {module_name!r} has no attribute {attr!r}") from None
    return target
