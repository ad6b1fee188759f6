"""Synthetic bias–variance diagnostic for Prefix-TEA (paper appendix "Synthetic diagnostic for Prefix-TEA").

One prompt, R = Z ~ N(0, 1), bounded two-dimensional score
    S(Z) = (1{Z ≥ 1} − Φ̄(1), 1{Z ≥ 1.5} − Φ̄(1.5)),
α = 0.25, N = 128. The target gradient is g = H(η) with η = (z_α, λ_α, √δ_α) the standard normal's
upper-α tail vector and H(η') = E[φ_η'(Z)], φ_η'(z) = (1/α)·1{z ≥ r'}·R̃_η'(z)·S(z)
(eqs. `eq:app_phi_eta_def`, `eq:app_H_eta_def`). R̃ is quadratic in z, so H has a closed form
through the truncated moments ∫_t^∞ z^k φ(z) dz, k = 0, 1, 2 (`shaped_score_mean`).

Estimators, both with total rollout budget m:
- TEA: the direct plug-in estimator ĝ^dir_m = (1/(αm)) Σ_i 1{R_i ≥ r̂} R̃_η̂(R_i) S(Z_i)
  (eq. `eq:direct_gradient_estimator`; not the stabilized, centred training advantage). It depends
  on the top q = ⌈αm⌉ order statistics only, which we sample directly (exponential spacings and the
  inverse normal CDF), so a replicate costs O(q) instead of O(m).
- Prefix-TEA (k, J): the cross-fitted fixed-order estimator with n = ⌊m/2⌋ per batch
  (eqs. `eq:app_split_budget_fixed_order_estimator`, `eq:app_total_budget_fixed_order_estimator`;
  `teacli.advantages.tea.cross_fitted_fixed_order`).

Metrics: bias_norm = ‖E ĝ − g‖₂, variance = E‖ĝ − E ĝ‖² (trace of the covariance, one prompt),
MSE_P = bias_norm² + variance/P. As in the paper, Prefix-TEA's bias is Rao–Blackwellized over the
evaluation split: E[G^cf | A] = Σ_j w_j H(η̂^A_{n_j}) exactly, averaged over draws of batch A; its
variance comes from the actual estimator with both batches sampled. TEA's bias and variance come
from the same Monte Carlo replicates. Bias replicates (`bias_reps`) and variance replicates (`reps`)
are counted separately because the bias needs far more of them; each row reports the Monte Carlo
errors (`bias_se`, `variance_se`).

Where this departs from or fills in the paper (docs/diagnostics.md):
- Bias estimates subtract mean-zero control variates (the first-order noise of each estimator:
  `tea_spacing_control`, `prefix_control`). The expectation is unchanged; the Monte Carlo error of
  the bias shrinks 4–30×. Variances are measured on the raw estimators.
- ε_σ = 1e-6 (the training default; the paper does not state the value used here).
- Rows are reproducible from `seed` alone (one numpy stream per estimator and m).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

ALPHA = 0.25
N_TARGET = 128
EPS_SIGMA = 1e-6
THRESHOLDS = (1.0, 1.5)
DEFAULT_MS = (256, 512, 1024, 2048, 4096)
PREFIX_CONFIGS = ((2, 4), (2, 8))  # (k, J): the paper's main setting and its stabilizing ablation
TABLE_PS = (1, 2048, 65536)
DEFAULT_REPS = 40_000  # variance replicates per (estimator, m)
DEFAULT_BIAS_REPS = 200_000  # bias replicates per (estimator, m)
FRONTIER_LOG2_P = tuple(range(0, 21))  # P = 1 … 2^20 in the frontier plot
# float64 elements per chunk row budget: bounds memory at a few hundred MB whatever m and reps are.
CHUNK_ELEMENTS = 1 << 23

Progress = Callable[[int], None]  # called with the number of work units just finished


# --------------------------------------------------------------------------------------------
# The model: score, exact H, exact target gradient


def true_tail_vector(alpha: float = ALPHA) -> tuple[float, float, float]:
    """η = (r, μ, σ) of N(0, 1)'s upper-α tail: (z_α, λ_α, √δ_α)."""
    from teacli.advantages.tail import tail_constants

    const = tail_constants(alpha)
    return const.z, const.lam, math.sqrt(const.delta)


def score(z: "Tensor") -> "Tensor":
    """S(z) = (1{z ≥ 1} − Φ̄(1), 1{z ≥ 1.5} − Φ̄(1.5)).  z: [...] → [..., 2]; E S(Z) = 0."""
    import torch

    cols = [(z >= t).to(z.dtype) - sf for t, sf in zip(THRESHOLDS, _threshold_sf())]
    return torch.stack(cols, dim=-1)


@lru_cache(maxsize=None)
def _threshold_sf() -> tuple[float, ...]:
    """Φ̄(t) for the score thresholds t."""
    return tuple(0.5 * math.erfc(t / math.sqrt(2.0)) for t in THRESHOLDS)


def _upper_moments(t: "Tensor") -> tuple["Tensor", "Tensor", "Tensor"]:
    """(∫_t^∞ φ, ∫_t^∞ zφ, ∫_t^∞ z²φ) = (Φ̄(t), φ(t), tφ(t) + Φ̄(t)) for the standard normal density φ."""
    import torch

    sf = torch.special.ndtr(-t)
    pdf = torch.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
    return sf, pdf, t * pdf + sf


def shaped_score_mean(
    r: "Tensor", mu: "Tensor", sigma: "Tensor", *, alpha: float = ALPHA, n_target: int = N_TARGET
) -> "Tensor":
    """H(η') = E[φ_η'(Z)] in closed form (eq. `eq:app_H_eta_def`).  r, mu, sigma: [P, 1] → [P, 2].

    R̃_η'(z) = a0 + a1 z + a2 z² with a2 = c̃/(2σ), a1 = 1 − c̃μ/σ, a0 = −r + c̃(2rμ − r²)/(2σ), so
    H_c = (1/α)[M(max(r, t_c)) − Φ̄(t_c)·M(r)] with M(a) = ∫_a^∞ R̃_η'(z) φ(z) dz.
    """
    import torch

    from teacli.advantages.tail import c_tilde

    ctilde = c_tilde(int(n_target), float(alpha))
    a2 = ctilde / (2.0 * sigma)
    a1 = 1.0 - 2.0 * a2 * mu
    a0 = -r + a2 * (2.0 * r * mu - r * r)

    def tail_integral(a: "Tensor") -> "Tensor":
        i0, i1, i2 = _upper_moments(a)
        return a0 * i0 + a1 * i1 + a2 * i2

    from_r = tail_integral(r)
    cols = [
        tail_integral(torch.maximum(r, torch.full_like(r, t))) - sf * from_r
        for t, sf in zip(THRESHOLDS, _threshold_sf())
    ]
    return torch.cat(cols, dim=-1) / alpha


def true_gradient(alpha: float = ALPHA, n_target: int = N_TARGET) -> "Tensor":
    """g = H(η_true), shape [2]."""
    import torch

    r, mu, sigma = (torch.tensor([[v]], dtype=torch.float64) for v in true_tail_vector(alpha))
    return shaped_score_mean(r, mu, sigma, alpha=alpha, n_target=n_target)[0]


# --------------------------------------------------------------------------------------------
# Estimators


def sample_spacings(rng: "np.random.Generator", reps: int, m: int, q: int) -> tuple["Tensor", "Tensor"]:
    """E [reps, q] i.i.d. Exp(1) and G [reps, 1] ~ Gamma(m + 1 − q): the randomness of the top q of m draws."""
    import torch

    return (
        torch.from_numpy(rng.standard_exponential((reps, q))),
        torch.from_numpy(rng.standard_gamma(m + 1 - q, (reps, 1))),
    )


def top_from_spacings(spacings: "Tensor", rest: "Tensor") -> "Tensor":
    """The q largest of m i.i.d. N(0, 1) draws, descending.  spacings: [reps, q], rest: [reps, 1] → [reps, q].

    With S_i = E_1 + … + E_i, the i smallest of m uniforms are S_i / S_{m+1}, where
    S_{m+1} = S_q + Gamma(m + 1 − q); the i-th largest normal is Φ̄⁻¹(S_i / S_{m+1}).
    """
    import torch

    partial = spacings.cumsum(dim=-1)
    return -torch.special.ndtri(partial / (partial[:, -1:] + rest))


def sample_top_order_statistics(rng: "np.random.Generator", reps: int, m: int, q: int) -> "Tensor":
    """The q largest of m i.i.d. N(0, 1) draws per replicate, descending.  → [reps, q]."""
    return top_from_spacings(*sample_spacings(rng, reps, m, q))


def tea_direct_from_top(
    top: "Tensor", m: int, *, alpha: float = ALPHA, n_target: int = N_TARGET, eps_sigma: float = EPS_SIGMA
) -> "Tensor":
    """Direct estimator ĝ^dir_m from the top q = ⌈αm⌉ rewards of each replicate.  top: [reps, q] → [reps, 2]."""
    import torch

    from teacli.advantages.tail import c_tilde, empirical_tail, tail_shaped_reward

    q = top.shape[-1]
    tail = empirical_tail(top, q, eps_sigma)  # every column is in the tail: 1{R ≥ r̂} = 1
    shaped = tail_shaped_reward(top, tail, c_tilde(int(n_target), float(alpha)))
    return torch.einsum("pi,pid->pd", shaped, score(top)) / (alpha * m)


def tea_direct(
    rewards: "Tensor", *, alpha: float = ALPHA, n_target: int = N_TARGET, eps_sigma: float = EPS_SIGMA
) -> "Tensor":
    """ĝ^dir_m = (1/m) Σ_i A^raw_i S(Z_i) on a full sample (eq. `eq:direct_gradient_estimator`).  [reps, m] → [reps, 2]."""
    import torch

    from teacli.advantages.tea import tea_raw

    raw = tea_raw(rewards, alpha=alpha, n_target=n_target, eps_sigma=eps_sigma)
    return torch.einsum("pi,pid->pd", raw, score(rewards)) / rewards.shape[-1]


def prefix_conditional_mean(
    tail_rewards: "Tensor",
    *,
    k: int,
    J: int,
    alpha: float = ALPHA,
    n_target: int = N_TARGET,
    eps_sigma: float = EPS_SIGMA,
) -> "Tensor":
    """E[g̃_{n,k,J} | batch A] = Σ_j w_j H(η̂^A_{n_j}), exactly.  tail_rewards: [reps, n] → [reps, 2]."""
    from teacli.advantages.tea import cancellation_weights, check_prefix_plan, prefix_tails

    n = tail_rewards.shape[-1]
    sizes = check_prefix_plan(2 * n, alpha, k, J, "prefix_conditional_mean", cross_fit=True)
    weights = cancellation_weights(sizes, n, int(k))
    out = 0.0
    for w, tail in zip(weights, prefix_tails(tail_rewards, sizes, alpha, eps_sigma)):
        out = out + w * shaped_score_mean(tail.r, tail.mu, tail.sigma, alpha=alpha, n_target=n_target)
    return out


def prefix_estimate(
    tail_rewards: "Tensor",
    eval_rewards: "Tensor",
    *,
    k: int,
    J: int,
    alpha: float = ALPHA,
    n_target: int = N_TARGET,
    eps_sigma: float = EPS_SIGMA,
) -> "Tensor":
    """The actual cross-fitted fixed-order estimator on batches A, B: [reps, n] each → [reps, 2]."""
    from teacli.advantages.tea import cross_fitted_fixed_order

    return cross_fitted_fixed_order(
        tail_rewards, eval_rewards, score(eval_rewards), alpha=alpha, n_target=n_target, k=k, J=J, eps_sigma=eps_sigma
    )


# --------------------------------------------------------------------------------------------
# Control variates with mean exactly zero. They only sharpen the bias estimates: subtracting a
# mean-zero quantity leaves the expectation unchanged. Variances are always measured on the
# estimators themselves.


def tea_spacing_control(m: int, q: int, *, alpha: float = ALPHA, n_target: int = N_TARGET) -> tuple["Tensor", "Tensor"]:
    """Coefficients (b_E [2, q], b_G [2]) of the linearization of ĝ^dir in its spacings (E, G) at their means.

    The control (E − 1)·b_Eᵀ + (G − (m + 1 − q))·b_G has mean exactly zero (E[E_i] = 1,
    E[G] = m + 1 − q) and removes the first-order noise of ĝ^dir: ĝ^dir is a smooth function of
    (E, G) because the top-q set is fixed in this representation.
    """
    import torch

    e0 = torch.ones(1, q, dtype=torch.float64)
    g0 = torch.full((1, 1), float(m + 1 - q), dtype=torch.float64)

    def estimate(spacings: "Tensor", rest: "Tensor") -> "Tensor":
        return tea_direct_from_top(top_from_spacings(spacings, rest), m, alpha=alpha, n_target=n_target)[0]

    with torch.enable_grad():
        jac_e, jac_g = torch.autograd.functional.jacobian(estimate, (e0, g0))
    return jac_e[:, 0, :].detach(), jac_g[:, 0, 0].detach()


def tail_influence(z: "Tensor", alpha: float = ALPHA) -> "Tensor":
    """Influence functions of (r̂, μ̂, σ̂) at N(0, 1): z [...] → [..., 3], each with mean exactly zero.

    IF_r = (1{z ≥ r} − α)/φ(r); IF_μ = (z − r)1{z ≥ r}/α − (μ − r);
    IF_m2 = (z² − r²)1{z ≥ r}/α − (m2 − r²) with m2 = σ² + μ²; IF_σ = (IF_m2 − 2μ·IF_μ)/(2σ).
    """
    above = (z >= true_tail_vector(alpha)[0]).to(z.dtype)
    return _influence_of_sums(1.0, above, z * above, z * z * above, alpha)


def _influence_of_sums(count, s0: "Tensor", s1: "Tensor", s2: "Tensor", alpha: float) -> "Tensor":
    """Σ_i IF(z_i) from count = #i, s_p = Σ_i z_i^p·1{z_i ≥ r} (IF is affine in (1, 1{z ≥ r}, z·1{.}, z²·1{.}))."""
    import torch

    r, mu, sigma = true_tail_vector(alpha)
    m2 = sigma * sigma + mu * mu
    if_r = (s0 - alpha * count) * (math.sqrt(2.0 * math.pi) * math.exp(0.5 * r * r))
    if_mu = (s1 - r * s0) / alpha - (mu - r) * count
    if_m2 = (s2 - r * r * s0) / alpha - (m2 - r * r) * count
    return torch.stack([if_r, if_mu, (if_m2 - 2.0 * mu * if_mu) / (2.0 * sigma)], dim=-1)


def shaped_score_jacobian(alpha: float = ALPHA, n_target: int = N_TARGET) -> "Tensor":
    """∂H/∂(r, μ, σ) at η_true, shape [2, 3] (autograd through the closed form)."""
    import torch

    eta = torch.tensor(true_tail_vector(alpha), dtype=torch.float64)

    def h(e: "Tensor") -> "Tensor":
        return shaped_score_mean(e[0:1, None], e[1:2, None], e[2:3, None], alpha=alpha, n_target=n_target)[0]

    with torch.enable_grad():
        return torch.autograd.functional.jacobian(h, eta).detach()


def prefix_control(
    tail_rewards: "Tensor", jacobian: "Tensor", *, k: int, J: int, alpha: float = ALPHA
) -> "Tensor":
    """Σ_j w_j Ḣ·(1/n_j) Σ_{i ≤ n_j} IF(A_i): the linear part of Σ_j w_j H(η̂^A_{n_j}) − g.  [reps, n] → [reps, 2]."""
    from teacli.advantages.tea import cancellation_weights, check_prefix_plan

    n = tail_rewards.shape[-1]
    sizes = check_prefix_plan(2 * n, alpha, k, J, "prefix_control", cross_fit=True)
    weights = cancellation_weights(sizes, n, int(k))
    above = (tail_rewards >= true_tail_vector(alpha)[0]).to(tail_rewards.dtype)
    z_above = tail_rewards * above
    moments = (above, z_above, tail_rewards * z_above)  # each [reps, n]
    linear, running, start = 0.0, [0.0, 0.0, 0.0], 0
    for w, size in zip(weights, sizes):  # sizes are increasing: accumulate block sums
        running = [acc + x[:, start:size].sum(dim=1) for acc, x in zip(running, moments)]
        start = size
        linear = linear + (w / size) * _influence_of_sums(float(size), *running, alpha)
    return linear @ jacobian.T


# --------------------------------------------------------------------------------------------
# Monte Carlo driver


class _Moments:
    """Running sums of d = x − g, ‖d‖² and ‖d‖⁴ over replicates (centred at g to avoid cancellation)."""

    def __init__(self, g: "Tensor") -> None:
        self.g = g
        self.count = 0
        self.total = g.new_zeros(g.shape)
        self.total_sq = 0.0
        self.total_4th = 0.0

    def add(self, x: "Tensor") -> None:
        d = x - self.g
        sq = d.pow(2).sum(dim=-1)
        self.count += d.shape[0]
        self.total += d.sum(dim=0)
        self.total_sq += float(sq.sum())
        self.total_4th += float(sq.pow(2).sum())

    def bias(self) -> "Tensor":
        return self.total / self.count

    def variance(self) -> float:
        """Unbiased trace of the covariance: (Σ‖x − g‖² − R‖x̄ − g‖²)/(R − 1)."""
        return (self.total_sq - self.count * float(self.bias().pow(2).sum())) / (self.count - 1)

    def bias_se(self) -> float:
        """RMS norm of the Monte Carlo error of the mean vector, sqrt(trace Cov / R)."""
        return math.sqrt(max(self.variance(), 0.0) / self.count)

    def variance_se(self) -> float:
        """Standard error of `variance()` (from the spread of ‖x − g‖², ignoring the small bias)."""
        mean_sq = self.total_sq / self.count
        return math.sqrt(max(self.total_4th / self.count - mean_sq * mean_sq, 0.0) / self.count)


def _chunks(reps: int, row_elements: int) -> list[int]:
    size = max(1, CHUNK_ELEMENTS // max(1, row_elements))
    return [min(size, reps - start) for start in range(0, reps, size)]


def _rng(seed: int, *tags: int) -> "np.random.Generator":
    import numpy as np

    return np.random.default_rng(np.random.SeedSequence([int(seed), *tags]))


def check_arguments(ms: Sequence[int], reps: int, bias_reps: int, alpha: float = ALPHA) -> None:
    """Raise ValueError for rep counts < 2 or a budget m too small for a prefix plan."""
    from teacli.advantages.tail import check_tail_size
    from teacli.advantages.tea import check_prefix_plan

    if int(reps) != reps or reps < 2:
        raise ValueError(f"synthetic diagnostic: reps must be an integer >= 2 (a variance needs two replicates), got {reps!r}")
    if int(bias_reps) != bias_reps or bias_reps < 2:
        raise ValueError(f"synthetic diagnostic: bias_reps must be an integer >= 2, got {bias_reps!r}")
    if not ms:
        raise ValueError("synthetic diagnostic: give at least one rollout budget m")
    for m in ms:
        check_tail_size(int(m), alpha, "synthetic diagnostic (TEA)")
        for k, J in PREFIX_CONFIGS:
            check_prefix_plan(int(m), alpha, k, J, f"synthetic diagnostic (Prefix-TEA k={k}, J={J})", cross_fit=True)


def work_units(ms: Sequence[int], reps: int, bias_reps: int, alpha: float = ALPHA) -> int:
    """Total progress units of `run_synthetic` (normal draws made, a proxy for time)."""
    from teacli.advantages.tail import tail_size

    total = 0
    for m in ms:
        total += bias_reps * tail_size(m, alpha)
        total += len(PREFIX_CONFIGS) * (bias_reps * (m // 2) + reps * 2 * (m // 2))
    return total


def run_synthetic(
    ms: Sequence[int] = DEFAULT_MS,
    reps: int = DEFAULT_REPS,
    bias_reps: int = DEFAULT_BIAS_REPS,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """One row per (estimator, m): bias norm, variance and MSE_P for the table's P (see module docstring).

    `bias_reps`: replicates of TEA (its bias and its variance) and of Prefix-TEA's Rao–Blackwellized
    bias. `reps`: replicates of the full Prefix-TEA estimator, for its variance. Deterministic given `seed`.
    """
    import torch

    from teacli.advantages.tail import tail_size

    check_arguments(ms, reps, bias_reps)
    advance = progress or (lambda units: None)
    g = true_gradient()
    jacobian = shaped_score_jacobian()
    rows: list[dict[str, Any]] = []
    for m in (int(m) for m in ms):
        q = tail_size(m, ALPHA)
        b_e, b_g = tea_spacing_control(m, q)
        raw, adjusted = _Moments(g), _Moments(g)
        rng = _rng(seed, 0, m)
        with torch.no_grad():
            for size in _chunks(bias_reps, 8 * q):
                spacings, rest = sample_spacings(rng, size, m, q)
                x = tea_direct_from_top(top_from_spacings(spacings, rest), m)
                raw.add(x)
                adjusted.add(x - (spacings - 1.0) @ b_e.T - (rest - float(m + 1 - q)) * b_g)
                advance(size * q)
        rows.append(_row("TEA", None, None, m, adjusted, raw))

        n = m // 2
        for k, J in PREFIX_CONFIGS:
            rb = _Moments(g)
            rng = _rng(seed, 1, k, J, m)
            with torch.no_grad():
                for size in _chunks(bias_reps, 8 * n):
                    a = torch.from_numpy(rng.standard_normal((size, n)))
                    rb.add(prefix_conditional_mean(a, k=k, J=J) - prefix_control(a, jacobian, k=k, J=J))
                    advance(size * n)
            full = _Moments(g)
            rng = _rng(seed, 2, k, J, m)
            with torch.no_grad():
                for size in _chunks(reps, 8 * n):
                    a = torch.from_numpy(rng.standard_normal((size, n)))
                    b = torch.from_numpy(rng.standard_normal((size, n)))
                    full.add(prefix_estimate(a, b, k=k, J=J))
                    advance(size * 2 * n)
            rows.append(_row(f"Prefix-TEA k={k},J={J}", k, J, m, rb, full))
    return rows


def _row(name: str, k: int | None, J: int | None, m: int, bias: _Moments, spread: _Moments) -> dict[str, Any]:
    bias_norm = float(bias.bias().norm())
    variance = spread.variance()
    row: dict[str, Any] = {"estimator": name, "k": k, "J": J, "m": m, "bias_norm": bias_norm, "variance": variance}
    for P in TABLE_PS:
        row[f"mse_P{P}"] = bias_norm**2 + variance / P
    # Monte Carlo precision: bias norms well below bias_se are noise, not signal.
    row.update(
        bias_se=bias.bias_se(),
        variance_se=spread.variance_se(),
        bias_reps=bias.count,
        variance_reps=spread.count,
    )
    return row


# --------------------------------------------------------------------------------------------
# Outputs


def _fmt(x: float) -> str:
    """The paper's number style: three decimals down to 0.01, else three significant digits in e-notation."""
    return f"{x:.3f}" if abs(x) >= 0.01 else f"{x:.3e}"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The paper's table layout (Table `tab:prefix_tea_summary`), TEA rows first, then each (k, J)."""
    header = ["Estimator", "m", "Bias norm", "Variance"] + [f"MSE P={P}" for P in TABLE_PS]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    order = ["TEA"] + [f"Prefix-TEA k={k},J={J}" for k, J in PREFIX_CONFIGS]
    for name in order:
        for row in sorted((r for r in rows if r["estimator"] == name), key=lambda r: r["m"]):
            cells = [name, str(row["m"]), _fmt(row["bias_norm"]), _fmt(row["variance"])]
            cells += [_fmt(row[f"mse_P{P}"]) for P in TABLE_PS]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_frontier(rows: list[dict[str, Any]], path: Path) -> None:
    """Heatmap of log10(MSE_P^Prefix / MSE_P^TEA) over m × P, one panel per (k, J); blue = Prefix-TEA better."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    ms = sorted({r["m"] for r in rows})
    Ps = np.array([2.0**e for e in FRONTIER_LOG2_P])
    tea = {r["m"]: r for r in rows if r["estimator"] == "TEA"}

    def mse(row: dict[str, Any]) -> "np.ndarray":
        return row["bias_norm"] ** 2 + row["variance"] / Ps

    grids = []
    for k, J in PREFIX_CONFIGS:
        pre = {r["m"]: r for r in rows if r["estimator"] == f"Prefix-TEA k={k},J={J}"}
        grids.append(np.stack([np.log10(mse(pre[m]) / mse(tea[m])) for m in ms]))  # [len(ms), len(Ps)]
    bound = max(1e-3, max(float(np.abs(gr).max()) for gr in grids))
    norm = TwoSlopeNorm(vmin=-bound, vcenter=0.0, vmax=bound)

    fig, axes = plt.subplots(1, len(grids), figsize=(5.5 * len(grids), 4.2), sharey=True, constrained_layout=True)
    axes = np.atleast_1d(axes)
    for ax, grid, (k, J) in zip(axes, grids, PREFIX_CONFIGS):
        image = ax.imshow(grid, origin="lower", aspect="auto", cmap="RdBu_r", norm=norm, interpolation="nearest")
        _zero_line(ax, grid)
        ax.set_xticks(range(0, len(Ps), 4), [f"$2^{{{FRONTIER_LOG2_P[i]}}}$" for i in range(0, len(Ps), 4)])
        ax.set_yticks(range(len(ms)), [str(m) for m in ms])
        ax.set_xlabel("prompt batch size P")
        ax.set_title(f"Prefix-TEA k={k}, J={J} vs TEA")
    axes[0].set_ylabel("rollout budget m")
    bar = fig.colorbar(image, ax=list(axes))
    bar.set_label(r"$\log_{10}(\mathrm{MSE}_P^{\mathrm{Prefix}} / \mathrm{MSE}_P^{\mathrm{TEA}})$  (< 0: Prefix-TEA better)")
    fig.savefig(path, dpi=150)
    plt.close(fig)


def _zero_line(ax: Any, grid: "np.ndarray") -> None:
    """The frontier (log-ratio = 0): a contour on two or more budgets; with one budget (a single row,
    where matplotlib's contour needs a 2 × 2 grid) a vertical tick where the row changes sign."""
    import numpy as np

    if grid.shape[0] >= 2:
        ax.contour(grid, levels=[0.0], colors="black", linewidths=1.0)
        return
    row = grid[0]
    for j in np.nonzero(np.sign(row[:-1]) * np.sign(row[1:]) < 0)[0]:
        x = j + row[j] / (row[j] - row[j + 1])  # linear interpolation between columns j and j + 1
        ax.plot([x, x], [-0.5, 0.5], color="black", linewidth=1.0)


def write_outputs(rows: list[dict[str, Any]], out: Path) -> dict[str, Path]:
    """synthetic.json (rows), synthetic.md (the paper's table layout) and frontier.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "synthetic.json", "md": out / "synthetic.md", "png": out / "frontier.png"}
    paths["json"].write_text(json.dumps(rows, indent=2) + "\n")
    paths["md"].write_text(markdown_table(rows))
    plot_frontier(rows, paths["png"])
    return paths
