"""Best-of-N statistics with values worked out by hand (teacli/eval/stats.py)."""

from __future__ import annotations

import sys

sys.modules.setdefault("vllm", None)  # the import rule: stats needs neither
sys.modules.setdefault("deepspeed", None)

import numpy as np
import pytest

from teacli.eval.stats import bootstrap_mean, grouped_bon, paired_bootstrap, powers_of_two_dividing, win_tie_loss


def test_powers_of_two_dividing():
    assert powers_of_two_dividing(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert powers_of_two_dividing(512)[-1] == 512 and len(powers_of_two_dividing(512)) == 10
    assert powers_of_two_dividing(24) == [1, 2, 4, 8]
    assert powers_of_two_dividing(6) == [1, 2]
    assert powers_of_two_dividing(1) == [1]
    with pytest.raises(ValueError):
        powers_of_two_dividing(0)


def test_grouped_bon_hand_example():
    r = np.array([[1.0, 5.0, 2.0, 3.0],
                  [0.0, 0.0, 4.0, -1.0]])
    # N=1: the mean reward. N=2: groups (1,5),(2,3) → (5+3)/2 = 4; (0,0),(4,-1) → (0+4)/2 = 2. N=4: the max.
    assert grouped_bon(r, 1).tolist() == [2.75, 0.75]
    assert grouped_bon(r, 2).tolist() == [4.0, 2.0]
    assert grouped_bon(r, 4).tolist() == [5.0, 4.0]
    assert grouped_bon(r, 2).mean() == 3.0
    # Groups are consecutive in sample order: pairing (1,2),(5,3) instead would give 3.5 for prompt 0.
    assert grouped_bon(r[:, [0, 2, 1, 3]], 2)[0] == 3.5
    with pytest.raises(ValueError, match="divisor"):
        grouped_bon(r, 3)
    with pytest.raises(ValueError, match=r"\[P, M\]"):
        grouped_bon(r[0], 2)


def test_grouped_bon_of_sorted_rewards_picks_each_group_top():
    r = np.arange(8.0)[None, :]  # groups of 4: (0..3), (4..7) → maxima 3, 7
    assert grouped_bon(r, 4).tolist() == [5.0]
    assert grouped_bon(r, 8).tolist() == [7.0]


def test_paired_bootstrap_constant_delta_has_zero_width():
    rng = np.random.default_rng(1)
    b = rng.normal(size=50) * 10.0  # large spread between prompts: pairing removes it entirely
    a = b + 0.25
    d, lo, hi = paired_bootstrap(a, b, 1000, seed=3)
    assert d == pytest.approx(0.25) and lo == pytest.approx(0.25) and hi == pytest.approx(0.25)


def test_paired_bootstrap_two_prompts_known_distribution():
    # Differences (0, 1): a resampled mean is 0 (p = 1/4), 0.5 (1/2) or 1 (1/4), so with 1,000
    # resamples the 2.5th percentile is 0 and the 97.5th is 1 (each end holds ~250 resamples).
    d, lo, hi = paired_bootstrap(np.array([1.0, 3.0]), np.array([1.0, 2.0]), 1000, seed=0)
    assert (d, lo, hi) == (0.5, 0.0, 1.0)
    # One prompt: every resample is that prompt.
    assert paired_bootstrap(np.array([2.0]), np.array([0.5]), 100, seed=0) == (1.5, 1.5, 1.5)


def test_paired_bootstrap_matches_normal_theory_and_is_seeded():
    rng = np.random.default_rng(0)
    P = 400
    a, b = rng.normal(1.0, 2.0, P), rng.normal(0.0, 1.0, P)
    d, lo, hi = paired_bootstrap(a, b, 4000, seed=7)
    se = np.std(a - b, ddof=1) / np.sqrt(P)
    assert d == pytest.approx(float(np.mean(a - b)))
    assert lo < d < hi
    assert (hi - lo) / 2 == pytest.approx(1.96 * se, rel=0.08)
    assert paired_bootstrap(a, b, 4000, seed=7) == (d, lo, hi)  # reproducible under a seed
    assert paired_bootstrap(a, b, 4000, seed=8) != (d, lo, hi)
    m, mlo, mhi = bootstrap_mean(a, 1000, seed=0)
    assert m == pytest.approx(a.mean()) and mlo < m < mhi
    with pytest.raises(ValueError):
        paired_bootstrap(a, b[:-1])


def test_win_tie_loss_tolerance_boundary():
    b = np.zeros(7)
    a = np.array([1e-9, -1e-9, 0.0, 2e-9, -2e-9, 0.5, -3.0])
    # |d| <= 1e-9 ties (the first three); 2e-9 and 0.5 win; -2e-9 and -3 lose.
    assert win_tie_loss(a, b) == (2, 3, 2)
    assert win_tie_loss(a, b, tol=0.0) == (3, 1, 3)
    assert win_tie_loss(b, a) == (2, 3, 2)


def test_min_resamples_is_where_the_interval_ends_leave_the_extreme_resamples():
    """numpy's linear percentile of B sorted values sits at position q·(B − 1), q = 0.025: from B = 41 the 95%
    interval's ends are the 2nd smallest and 2nd largest resampled means (positions 1 and B − 2); at B = 40 the
    lower end is still interpolated with the smallest (position 0.975)."""
    from teacli.eval.stats import MIN_RESAMPLES, min_resamples

    assert MIN_RESAMPLES == min_resamples(0.95) == 41
    assert np.percentile(np.arange(41.0), [2.5, 97.5]).tolist() == [1.0, 39.0]
    assert np.percentile(np.arange(40.0), 2.5) == pytest.approx(0.975)
    assert min_resamples(0.9) == 21 and min_resamples(0.99) == 201  # 1 + 1/0.05, 1 + 1/0.005
    # the interval that prompted it: one resample, an "interval" [m, m] that need not hold the estimate
    d = np.array([0.0, 0.1, 0.2, 0.5])
    est, lo, hi = paired_bootstrap(d, np.zeros(4), resamples=1, seed=0)
    assert lo == hi and not lo <= est <= hi
