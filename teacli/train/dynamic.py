"""Dynamic sampling (`rollout.dynamic_sampling`): train only on groups whose rewards differ.

A group whose m rewards are all equal carries no signal for any advantage rule (every rule is a
function of the within-group differences). As DAPO and verl's `filter_groups` do, such groups are
dropped and more prompts are generated until the step has `prompts_per_step` informative groups,
for at most `rollout.max_resample_rounds` extra rounds.

The extra prompts are the next ones of the run's data order (the same seeded permutation per epoch
as without the option), so a step consumes a variable number of prompts and the data position is
part of the trainer state: each checkpoint's trainer_state.json keeps `data_position`, and a resumed
run continues from it, exactly as the uninterrupted run would have.

Several ranks: round 0 gives every rank its usual share of the step's prompts. After each round
each rank counts its own shortfall (its share of informative groups still missing) and the ranks
all-reduce the maximum; every rank then runs another round of that many prompts per rank (the
stream advancing by world_size × that), or all stop together when it is 0 or the bound is reached.
So every rank runs the same rounds (ZeRO-3 and vLLM's external launcher need every rank in each
generation), holds the same data position, and trains on exactly its share of groups: a rank
that already had enough drops its surplus; when the bound is reached, the shortfall is filled with
uninformative groups whose advantages are set to 0 (they keep the step's micro-batches aligned
across ranks and add only their KL term), counted in `dynamic_filled_groups`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class Round:
    """One generation round on this rank: what `generate_and_score` returns."""

    prompts: list[Any]
    prompt_ids: list[list[int]]
    groups: list[list[Any]]
    rewards: "Tensor"  # [p, m]
    time_generate: float = 0.0
    time_reward: float = 0.0


@dataclass
class Selection:
    """The step's groups on this rank, and what dynamic sampling did to get them."""

    prompts: list[Any]
    prompt_ids: list[list[int]]
    groups: list[list[Any]]
    rewards: "Tensor"  # [k, m]
    filled: "Tensor"  # [k] bool: uninformative groups kept because the bound was reached (advantage 0)
    stats: dict[str, float] = field(default_factory=dict)


def informative(rewards: "Tensor") -> "Tensor":
    """rewards [P, m] → [P] bool: the groups whose rewards are not all equal."""
    return rewards.max(dim=1).values > rewards.min(dim=1).values


def select(rounds: list[Round], want: int) -> Selection:
    """The first `want` informative groups over the rounds, in order; if there are fewer, the
    shortfall filled with the first uninformative groups (flagged in `filled`)."""
    import torch

    keep: list[tuple[int, int]] = []
    flat: list[tuple[int, int]] = []
    spare: list[tuple[int, int]] = []
    for r, rd in enumerate(rounds):
        for g, ok in enumerate(informative(rd.rewards).tolist()):
            flat.append((r, g))
            (keep if ok else spare).append((r, g))
    n_informative = len(keep)
    keep = keep[:want]
    fill = spare[: max(0, want - len(keep))]
    chosen = set(keep) | set(fill)
    order = [rg for rg in flat if rg in chosen]  # generation order
    fills = set(fill)
    pick = lambda attr: [getattr(rounds[r], attr)[g] for r, g in order]  # noqa: E731
    rewards = torch.stack([rounds[r].rewards[g] for r, g in order]) if order else torch.zeros(0, 0)
    return Selection(
        prompts=pick("prompts"), prompt_ids=pick("prompt_ids"), groups=pick("groups"), rewards=rewards,
        filled=torch.tensor([rg in fills for rg in order], dtype=torch.bool),
        stats={
            "dynamic_extra_rounds": float(len(rounds) - 1),
            "dynamic_dropped_groups": float(len(flat) - n_informative - len(fill)),
            "dynamic_surplus_groups": float(max(0, n_informative - want)),
            "dynamic_filled_groups": float(len(fill)),
        },
    )


def collect(
    run_round: Callable[[int, int, int], Round],
    *,
    want: int,
    position: int,
    world_size: int,
    rank: int,
    max_extra_rounds: int,
    dynamic: bool,
    reduce_max: Callable[[int], int],
) -> tuple[list[Round], int]:
    """Generate the step's rounds; returns them and the data position after the step.

    run_round(start, count, round) generates and scores this rank's prompts at data positions
    [start, start + count) of the run's order. Round 0 is this rank's share (`want`) of the step's
    world_size × want prompts at `position`; without `dynamic` that is all. With it, rounds follow
    while any rank (`reduce_max` over ranks) still lacks informative groups, at most
    `max_extra_rounds` of them.
    """
    rounds: list[Round] = []
    count = want
    while True:
        rounds.append(run_round(position + rank * count, count, len(rounds)))
        position += world_size * count
        if not dynamic:
            break
        have = sum(int(informative(rd.rewards).sum()) for rd in rounds)
        count = reduce_max(max(0, want - have))
        if count == 0 or len(rounds) > max_extra_rounds:
            break
    return rounds, position
