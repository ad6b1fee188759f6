"""Tail constants against closed forms and Monte Carlo."""

import math

import numpy as np
import pytest
import torch

from teacli.advantages.tail import (
    c_tilde,
    empirical_tail,
    expected_max_normal,
    min_group_size,
    tail_constants,
    tail_size,
)


def test_expected_max_closed_forms():
    # E[max of 2] = 1/sqrt(pi); E[max of 3] = 3/(2 sqrt(pi)) (classical results)
    assert expected_max_normal(1) == pytest.approx(0.0, abs=1e-12)
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-10)
    assert expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-10)
    # The published value (the paper, Lemma VN_tail_surrogate): c_128 = 2.594597
    assert expected_max_normal(128) == pytest.approx(2.594597, abs=5e-7)


def test_tail_constants_are_truncated_normal_moments():
    const = tail_constants(0.25)
    rng = np.random.default_rng(0)
    z = rng.standard_normal(2_000_000)
    tail = z[z >= np.quantile(z, 0.75)]
    assert const.z == pytest.approx(0.6744897501960817, rel=1e-9)
    assert const.lam == pytest.approx(tail.mean(), abs=3e-3)
    assert const.delta == pytest.approx(tail.var(), abs=3e-3)


@pytest.mark.parametrize("n_target", [16, 128])
def test_c_tilde_extrapolates_expected_max_on_gaussian_rewards(n_target):
    # mu_alpha + c~_N sigma_alpha must equal E[max of N] for Gaussian rewards (Lemma VN_tail_surrogate).
    mu0, s0, alpha = 1.5, 0.7, 0.25
    const = tail_constants(alpha)
    mu_alpha = mu0 + s0 * const.lam
    sigma_alpha = s0 * math.sqrt(const.delta)
    predicted = mu_alpha + c_tilde(n_target, alpha) * sigma_alpha
    rng = np.random.default_rng(1)
    maxima = (mu0 + s0 * rng.standard_normal((40_000, n_target))).max(axis=1)
    stderr = maxima.std() / math.sqrt(len(maxima))
    assert abs(predicted - maxima.mean()) < 4 * stderr


def test_tail_size_is_exact_for_rational_alpha():
    assert tail_size(64, 0.25) == 16  # not 17 from floating-point rounding
    assert tail_size(12, 0.25) == 3
    assert tail_size(10, 0.25) == 3
    assert min_group_size(0.25) == 5 and tail_size(5, 0.25) == 2 and tail_size(4, 0.25) == 1


def test_empirical_tail_uses_top_q_values_without_bessel():
    rewards = torch.tensor([[3.0, 10.0, 6.0, 1.0, 7.0, 0.0]], dtype=torch.float64)
    tail = empirical_tail(rewards, 3, 1e-6)
    # top 3: 10, 7, 6 -> r = 6, mu = 23/3, var = ((7/3)^2 + (2/3)^2 + (5/3)^2)/3 = 78/27
    assert tail.r.item() == 6.0
    assert tail.mu.item() == pytest.approx(23 / 3)
    assert tail.sigma.item() == pytest.approx(math.sqrt(78 / 27))
    flat = empirical_tail(torch.full((1, 6), 2.0, dtype=torch.float64), 3, 1e-3)
    assert flat.sigma.item() == pytest.approx(1e-3)
