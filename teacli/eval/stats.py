"""Best-of-N statistics: grouped best-of-N, paired prompt bootstrap, two-level (seeds, prompts)
bootstrap, win/tie/loss. numpy, plus scipy.special for two quantiles.

Paper, appendix "Training and Evaluation Details":
  * Reported best-of-N (grouped): for each prompt, split its M scored completions into M/N
    *consecutive* groups of N, take each group's maximum, average the maxima within the prompt;
    the reported bo<N> is the mean of that over prompts.
  * Uncertainty estimates: paired prompt bootstrap with 1,000 resamples (prompts resampled with
    replacement, the same indices for both methods), 95% percentile interval.
  * Win/tie/loss from the same prompt-level grouped values; a tie is |difference| <= 1e-9.

The paper does not say which bootstrap interval it reports; we use the percentile interval
(2.5th and 97.5th percentiles of the resampled mean difference, numpy's linear interpolation).

Methods trained with several seeds (`seed_prompt_bootstrap`, docs/evaluation.md "Seeds"): the
prompt bootstrap leaves out run-to-run variance. The two-level bootstrap adds a seed level: each
resample draws the seeds (runs) with replacement, then the prompts (the same draws as the prompt
bootstrap), paired across methods at both levels where the methods share their seed set. Seeds and
prompts are crossed (every seed is evaluated on every prompt), so the resampled statistic is the
prompt-level resampled mean plus the seed-level deviation, the latter scaled so that no variance is
counted twice and a handful of seeds is not read as a large sample:
  * shrink: a seed's mean over prompts carries run × prompt noise (MS_residual / P) that the prompt
    level already resamples; the seed deviations are shrunk to the ANOVA estimate of the
    between-seed variance, max(0, var(seed means) − MS_residual / P) (`seed_variance`);
  * sqrt(S / (S − 1)): the bootstrap variance of a mean of S draws is (S − 1)/S of the sample's;
  * t_ν / z quantile ratio: the between-seed variance is estimated from S − 1 degrees of freedom
    (ν = S − 1; for two unpaired methods, the Welch–Satterthwaite ν of their two seed terms), so the
    seed level is widened as a t interval widens a normal one.
With no between-seed variance left (or one run per method) the interval is the prompt bootstrap's.
benchmarks/bootstrap_coverage.py measures the coverage these buy (tests/eval/test_stats_seeds.py
checks a small version).

Imports only numpy and scipy.special (docs/architecture.md import rule): `report/` uses this module
without torch; scipy is imported inside the function that needs it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

TIE_TOL = 1e-9
DEFAULT_RESAMPLES = 1000


def min_resamples(level: float = 0.95) -> int:
    """The fewest resamples for a `level` percentile interval whose ends depend on neither extreme resample.

    numpy's linear percentile puts the lower end at position q·(B − 1) of the B sorted resampled means
    (0 = the smallest), q = (1 − level)/2, and the upper end symmetrically. Below position 1 the end is
    interpolated with the smallest mean itself (at B = 1 both ends are the one resampled mean, an interval
    that need not contain the estimate); from position 1 on it lies on or between interior order statistics,
    with at least one resampled mean beyond each end. q·(B − 1) ≥ 1 ⇔ B ≥ 1 + 1/q: 41 for a 95% interval.
    """
    q = (1.0 - level) / 2.0
    return math.ceil(1.0 + 1.0 / q - 1e-9)  # 1/q is 39.99999999999996 in floating point for level 0.95


MIN_RESAMPLES = min_resamples(0.95)  # 41: what `tea report --bootstrap` accepts
# The most `tea report --bootstrap` accepts: a resample draws one index per prompt at once ([B, P] int64 and the
# resampled values, 16 bytes per cell: 0.8 GB for B = 100,000 on 500 prompts), and past some thousands the
# interval's ends move by less than the prompts' own sampling error.
MAX_RESAMPLES = 100_000


def powers_of_two_dividing(M: int) -> list[int]:
    """[1, 2, 4, ...]: every power of two N that divides M (M = 256 → 1..256; M = 24 → 1, 2, 4, 8)."""
    if M < 1:
        raise ValueError(f"M must be >= 1, got {M}")
    out, n = [], 1
    while n <= M and M % n == 0:
        out.append(n)
        n *= 2
    return out


def grouped_bon(rewards: np.ndarray, N: int) -> np.ndarray:
    """rewards[P, M] (sample order as drawn) → grouped best-of-N per prompt [P].

    value_p = (N/M) · Σ_g max(rewards[p, g·N : (g+1)·N]), g = 0 … M/N − 1.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"rewards must be [P, M], got shape {r.shape}")
    P, M = r.shape
    if N < 1 or M % N:
        raise ValueError(f"N={N} must be a positive divisor of M={M}")
    return r.reshape(P, M // N, N).max(axis=2).mean(axis=1)


def bootstrap_indices(P: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, P] prompt indices drawn with replacement; a function of (P, resamples, seed) only."""
    if P < 1:
        raise ValueError("bootstrap needs at least one prompt")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    return np.random.default_rng(seed).integers(0, P, size=(resamples, P))


def paired_bootstrap(a: np.ndarray, b: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
    """a[P], b[P] (per-prompt values of two methods, same prompt order) → (delta, lo, hi).

    delta = mean(a − b); [lo, hi] = percentile interval of the mean difference over `resamples`
    paired resamples of the prompts. Same (P, resamples, seed) → same resampled indices, so every
    N and every method of a report shares them.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired_bootstrap needs two [P] arrays of equal length, got {a.shape} and {b.shape}")
    d = a - b
    means = d[bootstrap_indices(d.shape[0], resamples, seed)].mean(axis=1)
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(d.mean()), float(lo), float(hi)


def bootstrap_mean(a: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """a[P] → (mean, lo, hi): the prompt-bootstrap interval of one method's mean (the plots' bands)."""
    a = np.asarray(a, dtype=np.float64)
    return paired_bootstrap(a, np.zeros_like(a), resamples, seed, level)


def win_tie_loss(a: np.ndarray, b: np.ndarray, tol: float = TIE_TOL) -> tuple[int, int, int]:
    """a[P], b[P] → (wins, ties, losses) of a against b; a tie is |a − b| <= tol."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"win_tie_loss needs arrays of equal shape, got {a.shape} and {b.shape}")
    d = a - b
    tie = np.abs(d) <= tol
    return int(((d > 0) & ~tie).sum()), int(tie.sum()), int(((d < 0) & ~tie).sum())


def seed_indices(seeds: Sequence[int], resamples: int, seed: int) -> np.ndarray:
    """[resamples, S] positions into `seeds` drawn with replacement; a function of (the seed set, resamples,
    seed) only, so every comparison of a method draws its seeds alike, and two methods with the same seed
    set draw the same seeds (the pairing). A stream apart from `bootstrap_indices`'s."""
    if len(seeds) < 1:
        raise ValueError("the seed level needs at least one seed")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    stream = np.random.SeedSequence([seed, 1, len(seeds), *sorted(int(s) for s in seeds)])
    return np.random.default_rng(stream).integers(0, len(seeds), size=(resamples, len(seeds)))


def seed_variance(v: np.ndarray) -> float:
    """v[S, P] (per-seed per-prompt values, S >= 2) → the between-seed variance component: the ANOVA
    estimate max(0, var(seed means) − MS_residual / P) of the two-way (seed × prompt) decomposition. The
    seed means' own variance also holds the run × prompt noise (MS_residual / P), which the prompt level
    resamples already; this is what is left for the seeds."""
    S, P = v.shape
    var_r = float(v.mean(axis=1).var(ddof=1))
    if P < 2:
        return var_r  # one prompt: the run × prompt noise cannot be told from the seed effect
    residual = v - v.mean(axis=1)[:, None] - v.mean(axis=0)[None, :] + v.mean()
    return max(0.0, var_r - float((residual**2).sum()) / ((S - 1) * (P - 1)) / P)


def _runs(x: np.ndarray, seeds: Sequence[int] | None, what: str) -> tuple[np.ndarray, list[int] | None]:
    """x[S, P] with its seed labels → rows sorted by seed; checks the labels."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] < 1:
        raise ValueError(f"{what} must be [S, P] (seeds × prompts), got shape {x.shape}")
    if seeds is None:
        if x.shape[0] > 1:
            raise ValueError(f"{what} has {x.shape[0]} seed rows but no seed labels")
        return x, None
    labels = [int(s) for s in seeds]
    if len(labels) != x.shape[0] or len(set(labels)) != len(labels):
        raise ValueError(f"{what}: seed labels {labels} must be distinct, one per row of {x.shape[0]}")
    order = np.argsort(labels, kind="stable")
    return x[order], [labels[i] for i in order]


def _seed_level(parts: Sequence[tuple[float, np.ndarray, list[int]]], resamples: int, seed: int, level: float) -> np.ndarray:
    """parts: (sign, v[S, P], seeds) per seed-level term → [resamples], the summed seed-level deviations
    (module docstring): each term's resampled seed mean minus its mean over seeds, times
    sqrt(S/(S−1) · between / var(seed means)), all times t_{ν, q} / z_q, q = (1 + level)/2, ν the
    Welch–Satterthwaite degrees of freedom of the terms' between/S (S − 1 for one term)."""
    from scipy.special import ndtri, stdtrit

    out = np.zeros(resamples)
    components = []
    for sign, v, seeds in parts:
        S, r = v.shape[0], v.mean(axis=1)
        between, var_r = seed_variance(v), float(r.var(ddof=1))
        if between <= 0.0 or var_r <= 0.0:
            continue
        k = np.sqrt(S / (S - 1) * between / var_r)
        out += sign * k * (r[seed_indices(seeds, resamples, seed)].mean(axis=1) - r.mean())
        components.append((between / S, S - 1))
    if not components:
        return out
    nu = sum(c for c, _ in components) ** 2 / sum(c**2 / df for c, df in components)
    q = 0.5 + level / 2.0
    return out * float(stdtrit(nu, q) / ndtri(q))


def seed_prompt_bootstrap(a: np.ndarray, b: np.ndarray | None = None, seeds_a: Sequence[int] | None = None,
                          seeds_b: Sequence[int] | None = None, resamples: int = DEFAULT_RESAMPLES, seed: int = 0,
                          level: float = 0.95) -> tuple[float, float, float]:
    """Two-level paired bootstrap: a[S_a, P], b[S_b, P] (per-seed per-prompt values of two methods, the
    same prompts in the same order; rows labelled by `seeds_a` / `seeds_b`, which a method of one run
    may leave None) → (delta, lo, hi). Without `b`, the interval of A's mean (the frontier's).

    delta = mean over prompts of (A's seed mean − B's seed mean). Each resample: the prompt-level mean
    of the seed-averaged differences over `bootstrap_indices(P, resamples, seed)` (the prompt
    bootstrap's own draws), plus the seed level: with equal seed sets, the seeds of both methods are
    drawn together (seed s of A with seed s of B) and the deviation is that of the per-seed differences
    A_s − B_s; otherwise each method of several seeds draws its own seeds and adds (A) or subtracts (B)
    its own deviation; a method of one run (a base arm) adds nothing at the seed level. Scaled as the
    module docstring says; [lo, hi] is the percentile interval. When no method has two seeds this is
    `paired_bootstrap` of the two runs exactly.
    """
    a, sa = _runs(a, seeds_a, "a")
    if b is None:
        b, sb = np.zeros((1, a.shape[1])), None
    else:
        b, sb = _runs(b, seeds_b, "b")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"seed_prompt_bootstrap needs the same prompts for both methods, got {a.shape[1]} and {b.shape[1]}")
    d = a.mean(axis=0) - b.mean(axis=0)
    means = d[bootstrap_indices(d.shape[0], resamples, seed)].mean(axis=1)
    if sa is not None and sa == sb:
        parts = [(1.0, a - b, sa)]
    else:
        parts = [(sign, v, labels) for sign, v, labels in ((1.0, a, sa), (-1.0, b, sb)) if labels is not None]
    parts = [p for p in parts if len(p[2]) > 1]
    if parts:
        means = means + _seed_level(parts, resamples, seed, level)
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(d.mean()), float(lo), float(hi)
