"""The report driver: run directories → comparisons → tables and plots under `--out`.

`read.py` reads and checks the run directories (bon.json, completion records, judge records,
recipe.yaml), `compare.py` computes every comparison (each run against its own baseline, Best TTA,
the extra W/T/L rows), this module lays them out as the paper's tables and writes them.

Every run must have been evaluated on the same split with the same M; otherwise the report stops
with an error naming each run and what it has. Comparisons are paired over the prompts common to
all runs (normally all of them; the report says when some were dropped).

Outputs (`--out`, default report/): report.md (everything, with the notes saying how each row was
chosen), report.tex, summary.json, one <table>.md/.tex/.csv per table, frontier.png, delta.png (when some run is
compared with a baseline) and,
where the runs' completion records are there, reward_distribution.png (pooled completion rewards per
run, plus the base policy's from eval/base/ when it was evaluated; Fig. `fig:mechanism_reward_distribution`).
Table layouts follow the paper:
  frontier      Method | Budget | Step | bo1 … boM                         (tab:core250_full_baseline_results)
  endpoints     Method | [Baseline] | Δbo(M/4) | Δbo(M/2) | ΔboM, + Best TTA (tab:main_core250_endpoint_summary)
  win_tie_loss  Comparison | bo(M/4) | bo(M/2) | boM, cells "W/T/L" in %   (tab:core250_win_tie_loss, m_to_n_bo512_wtl)
  paired        Method | Baseline | Budget | per N: baseline, run, Δ [CI] | Length Δ  (tab:m_to_n_scaling_full,
                                                                                       target_n_ablation)
  best_tta      N | Best TTA | bo<N> | baseline | Δ [95% CI] | W/T/L       (the Best TTA row, every N)
  deltas_<run>  N | <baseline> | <run> | Δ [95% CI] | W/T/L                (tab:hh_helpful_full_robustness)
  length        Method | Mean length | Source samples                    (tab:core250_length_check)
  step_size     Method | Step | KL | Adv. std | Grad norm | Clipped     (not in the paper: the step-size confound)
  judge         Method | Sel. | Baseline | W–L | Win | Invalid           (tab:deepseek_v4pro_checks)

The output directory is replaced whole: everything is written to a temporary directory beside
`--out` and renamed into place at the end, so a failure leaves the earlier report as it was and a
reused `--out` holds no file from an earlier report. `.tea-report` lists the files a report wrote;
a non-empty `--out` without it (or holding files it does not list) is refused, so no user file is
ever replaced.

Imports only the standard library, numpy, PyYAML and matplotlib (docs/architecture.md import rule).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teacli import tables as T
from teacli.eval import stats
from teacli.monitors import hacking
from teacli.report.compare import GRPO_Z_RULE, OURS_RULES, TTA_RULES, Report, check_levels, compare
from teacli.report.read import (  # noqa: F401  (re-exported: the report's reading API)
    JudgeRow,
    ReportError,
    RunEval,
    available_evals,
    check_same_generation,
    check_same_reward,
    choose_eval,
    default_report_runs,
    eval_dir,
    load_run,
    read_bon,
    read_judge,
    read_recipe,
    read_records,
    run_names,
)
from teacli.report.step_size import WINDOW as STEP_WINDOW
from teacli.report.step_size import pooled as pooled_step_size
from teacli.report.step_size import read_step_size
from teacli.rundir import writing

MANIFEST = ".tea-report"


# ------------------------------------------------------------------------------------------------
# Tables


def _budget(r: RunEval, rep: Report | None = None) -> str:
    """m=64, or m=64,k=32 for BoN mean (the paper's Budget column); "untrained" for the base arm."""
    if rep is not None and r.name == rep.base_arm:
        return "untrained"
    k = r.params.get("k") if r.advantage == "bon_mean" else None
    return f"m={r.group_size}" + (f",k={k}" if k is not None else "")


def _cols(Ns: Sequence[int], wanted: Sequence[int]) -> list[tuple[int, int]]:
    idx = {n: j for j, n in enumerate(Ns)}
    return [(n, idx[n]) for n in wanted]


def _picks_text(rep: Report, Ns: Sequence[int]) -> str:
    """'bo64: a; bo128, bo256: b' — which run is Best TTA in each of these columns."""
    by_n = {p.N: p.run for p in rep.best_tta}
    groups: dict[str, list[int]] = {}
    for n in Ns:
        groups.setdefault(by_n[n], []).append(n)
    return "; ".join(f"{', '.join(f'bo{n}' for n in ns)}: {run}" for run, ns in groups.items())


def seed_sets(rep: Report) -> dict[str, list[int]]:
    """Each pooled method → its seeds."""
    return {r.name: sorted(s.recipe.seed for s in r.seeds if s.recipe and s.recipe.seed is not None) for r in rep.runs if r.seeds}


def interval_name(rep: Report) -> str:
    """The tables' name for the intervals' method (rep.levels)."""
    if rep.levels == "seeds-prompts":
        return "two-level paired bootstrap (seeds, then prompts)"
    return "paired prompt bootstrap"


def make_tables(rep: Report) -> list[T.Table]:
    Ns, P = rep.N, len(rep.prompts)
    where = f"{rep.split} ({P} prompts, M={rep.M})"
    ci = f"{interval_name(rep)} 95% CI, {rep.resamples} resamples, seed {rep.seed}"
    compared = rep.compared()
    several = len(rep.baselines_in_use()) > 1
    ends = _cols(Ns, rep.endpoints)
    out = []

    frontier = T.Table("frontier", f"Best-of-N frontier on {where}: mean grouped best-of-N reward; Step = evaluated checkpoint",
                       ["Method", "Budget", "Step", *[f"bo{n}" for n in Ns]])
    for r in rep.runs:
        frontier.rows.append([r.name, _budget(r, rep), r.checkpoint, *[rep.frontier[r.name][j][0] for j in range(len(Ns))]])
    out.append(frontier)

    if compared:
        against = "each run's baseline (the Baseline column)" if several else rep.baseline
        caption = f"High-N endpoint results on {where}: improvement over {against} ({ci})"
        if rep.best_tta:
            caption += (f". Best TTA: the test-time-aware run (m={rep.tta_budget}) with the highest mean in each column, "
                        f"against {rep.baseline} ({_picks_text(rep, rep.endpoints)})")
        endpoints = T.Table("endpoints", caption, ["Method", *(["Baseline"] if several else []), *[f"Δbo{n}" for n in rep.endpoints]])
        for r in compared:
            endpoints.rows.append([r.name, *([rep.base_of[r.name]] if several else []),
                                   *[T.Delta(*rep.deltas[r.name][j]) for _, j in ends]])
        if rep.best_tta:
            endpoints.midrule_before.add(len(endpoints.rows))
            endpoints.rows.append(["Best TTA", *([rep.baseline] if several else []), *[T.Delta(*rep.best_tta[j].delta) for _, j in ends]])
        out.append(endpoints)

        caption = f"Prompt-level win/tie/loss (%) on {where}; tie = |diff| <= 1e-9"
        if rep.pooled():
            caption += "; a pooled method's value on a prompt is its mean over seeds"
        if rep.extra:
            caption += "; 'vs Best TTA' rows: per column the best test-time-aware run at the same m"
        wtl = T.Table("win_tie_loss", caption, ["Comparison", *[f"bo{n}" for n in rep.endpoints]])
        for r in compared:
            wtl.rows.append([f"{r.name} vs {rep.base_of[r.name]}", *[T.WTL(*rep.wtl[r.name][j]) for _, j in ends]])
        if rep.extra:
            wtl.midrule_before.add(len(wtl.rows))
        for row in rep.extra:
            wtl.rows.append([row.label, *[T.WTL(*row.wtl[j]) for _, j in ends]])
        if rep.wtl_base:
            wtl.midrule_before.add(len(wtl.rows))
            for name, counts in rep.wtl_base.items():
                wtl.rows.append([f"{name} vs {rep.base_arm}", *[T.WTL(*counts[j]) for _, j in ends]])
        out.append(wtl)

        paired = T.Table("paired", f"Each run against its baseline on {where}: best-of-N means, delta ({ci}); "
                         "Length Δ = mean completion tokens minus the baseline's",
                         ["Method", "Baseline", "Budget",
                          *[h for n in rep.endpoints for h in (f"Baseline bo{n}", f"Method bo{n}", f"Δbo{n} [95% CI]")], "Length Δ"])
        for r in compared:
            b = rep.base_of[r.name]
            cells: list[T.Cell] = []
            for _, j in ends:
                cells += [rep.frontier[b][j][0], rep.frontier[r.name][j][0], T.Delta(*rep.deltas[r.name][j])]
            dl = rep.length_delta[r.name]
            paired.rows.append([r.name, b, _budget(r), *cells, None if dl is None else f"{dl:+.1f}"])
        out.append(paired)

    if rep.best_tta:
        best = T.Table("best_tta", f"Best TTA on {where}: per N, the test-time-aware run (m={rep.tta_budget}) with the highest "
                       f"mean bo<N>, against {rep.baseline} ({ci}; W/T/L in %)",
                       ["N", "Best TTA", "bo<N>", rep.baseline, "Δ [95% CI]", "W/T/L"])
        for j, p in enumerate(rep.best_tta):
            best.rows.append([p.N, p.run, p.mean, rep.frontier[rep.baseline][j][0], T.Delta(*p.delta), T.WTL(*p.wtl)])
        out.append(best)

    for r in compared:
        b = rep.base_of[r.name]
        t = T.Table(f"deltas_{_safe(r.name)}", f"{r.name} vs {b} on {where}: best-of-N values, delta ({ci}) and W/T/L (%)",
                    ["N", b, r.name, "Δ [95% CI]", "W/T/L"])
        for j, n in enumerate(Ns):
            t.rows.append([n, rep.frontier[b][j][0], rep.frontier[r.name][j][0], T.Delta(*rep.deltas[r.name][j]),
                           T.WTL(*rep.wtl[r.name][j])])
        out.append(t)

    if rep.vs_base:
        names = list(rep.vs_base)
        t = T.Table("vs_base", f"Each run minus the untrained policy ({rep.base_arm}) on {where}: delta of mean grouped "
                    f"best-of-N ({ci})", ["N", rep.base_arm, *[f"{n} − base" for n in names]])
        for j, n in enumerate(Ns):
            t.rows.append([n, rep.frontier[rep.base_arm][j][0], *[T.Delta(*rep.vs_base[name][j]) for name in names]])
        out.append(t)

    if rep.seed_rows:
        pooled = ", ".join(f"{r.name} ({len(r.seeds)} seeds)" for r in rep.pooled())
        t = T.Table("seeds", f"Every seed of the pooled methods on {where} ({pooled}): mean grouped best-of-N of each seed "
                    f"run and its delta to its baseline's run of the same seed (one run each: paired prompt bootstrap 95% CI, "
                    f"{rep.resamples} resamples, seed {rep.seed})",
                    ["Method", "Seed", "Run", "Step", *[f"bo{n}" for n in rep.endpoints], "Baseline run",
                     *[f"Δbo{n} [95% CI]" for n in rep.endpoints]])
        for row in rep.seed_rows:
            t.rows.append([row.method, row.seed, row.run, row.checkpoint, *[row.means[j] for _, j in ends], row.against,
                           *[T.Delta(*row.delta[j]) if row.delta else None for _, j in ends]])
        out.append(t)

    length = T.Table("length", f"Mean completion length (generated tokens) on {where}", ["Method", "Mean length", "Source samples"])
    for r in rep.runs:
        got = rep.lengths[r.name]
        length.rows.append([r.name, None, None] if got is None else [r.name, f"{got[0]:.1f}", got[1]])
    out.append(length)

    sizes = step_size_rows(rep.runs)
    if sizes:
        t = T.Table("step_size", f"Step size of each method's training (docs/evaluation.md, \"Step size\"): KL = the mean recorded "
                    f"KL to the reference (nats) over the {STEP_WINDOW} steps ending at the evaluated checkpoint (a pooled method: "
                    f"the mean over seeds, each seed's beside it); Adv. std and Grad norm (before clipping) = means over training; "
                    f"Clipped = share of steps clipped", ["Method", "Step", "KL", "Adv. std", "Grad norm", "Clipped"])
        t.rows.extend(sizes)
        out.append(t)

    cells = {r.name: hacking.report_cells([s.path for s in r.seeds] or [r.path]) for r in rep.runs}
    if any(flagged != "–" for _, flagged in cells.values()):  # a run that declared validation.watch_patterns
        watch = T.Table("watch", "Reward-hacking watch (docs/diagnostics.md): Jumps = steps where the batch's best reward "
                        "jumped (per seed run); Flagged = share of the best-of-N picks matching validation.watch_patterns",
                        ["Method", "Jumps", "Flagged"])
        for r in rep.runs:
            watch.rows.append([r.name, *cells[r.name]])
        out.append(watch)

    judge_rows = [(r, j) for r in rep.runs for j in r.judge if j.win + j.loss]  # a failed judge (no valid verdict): in notes
    if judge_rows:
        judge = T.Table("judge", "Pairwise judge: W–L = this run's wins – the other run's wins; Win = W / (W + L); Invalid = no verdict",
                        ["Method", "Sel.", "Baseline", "W–L", "Win", "Invalid"])
        for r, j in judge_rows:
            win = f"{100.0 * j.win / (j.win + j.loss):.1f}%" if j.win + j.loss else None
            judge.rows.append([r.name, f"bo{j.N}", j.other, T.WL(j.win, j.loss), win, j.invalid])
        out.append(judge)
    return out


def step_size_rows(runs: Sequence[RunEval]) -> list[list[T.Cell]]:
    """The step_size table's rows (teacli/report/step_size.py); none when no run has training metrics."""
    def fmt(x: float | None, spec: str) -> str | None:
        return None if x is None else format(x, spec)

    rows, any_metrics = [], False
    for r in runs:
        members = r.seeds or [r]
        sizes = [read_step_size(m.path, m.checkpoint) for m in members]
        size = sizes[0] if len(sizes) == 1 else pooled_step_size(sizes)
        any_metrics |= size is not None
        if size is None:
            rows.append([r.name, r.checkpoint, None, None, None, None])
            continue
        kl = fmt(size.kl, ".3g")
        if len(members) > 1 and kl is not None:
            kl += " (" + " ".join(f"s{m.recipe.seed if m.recipe else '?'}:{fmt(s.kl, '.3g') if s and s.kl is not None else '–'}"
                                  for m, s in zip(members, sizes)) + ")"
        rows.append([r.name, r.checkpoint, kl, fmt(size.adv_std, ".3f"), fmt(size.grad_norm, ".3g"),
                     None if size.clipped is None else f"{100 * size.clipped:.0f}%"])
    return rows if any_metrics else []


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


# ------------------------------------------------------------------------------------------------
# Notes and summary


def judge_warnings(rep: Report) -> list[str]:
    """A judge file without any valid verdict is left out of the judge table (report.md's notes say so too): a line
    for stderr each."""
    return [f"{r.name}: judge/{j.other}-bo{j.N}.jsonl has no valid verdict ({j.invalid} invalid); left out "
            f"of the judge table (rerun tea judge with --retry-invalid)" for r in rep.runs for j in r.judge if not j.win + j.loss]


def notes(rep: Report) -> list[str]:
    """How the report was computed and how each row was chosen (the top of report.md)."""
    pairs = [(r, b) for r, b in rep.base_of.items() if b is not None and b != rep.baseline]
    unpaired = [r for r, b in rep.base_of.items() if b is None and r not in (rep.baseline, rep.base_arm)]
    lines = [
        f"Split {rep.split}, M = {rep.M} completions per prompt, {len(rep.prompts)} prompts, the same for every run.",
        f"Baseline: {rep.baseline}" + (f"; pairs (run vs its own baseline): {', '.join(f'{r} vs {b}' for r, b in pairs)}" if pairs else "")
        + (f"; not compared (they are baselines): {', '.join(unpaired)}" if unpaired else "") + ".",
        f"Intervals: {interval_name(rep)}, {rep.resamples} resamples, seed {rep.seed}, 95% percentile interval"
        f" (--bootstrap-levels {rep.levels_requested}" + (f" → {rep.levels}" if rep.levels_requested == "auto" else "") + "). "
        + _levels_note(rep) + " Ties: |difference| <= 1e-9.",
        "bo<N>: grouped best-of-N (M/N consecutive groups of N, mean of group maxima per prompt, mean over prompts).",
        "Runs: " + "; ".join(f"{r.name} ({r.advantage}, {_budget(r, rep)}, checkpoint {r.checkpoint})" for r in rep.runs) + ".",
        "Roles come from each run's recipe.yaml advantage.name: test-time-aware (TTA) = " + ", ".join(TTA_RULES)
        + "; ours = " + ", ".join(OURS_RULES) + f"; GRPO-Z = {GRPO_Z_RULE}.",
    ]
    for r in rep.pooled():
        lines.append(f"{r.name}: {len(r.seeds)} seeds pooled ({', '.join(s.name for s in r.seeds)}; recipes equal but for "
                     "seed): per prompt and N, the mean over seeds of the grouped best-of-N; means, W/T/L and the Best TTA "
                     "pick use those seed-averaged values"
                     + ("; intervals resample its seeds, then prompts" if rep.levels == "seeds-prompts" else
                        "; intervals resample prompts only (no run-to-run variance)")
                     + "; mean length pools every completion of every seed; per-seed rows in `seeds` (prompt-only intervals).")
    if rep.base_arm:
        lines.append(f"Base arm: {rep.base_arm}, the untrained policy (eval/base/); every run's delta to it at every N "
                     "is in `vs_base`, its W/T/L in the last rows of `win_tie_loss`.")
    if rep.best_tta:
        lines.append(f"Best TTA: for each N, the TTA run with m={rep.tta_budget} (the baseline's budget; other m are "
                     f"compute-unmatched and not candidates) with the highest mean bo<N>, against {rep.baseline}: "
                     + _picks_text(rep, rep.N) + ".")
    if rep.extra:
        lines.append("Extra W/T/L rows: each run with an 'ours' rule against the Best TTA run of each column at its own m, "
                     "and against each GRPO-Z run at its m that is not its baseline: "
                     + "; ".join(f"{x.label} ({', '.join(dict.fromkeys(x.against))})" for x in rep.extra) + ".")
    failed = [f"{r.name}/judge/{j.other}-bo{j.N}.jsonl ({j.invalid} invalid)" for r in rep.runs for j in r.judge if not j.win + j.loss]
    if failed:
        lines.append("Judge files with no valid verdict (every reply failed to parse; rerun `tea judge` with --retry-invalid) "
                     "are left out of `judge`: " + ", ".join(failed) + ".")
    if rep.dropped:
        lines.append("Prompts not common to all runs were left out: "
                     + ", ".join(f"{n}: {k}" for n, k in rep.dropped.items()) + ".")
    return lines


def _levels_note(rep: Report) -> str:
    """What the chosen levels count, and how seeds were paired."""
    if rep.levels == "prompts":
        if any(r.seeds for r in rep.runs):
            return ("Prompts only: the intervals leave out run-to-run (seed) variance, though some methods have "
                    "several seeds.")
        return "Prompts only: every method is one run, so run-to-run variance is not measured."
    sets = seed_sets(rep)
    single = [r.name for r in rep.runs if not r.seeds and r.name != rep.base_arm]
    text = ("Seeds, then prompts: each resample draws each method's seeds with replacement and the prompts with "
            "replacement; two methods with the same seed set are paired seed by seed, others are drawn apart.")
    if len({tuple(v) for v in sets.values()}) > 1:
        text += " Seed sets: " + "; ".join(f"{n} {v}" for n, v in sets.items()) + "."
    if single:
        text += f" One run (no seed level, its run-to-run variance not counted): {', '.join(single)}."
    return text


def _markdown_report(rep: Report, tabs: list[T.Table], pngs: list[Path]) -> str:
    parts = ["# Best-of-N report", "", *[f"- {line}" for line in notes(rep)], ""]
    for t in tabs:
        parts += [T.markdown(t)]
    for p in pngs:
        parts += [f"![{p.stem}]({p.name})", ""]
    if pngs and not rep.deltas:
        why = (f"{rep.runs[0].name} is the only run" if len(rep.runs) == 1 else "no run is compared with a baseline")
        parts += [f"No delta plot: {why}, so there is no delta to show; give two or more run directories to compare them.", ""]
    return "\n".join(parts)


def _summary(rep: Report) -> dict[str, Any]:
    return {
        "split": rep.split, "M": rep.M, "N": rep.N, "prompts": len(rep.prompts), "baseline": rep.baseline,
        "bootstrap": {"resamples": rep.resamples, "seed": rep.seed, "level": 0.95, "interval": "percentile",
                      "levels": rep.levels, "levels_requested": rep.levels_requested, "method": interval_name(rep),
                      "seed_sets": seed_sets(rep) or None},
        "runs": {
            r.name: {
                "path": str(r.path), "checkpoint": r.checkpoint, "group_size": r.group_size, "advantage": r.advantage,
                "baseline": rep.base_of[r.name],
                "mean": [f[0] for f in rep.frontier[r.name]],
                "mean_ci": [[f[1], f[2]] for f in rep.frontier[r.name]],
                "delta": [list(d) for d in rep.deltas.get(r.name, [])] or None,
                "win_tie_loss": [list(w) for w in rep.wtl.get(r.name, [])] or None,
                "mean_tokens": rep.lengths[r.name][0] if rep.lengths[r.name] else None,
                "samples": rep.lengths[r.name][1] if rep.lengths[r.name] else None,
                "length_delta": rep.length_delta.get(r.name),
                "judge": [vars(j) for j in r.judge],
                "delta_vs_base": [list(d) for d in (rep.vs_base or {}).get(r.name, [])] or None,
                "win_tie_loss_vs_base": [list(w) for w in (rep.wtl_base or {}).get(r.name, [])] or None,
                "seeds": [{"run": x.run, "seed": x.seed, "checkpoint": x.checkpoint, "mean": x.means, "against": x.against,
                           "delta": [list(d) for d in x.delta] if x.delta else None}
                          for x in (rep.seed_rows or []) if x.method == r.name] or None,
            }
            for r in rep.runs
        },
        "base_arm": rep.base_arm,
        "best_tta": [{"N": p.N, "run": p.run, "mean": p.mean, "delta": list(p.delta), "win_tie_loss": list(p.wtl)}
                     for p in rep.best_tta] or None,
        "extra_win_tie_loss": [{"label": x.label, "run": x.run, "against": x.against, "win_tie_loss": [list(w) for w in x.wtl]}
                               for x in rep.extra],
    }


# ------------------------------------------------------------------------------------------------
# The output directory: written aside, renamed into place


def check_out(out: Path) -> None:
    """Refuse an --out that is a file, or a non-empty directory that an earlier report did not write."""
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: is a file; give a directory (default report/)")
    if not out.is_dir():
        return
    entries = {p.name for p in out.iterdir()}
    if not entries:
        return
    manifest = out / MANIFEST
    if not manifest.is_file():
        raise ReportError(f"--out {out}: holds files that `tea report` did not write (no {MANIFEST} manifest); "
                          "empty it or choose another directory")
    try:
        listed = set(json.loads(manifest.read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ReportError(f"{manifest}: not a report manifest; empty {out} or choose another --out") from None
    foreign = sorted(entries - listed - {MANIFEST})
    if foreign:
        raise ReportError(f"--out {out}: holds {', '.join(foreign[:5])}{' …' if len(foreign) > 5 else ''}, which the "
                          "earlier report there did not write; move them or choose another directory")


def _publish(staging: Path, out: Path) -> None:
    """Replace `out` by `staging` (same parent, so each step is one rename)."""
    if out.is_dir():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out)


def reward_distributions(rep: Report, runs: Sequence[RunEval], checkpoint: str) -> dict[str, list[float]]:
    """Pooled completion rewards per run over the report's prompts (runs with records only), plus the
    base policy's (eval/base/ of the first run that has it for this split and M) unless the report is
    of the base evaluations already."""
    prompts = list(rep.prompts)
    out = {r.name: [x for pid in prompts for x in r.rewards[pid]] for r in runs if r.rewards is not None}
    if checkpoint == "base" or not out:
        return out
    for r in runs:
        directory = eval_dir(r.path, "base")
        bon, records = directory / f"{rep.split}-M{rep.M}.bon.json", directory / f"{rep.split}-M{rep.M}.jsonl"
        if bon.is_file() and records.is_file():
            _, _, per_prompt = read_bon(bon, rep.split, rep.M)
            _, rewards = read_records(records, rep.M, list(per_prompt))
            out[f"base ({r.name})"] = [x for pid in prompts if pid in rewards for x in rewards[pid]]
            break
    return out


def write_outputs(rep: Report, tabs: list[T.Table], directory: Path, plots: bool = True,
                  distributions: Mapping[str, Sequence[float]] | None = None) -> list[Path]:
    """Every table, plot, report.md/.tex and summary.json into `directory` (the staging directory)."""
    files = [p for ps in T.write_all(tabs, directory).values() for p in ps]
    pngs = []
    if plots:
        from teacli.report import plots as PL

        title = f"{rep.split}, M={rep.M}, {len(rep.prompts)} prompts"
        pngs.append(PL.plot_frontier(rep.N, {r.name: tuple(zip(*rep.frontier[r.name])) for r in rep.runs},
                                     directory / "frontier.png", f"Best-of-N frontier ({title})"))
        several = len(rep.baselines_in_use()) > 1
        if rep.deltas:  # one run: nothing to take a delta of (report.md says so instead of an empty plot)
            pngs.append(PL.plot_delta(rep.N, {f"{n} − {rep.base_of[n]}": tuple(zip(*d)) for n, d in rep.deltas.items()},
                                      "its baseline" if several else rep.baseline, directory / "delta.png",
                                      f"Delta to {'each run’s baseline' if several else rep.baseline} ({title})"))
        if distributions:
            pngs.append(PL.plot_reward_distribution(distributions, directory / "reward_distribution.png",
                                                    f"Pooled completion rewards ({title})"))
    (directory / "report.md").write_text(_markdown_report(rep, tabs, pngs))
    (directory / "report.tex").write_text("\n".join(T.latex(t) for t in tabs))
    (directory / "summary.json").write_text(json.dumps(_summary(rep), indent=2) + "\n")
    return files + pngs + [directory / "report.md", directory / "report.tex", directory / "summary.json"]


# ------------------------------------------------------------------------------------------------
# The driver


def parse_pairs(items: Sequence[str]) -> dict[str, str]:
    """`--pair RUN=BASELINE` options (repeatable) → {run: its baseline}; a malformed item or a run given two
    baselines is a ReportError naming it."""
    pairs: dict[str, str] = {}
    for item in items:
        run, sep, base = item.partition("=")
        if not sep or not run.strip() or not base.strip():
            raise ReportError(f"--pair {item!r}: expected RUN=BASELINE, e.g. --pair runs/tea_m16=runs/grpo_m16")
        if pairs.get(run.strip(), base.strip()) != base.strip():
            raise ReportError(f"--pair {run.strip()}: given two baselines ({pairs[run.strip()]} and {base.strip()})")
        pairs[run.strip()] = base.strip()
    return pairs


def parse_endpoints(text: str | None) -> list[int] | None:
    """`--endpoints 64,128,256` → [64, 128, 256]; None (not given) → None (the three largest N)."""
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x] if text else None
    except ValueError:
        raise ReportError(f"--endpoints {text!r}: expected numbers separated by commas, e.g. 64,128,256") from None


@dataclass
class ReportResult:
    out: Path
    report: Report
    tables: list[T.Table]
    files: list[Path]


def build_report(
    run_dirs: Sequence[Path],
    out: Path,
    *,
    baseline: str | None = None,
    pairs: Mapping[str, str] | None = None,
    resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = 0,
    split: str | None = None,
    M: int | None = None,
    checkpoint: str = "selected",
    endpoints: Sequence[int] | None = None,
    plots: bool = True,
    base_arm: Path | None = None,
    levels: str = "auto",
) -> ReportResult:
    """Read the runs' evaluation files, compare every run with its baseline, write tables and plots.

    `pairs`: run → its own baseline (names or paths of reported runs, or method names); other runs use
    `baseline`. Runs that are seeds of one recipe are pooled into one method (teacli/report/pool.py).
    `base_arm`: a run directory whose untrained policy's evaluation (eval/base/) is an arm every
    method is compared with. `levels`: what the intervals resample, "auto", "prompts" or "seeds-prompts"
    (teacli/report/compare.py).
    """
    from teacli.report import pool

    runs_paths = [Path(p) for p in run_dirs]
    if not runs_paths:
        raise ReportError("no run directories to report")
    for p in [*runs_paths, *([Path(base_arm)] if base_arm is not None else [])]:
        if not p.is_dir():
            raise ReportError(f"{p}: not a directory")
    if base_arm is not None and any(Path(base_arm).resolve() == p.resolve() for p in runs_paths):
        raise ReportError(f"--base-arm {base_arm}: also given as a RUN_DIR; the base arm is reported from its eval/base/ only")
    if resamples < stats.MIN_RESAMPLES:
        raise ReportError(f"--bootstrap {resamples}: a 95% percentile interval needs at least {stats.MIN_RESAMPLES} "
                          f"resamples (with fewer, an end of the interval is the smallest or largest resampled mean); "
                          f"use {stats.MIN_RESAMPLES} or more (default {stats.DEFAULT_RESAMPLES})")
    if resamples > stats.MAX_RESAMPLES:
        raise ReportError(f"--bootstrap {resamples}: at most {stats.MAX_RESAMPLES:,} resamples (each holds one index per "
                          f"prompt in memory; the default {stats.DEFAULT_RESAMPLES} already puts the 95% interval's ends "
                          "well within the prompts' own sampling error)")
    if seed < 0:
        raise ReportError(f"--seed {seed}: the bootstrap seed must be an integer >= 0")
    check_levels(levels)
    out = Path(out)
    check_out(out)  # before the work: a bad --out costs nothing
    all_names = run_names([*runs_paths, *([Path(base_arm)] if base_arm is not None else [])])
    names = all_names[: len(runs_paths)]
    infos = [read_recipe(p / "recipe.yaml") for p in runs_paths]
    methods = pool.group_runs(runs_paths, names, infos)
    alias = pool.aliases(methods, runs_paths, names, infos)
    method_names = [m.name for m in methods]
    path_of = [(runs_paths[i], m.name) for m in methods for i in m.members]

    def resolve(spec: str, option: str) -> str:
        return _resolve_run(spec, alias, path_of, method_names, option)

    base_name = resolve(baseline, "--baseline") if baseline is not None else method_names[0]
    pair_names: dict[str, str] = {}
    for run, base in (pairs or {}).items():
        r, b = resolve(run, "--pair"), resolve(base, "--pair")
        if pair_names.get(r, b) != b:
            raise ReportError(f"--pair {run}: given two baselines ({pair_names[r]} and {b})")
        pair_names[r] = b
    every = [*runs_paths, *([Path(base_arm)] if base_arm is not None else [])]
    checkpoints = [checkpoint] * len(runs_paths) + (["base"] if base_arm is not None else [])
    split, M = choose_eval(every, all_names, checkpoints, split, M)
    loaded = [load_run(p, n, checkpoint, split, M, info) for p, n, info in zip(runs_paths, names, infos)]
    runs = [pool.pool(m.name, [loaded[i] for i in m.members]) if m.pooled else loaded[m.members[0]] for m in methods]
    arm = load_run(Path(base_arm), all_names[-1], "base", split, M) if base_arm is not None else None
    check_same_reward([*loaded, *([arm] if arm is not None else [])])
    check_same_generation(loaded, arm)
    rep = compare(runs, base_name, resamples, seed, endpoints, pair_names, arm, levels)
    tabs = make_tables(rep)

    out.resolve().parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.resolve().name}.tmp-", dir=out.resolve().parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would follow the directory into place
    try:
        with writing(out):  # a failed write names no file; the CLI's error then names --out
            written = write_outputs(rep, tabs, staging, plots, reward_distributions(rep, runs, checkpoint) if plots else None)
            (staging / MANIFEST).write_text(json.dumps({"files": sorted(p.name for p in written)}, indent=1) + "\n")
            _publish(staging, out.resolve())
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ReportResult(out, rep, tabs, [out / p.name for p in written])


def _resolve_run(spec: str, alias: Mapping[str, str], paths: Sequence[tuple[Path, str]], methods: Sequence[str], option: str) -> str:
    """The method `spec` names: a method name, or the name or path of one of its runs (`paths`: run → method)."""
    if spec in alias:
        return alias[spec]
    for p, method in paths:
        if Path(spec).resolve() == p.resolve():
            return method
    raise ReportError(f"{option} {spec!r} is not one of the reported runs ({', '.join(methods)}); name it as a RUN_DIR too")
