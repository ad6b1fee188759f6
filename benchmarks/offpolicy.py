"""On-policy against one step off-policy (`rollout.max_staleness` 0 and 1), side by side in one invocation.

    python benchmarks/offpolicy.py RECIPE --out DIR [--steps 6] [--skip 2] [--rehearse] [--set key=value ...]
    python benchmarks/offpolicy.py --report DIR [--skip 2]       # the table again, from the two runs' metrics

Trains RECIPE twice, one run after the other on the same machine (DIR/staleness0, DIR/staleness1; `--rehearse`:
the recipe's shapes with random weights, `tea train --rehearse`), and prints per run the means over the steps after
the first `--skip` of the whole step, generation and reward (the background thread's, off-policy), the update
(reference + backward + step) and the trainer's wait for its rollouts, then the off-policy step's time as a share of
the on-policy step's. Means, not medians: one step off, a step's time alternates (the trainer waits for a batch on
one step, finds the next one ready on the other: 8.6, 29.2, 7.1 s on an H200), so only the mean is the run's time
a step. One step off pays where generation and the update can run at once (a GPU: decode is memory-bound, the
update compute-bound); where they share the same cores (a CPU) it cannot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

COLUMNS = (("step s", "time_step"), ("generate s", "time_generate"), ("reward s", "time_reward"),
           ("update s", None), ("wait s", "time_wait_rollouts"))


def train(recipe: str, run: Path, staleness: int, steps: int, rehearse: bool, sets: list[str]) -> None:
    cmd = [sys.executable, "-m", "teacli.cli", "train", recipe, "--run-dir", str(run), "--steps", str(steps),
           "--set", f"rollout.max_staleness={staleness}", *[a for s in sets for a in ("--set", s)]]
    if rehearse:
        cmd.append("--rehearse")
    subprocess.run(cmd, check=True)


def means(run: Path, skip: int) -> dict[str, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][skip:]
    if not rows:
        raise SystemExit(f"offpolicy.py: {run} has no steps after the first {skip} (--skip)")
    mean = lambda key: statistics.fmean(float(r.get(key, 0.0)) for r in rows)  # noqa: E731
    out = {label: mean(key) for label, key in COLUMNS if key}
    out["update s"] = mean("time_ref_logprobs") + mean("time_train")
    return out


def table(results: dict[int, dict[str, float]]) -> str:
    lines = ["| rollout.max_staleness | " + " | ".join(label for label, _ in COLUMNS) + " | step / on-policy |",
             "|---:|" + "---:|" * (len(COLUMNS) + 1)]
    base = results[0]["step s"]
    for staleness, row in sorted(results.items()):
        cells = " | ".join(f"{row[label]:.3f}" for label, _ in COLUMNS)
        lines.append(f"| {staleness} | {cells} | {row['step s'] / base:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?")
    ap.add_argument("--out", type=Path, help="a directory for the two runs (it must not hold them yet)")
    ap.add_argument("--report", type=Path, help="print the table of the two runs already in this directory, train nothing")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--skip", type=int, default=2, help="steps left out of the means (compile, warm-up; off-policy's first is on-policy)")
    ap.add_argument("--rehearse", action="store_true", help="tea train --rehearse: the recipe's shapes, random weights")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="a recipe override for both runs")
    a = ap.parse_args(argv)
    if a.report is not None:
        print(table({staleness: means(a.report / f"staleness{staleness}", a.skip) for staleness in (0, 1)}))
        return
    if a.recipe is None or a.out is None:
        ap.error("give RECIPE and --out (or --report DIR)")
    if a.skip >= a.steps:
        raise SystemExit(f"offpolicy.py: --skip {a.skip} leaves none of --steps {a.steps}")
    results = {}
    for staleness in (0, 1):
        run = a.out / f"staleness{staleness}"
        if (run / "metrics.jsonl").exists():
            raise SystemExit(f"offpolicy.py: {run} holds a run already; give another --out")
        train(a.recipe, run, staleness, a.steps, a.rehearse, a.sets)
        results[staleness] = means(run, a.skip)
    print(table(results))


if __name__ == "__main__":
    main()
