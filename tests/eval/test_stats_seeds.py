"""The two-level (seeds, then prompts) bootstrap of teacli/eval/stats.py: hand-worked cases, the pairing,
and a small version of benchmarks/bootstrap_coverage.py's coverage simulation."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from statistics import NormalDist

sys.modules.setdefault("vllm", None)  # the import rule: stats needs neither
sys.modules.setdefault("deepspeed", None)

import numpy as np
import pytest

from teacli.eval.stats import bootstrap_indices, bootstrap_mean, paired_bootstrap, seed_prompt_bootstrap, seed_variance

Z975 = NormalDist().inv_cdf(0.975)


def _coverage_benchmark():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bootstrap_coverage.py"
    spec = importlib.util.spec_from_file_location("bootstrap_coverage", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_one_run_per_method_is_the_prompt_bootstrap_exactly():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=40), rng.normal(size=40)
    assert seed_prompt_bootstrap(a[None], b[None], resamples=500, seed=4) == paired_bootstrap(a, b, 500, seed=4)
    assert seed_prompt_bootstrap(a[None], b[None], [3], [3], resamples=500, seed=4) == paired_bootstrap(a, b, 500, seed=4)
    assert seed_prompt_bootstrap(a[None], None, [0], resamples=500, seed=4) == bootstrap_mean(a, 500, seed=4)


def test_seed_only_variation_hand_worked():
    # Two seeds whose values do not vary over prompts: x_0 = 0, x_1 = 1 on all 5 prompts. The prompt level
    # is flat (every prompt's seed mean is 0.5); the residual is 0, so the between-seed variance is the seed
    # means' var = 0.5 (ddof 1). A resampled seed mean is 0, 0.5 or 1 (p = 1/4, 1/2, 1/4), so with 1,000
    # resamples its 2.5th and 97.5th percentiles are 0 and 1: deviations -0.5 and +0.5, scaled by
    # sqrt(S/(S-1) * between/var) = sqrt(2) and by t_1/z (t with 1 df is Cauchy: tan(pi (q - 1/2))).
    v = np.array([[0.0] * 5, [1.0] * 5])
    assert seed_variance(v) == pytest.approx(0.5)
    t1 = math.tan(math.pi * (0.975 - 0.5))
    half = 0.5 * math.sqrt(2.0) * t1 / Z975
    d, lo, hi = seed_prompt_bootstrap(v, None, [0, 1], resamples=1000, seed=0)
    assert d == 0.5 and lo == pytest.approx(0.5 - half) and hi == pytest.approx(0.5 + half)
    # Three seeds 0, 1, 2: between = var = 1, scale sqrt(3/2), t with 2 df: q -> (2q-1) sqrt(2 / (1 - (2q-1)^2)).
    v3 = np.array([[0.0] * 4, [1.0] * 4, [2.0] * 4])
    t2 = (2 * 0.975 - 1) * math.sqrt(2.0 / (1.0 - (2 * 0.975 - 1) ** 2))
    draws = np.array([0.0, 1.0, 2.0])[np.random.default_rng(np.random.SeedSequence([7, 1, 3, 0, 1, 2])).integers(0, 3, (1000, 3))].mean(axis=1)
    lo3, hi3 = np.percentile(1.0 + math.sqrt(1.5) * t2 / Z975 * (draws - 1.0), [2.5, 97.5])
    assert seed_prompt_bootstrap(v3, None, [0, 1, 2], resamples=1000, seed=7) == pytest.approx((1.0, lo3, hi3))


def test_seed_means_that_the_run_by_prompt_noise_explains_add_nothing():
    # Seed means 0.5 and 0: var 0.125 (ddof 1). Two-way residuals: +-0.75 on prompt 0, +-0.25 elsewhere,
    # SS = 2 * 0.5625 + 6 * 0.0625 = 1.5 over (2-1)(4-1) = 3 df: MS = 0.5, MS / P = 0.125 = the whole of the
    # seed means' variance. Nothing is left for the seed level: the prompt bootstrap of the seed means.
    v = np.array([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert seed_variance(v) == pytest.approx(0.0)
    assert seed_prompt_bootstrap(v, None, [0, 1], resamples=300, seed=2) == bootstrap_mean(v.mean(axis=0), 300, seed=2)


def test_pairing_cancels_the_effect_a_seed_shares_across_methods():
    rng = np.random.default_rng(3)
    prompts, offsets = rng.normal(size=30), np.array([0.0, 0.3, -0.2])[:, None]
    b = prompts + offsets
    a = b + 0.1  # seed s of A = seed s of B + 0.1: the same data order moves both alike
    d, lo, hi = seed_prompt_bootstrap(a, b, [0, 1, 2], [0, 1, 2])
    assert (d, lo, hi) == pytest.approx((0.1, 0.1, 0.1))
    # Rows in another order with their labels: the same pairing, the same interval.
    perm = [2, 0, 1]
    assert seed_prompt_bootstrap(a[perm], b, [2, 0, 1], [0, 1, 2]) == pytest.approx((d, lo, hi))
    # Other seeds for B: nothing pairs, both methods' seed spread counts.
    d2, lo2, hi2 = seed_prompt_bootstrap(a, b, [0, 1, 2], [3, 4, 5])
    assert d2 == pytest.approx(0.1) and lo2 < 0.0 < hi2


def test_unequal_seed_sets_draw_each_method_apart():
    rng = np.random.default_rng(5)
    prompts = rng.normal(size=25)
    a = np.stack([prompts + 0.2] * 3)  # A's three seeds agree: no seed level of its own
    b = prompts + rng.normal(0.0, 0.2, size=(2, 1)) + rng.normal(0.0, 0.05, size=(2, 25))
    got = seed_prompt_bootstrap(a, b, [0, 1, 2], [0, 1])
    assert got == pytest.approx(seed_prompt_bootstrap(a[:1], b, [0], [0, 1]))  # A adds nothing, B's seed level alone
    # A − B is the mirror of B − A (the same draws, negated).
    back = seed_prompt_bootstrap(b, a, [0, 1], [0, 1, 2])
    assert got == pytest.approx((-back[0], -back[2], -back[1]))
    # B's seed spread widens the interval beyond the prompt bootstrap of the seed means.
    _, plo, phi = paired_bootstrap(a.mean(axis=0), b.mean(axis=0))
    assert got[2] - got[1] > 2 * (phi - plo)


def test_prompt_level_uses_the_prompt_bootstraps_draws():
    # Seeds add a seed-level term to the prompt bootstrap's own resampled means, never other prompt draws.
    rng = np.random.default_rng(6)
    v = rng.normal(size=(3, 20)) + np.array([0.0, 1.0, 2.0])[:, None]
    prompt_means = v.mean(axis=0)[bootstrap_indices(20, 1000, 9)].mean(axis=1)
    _, lo, hi = seed_prompt_bootstrap(v, None, [0, 1, 2], resamples=1000, seed=9)
    plo, phi = np.percentile(prompt_means, [2.5, 97.5])
    assert lo < plo and hi > phi


def test_bad_inputs():
    v = np.zeros((2, 3))
    with pytest.raises(ValueError, match="no seed labels"):
        seed_prompt_bootstrap(v)
    with pytest.raises(ValueError, match="distinct, one per row"):
        seed_prompt_bootstrap(v, None, [1, 1])
    with pytest.raises(ValueError, match="distinct, one per row"):
        seed_prompt_bootstrap(v, None, [0, 1, 2])
    with pytest.raises(ValueError, match="same prompts"):
        seed_prompt_bootstrap(v, np.zeros((2, 4)), [0, 1], [0, 1])
    with pytest.raises(ValueError, match=r"\[S, P\]"):
        seed_prompt_bootstrap(np.zeros(3))


@pytest.mark.parametrize(("pairing", "S"), [("paired", 4), ("vs base", 3)])
def test_two_level_interval_covers_when_the_seed_effect_dominates(pairing, S):
    # benchmarks/bootstrap_coverage.py's simulation, small: 300 simulated reports of 48 prompts, a run-to-run
    # effect larger than the prompt-level error. The two-level interval covers the true difference at the
    # nominal 95% within 3 binomial SDs of 300 replications; the prompt-only interval misses it most times.
    bench = _coverage_benchmark()
    R = 300
    sd = math.sqrt(0.95 * 0.05 / R)
    cov = bench.coverage("seed-dominated", pairing, S, 48, R, 1000)
    assert abs(cov["seeds-prompts"][0] - 0.95) <= 3 * sd, cov
    assert cov["prompts"][0] < 0.95 - 10 * sd, cov
