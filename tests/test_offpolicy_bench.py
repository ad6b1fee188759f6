"""benchmarks/offpolicy.py: both runs train, their means come from their own metrics, and the ratio is the
off-policy step over the on-policy one (CPU, a tiny model; no speed is claimed here)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))


def _bench():
    spec = importlib.util.spec_from_file_location("offpolicy_bench", REPO / "benchmarks" / "offpolicy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_runs(directory: Path) -> None:
    """On-policy 2 s a step; one step off alternating 0.5 and 3.5 s (its median over steps 2-4 would be 0.5 s: the
    same time a step, 1.5 s on average, is what the runs took)."""
    for staleness, steps in ((0, (20.0, 2.0, 2.0, 2.0)), (1, (15.0, 0.5, 3.5, 0.5))):
        run = directory / f"staleness{staleness}"
        run.mkdir(parents=True)
        rows = [{"step": k + 1, "time_step": step, "time_generate": 1.0, "time_reward": 0.25,
                 "time_ref_logprobs": 0.1, "time_train": 0.4 + 0.1 * k, **({"time_wait_rollouts": 0.05 * k} if staleness else {})}
                for k, step in enumerate(steps)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_table_is_the_runs_means_and_their_ratio(tmp_path):
    bench = _bench()
    write_runs(tmp_path)
    got = {s: bench.means(tmp_path / f"staleness{s}", skip=1) for s in (0, 1)}
    assert got[0]["step s"] == 2.0 and got[1]["step s"] == pytest.approx((0.5 + 3.5 + 0.5) / 3)  # the first step (compile) left out
    assert got[0]["update s"] == pytest.approx(0.1 + (0.5 + 0.6 + 0.7) / 3) and got[0]["wait s"] == 0.0
    assert got[1]["wait s"] == pytest.approx(0.05 * (1 + 2 + 3) / 3)
    text = bench.table(got)
    assert text.splitlines()[-1].endswith("| 0.75 |") and "| 1 | 1.500 |" in text


def test_report_prints_the_table_of_runs_already_made(tmp_path, capsys):
    write_runs(tmp_path / "runs")
    _bench().main(["--report", str(tmp_path / "runs"), "--skip", "1"])
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith("| 0.75 |")


@pytest.mark.slow
def test_both_runs_train_through_the_cli(tmp_path, monkeypatch, capsys):
    from tiny_lm import make_assets, tea_env, tiny_recipe, write_recipe

    assets = make_assets(tmp_path / "assets")
    rec = write_recipe(tmp_path / "r.yaml", tiny_recipe(assets / "policy", assets / "data", validation__enabled=False))
    for key, value in tea_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    _bench().main([str(rec), "--out", str(tmp_path / "out"), "--steps", "3", "--skip", "1"])
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    assert len(rows) == 2 and rows[0].endswith("| 1.00 |")
    off = [json.loads(line) for line in (tmp_path / "out" / "staleness1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["staleness"] for r in off] == [0, 1, 1]
