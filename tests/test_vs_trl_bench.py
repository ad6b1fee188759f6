"""benchmarks/vs_trl.py's tea side on CPU (--small): the recipe settings its flags set reach the trainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tiny_lm import tea_env  # noqa: E402


@pytest.mark.parametrize("flag, shared", [("on", True), ("off", False)])
def test_share_prompts_flag_reaches_the_trainer(tmp_path, flag, shared):
    """--tea-share-prompts: optim.share_prompts for tea's side (the MFU of backward + step counts the tokens the
    forward ran, so whether prompts were shared must be what the settings line and the JSON say)."""
    out = tmp_path / "vs_trl.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_trl.py"), "--small", "--only", "tea", "--steps", "1",
                           "--tea-share-prompts", flag, "--json", str(out)],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["args"]["tea_share_prompts"] == flag and result["results"]["tea"]["settings"]["share_prompts"] is shared
    assert f"share_prompts={shared}" in proc.stdout


def test_decode_loop_benchmark_compares_the_two_loops(tmp_path):
    """benchmarks/decode_loop.py --small: a row per loop and run (tea, generate, twice), and the two loops'
    greedy tokens equal (fp32 on the CPU, where they are the same computation)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_loop.py"), "--small", "--repeats", "1"],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ") and "loop" not in line]
    assert rows == ["generate", "tea", "generate", "tea"]
    assert "greedy tokens equal: True" in proc.stdout


def test_decode_step_benchmark_prints_its_four_tables(tmp_path):
    """benchmarks/decode_step.py --small: the draw's rows (no compiled row off CUDA), the attention's two rows (the fold equal to the engine's attention within rounding), a generation row per
    variant, and the reference head's two rows with the same log-probs."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_step.py"), "--small", "--repeats", "1"],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = proc.stdout.split("### ")[1:]
    assert [t.split(":")[0] for t in tables] == ["draw", "attention", "generation", "reference head"]
    rows = {t.split(":")[0]: [line.split("|")[1:-1] for line in t.splitlines() if line.startswith("| ") and "---" not in line][1:]
            for t in tables}
    assert [r[0].strip() for r in rows["draw"]] == ["before", "after, eager"]
    assert [r[0].strip() for r in rows["attention"]] == ["gqa", "folded"] and float(rows["attention"][1][3]) < 1e-5
    assert [r[0].strip() for r in rows["generation"]] == ["before", "draw", "fold", "draw + fold"]
    assert [r[0].strip() for r in rows["reference head"]] == ["before (eager)", "after (eager)"]
    assert float(rows["reference head"][1][3]) == 0.0
