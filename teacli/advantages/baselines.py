"""Baseline advantage rules (paper appendix "Estimator and Baseline Definitions").

Every rule maps rewards [P, m] → advantages [P, m] and is pure tensor math.

Choices where the paper is silent (docs/advantages.md says the same):
- std(·) is the population standard deviation (1/m, no Bessel correction), matching the 1/q
  normalisation of TEA's tail variance; ε = 1e-6 is added to it.
- BoN-max: i* is the first index attaining the maximum (deterministic tie-breaking); R^(2) is the
  second entry of the sorted group, so a tied maximum gives R* − R^(2) = 0.
- BoN mean (max@k): tied rewards receive the average of their transformed rewards, so the result
  does not depend on how a sort orders equal values.
- CAT-BoN: F̂_<(R_i) counts rewards strictly below R_i, so tied rewards share one rank weight.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import Tensor

EPS = 1e-6


def _zscore(x: "Tensor", eps: float) -> "Tensor":
    centred = x - x.mean(dim=-1, keepdim=True)
    return centred / (x.std(dim=-1, keepdim=True, correction=0) + eps)


def grpo(rewards: "Tensor") -> "Tensor":
    """GRPO: A_i = R_i − R̄ (eq. `eq:app_grpo_advantage`)."""
    return rewards - rewards.mean(dim=-1, keepdim=True)


def grpo_z(rewards: "Tensor", *, eps: float = EPS) -> "Tensor":
    """GRPO-Z: A_i = (R_i − R̄)/(std(R) + ε) (eq. `eq:app_grpoz_advantage`)."""
    return _zscore(rewards, eps)


def _argmax_and_runner_up(rewards: "Tensor") -> tuple["Tensor", "Tensor", "Tensor"]:
    import torch

    top2 = torch.topk(rewards, 2, dim=-1, sorted=True).values  # [P, 2]
    # torch.argmax returns the first maximal index: deterministic tie-breaking.
    best = torch.argmax(rewards, dim=-1, keepdim=True)  # [P, 1]
    return best, top2[:, :1], top2[:, 1:]


def bon_max_mean(rewards: "Tensor") -> "Tensor":
    """BoN-max mean: R* − R̄ on the reward-selected response, 0 elsewhere (eq. `eq:app_bonmax_mean_advantage`)."""
    import torch

    _check_min_m(rewards, 2, "bon_max_mean", "m")
    best, r_star, _ = _argmax_and_runner_up(rewards)
    value = r_star - rewards.mean(dim=-1, keepdim=True)
    return torch.zeros_like(rewards).scatter_(-1, best, value)


def bon_max_second(rewards: "Tensor") -> "Tensor":
    """BoN-max second: R* − R^(2) on the reward-selected response, 0 elsewhere (eq. `eq:app_bonmax_second_advantage`)."""
    import torch

    _check_min_m(rewards, 2, "bon_max_second", "m")
    best, r_star, r_second = _argmax_and_runner_up(rewards)
    return torch.zeros_like(rewards).scatter_(-1, best, r_star - r_second)


@lru_cache(maxsize=64)
def _maxk_coefficients(m: int, k: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """a_i = C(i−1, k−1)/C(m, k) and b_j = C(j−2, k−2)/C(m, k) for sorted positions 1..m (in log space)."""

    def log_comb(n: int, r: int) -> float:
        if r < 0 or r > n:
            return -math.inf
        return math.lgamma(n + 1) - math.lgamma(r + 1) - math.lgamma(n - r + 1)

    norm = log_comb(m, k)
    a = tuple(math.exp(log_comb(i - 1, k - 1) - norm) for i in range(1, m + 1))
    b = tuple(math.exp(log_comb(j - 2, k - 2) - norm) if j >= 2 else 0.0 for j in range(1, m + 1))
    return a, b


def maxk_transformed_rewards(rewards: "Tensor", k: int) -> "Tensor":
    """Bagirov et al.'s max@k transformed reward B (eq. `eq:app_maxatk_transformed_reward`), in sample order.

    B_(i) = r_(i)·C(i−1, k−1)/C(m, k) + Σ_{j>i} r_(j)·C(j−2, k−2)/C(m, k) on ascending order
    statistics; ties get the mean of their group's values.
    """
    import torch

    m = rewards.shape[-1]
    a, b = _maxk_coefficients(m, k)
    a_t = torch.tensor(a, dtype=torch.float64, device=rewards.device)
    b_t = torch.tensor(b, dtype=torch.float64, device=rewards.device)
    sorted_r, order = torch.sort(rewards.double(), dim=-1, stable=True)
    weighted = sorted_r * b_t
    # Σ_{j>i} b_j r_(j): reverse cumulative sum, shifted by one position.
    tail = weighted.flip(-1).cumsum(-1).flip(-1) - weighted
    transformed = sorted_r * a_t + tail
    transformed = _average_over_ties(sorted_r, transformed)
    out = torch.empty_like(transformed).scatter_(-1, order, transformed)
    return out.to(rewards.dtype)


def _average_over_ties(sorted_values: "Tensor", x: "Tensor") -> "Tensor":
    """Replace x by its mean over runs of equal values in each sorted row."""
    import torch

    new_run = torch.ones_like(sorted_values, dtype=torch.bool)
    new_run[:, 1:] = sorted_values[:, 1:] != sorted_values[:, :-1]
    if bool(new_run.all()):
        return x
    run_id = new_run.long().cumsum(-1) - 1  # [P, m], 0-based run index per row
    sums = torch.zeros_like(x).scatter_add_(-1, run_id, x)
    counts = torch.zeros_like(x).scatter_add_(-1, run_id, torch.ones_like(x))
    return (sums / counts).gather(-1, run_id)


def bon_mean(rewards: "Tensor", *, k: int | None = None, eps: float = EPS) -> "Tensor":
    """BoN mean (max@k): z-scored max@k transformed reward (eq. `eq:app_maxatk_advantage`).

    k: subset size, 2 ≤ k < m; default m/2 (the paper: k = 32 at m = 64, k = 64 at m = 128).
    """
    m = rewards.shape[-1]
    k = m // 2 if k is None else k
    if int(k) != k or not (2 <= k < m):
        raise ValueError(
            f"bon_mean: k must be an integer with 2 <= k < m={m} (exact max@k needs k < m); "
            f"got k={k!r}; the smallest valid m for k={k} is {max(int(k) + 1, 3) if isinstance(k, int) else 3}"
        )
    return _zscore(maxk_transformed_rewards(rewards, int(k)), eps)


def cat_bon(rewards: "Tensor", *, n_target: int = 128, eps: float = EPS) -> "Tensor":
    """CAT-BoN: normalised rank weight times the z-scored reward (eqs. `eq:app_cat_weight`, `eq:app_cat_advantage`).

    w_i = N·F̂_<(R_i)^(N−1), w̃_i = w_i/(mean_j w_j + ε), A_i = w̃_i·(R_i − R̄)/(std(R) + ε).
    """
    if int(n_target) != n_target or n_target < 1:
        raise ValueError(f"cat_bon: n_target must be an integer >= 1 (paper: 128), got {n_target!r}")
    m = rewards.shape[-1]
    import torch

    # #{j : R_j < R_i} = the left insertion point of R_i in its sorted row.
    below = torch.searchsorted(torch.sort(rewards, dim=-1).values.contiguous(), rewards.contiguous(), right=False)
    frac = below.double() / m
    w = n_target * frac.pow(n_target - 1)
    w_norm = w / (w.mean(dim=-1, keepdim=True) + eps)
    return (w_norm * _zscore(rewards.double(), eps)).to(rewards.dtype)


def _check_min_m(rewards: "Tensor", smallest: int, rule: str, param: str) -> None:
    m = rewards.shape[-1]
    if m < smallest:
        raise ValueError(f"{rule}: group size {param}={m} is too small; the smallest valid m is {smallest}")


@lru_cache(maxsize=None)
def chow_lambda(n: int) -> float:
    """λ_N of Chow et al. (2024), "Inference-Aware Fine-Tuning for Best-of-N Sampling", arXiv 2412.15287.

    Their BoN-RL analysis replaces the BoN policy by the tilted policy π_bon(y) ∝ π(y)·exp(λ_N·Q_π(x, y)),
    Q_π(x, y) = P_{y'∼π}(r(y') ≤ r(y)) (the win-rate of y), with λ_N chosen so that
    KL(π_bon ‖ π) equals the BoN policy's KL, log N − (N − 1)/N (Beirami et al. 2024); Lemma 2's
    gradient carries the same λ_N. For a continuous reward Q is Uniform(0, 1) under π, so the tilted
    law of Q has density λe^{λu}/(e^λ − 1) and KL(λ) = λ·E[U] − log((e^λ − 1)/λ) with
    E[U] = 1/(1 − e^{−λ}) − 1/λ; we solve KL(λ_N) = log N − (N − 1)/N by bracketing.
    λ_1 = 0, λ_2 = 2.2886, λ_32 = 33.016; for large N, KL(λ) ≈ log λ − 1 gives λ_N ≈ N·e^{1/N} ≈ N + 1.
    The source's text could not be consulted offline when this was written: the construction follows
    the paper's description of Lemma 2; pass `lam` to use another value.
    """
    if int(n) != n or n < 1:
        raise ValueError(f"chow: N_sel must be an integer >= 1, got {n!r}")
    if n == 1:
        return 0.0
    from scipy.optimize import brentq

    target = math.log(n) - (n - 1) / n

    def kl(lam: float) -> float:
        mean_u = 1.0 / (-math.expm1(-lam)) - 1.0 / lam
        log_norm = lam + math.log(-math.expm1(-lam)) - math.log(lam)  # log((e^λ − 1)/λ)
        return lam * mean_u - log_norm - target

    return float(brentq(kl, 1e-6, 1e6, xtol=1e-12, rtol=1e-12, maxiter=500))


def chow(
    rewards: "Tensor",
    *,
    n_sel: int | None = None,
    m_corr: int | None = None,
    lam: float | None = None,
    generator: "torch.Generator | None" = None,
) -> "Tensor":
    """Chow BoN-RL: Monte Carlo estimator of Chow et al.'s Lemma 2 gradient (eq. `eq:app_chow_advantage`).

    Each group is split at random into a selection set S (n_sel, default m/2) and a correction set
    C (m_corr, default m − n_sel); with i* = argmax_{i∈S} R_i and R* = R_{i*},
    A_i = m·[1{i = i*}·R* − 1{i ∈ C}·(λ/m_corr)·1{R_i > R*}·R*], λ = λ_{n_sel} (`chow_lambda`)
    unless `lam` is given. The factor m undoes the trainer's 1/m average. `generator` seeds the split.
    """
    import torch

    P, m = rewards.shape
    n_sel = m // 2 if n_sel is None else n_sel
    m_corr = m - n_sel if m_corr is None else m_corr
    if int(n_sel) != n_sel or int(m_corr) != m_corr or n_sel < 1 or m_corr < 1 or n_sel + m_corr != m:
        raise ValueError(
            f"chow: n_sel and m_corr must be integers >= 1 with n_sel + m_corr = m={m}, got "
            f"n_sel={n_sel!r}, m_corr={m_corr!r}; the smallest valid m is 2"
        )
    lam = chow_lambda(int(n_sel)) if lam is None else float(lam)
    perm = torch.rand(P, m, generator=generator, device="cpu").argsort(dim=-1).to(rewards.device)
    in_sel = torch.zeros(P, m, dtype=torch.bool, device=rewards.device).scatter_(-1, perm[:, :n_sel], True)
    masked = rewards.masked_fill(~in_sel, -math.inf)
    best = masked.argmax(dim=-1, keepdim=True)  # [P, 1], first maximal index within S
    r_star = rewards.gather(-1, best)  # [P, 1]
    selected = torch.zeros_like(rewards).scatter_(-1, best, r_star)
    correction = (~in_sel) & (rewards > r_star)
    return m * (selected - correction * (lam / m_corr) * r_star)
