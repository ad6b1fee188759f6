"""The comparisons of `tea report`: each run against its own baseline, Best TTA, the extra W/T/L rows.

Pairing. Every run is compared with one baseline run: the one `pairs` names for it (`--pair
RUN=BASELINE`, a study's `pairs:`), else the default baseline (`--baseline`, else the first run).
A run that is itself a baseline (the default one or the target of a pair) is compared only when a
pair names it, so in the m-to-N study (Tab. m_to_n_scaling_full: "Deltas are TEA minus GRPO" at
matched m) TEA m=16 is compared with GRPO m=16 and GRPO m=16 with nothing.

Run roles come from each run's recipe.yaml `advantage.name`, never from run names:
  test-time-aware (TTA) rules  bon_max_mean, bon_max_second, bon_mean, chow, cat_bon (paper "Baselines")
  ours                         tea, prefix_tea
  GRPO-Z                       grpo_z (the paper's advantage-scale control)

Best TTA (Tab. main_core250_endpoint_summary: "the strongest cited test-time-aware baseline for each
column"): for each N, among the TTA runs with the default baseline's rollout budget m, the one with
the highest mean bo<N>; its delta, CI and W/T/L are against the default baseline. Runs at another m
(the compute-unmatched m = 128 stress tests) are not candidates: the paper reports them separately.
Ties go to the run listed first.

Extra W/T/L rows (Tab. core250_win_tie_loss: "TEA vs Best TTA", "TEA vs GRPO-Z"): for every run of
ours, against the Best TTA run of each column among the TTA runs at its own m, and against every
GRPO-Z run at its m that is not already its baseline. The paper prints these for TEA only; Prefix-TEA
gets them too (a superset, labelled by run).

Seeds and the base arm. A method whose seeds were pooled (teacli/report/pool.py) is one row whose
per-prompt values are the seed means: its mean, the Best TTA pick (the highest pooled mean) and W/T/L
(a prompt wins when the method's seed-averaged value beats the other's) use them as one run's values.
Its intervals count its seeds (below). Its seeds also get per-seed rows, each paired with the run of
the same seed of its baseline when the baseline is a pooled method with that seed. The base arm (the
untrained policy, `--base-arm`) is a frontier row every other run or method is compared with too
(method − base at every N, W/T/L); it never is a baseline, a Best TTA candidate or an "ours" run.

Statistics (teacli.eval.stats, paper appendix "Uncertainty estimates"): percentile 95% intervals with
the same resampled prompt indices for every N and every comparison, fixed by the seed, and
prompt-level win/tie/loss with ties at |difference| <= 1e-9, over the prompts common to all runs.
The intervals' levels (`levels`, `tea report --bootstrap-levels`): "prompts", the paired prompt
bootstrap of the (seed-averaged) per-prompt values; "seeds-prompts", the two-level bootstrap
(`stats.seed_prompt_bootstrap`: seeds, then prompts; seeds paired across two methods with the same
seed set, drawn apart otherwise; a method of one run adds no seed level); "auto" (the default),
seeds-prompts when some method has two or more seeds, else prompts. The per-seed rows are single
runs: their intervals are prompt-only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from teacli.eval import stats
from teacli.report.read import ReportError, RunEval

TTA_RULES = ("bon_max_mean", "bon_max_second", "bon_mean", "chow", "cat_bon")
OURS_RULES = ("tea", "prefix_tea")
GRPO_Z_RULE = "grpo_z"

LEVELS = ("auto", "prompts", "seeds-prompts")  # what the intervals resample (module docstring)

Interval = tuple[float, float, float]  # (value, lo, hi)
Counts = tuple[int, int, int]  # (win, tie, loss)


@dataclass(frozen=True)
class Pick:
    """The Best TTA run at one N, against the default baseline."""

    N: int
    run: str
    mean: float
    delta: Interval
    wtl: Counts


@dataclass(frozen=True)
class ExtraRow:
    """A W/T/L row whose opponent is not the run's baseline: per N, the run compared against."""

    label: str
    run: str
    against: list[str]  # per N
    wtl: list[Counts]  # per N


@dataclass(frozen=True)
class SeedRow:
    """One seed of a pooled method: its means per N and, when its baseline has the same seed, the paired delta."""

    method: str
    seed: int | None
    run: str
    checkpoint: int | str
    means: list[float]  # per N
    against: str | None  # the baseline's run of the same seed
    delta: list[Interval] | None  # per N


@dataclass
class Report:
    runs: list[RunEval]
    baseline: str  # the default baseline
    base_of: dict[str, str | None]  # run → the baseline its deltas use (None: not compared)
    split: str
    M: int
    N: list[int]
    prompts: list[str]  # common prompt ids, default-baseline order
    dropped: dict[str, int]  # run → prompts not common to all runs
    resamples: int
    seed: int
    endpoints: list[int]
    values: dict[str, np.ndarray]  # run → [P, len(N)] per-prompt grouped best-of-N
    frontier: dict[str, list[Interval]]  # run → per N (mean, lo, hi)
    deltas: dict[str, list[Interval]]  # compared run → per N (delta, lo, hi) against base_of[run]
    wtl: dict[str, list[Counts]]  # compared run → per N
    lengths: dict[str, tuple[float, int] | None]  # run → (mean tokens, completions) over common prompts
    length_delta: dict[str, float | None]  # compared run → mean tokens minus its baseline's
    tta_budget: int | None  # m of the Best TTA candidates (the default baseline's)
    best_tta: list[Pick]  # one per N when there are candidates, else empty
    extra: list[ExtraRow]
    base_arm: str | None = None  # the untrained policy's row
    vs_base: dict[str, list[Interval]] | None = None  # run → per N (delta, lo, hi) against the base arm
    wtl_base: dict[str, list[Counts]] | None = None  # run → per N, against the base arm
    seed_rows: list[SeedRow] | None = None  # every seed of every pooled method
    levels: str = "prompts"  # what the intervals resample: "prompts" or "seeds-prompts" ("auto" resolved)
    levels_requested: str = "auto"  # as asked (--bootstrap-levels)

    def compared(self) -> list[RunEval]:
        return [r for r in self.runs if self.base_of[r.name] is not None]

    def pooled(self) -> list[RunEval]:
        return [r for r in self.runs if r.seeds]

    def baselines_in_use(self) -> list[str]:
        return list(dict.fromkeys(b for b in self.base_of.values() if b is not None))


def baselines_of(names: Sequence[str], default: str, pairs: Mapping[str, str]) -> dict[str, str | None]:
    """run → its baseline: the pair's, else the default; None for a run that is a baseline and unpaired."""
    for run, base in pairs.items():
        if run not in names or base not in names:
            raise ReportError(f"pair {run}={base}: both must be reported runs ({', '.join(names)})")
        if run == base:
            raise ReportError(f"pair {run}={base}: a run cannot be its own baseline")
    targets = {default, *pairs.values()}
    return {n: pairs.get(n, None if n in targets else default) for n in names}


def _mean_tokens(r: RunEval, prompts: Sequence[str]) -> tuple[float, int] | None:
    if r.tokens is None:
        return None
    toks = [t for pid in prompts for t in r.tokens[pid]]
    return (float(np.mean(toks)), len(toks)) if toks else None


def _best_per_n(candidates: Sequence[RunEval], values: Mapping[str, np.ndarray], n_count: int) -> list[str]:
    """For each N index, the candidate with the highest mean over prompts (first listed on ties)."""
    out = []
    for j in range(n_count):
        best = max(range(len(candidates)), key=lambda i: (values[candidates[i].name][:, j].mean(), -i))
        out.append(candidates[best].name)
    return out


def check_levels(levels: str) -> None:
    if levels not in LEVELS:
        raise ReportError(f"--bootstrap-levels {levels!r}: expected one of {', '.join(LEVELS)}")


def resolve_levels(levels: str, runs: Sequence[RunEval]) -> str:
    """"auto" → "seeds-prompts" when some method has two or more seeds, else "prompts"; others as given."""
    check_levels(levels)
    if levels == "auto":
        return "seeds-prompts" if any(len(r.seeds) >= 2 for r in runs) else "prompts"
    return levels


def _seed_of(r: RunEval) -> int:
    if r.recipe is None or r.recipe.seed is None:
        raise ReportError(f"{r.path}: a pooled seed run without a recipe seed")
    return r.recipe.seed


def compare(runs: list[RunEval], baseline: str, resamples: int, seed: int, endpoints: Sequence[int] | None,
            pairs: Mapping[str, str] | None = None, base_arm: RunEval | None = None, levels: str = "auto") -> Report:
    """Frontier of every run, each compared run against its baseline, Best TTA and the extra W/T/L rows;
    with `base_arm` (listed last), every run against it too; per-seed rows of pooled methods. `levels`:
    what the intervals resample (module docstring)."""
    methods = list(runs)
    runs = methods + ([base_arm] if base_arm is not None else [])
    by_name = {r.name: r for r in runs}
    base = by_name[baseline]
    first = runs[0]
    Ns = first.N
    for r in runs[1:]:
        if r.N != Ns:
            raise ReportError(f"runs {first.name} and {r.name} report different N ({first.N} vs {r.N})")
    base_of = baselines_of([r.name for r in methods], baseline, dict(pairs or {}))
    if base_arm is not None:
        base_of[base_arm.name] = None
    common = set.intersection(*(set(r.per_prompt) for r in runs))
    prompts = [pid for pid in base.per_prompt if pid in common]
    if not prompts:
        raise ReportError(f"the runs share no evaluated prompt ({', '.join(r.name for r in runs)})")
    dropped = {r.name: len(r.per_prompt) - len(prompts) for r in runs if len(r.per_prompt) != len(prompts)}
    values = {r.name: np.array([r.per_prompt[pid] for pid in prompts], dtype=np.float64) for r in runs}
    if endpoints:
        twice = sorted({n for n in endpoints if list(endpoints).count(n) > 1})
        if twice:
            raise ReportError(f"--endpoints {','.join(map(str, endpoints))}: {', '.join(map(str, twice))} given twice; "
                              "name each column once")
        unknown = [n for n in endpoints if n not in Ns]
        if unknown:
            raise ReportError(f"--endpoints {unknown}: not among the evaluated N {Ns}")
        ends = list(endpoints)
    else:
        ends = Ns[-3:]
    J = range(len(Ns))
    chosen = resolve_levels(levels, runs)
    # run → ([S, P, len(N)] per-seed per-prompt values, seed labels); a run of one seed is [1, P, len(N)], None
    by_seed: dict[str, tuple[np.ndarray, list[int] | None]] = {r.name: (values[r.name][None], None) for r in runs}
    for r in runs:
        if r.seeds:
            per_seed = np.array([[s.per_prompt[pid] for pid in prompts] for s in r.seeds], dtype=np.float64)
            by_seed[r.name] = (per_seed, [_seed_of(s) for s in r.seeds])

    def interval(a: str, b: str | None, j: int) -> Interval:
        """a − b (b None: a's mean) at N index j, resampling what `chosen` says."""
        if chosen == "prompts":
            return (stats.paired_bootstrap(values[a][:, j], values[b][:, j], resamples, seed) if b is not None
                    else stats.bootstrap_mean(values[a][:, j], resamples, seed))
        (va, sa), (vb, sb) = by_seed[a], (by_seed[b] if b is not None else (None, None))
        return stats.seed_prompt_bootstrap(va[:, :, j], None if vb is None else vb[:, :, j], sa, sb, resamples, seed)

    def delta(a: str, b: str) -> list[Interval]:
        return [interval(a, b, j) for j in J]

    def wtl(a: str, b: str, j: int) -> Counts:
        return stats.win_tie_loss(values[a][:, j], values[b][:, j])

    frontier, deltas, counts, lengths, length_delta = {}, {}, {}, {}, {}
    for r in runs:
        frontier[r.name] = [interval(r.name, None, j) for j in J]
        lengths[r.name] = _mean_tokens(r, prompts)
    for r in runs:
        b = base_of[r.name]
        if b is None:
            continue
        deltas[r.name] = delta(r.name, b)
        counts[r.name] = [wtl(r.name, b, j) for j in J]
        mine, theirs = lengths[r.name], lengths[b]
        length_delta[r.name] = mine[0] - theirs[0] if mine and theirs else None

    vs_base = wtl_base = None
    if base_arm is not None:
        b = base_arm.name
        vs_base = {r.name: delta(r.name, b) for r in methods}
        wtl_base = {r.name: [wtl(r.name, b, j) for j in J] for r in methods}

    seed_rows = _seed_rows(methods, base_of, prompts, resamples, seed) if any(r.seeds for r in methods) else None

    def tta_at(m: int) -> list[RunEval]:
        return [r for r in methods if r.advantage in TTA_RULES and r.group_size == m and r.name != baseline]

    best_tta: list[Pick] = []
    candidates = tta_at(base.group_size)
    if candidates:
        for j, name in enumerate(_best_per_n(candidates, values, len(Ns))):
            ci = interval(name, baseline, j)
            best_tta.append(Pick(Ns[j], name, float(values[name][:, j].mean()), ci, wtl(name, baseline, j)))

    extra: list[ExtraRow] = []
    for r in methods:
        if r.advantage not in OURS_RULES:
            continue
        tta = tta_at(r.group_size)
        if tta:
            best = _best_per_n(tta, values, len(Ns))
            extra.append(ExtraRow(f"{r.name} vs Best TTA", r.name, best, [wtl(r.name, best[j], j) for j in J]))
        for z in methods:
            if z.advantage == GRPO_Z_RULE and z.group_size == r.group_size and z.name != base_of[r.name]:
                extra.append(ExtraRow(f"{r.name} vs {z.name}", r.name, [z.name] * len(Ns), [wtl(r.name, z.name, j) for j in J]))

    return Report(runs, baseline, base_of, first.split, first.M, Ns, prompts, dropped, resamples, seed, ends, values,
                  frontier, deltas, counts, lengths, length_delta, base.group_size if candidates else None, best_tta, extra,
                  base_arm.name if base_arm is not None else None, vs_base, wtl_base, seed_rows, chosen, levels)


def _seed_rows(methods: Sequence[RunEval], base_of: Mapping[str, str | None], prompts: Sequence[str],
               resamples: int, seed: int) -> list[SeedRow]:
    """Every seed of every pooled method over the report's prompts, paired seed by seed with its baseline's run
    of the same seed (when its baseline is pooled and has that seed)."""
    by_name = {r.name: r for r in methods}

    def arr(r: RunEval) -> np.ndarray:
        return np.array([r.per_prompt[pid] for pid in prompts], dtype=np.float64)

    rows = []
    for r in methods:
        b = base_of.get(r.name)
        theirs = {s.recipe.seed: s for s in by_name[b].seeds if s.recipe} if b is not None else {}
        for s in r.seeds:
            mine = arr(s)
            other = theirs.get(s.recipe.seed if s.recipe else None)
            delta = None
            if other is not None:
                o = arr(other)
                delta = [stats.paired_bootstrap(mine[:, j], o[:, j], resamples, seed) for j in range(len(r.N))]
            rows.append(SeedRow(r.name, s.recipe.seed if s.recipe else None, s.name, s.checkpoint,
                                [float(x) for x in mine.mean(axis=0)], other.name if other is not None else None, delta))
    return rows
