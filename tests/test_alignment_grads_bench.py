"""benchmarks/alignment_grads.py runs both ways on the tests' tiny shape and prints a row for each, the batched
gradients equal to the loop's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "alignment_grads.py"


def test_alignment_grads_benchmark_prints_both_methods():
    proc = subprocess.run([sys.executable, str(BENCH), "--model", "tiny", "--completions", "6", "--batch", "4",
                           "--prompt-tokens", "8", "--completion-tokens", "10", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|") for line in proc.stdout.splitlines() if line.startswith("| loop") or line.startswith("| batched")}
    assert set(rows) == {"loop", "batched"}
    assert float(rows["batched"][5]) < 1e-5 and float(rows["loop"][5]) == 0.0
    assert "block=model.layers.1" in proc.stdout
