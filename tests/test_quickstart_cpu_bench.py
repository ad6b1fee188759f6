"""benchmarks/quickstart_cpu.py builds tea train's trainer through the trainer's own setup (teacli.train.setup) and times a before
and an after step, here on the tests' tiny policy (it had fallen out of step with setup's return values)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BENCH = TESTS.parent / "benchmarks" / "quickstart_cpu.py"


def test_quickstart_cpu_benchmark_runs_on_the_tiny_policy(tmp_path):
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_assets, tea_env, tiny_recipe, write_recipe

    assets = make_assets(tmp_path / "assets")
    recipe = write_recipe(tmp_path / "r.yaml", tiny_recipe(assets / "policy", assets / "data"))
    proc = subprocess.run([sys.executable, str(BENCH), "--rounds", "2", "--recipe", str(recipe)],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = [line for line in proc.stdout.splitlines() if line.startswith("| step |")]
    # The times are printed to 0.1 s, which a tiny step undercuts (0.0); the after/before ratio is computed from the
    # unrounded times, so a positive one says both steps were timed.
    assert len(step) == 1 and float(step[0].split("|")[4]) > 0, proc.stdout
