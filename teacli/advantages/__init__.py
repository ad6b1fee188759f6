"""Advantage rules: rewards [P, m] → advantages [P, m] (P prompts × m rollouts per prompt).

`ADVANTAGE_RULES` is a plain dict name → function; `compute_advantages(name, rewards, **params)`
validates the input, resolves the rule (a registered name or a `package.module:function` path to a
user's rule with the same signature) and calls it. Rules are pure tensor math: no trainer state.

A user rule is any callable `rule(rewards: Tensor[P, m], **params) -> Tensor[P, m]`; it may raise
`ValueError` for parameters or group sizes it cannot handle.

`scale_advantages` divides any rule's advantages by a reward standard deviation, as TRL's `scale_rewards`
("group", "batch", "none") and verl's `norm_adv_by_std_in_grpo` do for GRPO: per group by the group's reward
std (GRPO-Z's normalizer, so GRPO scaled by group is GRPO-Z exactly), or by the whole step's. Not in the
paper: it exists to compare rules at a matched step size (docs/advantages.md, "Scaling advantages").
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any, Callable

from teacli.advantages.baselines import EPS, bon_max_mean, bon_max_second, bon_mean, cat_bon, chow, grpo, grpo_z
from teacli.advantages.tea import prefix_tea, tea, tea_raw

if TYPE_CHECKING:
    from torch import Tensor

AdvantageRule = Callable[..., "Tensor"]

ADVANTAGE_RULES: dict[str, AdvantageRule] = {
    "tea": tea,
    "tea_raw": tea_raw,
    "prefix_tea": prefix_tea,
    "grpo": grpo,
    "grpo_z": grpo_z,
    "bon_max_mean": bon_max_mean,
    "bon_max_second": bon_max_second,
    "bon_mean": bon_mean,
    "chow": chow,
    "cat_bon": cat_bon,
}


def resolve_rule(name: str) -> AdvantageRule:
    """A registered rule by name, or a user's rule by `package.module:function`."""
    if name in ADVANTAGE_RULES:
        return ADVANTAGE_RULES[name]
    if ":" not in name:
        raise ValueError(
            f"unknown advantage rule {name!r}: use one of {', '.join(sorted(ADVANTAGE_RULES))} "
            f"or a dotted path 'package.module:function'"
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"advantage rule {name!r}: cannot import module {module_name!r}: {exc}") from exc
    rule = getattr(module, attr, None)
    if not callable(rule):
        raise ValueError(f"advantage rule {name!r}: module {module_name!r} has no callable {attr!r}")
    return rule


def rule_parameters(name: str) -> dict[str, Any]:
    """The keyword parameters a rule accepts, with their defaults (None where a default is derived from m)."""
    rule = resolve_rule(name)
    params = {}
    for p in list(inspect.signature(rule).parameters.values())[1:]:
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD):
            params[p.name] = None if p.default is inspect.Parameter.empty else p.default
    return params


def _check_params(name: str, rule: AdvantageRule, params: dict[str, Any]) -> None:
    sig = inspect.signature(rule)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    accepted = set(list(sig.parameters)[1:])
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ValueError(
            f"advantage rule {name!r} does not take parameter(s) {', '.join(unknown)}; "
            f"it accepts: {', '.join(sorted(accepted)) or 'no parameters'}"
        )


def check_rewards(name: str, rewards: "Tensor") -> None:
    import torch

    if not isinstance(rewards, torch.Tensor):
        raise ValueError(f"advantage rule {name!r}: rewards must be a torch.Tensor of shape [P, m], got {type(rewards).__name__}")
    if rewards.dim() != 2:
        raise ValueError(f"advantage rule {name!r}: rewards must have shape [P, m] (rank 2), got shape {tuple(rewards.shape)}")
    if rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(f"advantage rule {name!r}: rewards of shape {tuple(rewards.shape)} are empty")
    if not rewards.is_floating_point():
        raise ValueError(f"advantage rule {name!r}: rewards must be floating point, got {rewards.dtype}")
    bad = ~torch.isfinite(rewards)
    if bool(bad.any()):
        p, i = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"advantage rule {name!r}: rewards contain {int(bad.sum())} non-finite value(s) (NaN/inf), "
            f"first at prompt {p}, rollout {i}: {float(rewards[p, i])}"
        )


def compute_advantages(name: str, rewards: "Tensor", **params: Any) -> "Tensor":
    """Advantages [P, m] for rewards [P, m] under the rule `name` with its parameters.

    Raises ValueError naming the rule for bad rewards (rank, NaN/inf), unknown parameters, or a
    group size the rule cannot use. The result has the input's dtype and device.
    """
    rule = resolve_rule(name)
    check_rewards(name, rewards)
    _check_params(name, rule, params)
    out = rule(rewards, **params)
    if tuple(out.shape) != tuple(rewards.shape):
        raise ValueError(
            f"advantage rule {name!r} returned shape {tuple(out.shape)} for rewards of shape {tuple(rewards.shape)}"
        )
    return out.to(rewards.dtype)


REWARD_SCALES = ("none", "group", "batch")


def scale_advantages(advantages: "Tensor", rewards: "Tensor", how: str, *, batch_std: float | None = None,
                     eps: float = EPS) -> "Tensor":
    """Advantages [P, m] divided by a reward standard deviation (population, 1/m) plus `eps`.

    how = "none": unchanged; "group": each row by its own group's reward std, std(R_p) + ε (GRPO-Z's
    normalizer); "batch": every row by the std of all the step's rewards, `batch_std` when given (the std over
    every rank's groups), else that of `rewards`. A positive factor per group: each group's ordering of its
    samples and the signs of their advantages are unchanged.
    """
    if how == "none":
        return advantages
    if how == "group":
        return advantages / (rewards.std(dim=-1, keepdim=True, correction=0) + eps)
    if how == "batch":
        std = float(rewards.std(correction=0)) if batch_std is None else batch_std
        return advantages / (std + eps)
    raise ValueError(f"unknown reward scale {how!r}: use one of {', '.join(REWARD_SCALES)}")


__all__ = ["ADVANTAGE_RULES", "REWARD_SCALES", "compute_advantages", "resolve_rule", "rule_parameters", "check_rewards",
           "scale_advantages"]
