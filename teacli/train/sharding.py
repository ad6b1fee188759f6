"""A step's work over any number of ranks: prompts for generation, sequences for the update.

`rollout.prompts_per_step` P need not be a multiple of the ranks W. Generation gives rank r a contiguous share of
the step's prompts (P // W, one more for the first P % W ranks); each rank scores its groups and computes their
advantages, so a group is always whole for the advantage rule. The update then shards the step's P·m sequences, not
its prompts: every rank's sequences are gathered in rank order and rank r trains on its contiguous slice of
⌊P·m/W⌋ or ⌈P·m/W⌉ of them (a group may be split between two ranks; its advantages were computed whole). Each rank's
loss is divided by P·m/W, so the ranks' gradients, averaged by the data-parallel all-reduce, are the mean over all
P·m sequences, exactly as one rank with all of them would compute (tests/train/test_sharding.py).

Where W divides P nothing is gathered and nothing moves: each rank trains on its own P/W groups, as before.
Imports teacli.padding's even cut; torch inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def shares(total: int, ranks: int) -> list[tuple[int, int]]:
    """(start, count) of each rank's contiguous share of `total` items: count total // ranks, one more for the first
    total % ranks ranks."""
    from teacli.padding import even_sizes

    out, start = [], 0
    for count in even_sizes(total, ranks):
        out.append((start, count))
        start += count
    return out


def most_sequences(prompts: int, group_size: int, ranks: int) -> int:
    """The most sequences one rank trains on in a step: ⌈P·m/W⌉ (P·m/W where W divides P)."""
    return -(-prompts * group_size // ranks)


def reshard(prompt_ids: list[list[int]], groups: list[list[Any]], advantages: "torch.Tensor", rank: int, ranks: int,
            gather=None) -> tuple[list[list[int]], list[list[Any]], "torch.Tensor"]:
    """This rank's slice of the step's sequences, from every rank's groups (`gather`: backend.all_gather_object).

    prompt_ids [p_r], groups [p_r][m] and advantages [p_r, m] are this rank's own. Returns its slice as runs of
    consecutive sequences that share a prompt (prompt ids per run, the run's completions) and their advantages, flat
    [n_r], in the same order: what `train_step` takes.
    """
    import torch

    if gather is None:
        from teacli.train.backend import all_gather_object as gather
    mine = (prompt_ids, groups, advantages.reshape(len(groups), -1).tolist())
    flat: list[tuple[int, list[int], Any, float]] = []  # (global group index, prompt ids, completion, advantage)
    g = 0
    for ids, gs, adv in gather(mine):
        for p, group, a in zip(ids, gs, adv):
            flat.extend((g, p, c, x) for c, x in zip(group, a))
            g += 1
    start, count = shares(len(flat), ranks)[rank]
    runs_ids: list[list[int]] = []
    runs: list[list[Any]] = []
    last = None
    for index, p, c, _ in flat[start : start + count]:
        if index != last:
            runs_ids.append(p)
            runs.append([])
            last = index
        runs[-1].append(c)
    adv_out = torch.tensor([x for *_, x in flat[start : start + count]], dtype=advantages.dtype)
    return runs_ids, runs, adv_out
