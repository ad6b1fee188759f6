"""Gaussian upper-tail constants and the empirical tail statistics of a reward group.

Paper references (the TEA paper; labels as in its LaTeX source):
- Lemma `lem:VN_tail_surrogate`: c̃_N = (c_N − λ_α)/√δ_α with c_N = E[max of N i.i.d. N(0, 1)],
  z_α = Φ⁻¹(1 − α), λ_α = φ(z_α)/(1 − Φ(z_α)), δ_α = 1 + z_α·λ_α − λ_α².
- Eq. `eq:empirical_tail_vector`: q = ⌈α·m⌉, r̂ = q-th largest reward, μ̂ = mean of the top q,
  σ̂² = max(top-q variance with 1/q normalisation, ε_σ²).
- Eq. `eq:tail_shaped_reward`: R̃_η(u) = (u − r) + c̃_N/(2σ)·((u − μ)² − (r − μ)²).

Constants are computed once per (N, α) and cached; they depend on nothing else.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor


@lru_cache(maxsize=None)
def expected_max_normal(n: int) -> float:
    """c_N = E[max of n i.i.d. standard normals], by adaptive quadrature.

    Uses E[max] = ∫ x · n·φ(x)·Φ(x)^(n−1) dx; c_1 = 0, c_2 = 1/√π, c_128 = 2.594597.
    """
    if int(n) != n or n < 1:
        raise ValueError(f"expected_max_normal: N must be a positive integer, got {n!r}")
    from scipy import integrate, stats

    n = int(n)

    def integrand(x: float) -> float:
        # log-space for Φ(x)^(n−1): stays accurate for n in the millions.
        return x * n * math.exp(stats.norm.logpdf(x) + (n - 1) * stats.norm.logcdf(x))

    # The density of the maximum concentrates near √(2 log n); integrate around it.
    centre = math.sqrt(2.0 * math.log(n)) if n > 1 else 0.0
    value, _ = integrate.quad(integrand, -12.0, centre, limit=200, epsabs=1e-13, epsrel=1e-12)
    upper, _ = integrate.quad(integrand, centre, centre + 14.0, limit=200, epsabs=1e-13, epsrel=1e-12)
    return value + upper


class TailConstants(NamedTuple):
    """Constants of the standard normal's upper-α tail (Lemma `lem:VN_tail_surrogate`)."""

    z: float  # z_α = Φ⁻¹(1 − α)
    lam: float  # λ_α = φ(z_α)/(1 − Φ(z_α)): the tail mean of N(0, 1) above z_α
    delta: float  # δ_α = 1 + z_α λ_α − λ_α²: the tail variance of N(0, 1) above z_α


@lru_cache(maxsize=None)
def tail_constants(alpha: float) -> TailConstants:
    """z_α, λ_α and δ_α for 0 < α < 1/2."""
    check_alpha(alpha, "tail_constants")
    from scipy import stats

    z = float(stats.norm.isf(alpha))
    lam = float(stats.norm.pdf(z) / stats.norm.sf(z))
    return TailConstants(z=z, lam=lam, delta=1.0 + z * lam - lam * lam)


@lru_cache(maxsize=None)
def c_tilde(n_target: int, alpha: float) -> float:
    """c̃_N = (c_N − λ_α)/√δ_α: μ_α + c̃_N·σ_α extrapolates E[max of N] from the α-tail."""
    const = tail_constants(alpha)
    return (expected_max_normal(n_target) - const.lam) / math.sqrt(const.delta)


def check_alpha(alpha: float, rule: str) -> None:
    if not (0.0 < float(alpha) < 0.5):
        raise ValueError(f"{rule}: alpha must lie in (0, 0.5) (paper default 0.25), got {alpha!r}")


def tail_size(m: int, alpha: float) -> int:
    """q = ⌈α·m⌉, computed exactly for rational α (α = 0.25, m = 64 → 16, not 17)."""
    return math.ceil(Fraction(alpha).limit_denominator(10_000) * m)


def min_group_size(alpha: float) -> int:
    """Smallest m with q = ⌈α·m⌉ ≥ 2 (a tail variance needs two points)."""
    frac = Fraction(alpha).limit_denominator(10_000)
    return math.floor(1 / frac) + 1


def check_tail_size(m: int, alpha: float, rule: str) -> int:
    q = tail_size(m, alpha)
    if q < 2:
        raise ValueError(
            f"{rule}: group size m={m} gives q=ceil(alpha*m)={q} < 2 tail samples at alpha={alpha}; "
            f"the smallest valid m is {min_group_size(alpha)}"
        )
    return q


class EmpiricalTail(NamedTuple):
    """Empirical top-α tail vector η̂ = (r̂, μ̂, σ̂) per prompt; each field has shape [P, 1]."""

    r: "Tensor"
    mu: "Tensor"
    sigma: "Tensor"


def empirical_tail(rewards: "Tensor", q: int, eps_sigma: float) -> EmpiricalTail:
    """η̂ from the top q rewards of each row (eq. `eq:empirical_tail_vector`).

    rewards: [P, n]. Ties need no breaking: r̂, μ̂ and σ̂ depend on the top-q *values* only.
    The variance uses the paper's 1/q normalisation (no Bessel correction).
    """
    import torch

    top = torch.topk(rewards, q, dim=-1, sorted=True).values  # [P, q], descending
    mu = top.mean(dim=-1, keepdim=True)
    var = (top - mu).pow(2).mean(dim=-1, keepdim=True)
    sigma = var.clamp_min(eps_sigma * eps_sigma).sqrt()
    return EmpiricalTail(r=top[:, -1:], mu=mu, sigma=sigma)


def tail_shaped_reward(u: "Tensor", tail: EmpiricalTail, ctilde: float) -> "Tensor":
    """R̃_η(u) = (u − r) + c̃/(2σ)·((u − μ)² − (r − μ)²)  (eq. `eq:tail_shaped_reward`)."""
    return (u - tail.r) + ctilde / (2.0 * tail.sigma) * ((u - tail.mu).pow(2) - (tail.r - tail.mu).pow(2))


# --------------------------------------------------------------------------------------------
# The Gaussian upper-tail check (paper appendix "Reward-distribution diagnostic",
# Tab. `tab:gaussian_tail_check_80_99`): QQ linearity of each group's upper tail.

QQ_Q_LOW = 0.80
QQ_Q_HIGH = 0.99
QQ_MIN_POINTS = 3  # a line through two points always fits: R² needs at least three


class QQFit(NamedTuple):
    """Per-row fit of the upper-tail order statistics to a + b·Φ⁻¹(q); arrays of shape [P].

    `r2` is 0.0 where the row is degenerate (`flat`: every reward in the range equal; `too_few`:
    fewer than QQ_MIN_POINTS order statistics in [q_low, q_high]); use `ok` to select fitted rows.
    """

    r2: "np.ndarray"
    a: "np.ndarray"
    b: "np.ndarray"
    ok: "np.ndarray"  # bool: fitted
    flat: "np.ndarray"  # bool
    too_few: "np.ndarray"  # bool
    q: "np.ndarray"  # [n] plotting positions used (shared by all rows)
    x: "np.ndarray"  # [n] Φ⁻¹(q)


def qq_positions(M: int, q_low: float = QQ_Q_LOW, q_high: float = QQ_Q_HIGH) -> tuple["np.ndarray", "np.ndarray"]:
    """(indices, q) of the ascending order statistics whose Hazen plotting positions q_i = (i − ½)/M
    (i = 1 … M) lie in [q_low, q_high]; indices are 0-based into the sorted row."""
    import numpy as np

    if not (0.0 < q_low < q_high < 1.0):
        raise ValueError(f"QQ tail fit: need 0 < q_low < q_high < 1, got q_low={q_low!r}, q_high={q_high!r}")
    q = (np.arange(1, M + 1) - 0.5) / M
    keep = np.nonzero((q >= q_low - 1e-12) & (q <= q_high + 1e-12))[0]
    return keep, q[keep]


def qq_tail_r2(rewards: "np.ndarray", q_low: float = QQ_Q_LOW, q_high: float = QQ_Q_HIGH) -> QQFit:
    """R² of the least-squares line y = a + b·Φ⁻¹(q) through each row's upper-tail order statistics.

    rewards: [P, M] (any order within a row). The order statistics r_(i) with plotting positions
    q_i = (i − ½)/M in [q_low, q_high] are regressed on Φ⁻¹(q_i); R² = corr². Vectorised over rows:
    one sort and a few reductions (negligible next to a training step).
    """
    import numpy as np
    from scipy.stats import norm

    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] == 0:
        raise ValueError(f"QQ tail fit: rewards must have shape [P, M], got {r.shape}")
    P, M = r.shape
    idx, q = qq_positions(M, q_low, q_high)
    x = norm.ppf(q)
    zeros = np.zeros(P)
    if len(idx) < QQ_MIN_POINTS:
        false = np.zeros(P, dtype=bool)
        return QQFit(zeros, zeros.copy(), zeros.copy(), false, false.copy(), ~false, q, x)
    y = np.sort(r, axis=1)[:, idx]  # [P, n]
    xc = x - x.mean()
    yc = y - y.mean(axis=1, keepdims=True)
    sxx = float(xc @ xc)
    syy = (yc * yc).sum(axis=1)
    sxy = yc @ xc
    scale = np.maximum(np.abs(y).max(axis=1), 1e-300)
    flat = syy <= (1e-12 * scale) ** 2 * len(idx)  # all equal up to rounding
    ok = ~flat
    r2 = np.where(ok, sxy * sxy / (sxx * np.where(ok, syy, 1.0)), 0.0)
    b = sxy / sxx
    a = y.mean(axis=1) - b * x.mean()
    return QQFit(np.clip(r2, 0.0, 1.0), a, b, ok, flat, np.zeros(P, dtype=bool), q, x)


def tail_check_stats(rewards: "Any", q_low: float = QQ_Q_LOW, q_high: float = QQ_Q_HIGH) -> dict[str, float]:
    """One training step's tail check: rewards [P, m] (tensor or array) → {"tail_r2_median", "tail_flat_frac"}.

    tail_r2_median is the median over groups of `qq_tail_r2`, a group whose upper tail is flat (every
    reward in the range equal: nothing to extrapolate) counting as R² = 0. Empty when m is too small
    for three order statistics in [q_low, q_high] (m < 16 at the defaults): no check is possible.
    """
    import numpy as np

    r = rewards.detach().cpu().double().numpy() if hasattr(rewards, "detach") else np.asarray(rewards, dtype=np.float64)
    fit = qq_tail_r2(r, q_low, q_high)
    if fit.too_few.all():
        return {}
    return {"tail_r2_median": float(np.median(np.where(fit.ok, fit.r2, 0.0))), "tail_flat_frac": float(fit.flat.mean())}
