"""How a step's sequences become batches: the data stream's order, exactly n micro-batches, padding and packing.

`stream_prompts` names the prompts of a data position (seeded epochs, identical on resume); the micro-batches are cut
by `teacli.padding.micro_batches` (exactly the engine's gradient-accumulation count of length-sorted micro-batches, so
a step is one optimizer update whatever the lengths); `pack_tight` / `pack_shared` pad them (each sequence whole,
left-padded; shared: each distinct prompt once, left-padded, and the completions right-padded, for
`logprobs.shared_prompt_logprobs`; `pack`, the prompt left-padded and the completion right-padded, is what the
behaviour log-probs and the diagnostics read); `pack_completions` lays a shared micro-batch's completions end to end
in rows (optim.completion_splits: packed); `packed_micro_batches` moves them to the device before the first forward; `token_counts` says what each phase processed, `padding` how much of what the micro-batches compute is
padding (metrics.jsonl `pad_frac_train`, `pad_frac_reference`).
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from teacli.logprobs import Packing

    from teacli.types import Completion


@lru_cache(maxsize=2)
def prompt_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The data order of one pass over n prompts: a seeded permutation, identical on resume.

    Cached: every step reads the current epoch's order, which is shuffled once.
    """
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


def stream_prompts(prompts: list[Any], start: int, count: int, seed: int) -> list[Any]:
    """The prompts at positions [start, start + count) of the run's data stream: epoch after epoch
    of seeded permutations, so a position always names the same prompt (resume replays nothing twice)."""
    n = len(prompts)
    out = []
    for k in range(start, start + count):
        epoch, pos = divmod(k, n)
        out.append(prompts[prompt_order(n, seed, epoch)[pos]])
    return out


def _padded(rows: list[list[int]], pad_id: int, left: bool) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Token rows padded to the longest (at least 1 column) on the left or the right: ids and mask [R, W] (CPU)."""
    import torch

    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            cols = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, cols] = torch.tensor(r, dtype=torch.long)
            mask[i, cols] = 1
    return ids, mask


def pack(prompt_ids: list[list[int]], completions: list[list[int]], pad_id: int, device) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", int]:
    """Left-pad prompts and right-pad completions into one batch.

    Returns input_ids [B, Lp+Tc], attention_mask [B, Lp+Tc], completion mask [B, Tc], Lp.
    """
    import torch

    p_ids, p_mask = _padded(prompt_ids, pad_id, left=True)
    c_ids, c_mask = _padded(completions, pad_id, left=False)
    input_ids, attn = torch.cat([p_ids, c_ids], dim=1), torch.cat([p_mask, c_mask], dim=1)
    return input_ids.to(device), attn.to(device), c_mask.to(device), p_ids.shape[1]


def pack_tight(prompt_ids: list[list[int]], completions: list[list[int]], pad_id: int, device) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", int]:
    """The sequences of `pack`, each prompt and its completion joined and left-padded to the longest sequence: a
    batch pads to its longest sequence, not to its longest prompt plus its longest completion, which are seldom one
    sequence's (with prompts and completions of spread lengths, that sum often pads a micro-batch by a quarter).

    Returns input_ids [B, W], attention_mask [B, W], completion mask [B, Tc] and Lp = W − Tc, as `pack` does: the
    columns from Lp hold every completion (Tc: the longest), each ending at the last column, so a shorter one has its
    prompt's last tokens in them (mask 0). The log-probs at the mask are the same as from `pack`'s batch
    (`logprobs.token_logprobs` with the mask's `completion_index`), but a completion's t-th token sits at column
    Tc − len + t of the mask, not t: what is aligned with it (the sampler's log-probs) is right-aligned too.
    """
    import torch

    tc = max(1, max(len(c) for c in completions))
    rows = [list(p) + list(c) for p, c in zip(prompt_ids, completions)]
    width = max(tc + 1, max(len(r) for r in rows))  # at least one prompt column before the completions
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    cmask = torch.zeros((len(rows), tc), dtype=torch.long)
    for i, (r, c) in enumerate(zip(rows, completions)):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        attn[i, width - len(r) :] = 1
        if c:
            cmask[i, tc - len(c) :] = 1
    return ids.to(device), attn.to(device), cmask.to(device), width - tc


def pack_shared(prompt_ids: list[list[int]], completions: list[list[int]], pad_id: int, device) -> tuple["torch.Tensor", ...]:
    """The sequences of `pack` with each distinct prompt once (for `logprobs.shared_prompt_logprobs`).

    Returns prompt ids and mask [U, Lp] (left-padded), row_of [B] (each sequence's prompt), completion
    ids and mask [B, Tc] (right-padded).
    """
    import torch

    distinct: dict[tuple[int, ...], int] = {}
    row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids]
    p_ids, p_mask = _padded([list(p) for p in distinct], pad_id, left=True)
    c_ids, c_mask = _padded(completions, pad_id, left=False)
    return tuple(t.to(device) for t in (p_ids, p_mask, torch.tensor(row_of), c_ids, c_mask))


def pack_completions(lengths: "Sequence[int]", row_of: "Sequence[int]", width: int) -> "Packing":
    """The `Packing` of completions of these lengths (sequence b's prompt: row_of[b]) in a [B, width] batch: each
    completion's first `length − 1` tokens laid in rows of width − 1 as `teacli.padding.packed_layout` lays them (CPU
    tensors)."""
    from teacli.logprobs import Packing
    from teacli.padding import packed_layout

    rows, _ = packed_layout(lengths, row_of)  # no row is wider than the longest completion less its last token
    return Packing.lay(rows, [max(0, n - 1) for n in lengths], row_of, width, max(0, width - 1))


def packed_micro_batches(seq_prompt: list, seq_comp: list, seq_adv: "torch.Tensor", batches: list[list[int]], shared: bool,
                         pad_id: int, device, seq_rollout_logp: list | None = None, splits: int | str = 1) -> list[tuple]:
    """(weight, batch, advantages, sampler log-probs) of every micro-batch, on `device`: the batch as `pack_shared`
    (shared) or `pack_tight` builds it, plus its completion positions (`logprobs.completion_index`, found on the host);
    the sampler's log-probs (`importance.pack_rollout_logprobs`, aligned with the batch's completion mask) where
    `seq_rollout_logp` is given, else None.

    Shared, a micro-batch's completions run in the forwards `teacli.padding.split_sizes(…, splits)` cuts
    (optim.completion_splits; its sequences ordered by completion length where there may be more than one): the batch
    holds, before its completion positions, the (rows, width, completion positions) of each, for
    `logprobs.shared_prompt_logprobs`' `splits`; with `splits` "packed", the `logprobs.Packing` of its completions
    (one forward, laid end to end in rows) instead.

    Everything moves to the device before the first forward. A copy from the host's pageable memory waits for
    the device to finish its queue, and so does reading a value back: once a micro-batch, that left the GPU idle
    while the host built and launched the next one (the 1B paper recipe's training was host-bound at 8 sequences a
    micro-batch: results/performance/2026-11-28-h200x2-micro/). A micro-batch left empty (fewer sequences than
    micro-batches) is a zero-weight pass over the first one's first sequence: the count stays the engine's."""
    from teacli.logprobs import completion_index
    from teacli.padding import split_sizes
    from teacli.train.importance import pack_rollout_logprobs

    out = []
    for idx in batches:
        weight = 1.0 if idx else 0.0
        idx = idx or batches[0][:1]
        if shared and splits != 1:  # stable: one group's micro-batch is in this order already
            idx = sorted(idx, key=lambda i: len(seq_comp[i]))
        batch = (pack_shared if shared else pack_tight)([seq_prompt[i] for i in idx], [seq_comp[i] for i in idx], pad_id, "cpu")
        cmask = batch[-1] if shared else batch[2]
        index = completion_index(cmask).to(device)
        if shared and splits == "packed":
            batch = (*batch, pack_completions([len(seq_comp[i]) for i in idx], batch[2].tolist(), cmask.shape[1]))
        elif shared:
            runs, first = [], 0
            for rows in split_sizes([len(seq_comp[i]) for i in idx], splits):
                cols = max(1, *(len(seq_comp[i]) for i in idx[first : first + rows]))
                whole = (rows, cols) == tuple(cmask.shape)  # one forward (the default): the micro-batch's own positions
                runs.append((rows, cols, index if whole else completion_index(cmask[first : first + rows, :cols]).to(device)))
                first += rows
            batch = (*batch, tuple(runs))
        moved = (*(t.to(device) if hasattr(t, "to") else t for t in batch), index)
        rollout = None
        if seq_rollout_logp is not None:
            rows = [seq_rollout_logp[i] for i in idx]
            if not shared:  # pack_tight: each completion ends at the mask's last column
                rows = [None if r is None else [0.0] * (cmask.shape[1] - len(seq_comp[i])) + list(r) for i, r in zip(idx, rows)]
            rollout = pack_rollout_logprobs(rows, cmask.shape[1], device)
        out.append((weight, moved, seq_adv[idx].to(device), rollout))
    return out


def padding(seq_prompt: list[list[int]], seq_comp: list[list[int]], batches: list[list[int]], shared: bool,
            splits: int | str = 1) -> tuple[int, int]:
    """(padding tokens, tokens computed) of the micro-batches `packed_micro_batches` packs (`teacli.padding.micro_padding`
    of their lengths, each distinct prompt once and the completions in their forwards where they are shared)."""
    from teacli.padding import micro_padding

    return micro_padding([len(p) for p in seq_prompt], [len(c) for c in seq_comp], [tuple(p) for p in seq_prompt], batches,
                         shared, splits)


def pad_share(pad: int, computed: int) -> float:
    """The share of computed tokens that are padding (0 when nothing was computed)."""
    return pad / computed if computed else 0.0


def token_counts(prompt_ids: list[list[int]], groups: list[list[Completion]]) -> dict[str, int]:
    """Tokens a step's phases process: prompt tokens once per prompt (generation's prefill, with the prompt
    shared) and once per sequence (reference and training), and the completions' tokens."""
    return {"tokens_prompt_unique": sum(len(ids) for ids in prompt_ids),
            "tokens_prompt": sum(len(ids) * len(g) for ids, g in zip(prompt_ids, groups)),
            "tokens_completion": sum(len(c.token_ids) for g in groups for c in g)}
