"""Synthetic Prefix-TEA diagnostic: exact H and g, the estimators, Rao–Blackwellization, the CLI."""

import json
import math
import subprocess
import sys

sys.modules.setdefault("vllm", None)  # the import rule: these must never be needed here
sys.modules.setdefault("deepspeed", None)

import numpy as np
import pytest
import torch
from scipy import integrate, optimize, stats
from typer.testing import CliRunner

from teacli.advantages.tail import c_tilde, tail_size
from teacli.advantages.tea import cancellation_weights, check_prefix_plan, cross_fitted_fixed_order
from teacli.cli import app
from teacli.diagnostics import synthetic as syn

D = torch.float64
ALPHA = 0.25
CT = c_tilde(128, ALPHA)


def _phi_scalar(z, r, mu, sigma, c):
    """φ_η(z) for one coordinate c, straight from the definitions (eqs. tail_shaped_reward, app_phi_eta_def)."""
    if z < r:
        return 0.0
    shaped = (z - r) + CT / (2 * sigma) * ((z - mu) ** 2 - (r - mu) ** 2)
    t = (1.0, 1.5)[c]
    return shaped * (float(z >= t) - stats.norm.sf(t)) / ALPHA


def _h_quadrature(r, mu, sigma):
    out = []
    for c, t in enumerate((1.0, 1.5)):
        f = lambda z: _phi_scalar(z, r, mu, sigma, c) * stats.norm.pdf(z)  # noqa: E731
        lo = r
        cut = max(r, t)  # the integrand jumps at max(r, t): integrate the two smooth pieces
        value = (integrate.quad(f, lo, cut, epsabs=1e-13)[0] if cut > lo else 0.0) + integrate.quad(
            f, cut, np.inf, epsabs=1e-13
        )[0]
        out.append(value)
    return np.array(out)


@pytest.mark.parametrize(
    "eta",
    [
        None,  # η_true = (z_α, λ_α, √δ_α)
        (0.5, 1.1, 0.4),
        (1.2, 1.6, 0.3),  # threshold above the first score cut
        (1.7, 2.0, 0.25),  # above both cuts
        (0.9, 1.4, 0.6),
    ],
)
def test_shaped_score_mean_matches_quadrature(eta):
    eta = eta or syn.true_tail_vector()
    got = syn.shaped_score_mean(*(torch.tensor([[v]], dtype=D) for v in eta))[0].numpy()
    np.testing.assert_allclose(got, _h_quadrature(*eta), rtol=1e-9, atol=1e-11)


def test_true_gradient_is_the_derivative_of_the_tail_surrogate():
    # Lemma tail_based_policy_gradient: g = ∇_θ (μ_α + c̃σ_α). Realise the score S by the exponential
    # tilt p_θ(z) ∝ φ(z)·exp(θ·T(z)), T = (1{z ≥ 1}, 1{z ≥ 1.5}), whose score at θ = 0 is exactly S,
    # and differentiate the tilted tail mean and sd numerically.
    def tail_objective(theta):
        weight = lambda z: math.exp(theta[0] * (z >= 1.0) + theta[1] * (z >= 1.5))  # noqa: E731
        pieces = [(-np.inf, 1.0), (1.0, 1.5), (1.5, np.inf)]

        def mass_above(a, power=0):  # ∫_a^∞ z^power w(z) φ(z) dz, unnormalised
            total = 0.0
            for lo, hi in pieces:
                lo = max(lo, a)
                if lo < hi:
                    mid = lo if np.isfinite(lo) else hi - 1.0
                    total += weight(mid + 1e-12) * integrate.quad(
                        lambda z: z**power * stats.norm.pdf(z), lo, hi, epsabs=1e-14, epsrel=1e-13
                    )[0]
            return total

        norm = mass_above(-np.inf)
        r = optimize.brentq(lambda a: mass_above(a) / norm - ALPHA, -3.0, 3.0, xtol=1e-14)
        mu = mass_above(r, 1) / (ALPHA * norm)
        var = mass_above(r, 2) / (ALPHA * norm) - mu * mu
        return mu + CT * math.sqrt(var)

    h = 1e-4
    numeric = [
        (tail_objective(h * e) - tail_objective(-h * e)) / (2 * h) for e in (np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    ]
    np.testing.assert_allclose(syn.true_gradient().numpy(), numeric, rtol=1e-6, atol=1e-7)


def test_influence_functions_have_mean_zero():
    for c in range(3):
        f = lambda z: syn.tail_influence(torch.tensor([z], dtype=D))[0, c].item() * stats.norm.pdf(z)  # noqa: E731
        r = syn.true_tail_vector()[0]
        value = integrate.quad(f, -np.inf, r)[0] + integrate.quad(f, r, np.inf)[0]
        assert value == pytest.approx(0.0, abs=1e-10)


def test_top_order_statistics_match_sorting_full_samples():
    rng = np.random.default_rng(0)
    m, q, reps = 64, tail_size(64, ALPHA), 40_000
    top = syn.sample_top_order_statistics(rng, reps, m, q)
    full = torch.sort(torch.from_numpy(rng.standard_normal((reps, m))), dim=1, descending=True).values[:, :q]
    assert torch.all(top[:, :-1] >= top[:, 1:])
    se = math.sqrt(2.0 / reps) * full.std(dim=0)
    assert torch.all((top.mean(dim=0) - full.mean(dim=0)).abs() < 4.5 * se)
    # and the direct estimator from the top q equals the full-sample one on the same sample
    z = torch.from_numpy(rng.standard_normal((5, 48)))
    top_z = torch.sort(z, dim=1, descending=True).values[:, : tail_size(48, ALPHA)]
    torch.testing.assert_close(syn.tea_direct_from_top(top_z, 48), syn.tea_direct(z), rtol=1e-12, atol=1e-12)


def test_tea_bias_at_m256_matches_the_paper_and_control_variate_is_unbiased():
    m = 256
    q = tail_size(m, ALPHA)
    rng = np.random.default_rng(1)
    spacings, rest = syn.sample_spacings(rng, 40_000, m, q)
    x = syn.tea_direct_from_top(syn.top_from_spacings(spacings, rest), m)
    b_e, b_g = syn.tea_spacing_control(m, q)
    control = (spacings - 1.0) @ b_e.T + (rest - (m + 1 - q)) * b_g
    g = syn.true_gradient()
    raw_bias = x.mean(0) - g
    adjusted = x - control
    bias = adjusted.mean(0) - g
    # the control variate removes most of the noise...
    assert adjusted.var(0).sum() < 0.3 * x.var(0).sum()
    # ...without moving the mean (mean zero): raw and adjusted means agree within MC error
    se_raw = (x.var(0) / len(x)).sqrt()
    assert torch.all((raw_bias - bias).abs() < 4 * se_raw)
    # paper Table tab:prefix_tea_summary: TEA bias norm 0.021, variance 0.024 at m = 256
    assert float(bias.norm()) == pytest.approx(0.021, abs=1.5e-3)
    assert float(x.var(0).sum()) == pytest.approx(0.024, rel=0.05)


def test_cross_fitted_estimator_by_hand():
    # Loop over prefixes and samples in plain Python for one replicate: n = 64, J = 4, k = 2.
    rng = np.random.default_rng(2)
    n = 64
    a, b = rng.standard_normal(n), rng.standard_normal(n)
    sizes = check_prefix_plan(2 * n, ALPHA, 2, 4, "test", cross_fit=True)
    weights = cancellation_weights(sizes, n, 2)
    expected = np.zeros(2)
    for size, w in zip(sizes, weights):
        top = np.sort(a[:size])[::-1][: size // 4]
        r, mu, sigma = top[-1], top.mean(), top.std()
        for c in range(2):
            expected[c] += w * np.mean([_phi_scalar(z, r, mu, sigma, c) for z in b[:size]])
    A, B = torch.from_numpy(a)[None], torch.from_numpy(b)[None]
    got = cross_fitted_fixed_order(A, B, syn.score(B), alpha=ALPHA, n_target=128, k=2, J=4)[0]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        cross_fitted_fixed_order(A, B[:, :-1], syn.score(B[:, :-1]))


@pytest.mark.parametrize("J", [4, 8])
def test_rao_blackwellized_mean_equals_mc_mean_of_the_actual_estimator(J):
    m, reps = 128, 100_000
    n = m // 2
    rng = np.random.default_rng(3 + J)
    a = torch.from_numpy(rng.standard_normal((reps, n)))
    b = torch.from_numpy(rng.standard_normal((reps, n)))
    actual = syn.prefix_estimate(a, b, k=2, J=J)  # both batches random
    rb = syn.prefix_conditional_mean(a, k=2, J=J)  # same A, B integrated out exactly
    diff = actual - rb  # mean zero given A: isolates the B noise
    se = (diff.var(0) / reps).sqrt()
    assert torch.all(diff.mean(0).abs() < 4 * se)
    # and the control variate has mean zero: RB means with and without it agree
    cv = syn.prefix_control(a, syn.shaped_score_jacobian(), k=2, J=J)
    assert torch.all(cv.mean(0).abs() < 4 * (cv.var(0) / reps).sqrt())


def test_conditional_mean_given_a_is_exact():
    # One fixed batch A; average the estimator over many fresh B: must converge to Σ_j w_j H(η̂_j).
    rng = np.random.default_rng(7)
    n, reps = 64, 200_000
    a = torch.from_numpy(rng.standard_normal((1, n))).expand(reps, n)
    b = torch.from_numpy(rng.standard_normal((reps, n)))
    actual = syn.prefix_estimate(a, b, k=2, J=4)
    rb = syn.prefix_conditional_mean(a[:1], k=2, J=4)[0]
    se = (actual.var(0) / reps).sqrt()
    assert torch.all((actual.mean(0) - rb).abs() < 4 * se)


def test_run_is_deterministic_and_validates_input():
    kw = dict(ms=[128], reps=20, bias_reps=30, seed=5)
    assert syn.run_synthetic(**kw) == syn.run_synthetic(**kw)
    assert syn.run_synthetic(**kw) != syn.run_synthetic(**{**kw, "seed": 6})
    with pytest.raises(ValueError, match="reps must be an integer >= 2"):
        syn.run_synthetic([256], reps=1, bias_reps=10)
    with pytest.raises(ValueError, match=r"m=64 .*the smallest valid m is 128"):
        syn.check_arguments([64], 10, 10)


def test_cli_end_to_end(tmp_path):
    out = tmp_path / "syn"
    args = ["diagnose", "synthetic", "--m", "256", "512", "--reps", "40", "--bias-reps", "200", "--seed", "3", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "synthetic.json").read_text())
    keys = {"estimator", "k", "J", "m", "bias_norm", "variance", "mse_P1", "mse_P2048", "mse_P65536"}
    assert len(rows) == 6 and all(keys <= set(r) for r in rows)
    names = {"TEA", "Prefix-TEA k=2,J=4", "Prefix-TEA k=2,J=8"}
    assert {r["estimator"] for r in rows} == names and {r["m"] for r in rows} == {256, 512}
    for r in rows:
        assert (r["k"], r["J"]) == ((None, None) if r["estimator"] == "TEA" else (2, int(r["estimator"][-1])))
        for P in (1, 2048, 65536):
            assert r[f"mse_P{P}"] == pytest.approx(r["bias_norm"] ** 2 + r["variance"] / P)
    table = (out / "synthetic.md").read_text()
    assert table.startswith("| Estimator | m | Bias norm | Variance | MSE P=1 | MSE P=2048 | MSE P=65536 |")
    assert "| Prefix-TEA k=2,J=8 | 512 |" in table and "| TEA | 256 |" in table
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--m", "100"], "m=100"),
        (["--m", "256", "--reps", "1"], "reps must be an integer >= 2"),
        (["256"], "unexpected argument"),
    ],
)
def test_cli_bad_input(tmp_path, args, message):
    result = CliRunner().invoke(app, ["diagnose", "synthetic", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert message in result.output
    if args == ["--m", "100"]:
        assert "smallest valid m is 128" in result.output


def test_module_imports_only_stdlib_at_import_time():
    probe = (
        "import sys; import teacli.diagnostics.synthetic; "
        "print(sorted(m for m in ('torch', 'numpy', 'scipy', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_single_budget_draws_the_frontier(tmp_path):
    """`--m 128` alone: one row of the heatmap; matplotlib's contour needs two, and used to crash."""
    out = tmp_path / "one"
    result = CliRunner().invoke(app, ["diagnose", "synthetic", "--m", "128", "--reps", "20", "--bias-reps", "50", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {r["m"] for r in json.loads((out / "synthetic.json").read_text())} == {128}


def test_zero_line_on_one_row_sits_where_the_sign_changes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from teacli.diagnostics.synthetic import _zero_line

    fig, ax = plt.subplots()
    _zero_line(ax, np.array([[1.0, 0.5, -0.5, -1.0]]))  # crosses zero halfway between columns 1 and 2
    (line,) = ax.get_lines()
    assert list(line.get_xdata()) == [1.5, 1.5]
    plt.close(fig)
