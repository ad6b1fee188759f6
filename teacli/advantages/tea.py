"""TEA and Prefix-TEA advantages (paper appendix "Estimator and Baseline Definitions").

- `tea_raw`: A^raw_i = (1/α)·1{R_i ≥ r̂}·R̃_η̂(R_i)            eq. `eq:app_tea_raw_advantage`
- `tea`:     A_i = (A^raw_i)_+ − mean_j (A^raw_j)_+             eq. `eq:app_tea_advantage`
- `prefix_tea`: C_i = Σ_j w_j ρ_j (A^raw_{i,j})_+ on nested prefixes of the same group,
  A_i = C_i − mean_ℓ C_ℓ                                       eq. `eq:app_prefix_tea_advantage`

Where this departs from or fills in the paper (see docs/advantages.md):
- The paper gives the training prefixes only for m = 64 ((40, 48, 56, 64)). We use the
  compatible-prefix rule of eq. `eq:app_compatible_prefix_construction` with ρ_j = 1/2 + j/(2J)
  on the whole group (the last prefix is the full group), which reproduces those sizes exactly;
  the cross-fitted estimator of the theory (diagnostics) uses ρ_j = 1/2 + j/(2(J+1)) on a half
  budget n = ⌊m/2⌋, as written in the appendix.
- Ties: the indicator 1{R ≥ r̂} admits every reward tied with r̂, but R̃_η̂(r̂) = 0, so tied
  samples at the threshold get zero raw advantage and no random tie-breaking is needed.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING

from teacli.advantages.tail import (
    c_tilde,
    check_alpha,
    check_tail_size,
    empirical_tail,
    tail_shaped_reward,
    tail_size,
)

if TYPE_CHECKING:
    from torch import Tensor

ALPHA = 0.25
N_TARGET = 128
EPS_SIGMA = 1e-6


def tea_raw(
    rewards: "Tensor", *, alpha: float = ALPHA, n_target: int = N_TARGET, eps_sigma: float = EPS_SIGMA
) -> "Tensor":
    """Raw tail-extrapolated advantage A^raw (eq. `eq:app_tea_raw_advantage`).

    rewards: [P, m] → [P, m]. Zero outside the top-α tail; unbounded sign inside it.
    `eps_sigma` floors σ̂ (ε_σ in eq. `eq:empirical_tail_vector`), in reward units.
    """
    check_alpha(alpha, "tea_raw")
    q = check_tail_size(rewards.shape[-1], alpha, "tea_raw")
    return _raw(rewards, q, alpha, c_tilde(int(n_target), float(alpha)), eps_sigma)


def tea(
    rewards: "Tensor", *, alpha: float = ALPHA, n_target: int = N_TARGET, eps_sigma: float = EPS_SIGMA
) -> "Tensor":
    """Stabilized TEA: positive part of A^raw, centred within the group (eq. `eq:app_tea_advantage`).

    rewards: [P, m] → [P, m]; each row sums to zero.
    """
    check_alpha(alpha, "tea")
    q = check_tail_size(rewards.shape[-1], alpha, "tea")
    pos = _raw(rewards, q, alpha, c_tilde(int(n_target), float(alpha)), eps_sigma).clamp_min(0.0)
    return pos - pos.mean(dim=-1, keepdim=True)


def _raw(rewards: "Tensor", q: int, alpha: float, ctilde: float, eps_sigma: float) -> "Tensor":
    tail = empirical_tail(rewards, q, eps_sigma)
    in_tail = rewards >= tail.r
    return (in_tail * tail_shaped_reward(rewards, tail, ctilde)) / alpha


# --------------------------------------------------------------------------------------------
# Prefix plan and moment-cancelling weights (appendix "Auxiliary results for fixed-order debiasing")


def _alpha_denominator(alpha: float) -> int:
    return Fraction(alpha).limit_denominator(10_000).denominator


def prefix_sizes(n: int, alpha: float, J: int, *, cross_fit: bool = False) -> tuple[int, ...]:
    """Compatible prefix sizes n_j = q_α·⌊ρ_j·n/q_α⌋ (eq. `eq:app_compatible_prefix_construction`).

    q_α is the denominator of α = p/q_α, so every α·n_j is an integer (common rounding offset 0).
    `cross_fit=False` (training, Prefix-TEA): ρ_j = 1/2 + j/(2J) on the full group n = m
      → m = 64, J = 4, α = 1/4 gives (40, 48, 56, 64), the paper's plan.
    `cross_fit=True` (the theory's split-budget estimator): ρ_j = 1/2 + j/(2(J+1)) on n.
    Sizes are returned as computed; `check_prefix_plan` says whether they form a valid plan.
    """
    qa = _alpha_denominator(alpha)
    denom = 2 * (J + 1) if cross_fit else 2 * J
    # ρ_j·n = n·(denom/2 + j)/denom, in exact integer arithmetic.
    return tuple(qa * ((n * (denom // 2 + j)) // (denom * qa)) for j in range(1, J + 1))


def _plan_problem(n: int, alpha: float, k: int, J: int, cross_fit: bool) -> str | None:
    sizes = prefix_sizes(n, alpha, J, cross_fit=cross_fit)
    if len(set(sizes)) != len(sizes):
        return f"prefix sizes {sizes} are not distinct"
    if min(sizes) < 1 or tail_size(min(sizes), alpha) < 2:
        return f"the smallest prefix {min(sizes)} has fewer than 2 tail samples at alpha={alpha}"
    return None


@lru_cache(maxsize=None)
def smallest_valid_group(alpha: float, k: int, J: int, cross_fit: bool = False) -> int:
    """The smallest group size m with a valid (k, J) prefix plan."""
    m = 2
    while True:
        n = m // 2 if cross_fit else m
        if n >= 2 and _plan_problem(n, alpha, k, J, cross_fit) is None:
            return m
        m += 1


def check_prefix_plan(m: int, alpha: float, k: int, J: int, rule: str, *, cross_fit: bool = False) -> tuple[int, ...]:
    """Validate (k, J) and the prefix plan for group size m; return the prefix sizes."""
    check_alpha(alpha, rule)
    if int(k) != k or k < 1:
        raise ValueError(f"{rule}: k (debiasing order) must be an integer >= 1 (paper: 2), got {k!r}")
    if int(J) != J or J < k:
        raise ValueError(f"{rule}: J (number of prefixes) must be an integer >= k={k}; the smallest valid J is {k}, got {J!r}")
    n = m // 2 if cross_fit else m
    problem = _plan_problem(n, alpha, k, J, cross_fit) if n >= 2 else f"n={n} is too small"
    if problem is not None:
        raise ValueError(
            f"{rule}: no valid prefix plan for group size m={m} with (k, J)=({k}, {J}) at alpha={alpha}: "
            f"{problem}; the smallest valid m is {smallest_valid_group(float(alpha), int(k), int(J), cross_fit)}"
        )
    return prefix_sizes(n, alpha, J, cross_fit=cross_fit)


def cancellation_weights(sizes: tuple[int, ...], n: int, k: int) -> tuple[float, ...]:
    """Minimum-norm weights w = Aᵀ(AAᵀ)⁻¹e₀ with A_ℓj = (n/n_j)^ℓ, ℓ = 0..k−1 (eq. `eq:app_min_norm_weights`).

    They satisfy Σ_j w_j = 1 and Σ_j w_j (n/n_j)^ℓ = 0 for ℓ = 1..k−1, cancelling the first k−1
    inverse powers of the prefix size in the bias expansion.
    """
    import numpy as np

    z = np.array([n / s for s in sizes], dtype=np.float64)
    A = np.vstack([z**ell for ell in range(k)])  # [k, J]
    e0 = np.zeros(k)
    e0[0] = 1.0
    w = A.T @ np.linalg.solve(A @ A.T, e0)
    return tuple(float(x) for x in w)


def prefix_tea(
    rewards: "Tensor",
    *,
    alpha: float = ALPHA,
    n_target: int = N_TARGET,
    k: int = 2,
    J: int = 4,
    eps_sigma: float = EPS_SIGMA,
) -> "Tensor":
    """Prefix-TEA (k, J) on nested prefixes of the same group (eq. `eq:app_prefix_tea_advantage`).

    rewards: [P, m] → [P, m]. For each prefix j the tail vector is estimated from the first m_j
    rewards only; rollouts beyond m_j get zero prefix advantage. C_i = Σ_j w_j ρ_j (A^raw_{i,j})_+
    with ρ_j = m/m_j, then centred over the full group. At m = 64, (k, J) = (2, 4): prefixes
    (40, 48, 56, 64), weights (−1.82946, −0.15392, 1.04289, 1.94050).
    """
    import torch

    m = rewards.shape[-1]
    sizes = check_prefix_plan(m, alpha, k, J, "prefix_tea")
    weights = cancellation_weights(sizes, m, int(k))
    ctilde = c_tilde(int(n_target), float(alpha))
    combined = torch.zeros_like(rewards)
    for size, w in zip(sizes, weights):
        raw = _raw(rewards[:, :size], tail_size(size, alpha), alpha, ctilde, eps_sigma).clamp_min(0.0)
        combined[:, :size] += (w * m / size) * raw
    return combined - combined.mean(dim=-1, keepdim=True)


# --------------------------------------------------------------------------------------------
# Cross-fitted fixed-order estimator of the theory (appendix "Auxiliary results for fixed-order
# debiasing"). Not a training advantage: it needs two independent batches and a score vector per
# evaluation sample, so it is used by the diagnostics (teacli/diagnostics/synthetic.py).


def prefix_tails(tail_rewards: "Tensor", sizes: tuple[int, ...], alpha: float, eps_sigma: float) -> list:
    """Empirical tail vectors η̂^A_{n_j} of the nested prefixes of batch A, one `EmpiricalTail` per size.

    tail_rewards: [P, n]; prefix j uses the first sizes[j] columns and q_j = ⌈α·n_j⌉ tail samples.
    """
    return [empirical_tail(tail_rewards[:, :size], tail_size(size, alpha), eps_sigma) for size in sizes]


def cross_fitted_fixed_order(
    tail_rewards: "Tensor",
    eval_rewards: "Tensor",
    eval_scores: "Tensor",
    *,
    alpha: float = ALPHA,
    n_target: int = N_TARGET,
    k: int = 2,
    J: int = 4,
    eps_sigma: float = EPS_SIGMA,
) -> "Tensor":
    """Split-budget fixed-order estimator g̃_{n,k,J} = Σ_j w_j G^cf_{n_j} (eq. `eq:app_split_budget_fixed_order_estimator`).

    tail_rewards: [P, n] batch A (tail estimation); eval_rewards: [P, n] and eval_scores: [P, n, d]
    batch B (evaluation) → [P, d]. G^cf_{n_j} = (1/n_j) Σ_{i ≤ n_j} φ_{η̂^A_{n_j}}(y_i^B) with
    φ_η(y) = (1/α)·1{R(y) ≥ r}·R̃_η(R(y))·S(y) (eq. `eq:app_phi_eta_def`). Prefixes
    n_j = q_α⌊ρ_j n/q_α⌋, ρ_j = 1/2 + j/(2(J+1)), and min-norm weights w_j with z_j = n/n_j.
    With a total budget of m rollouts, pass n = ⌊m/2⌋ samples per batch
    (eq. `eq:app_total_budget_fixed_order_estimator`).
    """
    import torch

    n = tail_rewards.shape[-1]
    if eval_rewards.shape != tail_rewards.shape or eval_scores.shape[:2] != tail_rewards.shape:
        raise ValueError(
            "cross_fitted_fixed_order: batches A and B must have the same shape [P, n] "
            f"(scores [P, n, d]); got {tuple(tail_rewards.shape)}, {tuple(eval_rewards.shape)}, {tuple(eval_scores.shape)}"
        )
    sizes = check_prefix_plan(2 * n, alpha, k, J, "cross_fitted_fixed_order", cross_fit=True)
    weights = cancellation_weights(sizes, n, int(k))
    ctilde = c_tilde(int(n_target), float(alpha))
    out = torch.zeros(eval_scores.shape[0], eval_scores.shape[-1], dtype=eval_scores.dtype, device=eval_scores.device)
    for size, w, tail in zip(sizes, weights, prefix_tails(tail_rewards, sizes, alpha, eps_sigma)):
        u = eval_rewards[:, :size]
        shaped = (u >= tail.r) * tail_shaped_reward(u, tail, ctilde) / alpha  # [P, n_j]
        out += (w / size) * torch.einsum("pi,pid->pd", shaped.to(eval_scores.dtype), eval_scores[:, :size])
    return out
