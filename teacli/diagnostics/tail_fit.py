"""`tea diagnose tail-fit`: the paper's Gaussian QQ upper-tail check and a best-of-N prediction from
evaluation records alone (no model).

Paper: appendix "Reward-distribution diagnostic" (Tab. `tab:gaussian_tail_check_80_99`) and Lemma
`lem:VN_tail_surrogate` (V_N ≈ μ_α + c̃_N σ_α).

- QQ check, per prompt and run: the ascending order statistics r_(i) of the prompt's M rewards whose
  Hazen plotting positions q_i = (i − ½)/M lie in [q_low, q_high] (defaults 0.80, 0.99) are regressed
  on Φ⁻¹(q_i); R² of that line (`teacli.advantages.tail.qq_tail_r2`). Per run: median, mean,
  10th percentile (numpy's linear interpolation) of R² over the fitted prompts and the share of
  them with R² ≥ 0.95. Degenerate prompts (every reward in the range equal, or fewer than three
  order statistics in the range) are counted and left out of these summaries; their per-prompt R²
  is null.
- Prediction: from the first K samples of each prompt (`fit_samples`, default min(64, M)), the
  empirical upper-α tail (q = ⌈αK⌉ largest: mean μ̂, standard deviation σ̂ with 1/q normalisation,
  eq. `eq:empirical_tail_vector`) gives V̂_N = μ̂ + c̃_N σ̂ per prompt, averaged over prompts, for
  N = 1, 2, 4, … up to `max_n` (default 4·M). Wherever N divides M the measured grouped best-of-N
  (`teacli.eval.stats.grouped_bon` over all M samples, as `tea eval-bon` reports it) is put beside it.
  The K fitting samples are among the M measured ones (the prediction is not out of sample).

Output files under `--out`: tail_fit.json, tail_fit.{md,tex,csv} (the paper's table layout),
prediction.{md,tex,csv}, qq.png (a few prompts per run) and prediction.png; each written atomically.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

DEFAULT_FIT_SAMPLES = 64
DEFAULT_ALPHA = 0.25
R2_GOOD = 0.95
_RECORDS = re.compile(r"^(?P<split>.+)-M(?P<M>\d+)\.jsonl$")


class TailFitError(ValueError):
    """A problem with the inputs, naming the run, file or option."""


@dataclass
class RunRewards:
    name: str
    path: Path
    split: str
    M: int
    prompt_ids: list[str]
    rewards: Any  # np.ndarray [P, M], columns in sample order


# ------------------------------------------------------------------------------------------------
# Reading


def _run_names(paths: Sequence[Path]) -> list[str]:
    names = [p.resolve().name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]


def find_records(run: Path, checkpoint: str, split: str | None, M: int | None) -> Path:
    """The one <split>-M<M>.jsonl of the run's evaluation directory that matches split and M."""
    from teacli.rundir import eval_dir

    try:
        directory = eval_dir(run, checkpoint)
    except ValueError as exc:
        raise TailFitError(str(exc)) from None
    found = []
    if directory.is_dir():
        for p in sorted(directory.iterdir()):
            m = _RECORDS.match(p.name)
            if m and p.is_file() and (split is None or m["split"] == split) and (M is None or int(m["M"]) == M):
                found.append(p)
    if not found:
        want = f"{split or '<split>'}-M{M if M is not None else '<M>'}.jsonl"
        raise TailFitError(f"{run}: no evaluation records {directory / want} (run `tea eval-bon` on it first)")
    if len(found) > 1:
        raise TailFitError(f"{run}: several evaluations in {directory} ({', '.join(p.name for p in found)}); "
                           "choose one with --split and --n")
    return found[0]


def read_run(run: Path, name: str, checkpoint: str = "selected", split: str | None = None, M: int | None = None) -> RunRewards:
    """rewards[P, M] of one run's evaluation records, checked (every prompt has samples 0..M-1)."""
    from teacli.eval.bon import EvalError, read_records, rewards_matrix

    if not Path(run).is_dir():
        raise TailFitError(f"{run}: not a directory")
    path = find_records(Path(run), checkpoint, split, M)
    m = _RECORDS.match(path.name)
    assert m is not None
    split_name, M_ = m["split"], int(m["M"])
    try:
        records = read_records(path)
    except EvalError as exc:
        raise TailFitError(str(exc)) from None
    prompts_file = path.with_name(f"{split_name}.prompts.jsonl")
    if prompts_file.is_file():
        order = [json.loads(line)["prompt_id"] for line in prompts_file.read_text().split("\n") if line.strip()]
    else:
        order = list(dict.fromkeys(str(r["prompt_id"]) for r in records))
    for i, rec in enumerate(records, 1):
        if not isinstance(rec["reward"], (int, float)) or isinstance(rec["reward"], bool) or not math.isfinite(rec["reward"]):
            raise TailFitError(f"{path}:{i}: reward must be a finite number, got {rec['reward']!r}")
    if not order:
        raise TailFitError(f"{path}: holds no records")
    try:
        rewards = rewards_matrix(records, order, M_, str(path))
    except EvalError as exc:
        raise TailFitError(f"{exc}; rerun `tea eval-bon` on {run} to complete it") from None
    return RunRewards(name, Path(run), split_name, M_, order, rewards)


def read_runs(runs: Sequence[Path], checkpoint: str = "selected", split: str | None = None, M: int | None = None) -> list[RunRewards]:
    paths = [Path(r) for r in runs]
    if not paths:
        raise TailFitError("give at least one RUN_DIR")
    return [read_run(p, n, checkpoint, split, M) for p, n in zip(paths, _run_names(paths))]


# ------------------------------------------------------------------------------------------------
# The fit and the prediction


def check_arguments(q_low: float, q_high: float, fit_samples: int | None, max_n: int | None, alpha: float) -> None:
    from teacli.advantages.tail import check_alpha

    if not (0.0 < q_low < q_high < 1.0):
        raise TailFitError(f"--q-low {q_low} / --q-high {q_high}: need 0 < q_low < q_high < 1 (paper: 0.80, 0.99)")
    if fit_samples is not None and fit_samples < 2:
        raise TailFitError(f"--fit-samples {fit_samples}: must be >= 2")
    if max_n is not None and max_n < 1:
        raise TailFitError(f"--max-n {max_n}: must be >= 1")
    try:
        check_alpha(alpha, "--alpha")
    except ValueError as exc:
        raise TailFitError(str(exc)) from None


def tail_summary(r2: Any, ok: Any) -> dict[str, float | None]:
    """median, mean, p10 of R² over the fitted prompts and the share with R² ≥ 0.95 (None when none fitted)."""
    import numpy as np

    good = np.asarray(r2)[np.asarray(ok, dtype=bool)]
    if good.size == 0:
        return {"median_r2": None, "mean_r2": None, "p10_r2": None, "frac_r2_ge_095": None}
    return {
        "median_r2": float(np.median(good)),
        "mean_r2": float(good.mean()),
        "p10_r2": float(np.percentile(good, 10)),
        "frac_r2_ge_095": float((good >= R2_GOOD).mean()),
    }


def prediction_ns(M: int, max_n: int | None) -> list[int]:
    top = 4 * M if max_n is None else max_n
    out, n = [], 1
    while n <= top:
        out.append(n)
        n *= 2
    return out


def predict_bon(rewards: Any, Ns: Sequence[int], alpha: float = DEFAULT_ALPHA, eps_sigma: float = 1e-6) -> list[float]:
    """Mean over prompts of μ̂_α + c̃_N σ̂_α (Lemma `lem:VN_tail_surrogate`) from rewards[P, K], for each N."""
    import numpy as np

    from teacli.advantages.tail import c_tilde, check_tail_size

    r = np.asarray(rewards, dtype=np.float64)
    q = check_tail_size(r.shape[1], alpha, "tail-fit prediction (--fit-samples)")
    top = -np.sort(-r, axis=1)[:, :q]
    mu = top.mean(axis=1)
    sigma = np.sqrt(np.maximum(((top - mu[:, None]) ** 2).mean(axis=1), eps_sigma * eps_sigma))
    return [float((mu + c_tilde(int(n), float(alpha)) * sigma).mean()) for n in Ns]


def fit_run(run: RunRewards, q_low: float, q_high: float, fit_samples: int | None, max_n: int | None,
            alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    """The tail_fit.json entry of one run (plus the fit's lines, under '_fit', for the QQ plot)."""
    from teacli.advantages.tail import qq_tail_r2
    from teacli.eval.stats import grouped_bon

    fit = qq_tail_r2(run.rewards, q_low, q_high)
    K = min(DEFAULT_FIT_SAMPLES, run.M) if fit_samples is None else fit_samples
    if K > run.M:
        raise TailFitError(f"--fit-samples {K}: {run.name} has only M={run.M} samples per prompt")
    Ns = prediction_ns(run.M, max_n)
    try:
        predicted = predict_bon(run.rewards[:, :K], Ns, alpha)
    except ValueError as exc:
        raise TailFitError(str(exc)) from None
    measured = [float(grouped_bon(run.rewards, n).mean()) if n <= run.M and run.M % n == 0 else None for n in Ns]
    entry: dict[str, Any] = {
        "path": str(run.path),
        "split": run.split,
        "M": run.M,
        "prompts": len(run.prompt_ids),
        "fitted": int(fit.ok.sum()),
        "degenerate": {"flat": int(fit.flat.sum()), "too_few": int(fit.too_few.sum())},
        "points_per_prompt": int(len(fit.q)),
        **tail_summary(fit.r2, fit.ok),
        "per_prompt_r2": {pid: (float(fit.r2[i]) if fit.ok[i] else None) for i, pid in enumerate(run.prompt_ids)},
        "prediction": {
            "fit_samples": K,
            "alpha": alpha,
            "N": Ns,
            "predicted": predicted,
            "measured": measured,
            "error": [None if m is None else p - m for p, m in zip(predicted, measured)],
        },
        "_fit": fit,
    }
    return entry


def tail_fit(runs: Sequence[RunRewards], q_low: float = 0.80, q_high: float = 0.99, fit_samples: int | None = None,
             max_n: int | None = None, alpha: float = DEFAULT_ALPHA) -> dict[str, Any]:
    check_arguments(q_low, q_high, fit_samples, max_n, alpha)
    return {"q_range": [q_low, q_high], "runs": {r.name: fit_run(r, q_low, q_high, fit_samples, max_n, alpha) for r in runs}}


# ------------------------------------------------------------------------------------------------
# Outputs


def _public(result: dict[str, Any]) -> dict[str, Any]:
    return {"q_range": result["q_range"],
            "runs": {name: {k: v for k, v in e.items() if not k.startswith("_")} for name, e in result["runs"].items()}}


def degenerate_notes(result: dict[str, Any]) -> list[str]:
    """One line per run with degenerate prompts (all rewards in the range equal, or fewer than 3 samples there),
    which the summary leaves out."""
    lines = []
    for name, e in result["runs"].items():
        degenerate = e["degenerate"]["flat"] + e["degenerate"]["too_few"]
        if degenerate:
            lines.append(f"{name}: {degenerate} of {e['prompts']} prompt(s) degenerate ({e['degenerate']['flat']} flat, "
                         f"{e['degenerate']['too_few']} with fewer than 3 samples in the range); left out of the summary")
    return lines


def tables(result: dict[str, Any]) -> list:
    from teacli.tables import Table

    lo, hi = result["q_range"]
    check = Table("tail_fit", f"Gaussian QQ upper-tail fit: q in [{lo:.2f}, {hi:.2f}], per prompt; entries summarize "
                  "prompt-level R² over the fitted prompts (degenerate prompts: all rewards in the range equal, or "
                  "too few samples in it)",
                  ["Method", "Median R²", "Mean R²", "p10 R²", "Pr(R² ≥ .95)", "Prompts", "Degenerate"])
    for name, e in result["runs"].items():
        frac = e["frac_r2_ge_095"]
        check.rows.append([name, e["median_r2"], e["mean_r2"], e["p10_r2"],
                           None if frac is None else f"{100 * frac:.1f}%", e["prompts"],
                           e["degenerate"]["flat"] + e["degenerate"]["too_few"]])
    pred = Table("prediction", "Best-of-N predicted by the Gaussian-tail model (V_N ≈ μ_α + c̃_N σ_α, from the first K "
                 "samples per prompt) beside the measured grouped best-of-N (all M samples); error = predicted − measured",
                 ["Method", "K", "N", "Predicted", "Measured", "Error"])
    for name, e in result["runs"].items():
        p = e["prediction"]
        for j, n in enumerate(p["N"]):
            pred.rows.append([name, p["fit_samples"], n, p["predicted"][j], p["measured"][j], p["error"][j]])
    return [check, pred]


QQ_COLUMNS = 4  # panels per row of qq.png


def plot_qq(result: dict[str, Any], runs: Sequence[RunRewards], path: Path, per_run: int = 3) -> None:
    """One panel per run: the lowest-, median- and highest-R² prompts' tail points and fitted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from teacli.advantages.tail import qq_positions

    cols = min(len(runs), QQ_COLUMNS)  # a grid, not one row: twelve runs in a row made a 55-inch-wide figure
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.0 * rows), squeeze=False, layout="constrained")
    for ax in axes.flat[len(runs):]:
        ax.set_visible(False)
    for ax, run in zip(axes.flat, runs):
        e = result["runs"][run.name]
        fit = e["_fit"]
        fitted = np.nonzero(fit.ok)[0]
        ax.set_title(f"{run.name}: median R² " + ("–" if e["median_r2"] is None else f"{e['median_r2']:.3f}"), fontsize="small")
        ax.set_xlabel("standard normal quantile Φ⁻¹(q)")
        ax.grid(True, alpha=0.3)
        if fitted.size == 0:
            ax.text(0.5, 0.5, "no prompt could be fitted", ha="center", transform=ax.transAxes)
            continue
        order = fitted[np.argsort(fit.r2[fitted], kind="stable")]
        picks = list(dict.fromkeys(int(order[k]) for k in np.linspace(0, order.size - 1, min(per_run, order.size)).round().astype(int)))
        idx, _ = qq_positions(run.M, *result["q_range"])
        for i in picks:
            y = np.sort(run.rewards[i])[idx]
            (line,) = ax.plot(fit.x, y, "o", markersize=3, label=f"{run.prompt_ids[i]} (R² {fit.r2[i]:.3f})")
            ax.plot(fit.x, fit.a[i] + fit.b[i] * fit.x, "-", color=line.get_color(), linewidth=1.0)
        # Below the panel, under its x label: inside it, a legend hid tail points wherever it was put.
        ax.legend(fontsize="x-small", loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    for row in axes:
        row[0].set_ylabel("reward (upper-tail order statistics)")
    fig.savefig(path, dpi=150)
    plt.close(fig)


def plot_prediction(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(8.4, 4.6), layout="constrained")
    handles, fit_samples = [], set()
    # More runs than the default cycle's 10 colours would repeat a colour: tab20's 20 then.
    colors = plt.get_cmap("tab10" if len(result["runs"]) <= 10 else "tab20").colors
    for i, (name, e) in enumerate(result["runs"].items()):
        p = e["prediction"]
        (line,) = ax.plot(p["N"], p["predicted"], "--", color=colors[i % len(colors)])
        fit_samples.add(p["fit_samples"])
        pts = [(n, m) for n, m in zip(p["N"], p["measured"]) if m is not None]
        if pts:
            ax.plot(*zip(*pts), "o-", color=line.get_color(), markersize=3)
        handles.append(Line2D([], [], color=line.get_color(), label=name))
    k = f"K={next(iter(fit_samples))}" if len(fit_samples) == 1 else "K per run: tail_fit.json"
    handles += [Line2D([], [], color="0.3", linestyle="--", label=f"predicted ({k})"),
                Line2D([], [], color="0.3", marker="o", markersize=3, label="measured")]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("best-of-N (N)")
    ax.set_ylabel("mean best-of-N reward")
    ax.set_title("Best-of-N: the tail model's prediction and the measured value", fontsize="medium")
    ax.grid(True, alpha=0.3)
    fig.legend(handles=handles, loc="outside right center", fontsize="x-small")  # one entry a run, beside the axes
    fig.savefig(path, dpi=150)
    plt.close(fig)


def write_outputs(result: dict[str, Any], runs: Sequence[RunRewards], out: Path, plots: bool = True) -> list[Path]:
    """tail_fit.json, the tables (md, tex, csv) and the plots under `out`, each file written atomically."""
    from teacli.tables import csv_text, latex, markdown
    from teacli.rundir import write_text_atomic

    if out.exists() and not out.is_dir():
        raise TailFitError(f"--out {out}: is a file; give a directory")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "tail_fit.json"
    write_text_atomic(path, json.dumps(_public(result), indent=2) + "\n")
    written.append(path)
    for t in tables(result):
        for suffix, text in ((".md", markdown(t)), (".tex", latex(t, "tab:tea_diagnose_")), (".csv", csv_text(t))):
            write_text_atomic(out / f"{t.name}{suffix}", text)
            written.append(out / f"{t.name}{suffix}")
    if plots:
        for name, draw in (("qq.png", lambda p: plot_qq(result, runs, p)), ("prediction.png", lambda p: plot_prediction(result, p))):
            tmp = out / f".{name}.tmp.png"
            draw(tmp)
            tmp.replace(out / name)
            written.append(out / name)
    return written
