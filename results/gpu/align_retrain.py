"""The retrained TEA seed 0 of the LM-judge study (runs/align_tea-s0: `tea train recipes/gpu_bon_judge_tea.yaml
--run-dir runs/align_tea-s0 --set seed=0` on an H200, trained again because the study kept no checkpoints; its
step-75 checkpoint is the trained policy of the alignment diagnostic) beside the study's four TEA runs
(gpu_bon_judge_tea-s0..s3, H100s), from their committed metrics.jsonl, validation.jsonl and selected.json under
results/gpu/runs/: validation at each validation step (* = the selected checkpoint), the pre-clip gradient
norm (median, max), the KL to the reference at steps 25, 50 and 75 and its maximum, the mean training reward over
steps 1-25, 26-50 and 51-75, and the mean completion length.

    python results/gpu/align_retrain.py > results/gpu/align_retrain.md
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = ("align_tea-s0", "gpu_bon_judge_tea-s0", "gpu_bon_judge_tea-s1", "gpu_bon_judge_tea-s2", "gpu_bon_judge_tea-s3")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table() -> str:
    out = ["| run | validation at 0 / 25 / 50 / 75 (* selected) | grad norm median (max) | KL at 25 / 50 / 75 | KL max "
           "| training reward, steps 1-25 / 26-50 / 51-75 | completion tokens (mean) |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for name in RUNS:
        run = HERE / "runs" / name
        rows = {r["step"]: r for r in _jsonl(run / "metrics.jsonl")}
        val = _jsonl(run / "validation.jsonl")
        chosen = json.loads((run / "selected.json").read_text())["step"]
        norms = [r["grad_norm"] for r in rows.values()]
        scores = " / ".join(f"{v['score']:.3f}" + ("*" if v["step"] == chosen else "") for v in val)
        kls = " / ".join(f"{rows[s]['kl']:.2f}" for s in (25, 50, 75))
        reward = " / ".join(f"{statistics.mean(rows[s]['reward_mean'] for s in range(a, a + 25)):.3f}" for a in (1, 26, 51))
        out.append(f"| {name} | {scores} | {statistics.median(norms):.1f} ({max(norms):.1f}) | {kls} | "
                   f"{max(r['kl'] for r in rows.values()):.2f} | {reward} | "
                   f"{statistics.mean(r['gen_len_mean'] for r in rows.values()):.1f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(table(), end="")
