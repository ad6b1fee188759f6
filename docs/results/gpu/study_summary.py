"""The GPU study's training as tables, from its committed files (docs/results/gpu/runs/, study_<reward>.log):
per run, the validation score at each validation step (* = the selected checkpoint), the pre-clip gradient
norm (median, max) against the clip, the share of steps the clip bound, the KL to the reference at the last
step, the median step time and its generation share, and the wall time of training and evaluation.

    python docs/results/gpu/study_summary.py rule > docs/results/gpu/training_rule.md

`spread` prints, per run (the untrained arm first), the shape of its held-out rewards: their mean, the
mean over prompts of the within-prompt standard deviation of the M rewards (TEA's objective trades
the mean for the spread that best-of-N rewards), the pooled 99th percentile, the mean completion
length and the share of completions cut at max_new_tokens.

    python docs/results/gpu/study_summary.py judge spread > docs/results/gpu/spread_judge.md
"""

import gzip
import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
METHODS = ("grpo", "grpo_z", "tea")


def walls(reward: str) -> dict[tuple[str, str], str]:
    """(stage, run) -> wall time as the study printed it, from its `done` lines."""
    out = {}
    for line in (HERE / f"study_{reward}.log").read_text().splitlines():
        m = re.match(r"\[study \S+\] done  (train|eval-bon) (\S+) in (\S+)$", line)
        if m:
            out[(m.group(1), m.group(2))] = m.group(3)
    return out


def run_prefix(reward: str) -> str:
    """The study's run-name prefix: gpu_bon (rule reward) or gpu_bon_<reward>."""
    return "gpu_bon" if reward == "rule" else f"gpu_bon_{reward}"


def main(reward: str) -> None:
    prefix = run_prefix(reward)
    wall = walls(reward)
    print("| run | validation at 0 / 25 / 50 / 75 (* selected) | grad norm median (max) | clip | steps clipped | KL at the end | step (s) | generation (s) | train wall | eval wall |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for method in METHODS:
        for run in sorted(HERE.glob(f"runs/{prefix}_{method}-s*")):
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
            val = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines() if line.strip()]
            chosen = json.loads((run / "selected.json").read_text())["step"]
            clip = yaml.safe_load((run / "recipe.yaml").read_text())["optim"]["max_grad_norm"]
            norms = [r["grad_norm"] for r in rows]
            scores = " / ".join(f"{v['score']:.3f}" + ("*" if v["step"] == chosen else "") for v in val)
            print(f"| {run.name} | {scores} | {statistics.median(norms):.1f} ({max(norms):.1f}) | {clip:g} | "
                  f"{sum(n > clip for n in norms) / len(norms):.0%} | {rows[-1]['kl']:.2f} | "
                  f"{statistics.median(r['time_step'] for r in rows):.1f} | {statistics.median(r['time_generate'] for r in rows):.1f} | "
                  f"{wall.get(('train', run.name), '–')} | {wall.get(('eval-bon', run.name), '–')} |")


def spread(reward: str) -> None:
    prefix = run_prefix(reward)
    runs = sorted(HERE.glob(f"runs/{prefix}_grpo-base")) + [r for m in METHODS for r in sorted(HERE.glob(f"runs/{prefix}_{m}-s*"))]
    print("| run | held-out mean | within-prompt std (mean over prompts) | pooled q99 | mean tokens | cut at max_new_tokens |")
    print("|---|---:|---:|---:|---:|---:|")
    for run in runs:
        (records,) = run.glob("eval/**/*.jsonl.gz")
        rows = [json.loads(line) for line in gzip.open(records, "rt")]
        by_prompt: dict[str, list[float]] = {}
        for r in rows:
            by_prompt.setdefault(r["prompt_id"], []).append(r["reward"])
        rewards = np.array([r["reward"] for r in rows])
        tokens = np.array([r["tokens"] for r in rows])
        cap = yaml.safe_load((run / "recipe.yaml").read_text())["rollout"]["max_new_tokens"]
        print(f"| {run.name} | {rewards.mean():.3f} | {np.mean([np.std(v) for v in by_prompt.values()]):.3f} | "
              f"{np.quantile(rewards, 0.99):.3f} | {tokens.mean():.1f} | {np.mean(tokens >= cap):.1%} |")


if __name__ == "__main__":
    reward = sys.argv[1] if len(sys.argv) > 1 else "rule"
    spread(reward) if sys.argv[2:] == ["spread"] else main(reward)
