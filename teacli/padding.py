"""Cutting rows sorted by length into a fixed number of batches with the least padding.

A batch of rows is padded to its longest row, so it computes rows × that width tokens. The trainer's micro-batches
(teacli/train/batching.py: exactly the engine's gradient-accumulation count of them) and the reward model's forward
batches (teacli/rewards/hf.py: as many as `reward.batch_size` rows a batch make) both cut a length-sorted list into a
number of consecutive batches fixed in advance. Even sizes pad wherever the lengths spread within a batch (the short
end of a right-skewed length distribution, `rehearsal.lengths: realistic`); `least_padding` picks the sizes that
compute the fewest tokens instead, with no batch computing more than a cap (the largest batch of the even cut: no
more memory than before). It lives below both stages, which share it, and the planner (teacli/planner.py), which cuts
drawn lengths as a run would to price their padding: `micro_sizes` is the trainer's cut, `batch_sizes` the reward
model's.
"""

from __future__ import annotations

from collections.abc import Sequence

# The exact search does count × rows² work (numpy): beyond this, the caller's even cut stands (rows scored or trained
# in one call: 512 for a step of the paper's recipes on one GPU).
MAX_WORK = 50_000_000


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


def least_padding(widths: Sequence[int], count: int, cap: int) -> list[int] | None:
    """Sizes of exactly `count` consecutive non-empty batches of rows whose widths are sorted (ascending or
    descending) that compute the fewest tokens (Σ size × the batch's widest row), none computing more than `cap`.

    None where no such cut exists, where `count` exceeds the rows, or where the search would be too large
    (MAX_WORK): the caller keeps its even cut. Ties go to the earliest cut found, so the result is deterministic."""
    import numpy as np

    n = len(widths)
    if count < 1 or count > n or count * n * n > MAX_WORK:
        return None
    descending = n > 1 and widths[0] > widths[-1]
    w = np.asarray(widths[::-1] if descending else widths, dtype=np.float64)  # ascending: a batch's widest is its last
    start, end = np.arange(n)[:, None], np.arange(1, n + 1)[None, :]  # a batch of rows [start, end)
    cost = (end - start) * w[None, :]
    cost[(end <= start) | (cost > cap)] = np.inf
    best = np.full(n + 1, np.inf)  # best[e]: the fewest tokens for rows [0, e) in the batches so far
    best[0] = 0.0
    back = []
    for _ in range(count):
        total = best[:n, None] + cost  # [start, end - 1]
        arg = total.argmin(axis=0)
        best = np.concatenate([[np.inf], total[arg, np.arange(n)]])
        back.append(arg)
    if not np.isfinite(best[n]):
        return None
    sizes, e = [], n
    for arg in reversed(back):
        s = int(arg[e - 1])
        sizes.append(e - s)
        e = s
    sizes.reverse()  # ascending order's batches
    return sizes[::-1] if descending else sizes


def micro_sizes(widths: Sequence[int], count: int) -> list[int]:
    """Sizes of the trainer's `count` micro-batches of whole sequences sorted by width (teacli/train/batching.py): the
    cut that computes the fewest tokens with none computing more than the largest batch of the even cut, or the even
    cut where there is no such cut (fewer rows than batches: the last ones empty) or the search is too large."""
    even = even_sizes(len(widths), count)
    if len(widths) < count:
        return even
    return least_padding(widths, count, max(computed(widths, even))) or even


def batch_sizes(widths: Sequence[int], batch_size: int) -> list[int]:
    """Sizes of the reward model's forward batches of rows sorted longest first (widths[b]: row b's tokens,
    teacli/rewards/hf.py): as many batches as `batch_size` rows a batch make, cut where they compute the fewest tokens
    with none computing more than the first (`batch_size` of the longest rows: no more memory), so a batch of shorter
    rows may hold more than `batch_size`; `batch_size` rows a batch where that search is too large."""
    count = -(-len(widths) // batch_size)
    even = [min(batch_size, len(widths) - k * batch_size) for k in range(count)]
    return (least_padding(widths, count, batch_size * widths[0]) if widths else None) or even
