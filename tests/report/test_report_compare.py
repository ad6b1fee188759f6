"""`tea report` comparisons the paper makes: each run against its own baseline (--pair), Best TTA, the
extra W/T/L rows (TEA vs Best TTA, TEA vs GRPO-Z) and the paired table; expected numbers worked out here.

Run directories are written by hand; recipe.yaml is written by teacli.config.to_yaml, as `tea train` does.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

sys.modules.setdefault("vllm", None)
sys.modules.setdefault("deepspeed", None)

import numpy as np
import pytest
from typer.testing import CliRunner

from teacli.cli import app
from teacli.config import Recipe, to_yaml

SPLIT, M, P = "core6", 4, 6
NS = [1, 2, 4]
RESAMPLES, SEED = 200, 0


def write_run(root: Path, name: str, values: np.ndarray, *, rule: str, m: int = 64, tokens: int = 10,
              params: dict | None = None, checkpoint=100) -> Path:
    """A run directory: bon.json with these per-prompt values [P, len(NS)], M records per prompt, recipe.yaml."""
    run = root / name
    ev = run / "eval"
    ev.mkdir(parents=True)
    recipe = Recipe()
    recipe.name, recipe.rollout.group_size = name, m
    recipe.advantage.name, recipe.advantage.params = rule, dict(params or {})
    (run / "recipe.yaml").write_text(to_yaml(recipe))  # what `tea train` writes: flow-style sections
    ids = [f"p{i}" for i in range(len(values))]
    with open(ev / f"{SPLIT}-M{M}.jsonl", "w") as f:
        for pid, row in zip(ids, values):
            for s in range(M):
                f.write(json.dumps({"prompt_id": pid, "sample": s, "response": "x", "reward": float(row[0]), "tokens": tokens}) + "\n")
    bon = {"split": SPLIT, "M": M, "checkpoint": checkpoint, "N": NS, "mean": values.mean(axis=0).tolist(),
           "per_prompt": {pid: v.tolist() for pid, v in zip(ids, values)}}
    (ev / f"{SPLIT}-M{M}.bon.json").write_text(json.dumps(bon))
    return run


def expected_delta(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    d = a - b
    idx = np.random.default_rng(SEED).integers(0, len(d), size=(RESAMPLES, len(d)))
    means = d[idx].mean(axis=1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def fmt(d) -> str:
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def wtl_text(a: np.ndarray, b: np.ndarray) -> str:
    d = a - b
    w, t, l = int((d > 1e-9).sum()), int((np.abs(d) <= 1e-9).sum()), int((d < -1e-9).sum())
    return f"{100 * w / len(d):.1f}/{100 * t / len(d):.1f}/{100 * l / len(d):.1f}"


def row(table: str, label: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(f"| {label} |"))


@pytest.fixture()
def core(tmp_path):
    """A core250-like set: GRPO baseline, GRPO-Z, two m=64 TTA runs, an m=128 TTA run, TEA, Prefix-TEA."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(P, 3)) + np.array([0.0, 1.0, 2.0])
    noise = lambda: rng.normal(scale=0.05, size=(P, 3))  # noqa: E731
    v = {
        "grpo": (a, "grpo", 64, {}),
        "grpo_z": (a + 0.5 + noise(), "grpo_z", 64, {}),
        "cat": (a + np.array([0.3, 0.3, 0.1]) + noise(), "cat_bon", 64, {"n_target": 128}),
        "second": (a + np.array([0.1, 0.2, 0.4]) + noise(), "bon_max_second", 64, {}),
        "bm2x": (a + 1.0 + noise(), "bon_mean", 128, {"k": 64}),  # best everywhere, but compute-unmatched
        "tea": (a + 0.45 + noise(), "tea", 64, {"alpha": 0.25, "n_target": 128}),
        "prefix": (a + 0.35 + noise(), "prefix_tea", 64, {}),
    }
    root = tmp_path / "runs"
    paths = {k: write_run(root, k, val, rule=rule, m=m, params=params) for k, (val, rule, m, params) in v.items()}
    return paths, {k: val for k, (val, *_rest) in v.items()}


def test_best_tta_and_extra_win_tie_loss_rows(core, tmp_path):
    paths, v = core
    out = tmp_path / "report"
    res = CliRunner().invoke(app, ["report", *map(str, paths.values()), "--bootstrap", str(RESAMPLES), "--out", str(out)])
    assert res.exit_code == 0, res.output

    # Best TTA per N among the m=64 TTA runs (cat, second), worked out here; bm2x (m=128) never counts.
    picks = [max(("cat", "second"), key=lambda k: v[k][:, j].mean()) for j in range(3)]
    assert picks == ["cat", "cat", "second"]
    endpoints = (out / "endpoints.md").read_text()
    best_row = row(endpoints, "Best TTA")
    for j, k in enumerate(picks):
        assert fmt(expected_delta(v[k][:, j], v["grpo"][:, j])) in best_row.split("|")[2 + j]
    assert "bo1, bo2: cat; bo4: second" in endpoints and "m=64" in endpoints
    assert "| Method | Δbo1 | Δbo2 | Δbo4 |" in endpoints  # one baseline: no Baseline column

    wtl = (out / "win_tie_loss.md").read_text()
    tea_vs_best = row(wtl, "tea vs Best TTA").split("|")[2:5]
    for j, k in enumerate(picks):
        assert tea_vs_best[j].strip() == wtl_text(v["tea"][:, j], v[k][:, j])
    tea_vs_z = row(wtl, "tea vs grpo_z").split("|")[2:5]
    assert [c.strip() for c in tea_vs_z] == [wtl_text(v["tea"][:, j], v["grpo_z"][:, j]) for j in range(3)]
    assert row(wtl, "prefix vs Best TTA") and row(wtl, "tea vs grpo")
    assert "grpo_z vs Best TTA" not in wtl and "cat vs grpo_z" not in wtl  # only the 'ours' rules get extra rows

    best = (out / "best_tta.md").read_text()
    assert "| N | Best TTA | bo<N> | grpo | Δ [95% CI] | W/T/L |" in best
    assert f"| 4 | second | {v['second'][:, 2].mean():.3f} | {v['grpo'][:, 2].mean():.3f} |" in best

    frontier = (out / "frontier.md").read_text()
    assert row(frontier, "bm2x").startswith("| bm2x | m=128,k=64 | 100 |") and row(frontier, "tea").startswith("| tea | m=64 | 100 |")

    summary = json.loads((out / "summary.json").read_text())
    assert [p["run"] for p in summary["best_tta"]] == picks
    assert summary["best_tta"][2]["delta"] == pytest.approx(list(expected_delta(v["second"][:, 2], v["grpo"][:, 2])))
    labels = {x["label"]: x["against"] for x in summary["extra_win_tie_loss"]}
    assert labels["tea vs Best TTA"] == picks and labels["tea vs grpo_z"] == ["grpo_z"] * 3
    report_md = (out / "report.md").read_text()
    assert "Best TTA: for each N, the TTA run with m=64" in report_md and "bo1, bo2: cat; bo4: second" in report_md
    assert "tea (tea, m=64, checkpoint 100)" in report_md


def test_no_tta_runs_no_best_tta(core, tmp_path):
    paths, _ = core
    res = CliRunner().invoke(app, ["report", str(paths["grpo"]), str(paths["tea"]), str(paths["bm2x"]), "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "r" / "best_tta.md").exists()  # bm2x is TTA but not at the baseline's m
    assert "Best TTA" not in (tmp_path / "r" / "endpoints.md").read_text()
    assert "vs Best TTA" not in (tmp_path / "r" / "win_tie_loss.md").read_text()


@pytest.fixture()
def scaling(tmp_path):
    """An m-to-N-like set: GRPO and TEA at m = 16 and m = 64."""
    rng = np.random.default_rng(2)
    g16 = rng.normal(size=(P, 3))
    g64 = g16 + 0.2 + rng.normal(scale=0.1, size=(P, 3))
    v = {"grpo16": (g16, "grpo", 16, 30), "tea16": (g16 + 0.4 + rng.normal(scale=0.1, size=(P, 3)), "tea", 16, 22),
         "grpo64": (g64, "grpo", 64, 40), "tea64": (g64 + 0.6 + rng.normal(scale=0.1, size=(P, 3)), "tea", 64, 35)}
    root = tmp_path / "runs"
    paths = {k: write_run(root, k, val, rule=rule, m=m, tokens=t) for k, (val, rule, m, t) in v.items()}
    return paths, {k: val for k, (val, *_rest) in v.items()}


def test_pair_compares_each_run_with_its_own_baseline(scaling, tmp_path):
    paths, v = scaling
    out = tmp_path / "report"
    args = ["report", *map(str, paths.values()), "--baseline", "grpo64", "--pair", f"{paths['tea16']}=grpo16",
            "--bootstrap", str(RESAMPLES), "--out", str(out), "--endpoints", "2,4"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output

    endpoints = (out / "endpoints.md").read_text()
    assert "| Method | Baseline | Δbo2 | Δbo4 |" in endpoints  # two baselines in use: the column says which
    assert row(endpoints, "tea16") == (f"| tea16 | grpo16 | {fmt(expected_delta(v['tea16'][:, 1], v['grpo16'][:, 1]))} | "
                                       f"{fmt(expected_delta(v['tea16'][:, 2], v['grpo16'][:, 2]))} |")
    assert row(endpoints, "tea64").startswith(f"| tea64 | grpo64 | {fmt(expected_delta(v['tea64'][:, 1], v['grpo64'][:, 1]))} |")
    assert "\n| grpo16 |" not in endpoints  # a baseline is compared only when paired

    wtl = (out / "win_tie_loss.md").read_text()
    assert row(wtl, "tea16 vs grpo16") == f"| tea16 vs grpo16 | {wtl_text(v['tea16'][:, 1], v['grpo16'][:, 1])} | {wtl_text(v['tea16'][:, 2], v['grpo16'][:, 2])} |"

    # Tab. m_to_n_scaling_full layout: per N the baseline, the run, the delta; then Length Δ.
    paired = (out / "paired.md").read_text()
    assert ("| Method | Baseline | Budget | Baseline bo2 | Method bo2 | Δbo2 [95% CI] | Baseline bo4 | Method bo4 | "
            "Δbo4 [95% CI] | Length Δ |") in paired
    assert row(paired, "tea16") == (
        f"| tea16 | grpo16 | m=16 | {v['grpo16'][:, 1].mean():.3f} | {v['tea16'][:, 1].mean():.3f} | "
        f"{fmt(expected_delta(v['tea16'][:, 1], v['grpo16'][:, 1]))} | {v['grpo16'][:, 2].mean():.3f} | "
        f"{v['tea16'][:, 2].mean():.3f} | {fmt(expected_delta(v['tea16'][:, 2], v['grpo16'][:, 2]))} | -8.0 |")
    assert row(paired, "tea64").endswith("| -5.0 |")
    rows = list(csv.DictReader(open(out / "paired.csv")))
    assert [r["Method"] for r in rows] == ["tea16", "tea64"] and rows[0]["Baseline"] == "grpo16"

    deltas = (out / "deltas_tea16.md").read_text()
    assert "| N | grpo16 | tea16 | Δ [95% CI] | W/T/L |" in deltas
    assert not (out / "deltas_grpo16.md").exists()
    summary = json.loads((out / "summary.json").read_text())
    assert {k: r["baseline"] for k, r in summary["runs"].items()} == {"grpo16": None, "tea16": "grpo16", "grpo64": None, "tea64": "grpo64"}
    assert summary["runs"]["tea16"]["length_delta"] == pytest.approx(-8.0)
    assert "pairs (run vs its own baseline): tea16 vs grpo16" in (out / "report.md").read_text()


@pytest.mark.parametrize("pair, message", [
    ("tea16", "expected RUN=BASELINE"),
    ("tea16=nope", "--pair 'nope' is not one of the reported runs"),
    ("tea16=tea16", "a run cannot be its own baseline"),
])
def test_bad_pair_is_one_line_error(scaling, tmp_path, pair, message):
    paths, _ = scaling
    res = CliRunner().invoke(app, ["report", *map(str, paths.values()), "--pair", pair, "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "r").exists()
