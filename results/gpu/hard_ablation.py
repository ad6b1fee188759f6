"""The m-ablation's planned test (recipes/studies/gpu_bon_hard_m.yaml): does TEA's gain over GRPO grow as m falls?

Per m, D(m) = TEA − GRPO in best-of-N (default N = 128) over the held-out prompts, pooled over the seeds, and
D(16) − D(64), D(32) − D(64): each with the report's two-level (seed, prompt) 95% interval
(`teacli.eval.stats.seed_prompt_bootstrap` of the per-seed per-prompt contrasts TEA_s − GRPO_s of one m against
another's; the prompts are resampled once for all arms, since every run is evaluated on the same prompts).

    python results/gpu/collect.py --restore runs
    python results/gpu/hard_ablation.py runs [--n 128] [--ms 16 32 64] [--bootstrap 1000] [--seed 0]

Every m, m = 64 included, is read over the ablation's own seeds (`seeds` in recipes/studies/gpu_bon_hard_m.yaml, as
its plan says), not over every seed the main study has: the arms are compared at the same seeds.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import yaml

from teacli.diagnostics.tail_fit import read_run
from teacli.eval.stats import grouped_bon, seed_prompt_bootstrap

PREFIX = "gpu_bon_hard"
STUDY = Path(__file__).resolve().parents[2] / "recipes" / "studies" / "gpu_bon_hard_m.yaml"


def plan_seeds() -> list[int]:
    """The seeds the ablation's plan reads: its study file's."""
    return list(yaml.safe_load(STUDY.read_text())["seeds"])


def run_name(method: str, m: int, seed: int) -> str:
    return f"{PREFIX}_{method}{'' if m == 64 else f'_m{m}'}-s{seed}"


def contrasts(runs: Path, m: int, n: int, seeds: list[int] | None = None, split: str = "heldout") -> tuple[np.ndarray, list[int], list[str]]:
    """[S, P] per-seed per-prompt TEA − GRPO at best-of-n, over the seeds both methods have at this m (of `seeds`, where
    given); those seeds; the prompt ids (every run's, checked to be the same)."""
    pattern = re.compile(rf"^{PREFIX}_(tea|grpo){'' if m == 64 else f'_m{m}'}-s(\d+)$")
    have: dict[str, set[int]] = {"tea": set(), "grpo": set()}
    for p in runs.iterdir():
        hit = pattern.match(p.name)
        if hit:
            have[hit[1]].add(int(hit[2]))
    both = have["tea"] & have["grpo"]
    seeds = sorted(both if seeds is None else both & set(seeds))
    if not seeds:
        raise SystemExit(f"hard_ablation.py: no seed with both {run_name('tea', m, 0)[:-3]} and {run_name('grpo', m, 0)[:-3]} runs under {runs}")
    rows, ids = [], None
    for s in seeds:
        pair = [read_run(runs / run_name(method, m, s), method, "selected", split) for method in ("tea", "grpo")]
        for r in pair:
            if ids is None:
                ids = r.prompt_ids
            if r.prompt_ids != ids:
                raise SystemExit(f"hard_ablation.py: {r.path} was evaluated on other prompts than the first run")
        rows.append(grouped_bon(pair[0].rewards, n) - grouped_bon(pair[1].rewards, n))
    return np.array(rows), seeds, ids


def table(runs: Path, ms: list[int], n: int, resamples: int, seed: int, seeds: list[int] | None = None) -> str:
    seeds = plan_seeds() if seeds is None else seeds
    got = {m: contrasts(runs, m, n, seeds) for m in ms}
    lines = [f"| contrast (bo{n}) | seeds | estimate | 95% interval (seed, prompt) |", "|---|---|---:|---|"]
    for m in ms:
        d, have, _ = got[m]
        est, lo, hi = seed_prompt_bootstrap(d, None, have, None, resamples, seed)
        lines.append(f"| D({m}) = TEA − GRPO at m = {m} | {', '.join(map(str, have))} | {est:+.3f} | [{lo:+.3f}, {hi:+.3f}] |")
    if 64 in got:
        for m in (x for x in ms if x != 64):
            (a, sa, ia), (b, sb, ib) = got[m], got[64]
            if ia != ib:
                raise SystemExit(f"hard_ablation.py: m = {m} and m = 64 were evaluated on other prompts")
            est, lo, hi = seed_prompt_bootstrap(a, b, sa, sb, resamples, seed)
            lines.append(f"| D({m}) − D(64) | {', '.join(map(str, sa))} / {', '.join(map(str, sb))} | {est:+.3f} | [{lo:+.3f}, {hi:+.3f}] |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--ms", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="the seeds to read (default: the study file's)")
    a = ap.parse_args()
    print(table(a.runs, a.ms, a.n, a.bootstrap, a.seed, a.seeds))


if __name__ == "__main__":
    main()
