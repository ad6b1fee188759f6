"""`tea report` on run directories written by hand: bootstrap deltas, W/T/L, lengths, judge W–L, plots."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

sys.modules.setdefault("vllm", None)  # the import rule: report needs neither
sys.modules.setdefault("deepspeed", None)

import numpy as np
import pytest
from typer.testing import CliRunner

from teacli.cli import app

SPLIT, M, P = "core6", 4, 6
RESAMPLES, SEED = 1000, 0


def by_hand_bon(rewards: np.ndarray) -> np.ndarray:
    """[P, M] → [P, 3] grouped best-of-N for N = 1, 2, 4: consecutive groups, mean of the maxima."""
    out = []
    for row in rewards:
        out.append([np.mean([max(row[g * n : (g + 1) * n]) for g in range(M // n)]) for n in (1, 2, 4)])
    return np.array(out)


def write_run(root: Path, name: str, rewards: np.ndarray, tokens: int, checkpoint, group_size: int = 64, m: int = M) -> Path:
    run = root / name
    ev = run / "eval"
    ev.mkdir(parents=True)
    (run / "recipe.yaml").write_text(f"name: {name}\nseed: 0\nrollout:\n  engine: hf\n  group_size: {group_size}\n"
                                     "advantage:\n  name: tea\n  params: {alpha: 0.25}\n")
    ids = [f"p{i}" for i in range(len(rewards))]
    with open(ev / f"{SPLIT}-M{m}.jsonl", "w") as f:
        for pid, row in zip(ids, rewards):
            for s, r in enumerate(row):
                f.write(json.dumps({"prompt_id": pid, "sample": s, "response": "x " * tokens, "reward": float(r), "tokens": tokens}) + "\n")
    (ev / f"{SPLIT}.prompts.jsonl").write_text("".join(json.dumps({"prompt_id": p, "messages": [{"role": "user", "content": p}]}) + "\n" for p in ids))
    Ns = [n for n in (1, 2, 4, 8) if n <= m]
    values = by_hand_bon(rewards) if m == M else np.zeros((len(rewards), len(Ns)))
    bon = {"split": SPLIT, "M": m, "checkpoint": checkpoint, "N": Ns, "mean": values.mean(axis=0).tolist(),
           "per_prompt": {pid: v.tolist() for pid, v in zip(ids, values)}}
    (ev / f"{SPLIT}-M{m}.bon.json").write_text(json.dumps(bon))
    return run


@pytest.fixture()
def runs(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(P, M))
    b = rng.normal(size=(P, M)) + 0.3
    b[0] = a[0]  # prompt p0: a tie at every N
    c = a + 0.5  # every group maximum moves by exactly 0.5: a constant delta
    root = tmp_path / "runs"
    ra = write_run(root, "grpo", a, tokens=10, checkpoint=100)
    rb = write_run(root, "tea", b, tokens=20, checkpoint=425)
    rc = write_run(root, "shifted", c, tokens=10, checkpoint="base")
    (rb / "judge").mkdir()
    verdicts = ["self", "self", "other", "invalid", "self"]
    (rb / "judge" / "grpo-bo4.jsonl").write_text("".join(
        json.dumps({"prompt_id": f"p{i}", "first": "self", "winner": w, "confidence": 0.8, "reason": "r"}) + "\n"
        for i, w in enumerate(verdicts)))
    (rb / "judge" / ".cache.jsonl").write_text("{}\n")  # not a judge record file
    return {"grpo": (ra, a), "tea": (rb, b), "shifted": (rc, c)}


def expected_delta(a_vals: np.ndarray, b_vals: np.ndarray) -> tuple[float, float, float]:
    """The paired percentile bootstrap worked out here: resample prompt indices, mean difference."""
    d = a_vals - b_vals
    idx = np.random.default_rng(SEED).integers(0, len(d), size=(RESAMPLES, len(d)))
    means = d[idx].mean(axis=1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def fmt(d):
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"


def test_report_tables_plots_and_numbers(runs, tmp_path):
    out = tmp_path / "report"
    paths = [str(runs[k][0]) for k in ("grpo", "tea", "shifted")]
    res = CliRunner().invoke(app, ["report", *paths, "--bootstrap", str(RESAMPLES), "--out", str(out)])
    assert res.exit_code == 0, res.output

    va, vb = by_hand_bon(runs["grpo"][1]), by_hand_bon(runs["tea"][1])
    endpoints = (out / "endpoints.md").read_text()
    for j in range(3):
        assert fmt(expected_delta(vb[:, j], va[:, j])) in endpoints
    assert endpoints.count("+0.500 [+0.500, +0.500]") == 3  # constant delta: zero-width CI at every N
    assert "| Method | Δbo1 | Δbo2 | Δbo4 |" in endpoints

    # Win/tie/loss of tea vs grpo, counted here; p0 ties everywhere.
    wtl = (out / "win_tie_loss.md").read_text()
    for j in range(3):
        d = vb[:, j] - va[:, j]
        w, t, l = int((d > 1e-9).sum()), int((np.abs(d) <= 1e-9).sum()), int((d < -1e-9).sum())
        assert t >= 1 and w + t + l == P
        assert f"{100 * w / P:.1f}/{100 * t / P:.1f}/{100 * l / P:.1f}" in wtl.split("tea vs grpo")[1].splitlines()[0]
    assert "shifted vs grpo | 100.0/0.0/0.0 | 100.0/0.0/0.0 | 100.0/0.0/0.0 |" in wtl

    frontier = (out / "frontier.md").read_text()
    assert "| Method | Budget | Step | bo1 | bo2 | bo4 |" in frontier
    assert f"| grpo | m=64 | 100 | {va[:, 0].mean():.3f} | {va[:, 1].mean():.3f} | {va[:, 2].mean():.3f} |" in frontier
    assert "| shifted | m=64 | base |" in frontier

    deltas = (out / "deltas_tea.md").read_text()
    assert "| N | grpo | tea | Δ [95% CI] | W/T/L |" in deltas and deltas.count("\n| ") == 5  # header, rule, N = 1, 2, 4

    length = (out / "length.md").read_text()
    assert "| grpo | 10.0 | 24 |" in length and "| tea | 20.0 | 24 |" in length

    judge = (out / "judge.md").read_text()
    assert "| tea | bo4 | grpo | 3–1 | 75.0% | 1 |" in judge  # Win = W / (W + L)
    assert judge.count("\n| ") == 3  # header, rule, one row: .cache.jsonl is not a judge file

    rows = list(csv.DictReader(open(out / "endpoints.csv")))
    tea_row = next(r for r in rows if r["Method"] == "tea")
    d, lo, hi = expected_delta(vb[:, 2], va[:, 2])
    assert float(tea_row["Δbo4"]) == pytest.approx(d) and float(tea_row["Δbo4 lo"]) == pytest.approx(lo)
    assert float(tea_row["Δbo4 hi"]) == pytest.approx(hi)
    wtl_rows = list(csv.DictReader(open(out / "win_tie_loss.csv")))
    assert {k for k in wtl_rows[0]} >= {"Comparison", "bo4 W", "bo4 T", "bo4 L"}

    tex = (out / "endpoints.tex").read_text()
    assert r"\(+0.500\,[+0.500,+0.500]\)" in tex and r"\toprule" in tex and r"\(\Delta\)bo4" in tex
    assert "3--1" in (out / "judge.tex").read_text()

    for png in ("frontier.png", "delta.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report_md = (out / "report.md").read_text()
    assert "Split core6, M = 4 completions per prompt, 6 prompts" in report_md and "Baseline: grpo" in report_md
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"]["tea"]["checkpoint"] == 425 and summary["runs"]["grpo"]["delta"] is None
    assert summary["runs"]["tea"]["delta"][2] == pytest.approx(list(expected_delta(vb[:, 2], va[:, 2])))


def test_report_baseline_option_and_reproducibility(runs, tmp_path):
    paths = [str(runs[k][0]) for k in ("grpo", "tea")]
    r1 = CliRunner().invoke(app, ["report", *paths, "--baseline", "tea", "--out", str(tmp_path / "r1")])
    r2 = CliRunner().invoke(app, ["report", *paths, "--baseline", "tea", "--out", str(tmp_path / "r2")])
    assert r1.exit_code == 0 and r2.exit_code == 0, r1.output + r2.output
    assert (tmp_path / "r1" / "endpoints.csv").read_text() == (tmp_path / "r2" / "endpoints.csv").read_text()
    va, vb = by_hand_bon(runs["grpo"][1]), by_hand_bon(runs["tea"][1])
    assert fmt(expected_delta(va[:, 1], vb[:, 1])) in (tmp_path / "r1" / "endpoints.md").read_text()
    res = CliRunner().invoke(app, ["report", *paths, "--baseline", "nope", "--out", str(tmp_path / "r3")])
    assert res.exit_code == 2 and "--baseline 'nope'" in res.output


def test_report_refuses_runs_with_different_split_or_m(runs, tmp_path):
    other = write_run(tmp_path / "runs", "big_m", np.zeros((P, 8)), tokens=5, checkpoint=50, m=8)
    res = CliRunner().invoke(app, ["report", str(runs["grpo"][0]), str(other), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "different splits or M" in text and "grpo: core6-M4" in text and "big_m: core6-M8" in text
    res = CliRunner().invoke(app, ["report", str(runs["grpo"][0]), "--split", "core250", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and "grpo" in res.output and "no finished evaluation" in res.output


def test_report_imports_neither_train_nor_rollout(runs, tmp_path):
    code = (
        "import sys\n"
        "sys.modules['vllm'] = sys.modules['deepspeed'] = None\n"
        "from pathlib import Path\n"
        "from teacli.report.build import build_report\n"
        "import teacli.eval.stats, teacli.tables, teacli.report.plots\n"
        "build_report([Path(p) for p in sys.argv[2:]], Path(sys.argv[1]))\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')\n"
        "             or m.startswith(('teacli.train', 'teacli.rollout', 'teacli.eval.bon', 'teacli.eval.judge')))\n"
        "print('BAD', bad)\n"
    )
    paths = [str(runs[k][0]) for k in ("grpo", "tea")]
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r"), *paths], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BAD []" in proc.stdout
    assert (tmp_path / "r" / "delta.png").exists()


def test_one_run_writes_no_empty_delta_plot_and_report_md_says_why(runs, tmp_path):
    out = tmp_path / "one"
    res = CliRunner().invoke(app, ["report", str(runs["grpo"][0]), "--bootstrap", "50", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "frontier.png").exists() and not (out / "delta.png").exists()
    md = (out / "report.md").read_text()
    assert "delta.png" not in md and "![frontier](frontier.png)" in md
    assert "No delta plot: grpo is the only run" in md
    assert "delta.png" not in json.loads((out / ".tea-report").read_text())["files"]


def test_a_judge_file_without_a_valid_verdict_is_a_note_not_a_0_0_row(runs, tmp_path):
    from teacli.report.build import build_report

    rb = runs["tea"][0]
    (rb / "judge" / "shifted-bo4.jsonl").write_text("".join(
        json.dumps({"prompt_id": f"p{i}", "first": "self", "winner": "invalid", "error": "unparseable reply"}) + "\n" for i in range(3)))
    out = tmp_path / "report"
    build_report([runs[k][0] for k in ("grpo", "tea", "shifted")], out, resamples=50, plots=False)
    judge = (out / "judge.md").read_text()
    res = CliRunner().invoke(app, ["report", *(str(runs[k][0]) for k in ("grpo", "tea", "shifted")), "--bootstrap", "50",
                                   "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0 and "0–0" not in res.stdout, res.output
    assert "tea: judge/shifted-bo4.jsonl has no valid verdict (3 invalid); left out of the judge table" in res.stderr
    assert "| tea | bo4 | grpo | 3–1 | 75.0% | 1 |" in judge and "shifted" not in judge and "0–0" not in judge
    report_md = " ".join((out / "report.md").read_text().split())
    assert "Judge files with no valid verdict" in report_md and "tea/judge/shifted-bo4.jsonl (3 invalid)" in report_md
