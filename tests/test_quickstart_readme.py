"""README states what the quickstart's validation scores are; the run is deterministic on a CPU machine (two fresh
installs on different machines gave the same four digits), so README's numbers are checked against a real run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CLAIM = re.compile(r"rises from the untrained policy's: ([0-9.]+) at step 0, ([0-9.]+) at\s+step 8( \(selected\))?, "
                   r"([0-9.]+) at step 16( \(selected\))?")


def readme_claim() -> tuple[dict[int, str], int]:
    """README's quickstart scores by step (as written) and the step it says was selected."""
    m = CLAIM.search((REPO / "README.md").read_text())
    assert m, "README no longer states the quickstart's validation scores in the form this test reads"
    scores = {0: m.group(1), 8: m.group(2), 16: m.group(4)}
    assert bool(m.group(3)) != bool(m.group(5)), "README must mark exactly one of steps 8 and 16 as selected"
    return scores, 8 if m.group(3) else 16


def test_readme_states_the_claim_in_a_form_this_test_reads():
    scores, selected = readme_claim()
    assert all(len(v.split(".")[1]) == 4 for v in scores.values()) and selected in (8, 16)


@pytest.mark.slow
def test_the_quickstart_gives_the_scores_readme_states(tmp_path):
    """`tea train quickstart` as README's first command runs it (the machine's threads, the default cache), then its
    validation.jsonl and selected.json against README, to README's four digits (about 9 minutes on 2 cores)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    run = tmp_path / "quickstart"
    proc = subprocess.run([sys.executable, "-m", "teacli.cli", "train", str(REPO / "recipes" / "quickstart.yaml"),
                           "--run-dir", str(run)], capture_output=True, text=True, env=env, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {r["step"]: r["score"] for r in map(json.loads, (run / "validation.jsonl").read_text().splitlines())}
    scores, selected = readme_claim()
    assert {step: f"{got[step]:.4f}" for step in scores} == scores
    assert json.loads((run / "selected.json").read_text())["step"] == selected
