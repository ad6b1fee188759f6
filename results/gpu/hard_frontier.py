"""The reward-KL frontier's planned reading (recipes/studies/gpu_bon_hard_kl.yaml): at a matched KL to the reference,
is TEA's best-of-N higher than GRPO's?

Each run is a point: its KL to the reference at its selected checkpoint (`teacli.report.step_size`: the mean recorded
`kl` over the 5 steps ending there) and its best-of-N (default N = 128) on the held-out prompts. A method's frontier
is its (mean KL, mean bo-N) per beta (0.1, 0.03, 0.01), joined in order of KL. TEA's frontier is higher if every TEA
point whose KL lies within GRPO's range lies above GRPO's frontier (linear in log KL between GRPO's points), lower if
every one lies below, else neither is shown higher. GRPO-Z and TEA-Z (recipes/studies/gpu_bon_hard_step.yaml) are
drawn beside them and placed against GRPO's frontier too, outside the rule. Beside it: TEA − GRPO at each matched
beta, with the report's two-level (seed, prompt) 95% interval (`teacli.eval.stats.seed_prompt_bootstrap`).

    python results/gpu/collect.py --restore runs
    python results/gpu/hard_frontier.py runs [--n 128] [--bootstrap 1000] [--seed 0] [--plot frontier.png]

Every point is read over the plan's seeds (the study file's `seeds`) that have a run under RUNS; the table says which.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import yaml

from teacli.diagnostics.tail_fit import read_run
from teacli.eval.stats import grouped_bon, seed_prompt_bootstrap
from teacli.report.step_size import read_step_size

PREFIX = "gpu_bon_hard"
STUDY = Path(__file__).resolve().parents[2] / "recipes" / "studies" / "gpu_bon_hard_kl.yaml"
BETAS = {0.1: "", 0.03: "_b003", 0.01: "_b001"}
SCALED = {"grpo": "grpo_z", "tea": "tea_z"}


def plan_seeds() -> list[int]:
    return list(yaml.safe_load(STUDY.read_text())["seeds"])


def point(runs: Path, recipe: str, seeds: list[int], n: int, split: str = "heldout") -> dict | None:
    """The recipe's runs among `seeds`: per seed (KL, bo-n per prompt); their means. None when none was run."""
    have, kls, bons, ids = [], [], [], None
    for s in seeds:
        path = runs / f"{PREFIX}_{recipe}-s{s}"
        if not path.is_dir():
            continue
        run = read_run(path, recipe, "selected", split)
        if ids is None:
            ids = run.prompt_ids
        if run.prompt_ids != ids:
            raise SystemExit(f"hard_frontier.py: {path} was evaluated on other prompts than {recipe}'s first run")
        size = read_step_size(path, json.loads((path / "selected.json").read_text())["step"])
        if size is None or size.kl is None:
            raise SystemExit(f"hard_frontier.py: {path} has no KL at its selected checkpoint (metrics.jsonl)")
        have.append(s)
        kls.append(size.kl)
        bons.append(grouped_bon(run.rewards, n))
    if not have:
        return None
    bons = np.array(bons)
    return {"recipe": recipe, "seeds": have, "kl": float(np.mean(kls)), "kls": kls, "bon": float(bons.mean()),
            "per_prompt": bons, "ids": ids}


def on_frontier(frontier: list[dict], kl: float) -> float | None:
    """GRPO's frontier at this KL, linear in log KL between its neighbouring points; None outside its range."""
    pts = sorted(frontier, key=lambda p: p["kl"])
    for a, b in zip(pts, pts[1:]):
        if a["kl"] <= kl <= b["kl"]:
            t = (math.log(kl) - math.log(a["kl"])) / (math.log(b["kl"]) - math.log(a["kl"]))
            return a["bon"] + t * (b["bon"] - a["bon"])
    return None


def verdict(frontier: list[dict], tea: list[dict]) -> str:
    gaps = [p["bon"] - f for p in tea if (f := on_frontier(frontier, p["kl"])) is not None]
    if not gaps:
        return "no TEA point lies within GRPO's KL range: neither is shown higher"
    if all(g > 0 for g in gaps):
        return "TEA's frontier is higher"
    if all(g < 0 for g in gaps):
        return "TEA's frontier is lower"
    return "neither frontier is shown higher"


def table(runs: Path, n: int, resamples: int, seed: int, seeds: list[int] | None = None) -> tuple[str, dict]:
    seeds = plan_seeds() if seeds is None else seeds
    pts = {(m, b): point(runs, f"{m}{suffix}", seeds, n) for b, suffix in BETAS.items() for m in ("grpo", "tea")}
    scaled = {m: point(runs, r, seeds, n) for m, r in SCALED.items()}
    grpo = [p for (m, _), p in pts.items() if m == "grpo" and p is not None]
    tea = [p for (m, _), p in pts.items() if m == "tea" and p is not None]
    lines = [f"| method | beta | seeds | KL (nats) | bo{n} | GRPO's frontier at this KL | above it by |", "|---|---:|---|---:|---:|---:|---:|"]

    def row(label: str, beta: str, p: dict) -> None:
        f = on_frontier(grpo, p["kl"])
        kl = f"{p['kl']:.2f}" + (f" ({', '.join(f'{k:.2f}' for k in p['kls'])})" if len(p["kls"]) > 1 else "")
        lines.append(f"| {label} | {beta} | {', '.join(map(str, p['seeds']))} | {kl} | {p['bon']:.3f} | "
                     + (f"{f:.3f} | {p['bon'] - f:+.3f} |" if f is not None and label != "GRPO" else "– | – |"))

    for (m, b), p in sorted(pts.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        if p is not None:
            row(m.upper(), f"{b:g}", p)
    for m, p in scaled.items():
        if p is not None:
            row(f"{m.upper()}-Z", "0.1", p)
    lines += ["", f"**By the plan: {verdict(grpo, tea)}** (TEA's per-beta points within GRPO's KL range "
              f"{min(p['kl'] for p in grpo):.2f}–{max(p['kl'] for p in grpo):.2f} nats).", "",
              f"| TEA − GRPO at matched beta (bo{n}) | seeds | estimate | 95% interval (seed, prompt) |", "|---|---|---:|---|"]
    for b in BETAS:
        t, g = pts[("tea", b)], pts[("grpo", b)]
        if t is None or g is None:
            continue
        both = [s for s in t["seeds"] if s in g["seeds"]]
        if t["ids"] != g["ids"]:
            raise SystemExit(f"hard_frontier.py: TEA and GRPO at beta {b:g} were evaluated on other prompts")
        d = np.array([t["per_prompt"][t["seeds"].index(s)] - g["per_prompt"][g["seeds"].index(s)] for s in both])
        est, lo, hi = seed_prompt_bootstrap(d, None, both, None, resamples, seed)
        lines.append(f"| beta = {b:g} | {', '.join(map(str, both))} | {est:+.3f} | [{lo:+.3f}, {hi:+.3f}] |")
    return "\n".join(lines), {"points": pts, "scaled": scaled}


def plot(got: dict, n: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for m, colour in (("grpo", "tab:blue"), ("tea", "tab:orange")):
        pts = sorted((p for (k, _), p in got["points"].items() if k == m and p is not None), key=lambda p: p["kl"])
        ax.plot([p["kl"] for p in pts], [p["bon"] for p in pts], "o-", color=colour, label=f"{m.upper()} (beta 0.1, 0.03, 0.01)")
        for p in pts:
            ax.scatter(p["kls"], [float(v.mean()) for v in p["per_prompt"]], s=10, color=colour, alpha=0.4)
        z = got["scaled"][m]
        if z is not None:
            ax.plot([z["kl"]], [z["bon"]], "s", color=colour, markersize=8, label=f"{m.upper()}-Z")
    ax.set_xscale("log")
    ax.set_xlabel("KL to the reference at the selected checkpoint (nats)")
    ax.set_ylabel(f"best-of-{n} reward, held-out prompts")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="the seeds to read (default: the study file's)")
    ap.add_argument("--plot", type=Path, default=None, help="draw the frontier into this png")
    a = ap.parse_args()
    text, got = table(a.runs, a.n, a.bootstrap, a.seed, a.seeds)
    print(text)
    if a.plot:
        plot(got, a.n, a.plot)


if __name__ == "__main__":
    main()
