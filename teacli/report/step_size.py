"""How large a step each method took: what a reader needs to see a step-size confound in a comparison.

Per training run, from its metrics.jsonl (`tea train` writes one line per step):
  kl        the KL to the reference at the evaluated checkpoint: the mean of the recorded `kl` (the mean sequence
            log-ratio log π − log π_ref of the step's rollouts, an unbiased estimate of KL(π ‖ π_ref) in nats) over
            the WINDOW steps ending at the checkpoint's step; one step's estimate is noisy, and the checkpoint's
            weights are those that step ended with.
  adv_std   the mean over training of the step's advantage std (after advantage.scale_rewards);
  grad_norm the mean over training of the global gradient norm before clipping, and `clipped`, the share of
            steps whose norm exceeded optim.max_grad_norm.
A seed-pooled method shows the mean over its seeds, with each seed's KL beside it. A run without metrics.jsonl
(or without `kl`: kl.beta 0), or evaluated at no training step (the untrained policy), has no value there.
Imports only the standard library and numpy (docs/architecture.md import rule).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WINDOW = 5


@dataclass(frozen=True)
class StepSize:
    step: int | None  # the evaluated checkpoint's step
    kl: float | None
    adv_std: float | None
    grad_norm: float | None
    clipped: float | None


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return float(np.mean(values)) if values else None


def read_step_size(run_dir: Path, checkpoint: int | str) -> StepSize | None:
    """The run's step size (module docstring); None when it has no readable metrics.jsonl."""
    try:
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    rows = [r for r in rows if isinstance(r, dict) and isinstance(r.get("step"), int)]
    if not rows:
        return None
    step = checkpoint if isinstance(checkpoint, int) and not isinstance(checkpoint, bool) else None
    kl = None
    if step is not None:
        kl = _mean([r.get("kl") for r in rows if step - WINDOW < r["step"] <= step])
    clipped = [bool(r["grad_clipped"]) for r in rows if "grad_clipped" in r]
    return StepSize(step, kl, _mean([r.get("adv_std") for r in rows]), _mean([r.get("grad_norm") for r in rows]),
                    float(np.mean(clipped)) if clipped else None)


def pooled(sizes: list[StepSize | None]) -> StepSize | None:
    """The mean over seeds of each value (each over the seeds that have it)."""
    got = [s for s in sizes if s is not None]
    if not got:
        return None
    return StepSize(None, *(_mean([getattr(s, k) for s in got]) for k in ("kl", "adv_std", "grad_norm", "clipped")))
