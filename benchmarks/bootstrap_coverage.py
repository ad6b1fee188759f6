"""Coverage of `tea report`'s intervals when methods have several seeds: simulate runs, count how often
each 95% interval covers the true difference, print a table.

    python benchmarks/bootstrap_coverage.py [--replications 500] [--resamples 1000] [--prompts 48]

Each replication simulates two methods A and B, S seeds each, evaluated on the same P prompts; the
per-seed per-prompt value (a run's grouped best-of-N on a prompt) is

    V_k[s, p] = mu_k + b_p + g_kp + u_s + w_ks + e_ksp

b_p the prompt's difficulty (shared by every run), g_kp the method × prompt effect, u_s the part of a
run's effect that seed s shares across methods (the same data order and sampling seed: it cancels when
seeds are paired), w_ks the method's own run-to-run effect, e_ksp run × prompt noise (evaluation
sampling included); all normal with mean 0, so the true difference is mu_A − mu_B. Pairing:
`paired` A and B share seeds 0..S−1; `unpaired` B has other seeds (u not shared, drawn apart);
`vs base` B is one untrained run (no run effect, one row, like `--base-arm`).

Intervals (all percentile 95%, the same prompt draws): `prompts` the paired prompt bootstrap of the
seed-averaged values (`--bootstrap-levels prompts`), `naive` seeds then prompts without the
small-sample scaling (the mean of V over drawn seeds × drawn prompts: a reference, not shipped),
`seeds-prompts` the shipped two-level bootstrap (teacli.eval.stats.seed_prompt_bootstrap). A cell is
coverage / mean width. The binomial SD of a coverage near 0.95 is sqrt(0.95 · 0.05 / R): ±0.0097 at
R = 500. The last line times one seed_prompt_bootstrap call at 1,000 resamples × 500 prompts × 5 seeds.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from teacli.eval import stats

# name → (sigma_g, sigma_u, sigma_w, sigma_e); sigma_b (difficulty) is 0.1 everywhere and cancels in pairs
REGIMES = {
    "seed-dominated": (0.01, 0.02, 0.02, 0.02),
    "mixed": (0.02, 0.01, 0.006, 0.03),
    "noise-dominated": (0.005, 0.0, 0.0, 0.08),
    "no seed effect": (0.03, 0.0, 0.0, 0.01),
}
PAIRINGS = ("paired", "unpaired", "vs base")
DELTA = 0.01  # mu_A − mu_B


Replication = tuple[np.ndarray, np.ndarray, list[int], list[int] | None]


def simulate(rng: np.random.Generator, regime: str, pairing: str, S: int, P: int) -> Replication:
    """One replication → (A[S, P], B[S_B, P], A's seeds, B's seeds or None for one run)."""
    sg, su, sw, se = REGIMES[regime]
    b = rng.normal(0.0, 0.1, P)
    u = rng.normal(0.0, su, S)[:, None]
    a_vals = DELTA + b + rng.normal(0.0, sg, P) + u + rng.normal(0.0, sw, S)[:, None] + rng.normal(0.0, se, (S, P))
    if pairing == "vs base":
        return a_vals, (b + rng.normal(0.0, sg, P) + rng.normal(0.0, se, P))[None, :], list(range(S)), None
    u_b = u if pairing == "paired" else rng.normal(0.0, su, S)[:, None]
    b_vals = b + rng.normal(0.0, sg, P) + u_b + rng.normal(0.0, sw, S)[:, None] + rng.normal(0.0, se, (S, P))
    return a_vals, b_vals, list(range(S)), list(range(S)) if pairing == "paired" else list(range(S, 2 * S))


def naive(a: np.ndarray, b: np.ndarray, seeds_a: list[int], seeds_b: list[int] | None, resamples: int,
          seed: int) -> tuple[float, float]:
    """Seeds then prompts with no scaling: the mean of V over the drawn seeds and the drawn prompts."""
    P = a.shape[1]
    idx = stats.bootstrap_indices(P, resamples, seed)

    def draw(v: np.ndarray, seeds: list[int] | None) -> np.ndarray:
        if seeds is None or len(seeds) < 2:
            rows = np.broadcast_to(v.mean(axis=0), (resamples, P))
        else:
            rows = v[stats.seed_indices(seeds, resamples, seed)].mean(axis=1)  # [resamples, P]: drawn seeds' mean
        return np.take_along_axis(rows, idx, axis=1).mean(axis=1)

    if seeds_b == seeds_a:
        means = draw(a - b, seeds_a)
    else:
        means = draw(a, seeds_a) - draw(b, seeds_b)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def coverage(regime: str, pairing: str, S: int, P: int, replications: int, resamples: int,
             seed: int = 0) -> dict[str, tuple[float, float]]:
    """interval → (coverage of DELTA, mean width) over `replications` simulated reports."""
    rng = np.random.default_rng([seed, S, P, list(REGIMES).index(regime), PAIRINGS.index(pairing)])
    hits = {"prompts": 0, "naive": 0, "seeds-prompts": 0}
    width = dict.fromkeys(hits, 0.0)
    for r in range(replications):
        a, b, sa, sb = simulate(rng, regime, pairing, S, P)
        got = {
            "prompts": stats.paired_bootstrap(a.mean(axis=0), b.mean(axis=0), resamples, r)[1:],
            "naive": naive(a, b, sa, sb, resamples, r),
            "seeds-prompts": stats.seed_prompt_bootstrap(a, b, sa, sb, resamples, r)[1:],
        }
        for k, (lo, hi) in got.items():
            hits[k] += lo <= DELTA <= hi
            width[k] += hi - lo
    return {k: (hits[k] / replications, width[k] / replications) for k in hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=500)
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 4, 5, 10])
    args = parser.parse_args()

    sd = math.sqrt(0.95 * 0.05 / args.replications)
    print(f"R={args.replications} replications, {args.resamples} resamples, P={args.prompts}; binomial SD at 0.95: {sd:.4f}")
    print("| regime | pairing | S | prompts | naive | seeds-prompts |")
    print("|---|---|---:|---:|---:|---:|")
    for regime in REGIMES:
        for pairing in PAIRINGS:
            for S in args.seeds:
                c = coverage(regime, pairing, S, args.prompts, args.replications, args.resamples)
                cells = " | ".join(f"{c[k][0]:.3f} / {c[k][1]:.4f}" for k in ("prompts", "naive", "seeds-prompts"))
                print(f"| {regime} | {pairing} | {S} | {cells} |", flush=True)

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 500)), rng.normal(size=(5, 500))
    stats.seed_prompt_bootstrap(a, b, range(5), range(5))  # warm-up: the scipy.special import
    times = []
    for _ in range(20):
        start = time.perf_counter()
        stats.seed_prompt_bootstrap(a, b, range(5), range(5))
        times.append(time.perf_counter() - start)
    print(f"seed_prompt_bootstrap, 1000 resamples x 500 prompts x 5 seeds: median {1e3 * float(np.median(times)):.1f} ms")


if __name__ == "__main__":
    main()
