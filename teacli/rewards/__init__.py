"""Rewards behind one protocol: `score(prompts, responses) -> Tensor[B]`.

`REWARDS` maps a recipe's reward name to "module:Class" (imported on use, so naming a reward
never imports a model library); any other "pkg.module:Class" dotted path also works.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from teacli.types import Prompt


class Reward(Protocol):
    def score(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> "torch.Tensor":
        """prompts[B], responses[B] → rewards[B] float32, higher is better."""
        ...


REWARDS: dict[str, str] = {
    "rule": "teacli.rewards.rule:RuleReward",
}


def load_reward(name: str, **params: Any) -> Reward:
    """Build the reward `name` (a REWARDS key or "pkg.module:Class") with `params`."""
    target = REWARDS.get(name, name)
    if ":" not in target:
        raise ValueError(f"unknown reward {name!r}; choose one of {', '.join(REWARDS)} or give 'pkg.module:Class'")
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)(**params)
