"""Report plots (matplotlib, Agg backend, PNG): the best-of-N frontier and the delta to each run's baseline
(both on a log2 N axis with the report's 95% bootstrap band), and the pooled reward distribution per method
with its upper tail in a panel beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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


def smoothed_density(values: "Sequence[float]", edges: "Sequence[float]", sigma_bins: float) -> "Any":
    """Density-normalised histogram of `values` on the bin `edges`, smoothed with one Gaussian kernel of
    `sigma_bins` bins (reflected at the range's ends, so the smoothed curve still integrates to 1)."""
    import numpy as np

    edges = np.asarray(edges, dtype=np.float64)
    hist, _ = np.histogram(np.asarray(values, dtype=np.float64), bins=edges, density=True)
    if sigma_bins <= 0:
        return hist
    half = int(np.ceil(4 * sigma_bins))
    offsets = np.arange(-half, half + 1)
    kernel = np.exp(-0.5 * (offsets / sigma_bins) ** 2)
    kernel /= kernel.sum()
    padded = np.concatenate([hist[:half][::-1], hist, hist[-half:][::-1]]) if half <= len(hist) else np.pad(hist, half, mode="reflect")
    return np.convolve(padded, kernel, mode="valid")


def tail_window(pooled: "Sequence[float]", centres: "Sequence[float]", tail_quantile: float, min_bins: int = 8) -> tuple[int, str]:
    """The first bin of the inset's upper tail and the inset's title.

    Normally the bins whose centre lies above the pooled `tail_quantile` quantile. A bounded reward that
    many completions reach (a rule reward with more than 1 - tail_quantile of its mass at the maximum)
    puts that quantile at the maximum itself, past every bin centre: the inset would be empty. The
    window then holds at least the last `min_bins` bins, and the title says why."""
    import numpy as np

    centres = np.asarray(centres, dtype=np.float64)
    cut = float(np.quantile(np.asarray(pooled, dtype=np.float64), tail_quantile))
    start = int(np.searchsorted(centres, cut, side="left"))
    q = f"q{int(round(100 * tail_quantile))}"
    if len(centres) - start >= min_bins:
        return start, f"upper tail (above the pooled {q})"
    start = max(0, len(centres) - min_bins)
    return start, f"upper tail (last {len(centres) - start} bins; the pooled {q} is {cut:.3g})"


def plot_reward_distribution(series: Mapping[str, "Sequence[float]"], path: Path, title: str, bins: int = 80,
                             sigma_bins: float = 1.5, tail_quantile: float = 0.9) -> Path:
    """Pooled completion rewards per method (paper Fig. `fig:mechanism_reward_distribution`): a density
    histogram on one grid over the common range, smoothed with the same Gaussian kernel for every method, and
    beside it a panel on the upper tail (rewards above the pooled `tail_quantile` quantile; `tail_window`).
    The tail is a panel of its own and the legend sits below both, so neither hides a curve."""
    plt = _pyplot()
    fig = reward_distribution_figure(series, title, bins, sigma_bins, tail_quantile)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def reward_distribution_figure(series: Mapping[str, "Sequence[float]"], title: str, bins: int = 80,
                               sigma_bins: float = 1.5, tail_quantile: float = 0.9) -> Any:
    """The figure of `plot_reward_distribution`: axes[0] the whole range, axes[1] the upper tail."""
    import numpy as np

    plt = _pyplot()
    pooled = np.concatenate([np.asarray(v, dtype=np.float64) for v in series.values()])
    lo, hi = float(pooled.min()), float(pooled.max())
    if hi <= lo:  # one value everywhere: a unit-width range around it
        lo, hi = lo - 0.5, hi + 0.5
    edges = np.linspace(lo, hi, bins + 1)
    centres = 0.5 * (edges[:-1] + edges[1:])
    start, label = tail_window(pooled, centres, tail_quantile)
    cut = float(edges[start])
    fig, (ax, tail_ax) = plt.subplots(1, 2, figsize=(8.4, 4.6), width_ratios=(2, 1), layout="constrained")
    tail = np.arange(len(centres)) >= start
    top = 0.0
    for name, values in series.items():
        density = smoothed_density(values, edges, sigma_bins)
        (line,) = ax.plot(centres, density, label=f"{name} (mean {np.mean(values):.3f})")
        tail_ax.plot(centres[tail], density[tail], color=line.get_color())
        top = max(top, float(density[tail].max()) if tail.any() else 0.0)
    tail_ax.set_xlim(cut, hi)
    tail_ax.set_ylim(0.0, top * 1.1 if top > 0 else 1.0)
    tail_ax.set_title(label, fontsize="small")
    tail_ax.set_xlabel("completion reward")
    tail_ax.grid(True, alpha=0.3)
    ax.axvspan(cut, hi, color="0.5", alpha=0.12, linewidth=0)  # where the tail panel looks
    ax.set_xlim(lo, hi)
    ax.set_xlabel("completion reward")
    ax.set_ylabel("density (smoothed)")
    ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.legend(loc="outside lower center", ncols=min(len(series), 3), fontsize="small")
    return fig
