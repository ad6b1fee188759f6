"""Calibrate the hard reward on the untrained policy: the same completions rescored at several tolerances.

Reads a base arm's evaluation (eval/base/<split>-M<M>.jsonl[.gz] and <split>.prompts.jsonl, as `tea eval-bon
--checkpoint base` writes them), rescores every completion with the rule reward at each τ (the completions do not
depend on τ: it is not in the prompt), and prints per τ: bo1, bo64, bo128, bo256 (grouped best-of-N, as `tea report`),
the headroom criterion h = (bo256 − bo1) / (1 − bo1) (issue: at most 0.60), and the Gaussian upper-tail QQ R² over
q in [0.80, 0.99] (median, 10th percentile, share ≥ 0.95; issue: median ≥ 0.95), as `tea diagnose tail-fit`.

    python results/gpu/hard_calibration.py RUN_DIR [--split heldout] [--data-dir DIR] [--tolerance 0.5 0.35 0.25] [--out FILE.md]

Records without their texts (results/gpu/collect.py keeps only the rewards) give one row, the rewards as
recorded (`τ` is then the evaluation's own, from its .run.json):

    python results/gpu/collect.py --restore runs
    python results/gpu/hard_calibration.py runs/gpu_bon_hard_grpo-base   # results/gpu/hard_calibration.md
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import numpy as np
import yaml

from teacli.advantages.tail import qq_tail_r2
from teacli.config import RuleParams
from teacli.data.load import load_split
from teacli.diagnostics.tail_fit import tail_summary
from teacli.eval.stats import grouped_bon
from teacli.rewards.rule import RuleReward
from teacli.types import Prompt


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load(run: Path, split: str, data_dir: str | None) -> tuple[list[Prompt], list[dict], int]:
    """The split's prompts (with their constraints: from the data, as the evaluation read them) and the records."""
    base = run / "eval" / "base"
    records_path = next(p for p in sorted(base.glob(f"{split}-M*.jsonl*")) if ".run." not in p.name and ".bon." not in p.name)
    records = read_jsonl(records_path)
    evaluated = [r["prompt_id"] for r in read_jsonl(base / f"{split}.prompts.jsonl")]
    data_dir = data_dir or yaml.safe_load((run / "recipe.yaml").read_text())["data"]["dir"]
    by_id = {p.id: p for p in load_split(data_dir, split)}
    prompts = [by_id[pid] for pid in evaluated]
    M = int(records_path.name.split("-M")[1].split(".")[0])
    return prompts, records, M


def calibrate(prompts: list[Prompt], records: list[dict], M: int, tolerances: list[float | None]) -> list[dict]:
    """One row per τ (None: the rewards as recorded)."""
    index = {p.id: i for i, p in enumerate(prompts)}
    rows = []
    for tol in tolerances:
        reward = RuleReward(tolerance=tol) if tol is not None else None
        r = np.full((len(prompts), M), np.nan)
        for rec in records:
            i = index[rec["prompt_id"]]
            r[i, rec["sample"]] = rec["reward"] if reward is None else reward.score_one(prompts[i], rec["response"])
        if np.isnan(r).any():
            raise SystemExit(f"{int(np.isnan(r).sum())} completions missing: the evaluation is not complete")
        bon = {n: float(grouped_bon(r, n).mean()) for n in (1, 64, 128, 256) if M % n == 0}
        fit = qq_tail_r2(r, 0.80, 0.99)
        tail = tail_summary(fit.r2, fit.ok)
        rows.append({"tolerance": tol, **{f"bo{n}": v for n, v in bon.items()},
                     "headroom_used": (bon[M] - bon[1]) / (1.0 - bon[1]), "fitted": int(fit.ok.sum()), **tail})
    return rows


def table(rows: list[dict], M: int, prompts: int) -> str:
    ns = [n for n in (1, 64, 128, 256) if f"bo{n}" in rows[0]]
    head = "| τ | " + " | ".join(f"bo{n}" for n in ns) + f" | (bo{M} − bo1) / (1 − bo1) | tail R² median | 10th pct | share ≥ 0.95 | prompts fitted |"
    lines = [head, "|" + "---|" * (len(ns) + 6)]
    for r in rows:
        lines.append(f"| {r['tolerance']:g} | " + " | ".join(f"{r[f'bo{n}']:.3f}" for n in ns)
                     + f" | {r['headroom_used']:.2f} | {r['median_r2']:.3f} | {r['p10_r2']:.3f} | {r['frac_r2_ge_095']:.0%} | {r['fitted']}/{prompts} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--tolerance", type=float, nargs="+", default=[0.5, 0.35, 0.25])
    ap.add_argument("--data-dir", help="where the split lives, when not at the run's data.dir")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    prompts, records, M = load(a.run, a.split, a.data_dir)
    tolerances: list[float | None] = a.tolerance
    if any(rec.get("response") is None for rec in records):  # texts not kept: the recorded rewards, at the evaluation's τ
        settings = json.loads(next((a.run / "eval" / "base").glob(f"{a.split}-M*.run.json")).read_text())
        tolerances = [None]
        recorded = settings["reward"]["params"].get("tolerance", RuleParams.tolerance)
    rows = calibrate(prompts, records, M, tolerances)
    for row in rows:
        if row["tolerance"] is None:
            row["tolerance"] = recorded
    text = table(rows, M, len(prompts))
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
