"""The report driver: run directories → comparisons → tables and plots under `--out`.

Inputs, per run directory (DESIGN.md contract; nothing else is read):
    eval/<split>-M<M>.bon.json   per-prompt grouped best-of-N values and the checkpoint step
    eval/<split>-M<M>.jsonl      completion records (only their `tokens`: mean completion length)
    judge/<other-run>-bo<N>.jsonl  pairwise judge records, when present
    recipe.yaml                  two scalars for the Budget column (rollout.group_size, advantage.name)
(`eval/base/` or `eval/step_XXXXXX/` instead of `eval/` with --checkpoint base / step_N.)

Every run must have been evaluated on the same split with the same M; otherwise the report stops
with an error naming each run and what it has. Comparisons are paired over the prompts common to
all runs (normally all of them; the report says when some were dropped).

Statistics (teacli.eval.stats, paper appendix "Uncertainty estimates"): for each method and each
N, the paired prompt bootstrap of its per-prompt delta to the baseline (default 1,000 resamples,
seeded; percentile 95% interval; the same resampled prompt indices for every N and method) and
prompt-level win/tie/loss with ties at |difference| <= 1e-9.

Outputs (`--out`, default report/): report.md (everything, with the notes), report.tex, summary.json,
one <table>.md/.tex/.csv per table, frontier.png and delta.png. Table layouts follow the paper:
  frontier      Method | Budget | Step | bo1 … boM                         (tab:core250_full_baseline_results)
  endpoints     Method | Δbo(M/4) | Δbo(M/2) | ΔboM, cells "Δ [lo, hi]"   (tab:main_core250_endpoint_summary)
  win_tie_loss  Comparison | bo(M/4) | bo(M/2) | boM, cells "W/T/L" in %   (tab:core250_win_tie_loss)
  deltas_<run>  N | <baseline> | <run> | Δ [95% CI] | W/T/L                (tab:hh_helpful_full_robustness)
  length        Method | Mean length | Source samples                    (tab:core250_length_check)
  judge         Method | Sel. | Baseline | W–L | Win | Invalid           (tab:deepseek_v4pro_checks)

Imports only the standard library, numpy and matplotlib (DESIGN import rule).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from teacli.eval import stats
from teacli.report import tables as T

_BON_FILE = re.compile(r"^(?P<split>.+)-M(?P<M>\d+)\.bon\.json$")
_JUDGE_FILE = re.compile(r"^(?P<other>.+)-bo(?P<N>\d+)\.jsonl$")


class ReportError(ValueError):
    """A report problem the user can act on (names the runs and files)."""


@dataclass
class JudgeRow:
    other: str
    N: int
    win: int
    loss: int
    invalid: int

    @property
    def total(self) -> int:
        return self.win + self.loss + self.invalid


@dataclass
class RunEval:
    name: str
    path: Path
    split: str
    M: int
    checkpoint: int | str
    N: list[int]
    per_prompt: dict[str, list[float]]  # prompt_id → value per N
    tokens: dict[str, list[int]] | None  # prompt_id → tokens of each completion (None: no records file)
    group_size: int | None
    advantage: str | None
    judge: list[JudgeRow] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# Reading run directories


def eval_dir(run: Path, checkpoint: str = "selected") -> Path:
    """eval/ (validation-selected), eval/base/ or eval/step_XXXXXX/."""
    if checkpoint == "selected":
        return run / "eval"
    if checkpoint == "base":
        return run / "eval" / "base"
    text = checkpoint[len("step_"):] if checkpoint.startswith("step_") else checkpoint
    if not text.isdigit():
        raise ReportError(f"--checkpoint {checkpoint!r}: expected selected, base or step_N")
    return run / "eval" / f"step_{int(text):06d}"


def available_evals(directory: Path) -> dict[tuple[str, int], Path]:
    """(split, M) → bon.json for every finished evaluation in `directory`."""
    if not directory.is_dir():
        return {}
    found = {}
    for p in directory.iterdir():
        m = _BON_FILE.match(p.name)
        if m and p.is_file():
            found[(m["split"], int(m["M"]))] = p
    return found


def default_report_runs(cwd: Path | None = None, checkpoint: str = "selected") -> list[Path]:
    """The current directory if it is a run directory, else every run under runs/ with a finished evaluation."""
    cwd = Path.cwd() if cwd is None else cwd
    if (cwd / "recipe.yaml").is_file():
        return [cwd]
    runs = sorted(d for d in (cwd / "runs").iterdir() if d.is_dir()) if (cwd / "runs").is_dir() else []
    found = [d for d in runs if available_evals(eval_dir(d, checkpoint))]
    if not found:
        raise ReportError("no RUN_DIR given and no run under runs/ has an evaluation (run `tea eval-bon` first)")
    return found


def _run_names(paths: Sequence[Path]) -> list[str]:
    names = [p.resolve().name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]


def choose_eval(runs: Sequence[Path], names: Sequence[str], checkpoint: str, split: str | None, M: int | None) -> tuple[str, int]:
    """The (split, M) every run has; an error naming the runs when there is none or the choice is ambiguous."""
    have = {}
    for run, name in zip(runs, names):
        evals = {k for k in available_evals(eval_dir(run, checkpoint)) if (split is None or k[0] == split) and (M is None or k[1] == M)}
        have[name] = evals
    listing = "; ".join(
        f"{name}: {', '.join(f'{s}-M{m}' for s, m in sorted(ev)) or 'none'}" for name, ev in have.items()
    )
    where = f"{eval_dir(Path('RUN'), checkpoint).relative_to('RUN').as_posix()}/"
    if any(not ev for ev in have.values()):
        missing = [n for n, ev in have.items() if not ev]
        want = f" for split {split!r}" if split else ""
        want += f" with M={M}" if M else ""
        raise ReportError(f"run(s) {', '.join(missing)} have no finished evaluation{want} in {where} "
                          f"(run `tea eval-bon` there). Evaluations found: {listing}")
    common = set.intersection(*have.values())
    if not common:
        raise ReportError(f"the runs were evaluated on different splits or M, so they cannot be compared: {listing}. "
                          "Evaluate them with the same --split and --n")
    if len(common) > 1:
        raise ReportError(f"the runs share several evaluations ({', '.join(f'{s}-M{m}' for s, m in sorted(common))}); "
                          "choose one with --split and --n")
    return next(iter(common))


def _recipe_scalars(path: Path) -> dict[str, str]:
    """'section.key' → scalar text for the two-level block mapping that `tea train` writes to recipe.yaml.

    A deliberately small reader (report imports no YAML library): top-level `section:` lines and
    their two-space-indented `key: value` lines; nested or flow values are kept as text.
    """
    out: dict[str, str] = {}
    if not path.is_file():
        return out
    section = None
    for line in path.read_text().splitlines():
        top = re.match(r"^([A-Za-z_][\w]*):\s*(.*)$", line)
        if top:
            section = top[1] if not top[2] else None
            continue
        sub = re.match(r"^  ([A-Za-z_][\w]*):\s*(.*)$", line)
        if sub and section:
            out[f"{section}.{sub[1]}"] = sub[2].strip().strip("'\"")
    return out


def read_judge(run: Path) -> list[JudgeRow]:
    """judge/<other-run>-bo<N>.jsonl → one row per file: self wins, other wins, invalid verdicts."""
    directory = run / "judge"
    rows = []
    if not directory.is_dir():
        return rows
    for p in sorted(directory.iterdir()):
        m = _JUDGE_FILE.match(p.name)
        if not (m and p.is_file()):
            continue
        win = loss = invalid = 0
        lines = p.read_text().splitlines()
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                winner = json.loads(line)["winner"]
            except (json.JSONDecodeError, KeyError, TypeError):
                if lineno == len(lines):
                    continue  # a torn last line of an interrupted judge run
                raise ReportError(f"{p}:{lineno}: not a judge record with a 'winner'") from None
            win += winner == "self"
            loss += winner == "other"
            invalid += winner not in ("self", "other")
        rows.append(JudgeRow(m["other"], int(m["N"]), win, loss, invalid))
    return sorted(rows, key=lambda r: (r.other, r.N))


def load_run(run: Path, name: str, checkpoint: str, split: str, M: int) -> RunEval:
    directory = eval_dir(run, checkpoint)
    bon_path = directory / f"{split}-M{M}.bon.json"
    try:
        bon = json.loads(bon_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"{bon_path}: cannot read ({exc})") from None
    for key in ("split", "M", "checkpoint", "N", "mean", "per_prompt"):
        if key not in bon:
            raise ReportError(f"{bon_path}: missing key {key!r}")
    if bon["split"] != split or int(bon["M"]) != M:
        raise ReportError(f"{bon_path}: says split {bon['split']!r}, M={bon['M']}, but its name says {split}-M{M}")
    Ns = [int(n) for n in bon["N"]]
    bad = [pid for pid, v in bon["per_prompt"].items() if len(v) != len(Ns)]
    if bad:
        raise ReportError(f"{bon_path}: prompt {bad[0]!r} has {len(bon['per_prompt'][bad[0]])} values for {len(Ns)} N")
    tokens = None
    records = directory / f"{split}-M{M}.jsonl"
    if records.is_file():
        tokens = {}
        for line in records.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # torn last line
            tokens.setdefault(str(rec["prompt_id"]), []).append(int(rec["tokens"]))
    scalars = _recipe_scalars(run / "recipe.yaml")
    group = scalars.get("rollout.group_size")
    return RunEval(
        name=name, path=run, split=split, M=M, checkpoint=bon["checkpoint"], N=Ns,
        per_prompt={str(k): [float(x) for x in v] for k, v in bon["per_prompt"].items()}, tokens=tokens,
        group_size=int(group) if group and group.isdigit() else None, advantage=scalars.get("advantage.name"),
        judge=read_judge(run),
    )


# ------------------------------------------------------------------------------------------------
# The comparisons


@dataclass
class Report:
    runs: list[RunEval]
    baseline: str
    split: str
    M: int
    N: list[int]
    prompts: list[str]  # common prompt ids, baseline order
    dropped: dict[str, int]  # run → prompts not common to all runs
    resamples: int
    seed: int
    endpoints: list[int]
    values: dict[str, np.ndarray]  # run → [P, len(N)] per-prompt grouped best-of-N
    frontier: dict[str, list[tuple[float, float, float]]]  # run → per N (mean, lo, hi)
    deltas: dict[str, list[tuple[float, float, float]]]  # non-baseline run → per N (delta, lo, hi)
    wtl: dict[str, list[tuple[int, int, int]]]  # non-baseline run → per N (win, tie, loss)
    lengths: dict[str, tuple[float, int] | None]  # run → (mean tokens, completions) over common prompts


def compare(runs: list[RunEval], baseline: str, resamples: int, seed: int, endpoints: Sequence[int] | None) -> Report:
    base = next(r for r in runs if r.name == baseline)
    first = runs[0]
    Ns = first.N
    for r in runs[1:]:
        if r.N != Ns:
            raise ReportError(f"runs {first.name} and {r.name} report different N ({first.N} vs {r.N})")
    common = set.intersection(*(set(r.per_prompt) for r in runs))
    prompts = [pid for pid in base.per_prompt if pid in common]
    if not prompts:
        raise ReportError(f"the runs share no evaluated prompt ({', '.join(r.name for r in runs)})")
    dropped = {r.name: len(r.per_prompt) - len(prompts) for r in runs if len(r.per_prompt) != len(prompts)}
    values = {r.name: np.array([r.per_prompt[pid] for pid in prompts], dtype=np.float64) for r in runs}
    if endpoints:
        unknown = [n for n in endpoints if n not in Ns]
        if unknown:
            raise ReportError(f"--endpoints {unknown}: not among the evaluated N {Ns}")
        ends = list(endpoints)
    else:
        ends = Ns[-3:]
    frontier, deltas, wtl, lengths = {}, {}, {}, {}
    for r in runs:
        v = values[r.name]
        frontier[r.name] = [stats.bootstrap_mean(v[:, j], resamples, seed) for j in range(len(Ns))]
        if r.tokens is not None:
            toks = [t for pid in prompts for t in r.tokens.get(pid, [])]
            lengths[r.name] = (float(np.mean(toks)) if toks else float("nan"), len(toks))
        else:
            lengths[r.name] = None
        if r.name == baseline:
            continue
        b = values[baseline]
        deltas[r.name] = [stats.paired_bootstrap(v[:, j], b[:, j], resamples, seed) for j in range(len(Ns))]
        wtl[r.name] = [stats.win_tie_loss(v[:, j], b[:, j]) for j in range(len(Ns))]
    return Report(runs, baseline, first.split, first.M, Ns, prompts, dropped, resamples, seed, ends, values,
                  frontier, deltas, wtl, lengths)


# ------------------------------------------------------------------------------------------------
# Tables


def make_tables(rep: Report) -> list[T.Table]:
    Ns, P = rep.N, len(rep.prompts)
    where = f"{rep.split} ({P} prompts, M={rep.M})"
    ci = f"paired prompt bootstrap 95% CI, {rep.resamples} resamples, seed {rep.seed}"
    others = [r for r in rep.runs if r.name != rep.baseline]
    idx = {n: j for j, n in enumerate(Ns)}
    out = []

    frontier = T.Table("frontier", f"Best-of-N frontier on {where}: mean grouped best-of-N reward; Step = evaluated checkpoint",
                       ["Method", "Budget", "Step", *[f"bo{n}" for n in Ns]])
    for r in rep.runs:
        budget = f"m={r.group_size}" if r.group_size else "–"
        frontier.rows.append([r.name, budget, r.checkpoint, *[rep.frontier[r.name][j][0] for j in range(len(Ns))]])
    out.append(frontier)

    if others:
        ends = T.Table("endpoints", f"High-N endpoint results on {where}: improvement over {rep.baseline} ({ci})",
                       ["Method", *[f"Δbo{n}" for n in rep.endpoints]])
        wtl = T.Table("win_tie_loss", f"Prompt-level win/tie/loss (%) against {rep.baseline} on {where}; tie = |diff| <= 1e-9",
                      ["Comparison", *[f"bo{n}" for n in rep.endpoints]])
        for r in others:
            ends.rows.append([r.name, *[T.Delta(*rep.deltas[r.name][idx[n]]) for n in rep.endpoints]])
            wtl.rows.append([f"{r.name} vs {rep.baseline}", *[T.WTL(*rep.wtl[r.name][idx[n]]) for n in rep.endpoints]])
        out += [ends, wtl]
        for r in others:
            t = T.Table(f"deltas_{_safe(r.name)}", f"{r.name} vs {rep.baseline} on {where}: best-of-N values, delta ({ci}) and W/T/L (%)",
                        ["N", rep.baseline, r.name, "Δ [95% CI]", "W/T/L"])
            for j, n in enumerate(Ns):
                t.rows.append([n, rep.frontier[rep.baseline][j][0], rep.frontier[r.name][j][0], T.Delta(*rep.deltas[r.name][j]),
                               T.WTL(*rep.wtl[r.name][j])])
            out.append(t)

    length = T.Table("length", f"Mean completion length (generated tokens) on {where}", ["Method", "Mean length", "Source samples"])
    for r in rep.runs:
        got = rep.lengths[r.name]
        length.rows.append([r.name, None, None] if got is None else [r.name, f"{got[0]:.1f}", got[1]])
    out.append(length)

    judge_rows = [(r, j) for r in rep.runs for j in r.judge]
    if judge_rows:
        judge = T.Table("judge", "Pairwise judge: W–L = this run's wins – the other run's wins; Win = W / (W + L); Invalid = no verdict",
                        ["Method", "Sel.", "Baseline", "W–L", "Win", "Invalid"])
        for r, j in judge_rows:
            win = f"{100.0 * j.win / (j.win + j.loss):.1f}%" if j.win + j.loss else None
            judge.rows.append([r.name, f"bo{j.N}", j.other, T.WL(j.win, j.loss), win, j.invalid])
        out.append(judge)
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


# ------------------------------------------------------------------------------------------------
# The driver


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
    resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = 0,
    split: str | None = None,
    M: int | None = None,
    checkpoint: str = "selected",
    endpoints: Sequence[int] | None = None,
    plots: bool = True,
) -> ReportResult:
    """Read the runs' evaluation files, compare every run with the baseline, write tables and plots."""
    runs_paths = [Path(p) for p in run_dirs]
    if not runs_paths:
        raise ReportError("no run directories to report")
    for p in runs_paths:
        if not p.is_dir():
            raise ReportError(f"{p}: not a directory")
    if resamples < 1:
        raise ReportError(f"--bootstrap must be >= 1, got {resamples}")
    names = _run_names(runs_paths)
    split, M = choose_eval(runs_paths, names, checkpoint, split, M)
    runs = [load_run(p, n, checkpoint, split, M) for p, n in zip(runs_paths, names)]
    base_name = _resolve_baseline(baseline, runs_paths, names)
    rep = compare(runs, base_name, resamples, seed, endpoints)
    tabs = make_tables(rep)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = [p for ps in T.write_all(tabs, out).values() for p in ps]
    pngs = []
    if plots:
        from teacli.report import plots as PL

        title = f"{split}, M={M}, {len(rep.prompts)} prompts"
        pngs.append(PL.plot_frontier(rep.N, {r.name: tuple(zip(*rep.frontier[r.name])) for r in runs},
                                     out / "frontier.png", f"Best-of-N frontier ({title})"))
        pngs.append(PL.plot_delta(rep.N, {n: tuple(zip(*d)) for n, d in rep.deltas.items()}, base_name,
                                  out / "delta.png", f"Delta to {base_name} ({title})"))
    (out / "report.md").write_text(_markdown_report(rep, tabs, pngs))
    (out / "report.tex").write_text("\n".join(T.latex(t) for t in tabs))
    (out / "summary.json").write_text(json.dumps(_summary(rep), indent=2) + "\n")
    files += pngs + [out / "report.md", out / "report.tex", out / "summary.json"]
    return ReportResult(out, rep, tabs, files)


def _resolve_baseline(baseline: str | None, paths: Sequence[Path], names: Sequence[str]) -> str:
    if baseline is None:
        return names[0]
    for p, n in zip(paths, names):
        if baseline in (n, str(p)) or Path(baseline).resolve() == p.resolve():
            return n
    raise ReportError(f"--baseline {baseline!r} is not one of the reported runs ({', '.join(names)}); name it as a RUN_DIR too")


def notes(rep: Report) -> list[str]:
    lines = [
        f"Split {rep.split}, M = {rep.M} completions per prompt, {len(rep.prompts)} prompts, the same for every run.",
        f"Baseline: {rep.baseline}. Deltas: paired prompt bootstrap, {rep.resamples} resamples, seed {rep.seed}, "
        "95% percentile interval. Ties: |difference| <= 1e-9.",
        "bo<N>: grouped best-of-N (M/N consecutive groups of N, mean of group maxima per prompt, mean over prompts).",
        "Runs: " + "; ".join(f"{r.name} (checkpoint {r.checkpoint})" for r in rep.runs) + ".",
    ]
    if rep.dropped:
        lines.append("Prompts not common to all runs were left out: "
                     + ", ".join(f"{n}: {k}" for n, k in rep.dropped.items()) + ".")
    return lines


def _markdown_report(rep: Report, tabs: list[T.Table], pngs: list[Path]) -> str:
    parts = ["# Best-of-N report", "", *[f"- {line}" for line in notes(rep)], ""]
    for t in tabs:
        parts += [T.markdown(t)]
    for p in pngs:
        parts += [f"![{p.stem}]({p.name})", ""]
    return "\n".join(parts)


def _summary(rep: Report) -> dict[str, Any]:
    return {
        "split": rep.split, "M": rep.M, "N": rep.N, "prompts": len(rep.prompts), "baseline": rep.baseline,
        "bootstrap": {"resamples": rep.resamples, "seed": rep.seed, "level": 0.95, "interval": "percentile"},
        "runs": {
            r.name: {
                "path": str(r.path), "checkpoint": r.checkpoint, "group_size": r.group_size, "advantage": r.advantage,
                "mean": [f[0] for f in rep.frontier[r.name]],
                "mean_ci": [[f[1], f[2]] for f in rep.frontier[r.name]],
                "delta": [list(d) for d in rep.deltas.get(r.name, [])] or None,
                "win_tie_loss": [list(w) for w in rep.wtl.get(r.name, [])] or None,
                "mean_tokens": rep.lengths[r.name][0] if rep.lengths[r.name] else None,
                "samples": rep.lengths[r.name][1] if rep.lengths[r.name] else None,
                "judge": [vars(j) for j in r.judge],
            }
            for r in rep.runs
        },
    }
