"""Report plots (matplotlib, Agg backend, PNG): the best-of-N frontier and the delta to each run's baseline.

Both put N on a log2 axis (N = 1, 2, 4, …, M) and shade the 95% prompt-bootstrap interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

Series = tuple[Sequence[float], Sequence[float], Sequence[float]]  # (value[N], lo[N], hi[N])


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes_n(ax, Ns: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(Ns), [str(n) for n in Ns])
    ax.set_xlabel("best-of-N (N)")
    ax.grid(True, alpha=0.3)


def plot_frontier(Ns: Sequence[int], series: Mapping[str, Series], path: Path, title: str) -> Path:
    """Mean grouped best-of-N reward vs N, one line per method with its 95% bootstrap band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), constrained_layout=True)
    for name, (value, lo, hi) in series.items():
        (line,) = ax.plot(Ns, value, marker="o", markersize=3, label=name)
        ax.fill_between(Ns, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    _axes_n(ax, Ns)
    ax.set_ylabel("reward (grouped best-of-N)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def plot_delta(Ns: Sequence[int], series: Mapping[str, Series], baseline: str, path: Path, title: str) -> Path:
    """Paired delta to the baseline vs N with 95% paired-bootstrap bands; a dashed line at zero.

    `series` is keyed by the legend label (e.g. "tea − grpo"); `baseline` names the y axis.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), constrained_layout=True)
    ax.axhline(0.0, color="black", linestyle="--", linewidth=1.0)
    for name, (value, lo, hi) in series.items():
        (line,) = ax.plot(Ns, value, marker="o", markersize=3, label=name)
        ax.fill_between(Ns, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    _axes_n(ax, Ns)
    ax.set_ylabel(f"Δ reward vs {baseline}")
    ax.set_title(title)
    if series:
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
