"""The Gaussian-tail check while training: warn once when the groups' upper tails stop looking Gaussian.

Each step the loop records `tail_r2_median` (`teacli.advantages.tail.tail_check_stats`: the median
over the step's groups of the upper-tail QQ R², q in [0.80, 0.99]; averaged over ranks like every
step metric) and `tail_flat_frac` in metrics.jsonl. `TailCheck.observe` keeps the last
`advantage.tail_check_window` values; once that many are in and their median is below
`advantage.tail_check_r2`, it prints one warning and writes it to `tail_check_warning.txt` in the run
directory. A run that already has that file (a resumed run that warned) does not warn again; after a
resume the window fills again from the resumed steps.

What a default of 0.8 means: on Gaussian, exponential or uniform rewards the running median stays
above 0.85 at every group size with three or more tail points (m ≥ 16); rewards with a few levels
(pass/fail, 1–5 ratings) give flat or step-shaped tails and medians of 0.1–0.6.
"""

from __future__ import annotations

import statistics
from collections import deque
from pathlib import Path
from typing import Any, Callable

WARNING_FILE = "tail_check_warning.txt"


def warning_text(median: float, threshold: float, window: int, flat_frac: float | None) -> str:
    flat = f"; {100 * flat_frac:.0f}% of the last step's groups had a flat upper tail" if flat_frac is not None else ""
    return (
        f"tail check: the median upper-tail QQ R² over the last {window} steps is {median:.3f}, below "
        f"advantage.tail_check_r2={threshold}{flat}. TEA and Prefix-TEA assume each prompt's reward has a roughly "
        "Gaussian upper tail (paper: Gaussian-tail model, Lemma VN_tail_surrogate); here the top rewards of a group do "
        "not line up with normal quantiles, so the extrapolation to best-of-N (mu + c_N sigma) can be off, and with "
        "flat tails the TEA advantage is mostly zero. Try: a continuous reward (a reward model's score rather than "
        "a pass/fail or a few levels), a larger rollout.group_size (more tail points per group), or a rule that does "
        "not extrapolate (grpo_z, bon_mean); `tea diagnose tail-fit` on an evaluation shows the tails per prompt."
    )


class TailCheck:
    def __init__(self, threshold: float | None, window: int, run_dir: Path, note: Callable[[str], None], is_main: bool = True):
        self.threshold, self.window, self.note, self.is_main = threshold, int(window), note, is_main
        self.path = Path(run_dir) / WARNING_FILE
        self.values: deque[float] = deque(maxlen=self.window)
        self.warned = self.path.exists()

    def observe(self, record: dict[str, Any]) -> str | None:
        """Feed one step's (rank-averaged) record; returns the warning when it is given now."""
        value = record.get("tail_r2_median")
        if self.threshold is None or value is None:
            return None
        self.values.append(float(value))
        if self.warned or len(self.values) < self.window:
            return None
        median = statistics.median(self.values)
        if median >= self.threshold:
            return None
        self.warned = True
        text = warning_text(median, self.threshold, self.window, record.get("tail_flat_frac"))
        if self.is_main:
            from teacli.rundir import write_text_atomic

            write_text_atomic(self.path, f"step {record.get('step')}: {text}\n")
            self.note(f"warning: {text}")
        return text
