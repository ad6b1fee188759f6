"""Best-of-N statistics: grouped best-of-N, paired prompt bootstrap, win/tie/loss. Pure numpy.

Paper, appendix "Training and Evaluation Details":
  * Reported best-of-N (grouped): for each prompt, split its M scored completions into M/N
    *consecutive* groups of N, take each group's maximum, average the maxima within the prompt;
    the reported bo<N> is the mean of that over prompts.
  * Uncertainty estimates: paired prompt bootstrap with 1,000 resamples (prompts resampled with
    replacement, the same indices for both methods), 95% percentile interval.
  * Win/tie/loss from the same prompt-level grouped values; a tie is |difference| <= 1e-9.

The paper does not say which bootstrap interval it reports; we use the percentile interval
(2.5th and 97.5th percentiles of the resampled mean difference, numpy's linear interpolation).

Imports only numpy (docs/architecture.md import rule): `report/` uses this module without torch.
"""

from __future__ import annotations

import numpy as np

TIE_TOL = 1e-9
DEFAULT_RESAMPLES = 1000


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
