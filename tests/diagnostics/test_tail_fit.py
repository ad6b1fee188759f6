"""`tea diagnose tail-fit`: the Gaussian QQ upper-tail check and the best-of-N prediction.

Expected values are worked out here: exact Gaussian quantiles give R² = 1 and recover (a, b); for
Gaussian rewards N(μ, σ²) the tail model's prediction is μ + c_N σ with c_1 = 0, c_2 = 1/√π and
c_4 = (3/√π)(1/2 + arcsin(1/3)/π) (the expected maxima of 2 and 4 standard normals).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from teacli.advantages.tail import qq_tail_r2
from teacli.cli import app
from teacli.diagnostics import tail_fit as TF


def hazen(M: int) -> np.ndarray:
    return (np.arange(1, M + 1) - 0.5) / M


def test_exact_gaussian_quantiles_give_r2_one_and_recover_the_line():
    rng = np.random.default_rng(0)
    M = 64
    a, b = 1.5, 0.7
    rows = np.stack([rng.permutation(a + b * norm.ppf(hazen(M))) for _ in range(3)])
    fit = qq_tail_r2(rows)
    assert fit.ok.all() and not fit.flat.any() and not fit.too_few.any()
    np.testing.assert_allclose(fit.r2, 1.0, atol=1e-12)
    np.testing.assert_allclose(fit.a, a, atol=1e-12)
    np.testing.assert_allclose(fit.b, b, atol=1e-12)
    # The range [0.80, 0.99] at M = 64: q_i = (i - 1/2)/64 for i = 52 … 63 (i = 64 gives 0.992 > 0.99).
    np.testing.assert_allclose(fit.q, (np.arange(52, 64) - 0.5) / 64)


def test_r2_of_a_two_step_tail_by_hand():
    # M = 32: the range holds i = 27 … 32 (q = 0.828 … 0.984), six order statistics, ranks 27-29 → 0, 30-32 → 1.
    # R² of a 0/1 step on x = Φ⁻¹(q): corr² = (Σ xc·y)² / (Σ xc² · Σ yc²) with Σ yc² = 6·(1/4) = 1.5.
    M = 32
    rewards = np.array([[0.0] * 29 + [1.0] * 3])
    x = norm.ppf((np.arange(27, 33) - 0.5) / M)
    xc = x - x.mean()
    expected = (xc[3:].sum()) ** 2 / ((xc**2).sum() * 1.5)
    fit = qq_tail_r2(rewards)
    assert fit.r2[0] == pytest.approx(expected, rel=1e-12)
    assert 0.0 < expected < 1.0


def test_degenerate_rows_are_flagged_not_nan():
    rewards = np.array([[2.0] * 40, list(range(40))], dtype=float)
    fit = qq_tail_r2(rewards)
    assert list(fit.flat) == [True, False] and list(fit.ok) == [False, True]
    assert np.isfinite(fit.r2).all() and fit.r2[0] == 0.0
    few = qq_tail_r2(np.arange(8.0).reshape(2, 4))  # M = 4: q = 0.875 only → fewer than three points
    assert few.too_few.all() and not few.ok.any() and np.isfinite(few.r2).all()
    summary = TF.tail_summary(few.r2, few.ok)
    assert summary == {"median_r2": None, "mean_r2": None, "p10_r2": None, "frac_r2_ge_095": None}


def test_prediction_is_mu_plus_c_n_sigma_for_gaussian_rewards():
    rng = np.random.default_rng(1)
    mu, sigma = 1.0, 2.0
    rewards = rng.normal(mu, sigma, size=(200, 2000))
    c = {1: 0.0, 2: 1.0 / math.sqrt(math.pi), 4: 3.0 / math.sqrt(math.pi) * (0.5 + math.asin(1.0 / 3.0) / math.pi)}
    predicted = TF.predict_bon(rewards, [1, 2, 4], alpha=0.25)
    # Sampling error of the mean over 200 prompts of (μ̂_α, σ̂_α) from 500 tail points each: ~0.005.
    for n, p in zip([1, 2, 4], predicted):
        assert p == pytest.approx(mu + c[n] * sigma, abs=0.03)


def _write_run(run, split, M, rows: dict[str, list[float]]):
    d = run / "eval"
    d.mkdir(parents=True)
    (run / "recipe.yaml").write_text("name: hand\n")
    lines = [json.dumps({"prompt_id": pid, "sample": s, "response": "r", "reward": r, "tokens": 3})
             for pid, rs in rows.items() for s, r in enumerate(rs)]
    (d / f"{split}-M{M}.jsonl").write_text("\n".join(lines) + "\n")
    (d / f"{split}.prompts.jsonl").write_text("".join(json.dumps({"prompt_id": p, "messages": []}) + "\n" for p in rows))


def test_cli_on_a_hand_built_run_dir(tmp_path):
    M = 32
    gauss = list(np.random.default_rng(2).permutation(3.0 + 0.5 * norm.ppf(hazen(M))))
    ramp = [float(s) for s in range(M)]  # sample s has reward s: grouped bo<N> = mean over groups of the last index
    flat = [1.0] * M
    _write_run(tmp_path / "runA", "core", M, {"g": gauss, "ramp": ramp, "flat": flat})
    out = tmp_path / "tf"
    result = CliRunner().invoke(app, ["diagnose", "tail-fit", str(tmp_path / "runA"), "--out", str(out), "--fit-samples", "16"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "tail_fit.json").read_text())
    assert data["q_range"] == [0.8, 0.99]
    run = data["runs"]["runA"]
    assert set(run) >= {"median_r2", "mean_r2", "p10_r2", "frac_r2_ge_095", "per_prompt_r2", "prediction"}
    assert run["per_prompt_r2"]["g"] == pytest.approx(1.0, abs=1e-12)
    assert run["per_prompt_r2"]["flat"] is None and run["degenerate"] == {"flat": 1, "too_few": 0}
    # ramp: six equally spaced order statistics against Φ⁻¹(q): R² = corr(x, ranks)², worked out directly.
    x = norm.ppf((np.arange(27, 33) - 0.5) / M)
    r2_ramp = np.corrcoef(x, np.arange(27, 33))[0, 1] ** 2
    assert run["per_prompt_r2"]["ramp"] == pytest.approx(r2_ramp, rel=1e-12)
    assert run["median_r2"] == pytest.approx((1.0 + r2_ramp) / 2) and run["frac_r2_ge_095"] == (0.5 if r2_ramp < 0.95 else 1.0)
    pred = run["prediction"]
    assert pred["fit_samples"] == 16 and pred["N"] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert pred["measured"][6:] == [None, None]
    # Measured grouped bo<N> of the ramp: groups of N consecutive samples, max = last index: mean_g (g·N + N − 1).
    bo = {n: np.mean([np.max(gauss[g * n:(g + 1) * n]) for g in range(M // n)]) for n in (1, 2, 4, 8, 16, 32)}
    ramp_bo = {n: np.mean([g * n + n - 1 for g in range(M // n)]) for n in bo}
    for j, n in enumerate([1, 2, 4, 8, 16, 32]):
        assert pred["measured"][j] == pytest.approx((bo[n] + ramp_bo[n] + 1.0) / 3)
        assert pred["error"][j] == pytest.approx(pred["predicted"][j] - pred["measured"][j])
    assert all(v is not None and math.isfinite(v) for v in pred["predicted"])
    assert "NaN" not in (out / "tail_fit.json").read_text()
    for name in ("tail_fit.md", "tail_fit.tex", "tail_fit.csv", "prediction.md", "prediction.csv"):
        assert (out / name).is_file()
    assert (out / "qq.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| runA |" in (out / "tail_fit.md").read_text()
    assert "1 of 3 prompt(s) degenerate" in result.output


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--q-low", "0.99", "--q-high", "0.8"], "need 0 < q_low < q_high < 1"),
        (["--fit-samples", "64"], "has only M=32"),
        (["--split", "nope"], "no evaluation records"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, extra, message):
    _write_run(tmp_path / "r", "core", 32, {"p": [float(s) for s in range(32)]})
    result = CliRunner().invoke(app, ["diagnose", "tail-fit", str(tmp_path / "r"), "--out", str(tmp_path / "o"), *extra])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "o" / "tail_fit.json").exists()


def test_no_plots_writes_and_says_no_plots(tmp_path):
    _write_run(tmp_path / "r", "core", 32, {"p": [float(s) for s in range(32)]})
    result = CliRunner().invoke(app, ["diagnose", "tail-fit", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert not list((tmp_path / "o").glob("*.png"))
    assert result.stdout.strip().splitlines()[-1].endswith("(tail_fit.json, tables)")


def test_cli_incomplete_records_name_the_file(tmp_path):
    _write_run(tmp_path / "r", "core", 32, {"p": [float(s) for s in range(31)]})
    result = CliRunner().invoke(app, ["diagnose", "tail-fit", str(tmp_path / "r"), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "core-M32.jsonl" in result.output and "missing" in result.output


def test_plots_of_many_runs_stay_readable(tmp_path, monkeypatch):
    """Twelve runs (the GPU study) made qq.png one row of twelve panels, 55 inches wide, and prediction.png a
    24-entry legend over the curves: a grid of at most four panels a row, and one legend entry a run beside
    the axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

    M, rng = 32, np.random.default_rng(0)
    runs = [tmp_path / f"run{i}" for i in range(6)]
    for run in runs:
        _write_run(run, "core", M, {f"p{j}": list(rng.normal(size=M)) for j in range(3)})
    figs, save = {}, Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, path, **k: (figs.__setitem__(str(path), self), save(self, path, **k))[1])
    result = CliRunner().invoke(app, ["diagnose", "tail-fit", *map(str, runs), "--out", str(tmp_path / "tf"), "--fit-samples", "16"])
    assert result.exit_code == 0, result.output
    qq = next(f for p, f in figs.items() if "qq" in p)
    assert [ax.get_visible() for ax in qq.axes] == [True] * 6 + [False] * 2  # 2 rows of 4
    assert qq.get_size_inches()[0] <= 4 * 4.6 + 1e-9
    canvas = FigureCanvasAgg(qq)
    canvas.draw()
    r = canvas.get_renderer()
    for ax in qq.axes[:6]:  # each panel's legend (its prompts) off its points
        assert not Bbox.intersection(ax.get_window_extent(r), ax.get_legend().get_window_extent(r)), ax.get_title()
    pred = next(f for p, f in figs.items() if "prediction" in p)
    canvas = FigureCanvasAgg(pred)
    canvas.draw()
    r = canvas.get_renderer()
    (ax,) = pred.axes
    (legend,) = pred.legends
    assert not Bbox.intersection(ax.get_window_extent(r), legend.get_window_extent(r))
    assert [t.get_text() for t in legend.get_texts()] == [f"run{i}" for i in range(6)] + ["predicted (K=16)", "measured"]
