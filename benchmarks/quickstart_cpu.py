"""The CPU quickstart's training step before and after issue 12's CPU work, side by side in one process.

    python benchmarks/quickstart_cpu.py --rounds 4          # ~6 minutes on 2 cores
    python benchmarks/quickstart_cpu.py --rounds 4 --json quickstart_cpu.json

Builds recipes/quickstart.yaml's trainer once (SmolLM2-135M-Instruct, bf16 DeepSpeed engine, the
reference model, the hf engine), then runs `--rounds` rounds of one `before` and one `after` step,
alternating, on the same prompts and seed (the quickstart's own data order), so both see the same
machine at the same time. Each step is the trainer's own `generate_step` + `train_step`; it updates
the policy, as in training.

  before: the quickstart as it was: generate's `torch.multinomial` draw, each sequence's prompt
          prefilled on its own (`rollout.share_prefix: false`), transformers' own sdpa attention in the
          trainer and the reference, gradient checkpointing on, every sequence forwarded whole with its
          prompt (`optim.share_prompts: false`), glibc malloc's steady state (blocks above 32 MiB mmapped
          and unmapped each time: `mallopt(M_MMAP_THRESHOLD, 32 MiB)`, its dynamic limit).
  after:  the defaults (docs/performance.md, "CPU").

Prints a table of median seconds per phase (generate, reference log-probs, policy forward/backward +
optimizer step, whole step) for each, and their ratio; the peak resident memory of the process.
Timings on shared cloud CPUs vary by up to 2x within minutes: compare the two columns of one run.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("generate", "ref_logprobs", "train", "step")


def set_mode(mode: str, recipe, engine, reference, rollout) -> None:
    """Switch the one trainer between the before and after settings (see the module docstring)."""
    from teacli import models

    before = mode == "before"
    models.attention.CPU_FP32_ATTENTION = not before  # the hf engine's sdpa_gqa prefill ran in bf16 before
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if before:  # M_MMAP_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD back to glibc's steady state
        libc.mallopt(-4, 65536), libc.mallopt(-3, 32 << 20), libc.mallopt(-1, 64 << 20)
    else:
        models.keep_cpu_memory()
    rollout.sampler = "multinomial" if before else "inverse_cdf"
    rollout.share_prefix = not before
    recipe.optim.share_prompts = not before
    attention = "sdpa" if before else models.register_sdpa_gqa()
    for model in (engine.module, reference):
        model.set_attn_implementation(attention)
    if before:
        engine.module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        engine.module.gradient_checkpointing_disable()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="before/after pairs (the first pair is a warm-up, not counted)")
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "quickstart.yaml"))
    parser.add_argument("--json", default=None, help="also write the per-step timings here")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (the first is a warm-up)")

    import torch

    from teacli.advantages import compute_advantages
    from teacli.config import load_recipe
    from teacli.train import backend, loop
    from teacli.train.setup import setup
    from teacli.train.update import train_step

    recipe = load_recipe(args.recipe)
    world = backend.init_world()
    s = setup(recipe, world, "off", "hf")  # hf engine: no correction
    engine, reference, reward, train_prompts, rollout, pad_id = s.engine, s.reference, s.reward, s.train_prompts, s.rollout, s.pad_id
    P = recipe.rollout.prompts_per_step
    steps: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for mode in ("before", "after"):
            set_mode(mode, recipe, engine, reference, rollout)
            t0 = time.perf_counter()
            sel, _, t_gen, _ = loop.generate_step(rollout, reward, train_prompts, recipe, world, r, r * P)
            advantages = compute_advantages(recipe.advantage.name, sel.rewards.double(), **recipe.advantage.params).float()
            t1 = time.perf_counter()
            stats = train_step(engine, reference, recipe, sel.prompt_ids, sel.groups, advantages, pad_id, world.device)
            t2 = time.perf_counter()
            t_ref = stats["time_ref_logprobs"]
            row = {"generate": t_gen, "ref_logprobs": t_ref, "train": t2 - t1 - t_ref, "step": t2 - t0,
                   "tokens": float(sum(len(c.token_ids) for g in sel.groups for c in g))}
            print(f"round {r} {mode:6s} " + "  ".join(f"{k} {v:.1f}" for k, v in row.items()), file=sys.stderr, flush=True)
            if r > 0:
                steps[mode].append(row)
    med = {mode: {k: statistics.median(s[k] for s in rows) for k in (*PHASES, "tokens")} for mode, rows in steps.items()}
    print(f"quickstart step on {torch.get_num_threads()} threads, median of {args.rounds - 1} steps each (after one warm-up pair)\n")
    print("| phase | before (s) | after (s) | after / before |")
    print("|---|---|---|---|")
    for k in PHASES:
        print(f"| {k} | {med['before'][k]:.1f} | {med['after'][k]:.1f} | {med['after'][k] / med['before'][k]:.2f} |")
    print(f"| generated tokens | {med['before']['tokens']:.0f} | {med['after']['tokens']:.0f} | |")
    print(f"\npeak resident memory of the process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": steps, "median": med}, indent=2) + "\n")


if __name__ == "__main__":
    main()
