"""The GPU study's training as tables, from its committed files (results/gpu/runs/ and the studies'
logs, study_<reward>.log for the 75-step study, study150_<reward>_s<seed>.log for the 150-step one, run a
seed at a time): per run, the validation score at each validation step (* = the selected checkpoint), the pre-clip gradient
norm (median, max) against the clip, the share of steps the clip bound, the KL to the reference at the last
step, the median step time and its generation share, and the wall time of training and evaluation.

    python results/gpu/study_summary.py rule > results/gpu/training_rule.md
    python results/gpu/study_summary.py rule --steps 150 > results/gpu/training150_rule.md
    python results/gpu/study_summary.py hard > results/gpu/training_hard.md   # the hard reward (100 steps)

`spread` prints, per run (the untrained arm first), the shape of its held-out rewards: their mean, the
mean over prompts of the within-prompt standard deviation of the M rewards (TEA's objective trades
the mean for the spread that best-of-N rewards), the pooled 99th percentile, the mean completion
length and the share of completions cut at max_new_tokens.

    python results/gpu/study_summary.py judge spread > results/gpu/spread_judge.md
    python results/gpu/study_summary.py judge spread --steps 150 > results/gpu/spread150_judge.md
"""

import argparse
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


def walls(reward: str, steps: int) -> dict[tuple[str, str], str]:
    """(stage, run) -> wall time as the study printed it, from the `done` lines of its logs."""
    out = {}
    if reward == "hard":  # run in parts: study_hard_<part>.log
        logs = sorted(HERE.glob("study_hard_*.log"))
    else:
        logs = [HERE / f"study_{reward}.log"] if steps == 75 else sorted(HERE.glob(f"study{steps}_{reward}_s*.log"))
    for log in logs:
        for line in log.read_text().splitlines():
            m = re.match(r"\[study \S+\] done  (train|eval-bon) (\S+) in (\S+)$", line)
            if m:
                out[(m.group(1), m.group(2))] = m.group(3)
    return out


def run_prefix(reward: str, steps: int = 75) -> str:
    """The study's run-name prefix: gpu_bon (rule reward, 75 steps), gpu_bon_<reward>, gpu_bon150, gpu_bon150_<reward>;
    gpu_bon_hard for the hard reward (recipes/studies/gpu_bon_hard.yaml, 100 steps)."""
    if reward == "hard":
        return "gpu_bon_hard"
    base = "gpu_bon" if steps == 75 else f"gpu_bon{steps}"
    return base if reward == "rule" else f"{base}_{reward}"


def main(reward: str, steps: int = 75) -> None:
    prefix = run_prefix(reward, steps)
    wall = walls(reward, steps)
    runs = [run for method in METHODS for run in sorted(HERE.glob(f"runs/{prefix}_{method}-s*"))]
    if not runs:
        sys.exit(f"study_summary.py: no run {prefix}_<method>-s<seed> under {HERE / 'runs'}")
    at = sorted({json.loads(line)["step"] for run in runs for line in (run / "validation.jsonl").read_text().splitlines() if line.strip()})
    print(f"| run | validation at {' / '.join(map(str, at))} (* selected) | grad norm median (max) | clip | steps clipped | KL at the end | step (s) | generation (s) | train wall | eval wall |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
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


def spread(reward: str, steps: int = 75) -> None:
    prefix = run_prefix(reward, steps)
    # the untrained arm is the 75-step study's for both: its evaluation does not depend on optim.steps
    runs = sorted(HERE.glob(f"runs/{run_prefix(reward)}_grpo-base")) + [r for m in METHODS for r in sorted(HERE.glob(f"runs/{prefix}_{m}-s*"))]
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
    parser = argparse.ArgumentParser(description="the GPU study's training tables")
    parser.add_argument("reward", nargs="?", default="rule", choices=["rule", "judge", "hard"])
    parser.add_argument("table", nargs="?", default="training", choices=["training", "spread"])
    parser.add_argument("--steps", type=int, default=75, choices=[75, 150], help="which study: 75 or 150 training steps")
    args = parser.parse_args()
    (spread if args.table == "spread" else main)(args.reward, args.steps)
