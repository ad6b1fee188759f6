"""benchmarks/completion_splits.py's CPU smoke run: a tiny Llama, one draw of each length mode; the table has a row
per mode and setting with the padding that teacli.padding counts (none at fixed lengths; at realistic ones falling as
the forwards rise), the fit's lines, and the profiler's totals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_completion_splits_smoke(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "completion_splits.py"), "--small", "--draws", "1",
                           "--repeats", "1", "--splits", "1,2,4,auto,packed", "--lengths", "fixed,realistic", "--profile",
                           "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    settings = (1, 2, 4, "auto", "packed")
    assert [(r["lengths"], r["splits"]) for r in rows] == [(m, k) for m in ("fixed", "realistic") for k in settings]
    fixed, real = rows[:5], rows[5:]
    assert [r["forwards"] for r in real[:3]] == [1, 2, 4] and all(r["pad_frac"] == 0 for r in fixed)
    assert fixed[3]["forwards"] == 1  # equal lengths: nothing to save, auto keeps one forward
    pads = [r["pad_frac"] for r in real[:3]]
    assert pads[0] > pads[1] > pads[2] >= 0 and all(r["train_ms"] > 0 and r["ref_ms"] > 0 for r in rows)
    assert real[4]["forwards"] == 1 and real[4]["pad_frac"] < pads[0]  # packed: one forward, less padding than one row each
    assert "| lengths | k | forwards |" in proc.stdout and "realistic train_ms:" in proc.stdout
    assert proc.stdout.count("host (self CPU)") == 2 * len(rows)


def test_fresh_draws_under_each_sdpa_order(tmp_path):
    """--fresh: every timed pass is a new draw (draws × repeats of them a row, none shared between rows: each order's
    row sees shapes of its own); --sdpa: a row per backend order, named in the table."""
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "completion_splits.py"), "--small", "--draws", "1",
                           "--repeats", "2", "--splits", "1", "--lengths", "realistic", "--fresh", "--sdpa",
                           "default,no-cudnn", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["sdpa"], r["passes"], r["forwards"]) for r in rows] == [("default", 2, 1), ("no-cudnn", 2, 1)]
    assert rows[0]["tokens"] != rows[1]["tokens"]  # other draws (the same seeds would give the same lengths)
    assert "| no-cudnn | realistic | 1 |" in proc.stdout and "torch's SDPA order (default): " in proc.stdout
    bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "completion_splits.py"), "--small", "--sdpa", "cudnn-first"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--sdpa" in bad.stderr
    for splits in ("1,pack", "0", "two"):
        bad = subprocess.run([sys.executable, str(REPO / "benchmarks" / "completion_splits.py"), "--small", "--splits", splits],
                             capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--splits" in bad.stderr, (splits, bad.stderr)
