"""Writes docs/results/training_summary.md from the study's copied metrics.jsonl files (run from the repo root:
`python docs/results/summarize_training.py`), so docs/results.md quotes a file rather than typed numbers."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
KEYS = [("adv_std", "mean adv_std", "{:.3f}"), ("grad_norm", "mean pre-clip grad_norm", "{:.1f}"),
        ("grad_clipped", "steps clipped", "{:.0%}"), ("kl", "mean KL(π‖π_ref) per sequence", "{:.2f}"),
        ("tail_r2_median", "mean tail_r2_median", "{:.3f}"), ("adv_nonzero_frac", "mean adv_nonzero_frac", "{:.2f}"),
        ("time_step", "mean step (s, H200)", "{:.2f}")]
lines = ["| Run | " + " | ".join(k[1] for k in KEYS) + " | tail-check warning |", "| --- |" + " ---: |" * len(KEYS) + " --- |"]
for run in sorted((HERE / "runs").glob("*-s*")):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().split("\n") if line.strip()]
    cells = [fmt.format(statistics.mean(float(r[k]) for r in rows if k in r)) for k, _, fmt in KEYS]
    warned = (run / "tail_check_warning.txt").exists()
    lines.append(f"| {run.name} | " + " | ".join(cells) + f" | {'yes' if warned else 'no'} |")
(HERE / "training_summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
