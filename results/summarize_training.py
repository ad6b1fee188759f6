"""Writes results/training_summary.md from the study's committed runs (results/runs/: metrics.jsonl,
validation.jsonl, selected.json, recipe.yaml; run from the repo root: `python results/summarize_training.py`),
so docs/results.md quotes a file rather than typed numbers. `table(RUNS_DIR)` reads any runs directory of the
same layout (the records restored by `results/gpu/collect.py --restore ... --records results/runs`).

The tail-check column is the run's tail_check_warning.txt where it is kept, else the training's own tail check
(teacli.monitors.tail_check.TailCheck, writing nothing) replayed on the logged `tail_r2_median` with the
recipe's `advantage.tail_check_r2` and `tail_check_window` (collect.py does not keep the warning file).
"""

import json
import statistics
from pathlib import Path

import yaml

HERE = Path(__file__).parent
KEYS = [("adv_std", "mean adv_std", "{:.3f}"), ("grad_norm", "mean pre-clip grad_norm", "{:.1f}"),
        ("grad_clipped", "steps clipped", "{:.0%}"), ("kl", "mean KL(π‖π_ref) per sequence", "{:.2f}"),
        ("tail_r2_median", "mean tail_r2_median", "{:.3f}"), ("adv_nonzero_frac", "mean adv_nonzero_frac", "{:.2f}"),
        ("time_step", "mean step (s, H200)", "{:.2f}")]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


def tail_check_warned(run: Path, rows: list[dict], threshold: float | None, window: int) -> bool:
    """Whether the run's tail check warned: its warning file, or TailCheck replayed on its metrics rows."""
    from teacli.monitors.tail_check import TailCheck

    check = TailCheck(threshold, window, run, note=lambda text: None, is_main=False)  # is_main False: writes nothing
    return check.warned or any([check.observe(r) is not None for r in rows])


def table(runs: Path) -> str:
    lines = ["| Run | validation at each step (* selected) | " + " | ".join(k[1] for k in KEYS) + " | tail-check warning |",
             "| --- | --- |" + " ---: |" * len(KEYS) + " --- |"]
    for run in sorted(runs.glob("*-s*")):
        rows = _jsonl(run / "metrics.jsonl")
        chosen = json.loads((run / "selected.json").read_text())["step"]
        val = " / ".join(f"{v['step']}: {v['score']:.3f}" + ("*" if v["step"] == chosen else "")
                         for v in _jsonl(run / "validation.jsonl"))
        cells = [fmt.format(statistics.mean(float(r[k]) for r in rows if k in r)) for k, _, fmt in KEYS]
        adv = yaml.safe_load((run / "recipe.yaml").read_text())["advantage"]
        warned = tail_check_warned(run, rows, adv.get("tail_check_r2", 0.8), int(adv.get("tail_check_window", 10)))
        lines.append(f"| {run.name} | {val} | " + " | ".join(cells) + f" | {'yes' if warned else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    text = table(HERE / "runs")
    (HERE / "training_summary.md").write_text(text)
    print(text, end="")
