"""Cutting rows sorted by length into batches with the least padding.

A batch of rows is padded to its longest row, so it computes rows × that width tokens. The trainer's micro-batches
(teacli/train/batching.py: exactly the engine's gradient-accumulation count of them) and the reward model's forward
batches (teacli/rewards/hf.py: as many as `reward.batch_size` rows a batch make) cut a length-sorted list into a
number of consecutive batches fixed in advance. Even sizes pad wherever the lengths spread within a batch (the short end of a right-skewed length
distribution, `rehearsal.lengths: realistic`); `least_padding` picks the sizes that compute the fewest tokens
instead, with no batch computing more than a cap (the largest batch of the even cut: no more memory than before),
and where the number of batches is free, the number that computes the fewest tokens plus FORWARD_TOKENS a batch: with
`optim.completion_splits`, a shared micro-batch's completions run in forwards of similar lengths on their prompt's
cache (`split_sizes`). It lives below the stages, which share it, and the planner (teacli/planner.py), which
cuts drawn lengths as a run would to price their padding: `micro_batches` (by `micro_sizes`) is the trainer's cut,
`split_sizes` its forwards and `micro_padding` what they compute, `batch_sizes` the reward model's cut.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# The exact search does count × rows² work (numpy): beyond this, the caller's even cut stands (rows scored or trained
# in one call: 512 for a step of the paper's recipes on one GPU).
MAX_WORK = 50_000_000
# What one more forward costs beside its tokens, in tokens of work: with optim.completion_splits auto, a shared
# micro-batch's completions run in more, shorter forwards (`split_sizes`) only where that saves more padding than this
# a forward. Measured on one H200 for the 1B paper policy (benchmarks/completion_splits.py,
# results/performance/2026-11-29-h200-splits/): a forward and backward costs 75.7 ms beside 12.2 µs a token (6,223
# tokens), a forward without gradients 20.2 ms beside 4.7 µs a token (4,257). A larger model's tokens cost more
# against the same launches: splitting pays sooner there (optim.completion_splits: k).
FORWARD_TOKENS = 6000


def even_sizes(rows: int, count: int) -> list[int]:
    """Sizes of `count` batches of `rows` rows that differ by at most one, the larger first."""
    q, r = divmod(rows, count)
    return [q + (k < r) for k in range(count)]


def computed(widths: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """Tokens each batch of `sizes` consecutive rows of `widths` (sorted, either way) computes: rows × its widest."""
    out, start = [], 0
    for size in sizes:
        part = widths[start : start + size]
        out.append(size * max(part, default=0))
        start += size
    return out


def least_padding(widths: Sequence[int], count: int, cap: float, *, most: int | None = None, per_batch: float = 0.0
                  ) -> list[int] | None:
    """Sizes of exactly `count` consecutive non-empty batches of rows whose widths are sorted (ascending or
    descending) that compute the fewest tokens (Σ size × the batch's widest row), none computing more than `cap`.

    With `most` > count, any number of batches from `count` to `most`, the one of the fewest tokens plus `per_batch`
    a batch (what a forward costs beside its tokens, `FORWARD_TOKENS`). None where no such cut exists, where `count`
    exceeds the rows, or where the search would be too large (MAX_WORK): the caller keeps its even cut. Ties go to
    the earliest cut found (the fewest batches), so the result is deterministic."""
    import numpy as np

    n = len(widths)
    if count < 1 or count > n or count * n * n > MAX_WORK:
        return None
    most = min(n, MAX_WORK // (n * n), count if most is None else max(most, count))  # the search's size caps `most`
    descending = n > 1 and widths[0] > widths[-1]
    w = np.asarray(widths[::-1] if descending else widths, dtype=np.float64)  # ascending: a batch's widest is its last
    start, end = np.arange(n)[:, None], np.arange(1, n + 1)[None, :]  # a batch of rows [start, end)
    cost = (end - start) * w[None, :]
    cost[(end <= start) | (cost > cap)] = np.inf
    best = np.full(n + 1, np.inf)  # best[e]: the fewest tokens for rows [0, e) in the batches so far
    best[0] = 0.0
    back: list = []
    chosen, least = 0, np.inf
    for batches in range(1, most + 1):
        total = best[:n, None] + cost  # [start, end - 1]
        arg = total.argmin(axis=0)
        best = np.concatenate([[np.inf], total[arg, np.arange(n)]])
        back.append(arg)
        if batches >= count and best[n] + per_batch * batches < least:
            chosen, least = batches, best[n] + per_batch * batches
    if not np.isfinite(least):
        return None
    sizes, e = [], n
    for arg in reversed(back[:chosen]):
        s = int(arg[e - 1])
        sizes.append(e - s)
        e = s
    sizes.reverse()  # ascending order's batches
    return sizes[::-1] if descending else sizes


def split_sizes(widths: Sequence[int], splits: int | str) -> list[int]:
    """Sizes of the consecutive forwards that a shared micro-batch's completions run in (`optim.completion_splits`;
    widths: the completions' lengths, sorted), each padded to its own longest: `splits` forwards (at most one a row)
    cut where they pad least, or for "auto" the number of them that computes the fewest tokens plus FORWARD_TOKENS a
    forward. One forward (every completion padded to the longest) where there are fewer than two rows."""
    n = len(widths)
    if n < 2:
        return [n] if n else []
    widths = [max(1, w) for w in widths]  # a batch pads to at least one column
    cap = n * max(widths)  # no forward computes more than the whole micro-batch in one
    if splits == "auto":
        sizes = least_padding(widths, 1, cap, most=n, per_batch=FORWARD_TOKENS)
    else:
        sizes = least_padding(widths, min(int(splits), n), cap)
    return sizes or [n]


def packed_rows(widths: Sequence[int], cap: int | None = None) -> list[list[int]]:
    """Rows that segments of these widths are laid end to end in, none wider than `cap` (default: the widest segment;
    first-fit decreasing: the widest first, each into the first row with room for it, else a new row): each row's
    segment indices in the order laid. A segment of no width goes in no row. `optim.completion_splits: packed`."""
    cap = max(widths, default=0) if cap is None else cap
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(widths)), key=lambda i: -widths[i]):
        w = widths[i]
        if w <= 0:
            continue
        for r, left in enumerate(room):
            if left >= w:
                rows[r].append(i)
                room[r] -= w
                break
        else:
            rows.append([i])
            room.append(cap - w)
    return rows


def packed_groups(widths: Sequence[int], groups: Iterable[Sequence[int]], cap: int) -> list[list[int]]:
    """Rows of segments packed group by group, none mixing groups (a row reads one prompt's cache): each group's
    members (indices into `widths`) laid by `packed_rows` at `cap`, group after group; each row's indices."""
    return [[members[i] for i in row] for members in groups for row in packed_rows([widths[b] for b in members], cap)]


def packed_layout(completions: Sequence[int], prompt_keys: Sequence[object]) -> tuple[list[list[int]], int]:
    """How a shared micro-batch's completions of these lengths run packed (`optim.completion_splits: packed`): each
    completion's first token is predicted from its prompt's last state, its other tokens (all but the last, which
    predicts nothing) are laid end to end in rows of the longest's width, a row holding one prompt's completions only
    (`packed_rows` per prompt). Returns (each row's completion indices, the width). What
    `teacli.train.batching.pack_completions` lays out and `packed_computed` counts."""
    segments = [max(0, c - 1) for c in completions]
    width = max(segments, default=0)
    groups = ([b for b, k in enumerate(prompt_keys) if k == key] for key in dict.fromkeys(prompt_keys))
    return packed_groups(segments, groups, width), width


def packed_computed(completions: Sequence[int], prompt_keys: Sequence[object]) -> int:
    """Tokens a shared micro-batch's completions compute packed (`packed_layout`): one a completion for its first
    token (its prompt's last state) and the rows × their width."""
    rows, width = packed_layout(completions, prompt_keys)
    return len(completions) + len(rows) * width


def micro_sizes(widths: Sequence[int], count: int) -> list[int]:
    """Sizes of the trainer's `count` micro-batches of whole sequences sorted by width (teacli/train/batching.py): the
    cut that computes the fewest tokens with none computing more than the largest batch of the even cut, or the even
    cut where there is no such cut (fewer rows than batches: the last ones empty) or the search is too large."""
    even = even_sizes(len(widths), count)
    if len(widths) < count:
        return even
    return least_padding(widths, count, max(computed(widths, even))) or even


def micro_batches(lengths: Sequence[int], n: int, groups: Sequence[int] | None = None, deal: bool = False
                  ) -> list[list[int]]:
    """The trainer's exactly `n` micro-batches of sequence indices (teacli/train/update.py), sorted by length (by group,
    then length, when `groups` is given: the sequences of a prompt stay together, `optim.share_prompts`), then cut
    into consecutive micro-batches.

    Without groups (each sequence packed whole, `pack_tight`: a micro-batch computes its rows × its longest) the
    cut is `micro_sizes` (more of the short sequences in a batch, fewer of the long); with groups, the even cut:
    sizes that differ by at most one (the shorter sequences get the larger batches). With fewer sequences than `n`,
    the last ones are empty. Exactly `n` backward passes make the last one DeepSpeed's gradient-accumulation boundary
    by construction, whatever the number of sequences; how the sequences are cut changes only the order of the
    gradient's terms. `deal` (with groups; `optim.completion_splits: packed`): the same sizes and groups, but each
    group's sequences dealt across its micro-batches (`_dealt`), so that packed rows can pair short with long.
    """
    key = (lambda i: lengths[i]) if groups is None else (lambda i: (groups[i], lengths[i]))
    order = sorted(range(len(lengths)), key=key)
    sizes = even_sizes(len(order), n) if groups is not None else micro_sizes([lengths[i] for i in order], n)
    if deal and groups is not None:
        order = _dealt(order, groups, sizes)
    out, start = [], 0
    for size in sizes:
        out.append(order[start : start + size])
        start += size
    return out


def _dealt(order: list[int], groups: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """`order` (sorted by group, then length) with each group's sequences dealt across the micro-batches its places
    fall in, in proportion: every micro-batch gets short and long ones alike, not a run of the shortest or the
    longest (`micro_batches`' `deal`). A place is keyed by where it sits in its micro-batch ((rank + ½) / size); the
    group's sequences, shortest first, fill its places in the order of that key."""
    batch_of, rank = [], []
    for b, size in enumerate(sizes):
        batch_of += [b] * size
        rank += [(r + 0.5) / size for r in range(size)]
    out = list(order)
    start = 0
    while start < len(order):
        end = start
        while end < len(order) and groups[order[end]] == groups[order[start]]:
            end += 1
        places = sorted(range(start, end), key=lambda k: (rank[k], batch_of[k]))
        for place, seq in zip(places, order[start:end]):
            out[place] = seq
        start = end
    return out


def micro_padding(prompts: Sequence[int], completions: Sequence[int], prompt_keys: Sequence[object], batches: list[list[int]],
                  shared: bool, splits: int | str = 1) -> tuple[int, int]:
    """(padding tokens, tokens computed) of the micro-batches `batches` of sequences whose prompts and completions have
    these lengths: a batch of whole sequences (left-padded) computes its rows × its longest sequence; a shared one
    (`optim.share_prompts`) its distinct prompts (by `prompt_keys`) × the longest of them plus, for each of the
    forwards `split_sizes(…, splits)` cuts its completions into (sorted by length), its rows × its longest
    completion (each at least one column, as they pad), or packed (`splits` "packed") what `packed_computed` says.
    An empty micro-batch's zero-weight pass over the first batch's first sequence is computed too."""
    pad = total = 0
    for idx in batches:
        idx = idx or batches[0][:1]
        comps = [completions[i] for i in idx]
        if shared:
            firsts = list({prompt_keys[i]: prompts[i] for i in idx}.values())
            if splits == "packed":
                work = packed_computed(comps, [prompt_keys[i] for i in idx])
            else:
                comps.sort()
                work = sum(computed([max(1, c) for c in comps], split_sizes(comps, splits)))
            batch = len(firsts) * max(1, *firsts) + work
            real = sum(firsts) + sum(comps)
        else:
            totals = [prompts[i] + n for i, n in zip(idx, comps)]
            batch = len(totals) * max(max(1, *comps) + 1, *totals)
            real = sum(totals)
        pad += batch - real
        total += batch
    return pad, total


def batch_sizes(widths: Sequence[int], batch_size: int) -> list[int]:
    """Sizes of the reward model's forward batches of rows sorted longest first (widths[b]: row b's tokens,
    teacli/rewards/hf.py): as many batches as `batch_size` rows a batch make, cut where they compute the fewest tokens
    with none computing more than the first (`batch_size` of the longest rows: no more memory), so a batch of shorter
    rows may hold more than `batch_size`; `batch_size` rows a batch where that search is too large."""
    count = -(-len(widths) // batch_size)
    even = [min(batch_size, len(widths) - k * batch_size) for k in range(count)]
    return (least_padding(widths, count, batch_size * widths[0]) if widths else None) or even
