"""`tea report`'s reward-distribution plot: pooled completion rewards per run (and the base policy's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_report import M, write_run  # noqa: E402

from teacli.cli import app  # noqa: E402
from teacli.report.build import build_report, reward_distributions  # noqa: E402
from teacli.report.plots import smoothed_density  # noqa: E402


def test_smoothed_density_integrates_to_one_and_smooths():
    rng = np.random.default_rng(0)
    values = rng.normal(size=5000)
    edges = np.linspace(values.min(), values.max(), 61)
    width = edges[1] - edges[0]
    raw = smoothed_density(values, edges, 0.0)
    smooth = smoothed_density(values, edges, 2.0)
    assert raw.sum() * width == pytest.approx(1.0)
    assert smooth.sum() * width == pytest.approx(1.0, abs=1e-12)  # the reflected kernel keeps all the mass
    assert np.abs(np.diff(smooth)).sum() < np.abs(np.diff(raw)).sum()  # smoother: less total variation
    # One kernel, by hand, away from the ends: the weighted sum of the neighbouring bins.
    k = np.exp(-0.5 * (np.arange(-8, 9) / 2.0) ** 2)
    assert smooth[30] == pytest.approx(float((raw[22:39] * k).sum() / k.sum()))


def test_report_pools_rewards_per_run_and_adds_the_base_policy(tmp_path):
    rng = np.random.default_rng(1)
    a, b, base = rng.normal(size=(6, M)), rng.normal(size=(6, M)) + 1.0, rng.normal(size=(6, M)) - 1.0
    ra = write_run(tmp_path / "runs", "grpo", a, tokens=5, checkpoint=10)
    rb = write_run(tmp_path / "runs", "tea", b, tokens=5, checkpoint=20)
    # The base policy's evaluation lives in eval/base/ of the first run (`tea eval-bon --checkpoint base`).
    tmp = write_run(tmp_path / "tmp", "grpo", base, tokens=5, checkpoint="base")
    (tmp / "eval").rename(ra / "eval" / "base")
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", str(ra), str(rb), "--bootstrap", "50", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "reward_distribution.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "reward_distribution.png" in json.loads((out / ".tea-report").read_text())["files"]
    assert "![reward_distribution](reward_distribution.png)" in (out / "report.md").read_text()
    result = build_report([ra, rb], tmp_path / "r2", resamples=50, plots=False)
    dist = reward_distributions(result.report, result.report.runs, "selected")
    assert set(dist) == {"grpo", "tea", "base (grpo)"}
    np.testing.assert_allclose(sorted(dist["grpo"]), sorted(a.ravel()))
    np.testing.assert_allclose(sorted(dist["base (grpo)"]), sorted(base.ravel()))
    assert reward_distributions(result.report, result.report.runs, "base").keys() == {"grpo", "tea"}


def test_tail_window_is_never_empty_when_the_quantile_sits_at_the_maximum():
    """A bounded reward with more than 10% of completions at its maximum (the GPU study's rule reward: the
    inset of its first report was empty) puts q90 at the maximum, past every bin centre."""
    import numpy as np

    from teacli.report.plots import tail_window

    edges = np.linspace(0.0, 1.0, 81)
    centres = 0.5 * (edges[:-1] + edges[1:])
    smooth = np.linspace(0.0, 1.0, 1001)  # uniform: q90 = 0.9, the bins from centre 0.90625 on (the last 8 of 80)
    start, label = tail_window(smooth, centres, 0.9)
    assert centres[start] >= 0.9 > centres[start - 1] and label == "upper tail (above the pooled q90)"
    bounded = np.concatenate([np.linspace(0.0, 0.99, 800), np.ones(200)])  # 20% at the maximum 1.0
    start, label = tail_window(bounded, centres, 0.9)
    assert start == 80 - 8 and label == "upper tail (last 8 bins; the pooled q90 is 1)"


def test_the_upper_tail_panel_and_the_legend_hide_no_part_of_the_main_curve():
    """The tail was an inset inside the main axes, over the curve between 0.62 and 1.0 of the axes' width;
    it is a panel of its own, and the legend sits outside the axes, whatever the data."""
    from matplotlib.transforms import Bbox

    from teacli.report.plots import _pyplot, reward_distribution_figure

    rng = np.random.default_rng(0)
    series = {"grpo": np.concatenate([rng.beta(5, 2, 500), np.ones(300)]), "tea": rng.beta(6, 2, 800)}
    fig = reward_distribution_figure(series, "t")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    main = fig.axes[0]
    data_box = main.get_window_extent(renderer)  # the main curve's data region: the whole of the main axes
    for other in fig.axes[1:]:
        assert not Bbox.intersection(data_box, other.get_window_extent(renderer)), other.get_title()
    legends = fig.legends + ([main.get_legend()] if main.get_legend() else [])
    assert legends and all(not Bbox.intersection(data_box, lg.get_window_extent(renderer)) for lg in legends)
    assert len(fig.axes) == 2 and fig.axes[1].get_xlim()[1] == pytest.approx(1.0)  # the tail panel ends at the maximum
    _pyplot().close(fig)
