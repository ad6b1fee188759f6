"""Every phase of a finished run against its floor on the card, and the planner's prediction against it.

    python benchmarks/phases.py RUN_DIR [RUN_DIR@GPUS ...] --card h200 [--memory-gib 79.2] [--skip 2] [--calibrate] [--json out.json]

Reads what `tea train` wrote (recipe.yaml, metrics.jsonl, validation.jsonl; a rehearsal's or a real run's) and
prints, per phase of a step (generation, reward scoring, reference, backward + step, weight push) and for the
validation: the median time over the steps after the first `--skip` (compile and warm-up), tokens/s, the phase's
floor on the card (teacli.planner: FLOPs at its dense bf16 peak; generation: bytes at its memory bandwidth),
time / floor, and for the FLOP phases their MFU (floor / time). Then the whole step against the sum of the floors,
the peak memory, and `tea train --estimate`'s prediction for the same recipe and GPU count with its error.
`@GPUS` gives a run's GPU count where its metrics do not record `world_size` (runs before they did). Each GPU
validates its share of the prompts; a multi-GPU run recorded before validation was split (its validation rows
have no `sequences_by_rank`: every GPU validated every prompt) is compared with the prediction for that (every
GPU of the run validating all the prompts), and its row says so.

`--calibrate` prints the efficiencies (floor / time) of the runs together, what teacli.planner.CALIBRATION holds,
and the training phase's time a micro-batch (`train_micro_s` where the host bounds it).
Targets (docs/reproducing.md): reward scoring and reference >= 55% MFU, backward + step >= 45% MFU, generation
within 3x its memory floor, the step within 2x the sum of its floors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

PHASES = (("generate", "time_generate"), ("reward", "time_reward"), ("reference", "time_ref_logprobs"),
          ("train", "time_train"), ("sync", "time_sync"))


def measure(run: Path, gpus: int | None, card_name: str, skip: int, memory_gib: float | None = None) -> dict:
    import yaml

    from teacli import planner
    from teacli.config import recipe_from_dict

    tree = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe = recipe_from_dict(tree, source=str(run / "recipe.yaml"), record=True)  # at the defaults it ran under
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steady = rows[skip:] or rows
    world = gpus or int(rows[-1].get("world_size", 1))
    card = planner.CARDS[card_name]
    if memory_gib:  # the card's memory as the run saw it (e.g. an H200 held to an H100's 79.2 GiB)
        import dataclasses

        card = dataclasses.replace(card, memory_gib=memory_gib)
    pol = planner.model_shape(recipe.policy.name_or_path, "policy")
    rm = planner.model_shape(recipe.reward.name_or_path, "reward", classifier=True) if recipe.reward.kind == "hf" else None
    med = lambda key: statistics.median(float(r.get(key, 0.0)) for r in steady)  # noqa: E731
    seqs = recipe.rollout.prompts_per_step // world * recipe.rollout.group_size
    prompt, new = med("tokens_prompt") / seqs, med("tokens_completion") / seqs
    tokens, ctx = med("tokens_prompt") + med("tokens_completion"), prompt + new
    reward_tokens = med("tokens_reward")
    # what the reward model computed: with reward.share_prompts each group's prompt once (tokens_reward_run, recorded
    # since issue 45), else every conversation whole
    reward_run = med("tokens_reward_run") if all(r.get("tokens_reward_run") for r in steady) else reward_tokens
    ckpt = int(med("grad_ckpt_layers"))
    engine = "vllm" if "vllm_share_gib" in steady[-1] else "hf"
    floors = {
        "generate": planner.generation_floor(pol, card, seqs, prompt, new),
        "reward": planner.forward_floor(rm, card, reward_run, reward_tokens / seqs) if rm else 0.0,
        "reference": planner.forward_floor(pol, card, tokens, ctx) if recipe.kl.beta > 0 else 0.0,
        "train": planner.train_floor(pol, card, tokens, ctx, lora=recipe.policy.lora.enabled, checkpointed=ckpt),
        "sync": 2 * 2 * pol.params / card.bandwidth if engine == "vllm" else 0.0,
    }
    phases = {}
    for name, key in PHASES:
        t = med(key)
        count = {"generate": med("tokens_completion"), "reward": reward_run, "reference": tokens, "train": tokens}.get(name)
        phases[name] = {"s": t, "floor_s": floors[name], "tokens_per_s": count / t if count and t else None}
    out = {"run": run.name, "recipe": recipe.name, "gpus": world, "engine": engine, "card": card.name, "steps": len(rows),
           "steps_timed": len(steady), "step_s": med("time_step"), "phases": phases,
           "micro_batches": -(-seqs // recipe.optim.micro_batch_size),  # a GPU's, a step
           "peak_gib": max(float(r.get("gpu_peak_gib", 0.0)) for r in steady)}
    if engine == "vllm":  # torch counts vLLM's pool as allocated while it sleeps: the trainer's own peak is the rest
        out["trainer_peak_gib"] = out["peak_gib"] - med("vllm_sleep_freed_gib")
        out["free_before_wake_gib"] = med("gpu_free_gib_before_wake")
        # while it generates: what was in use before the KV cache woke, and the KV cache (what sleep freed, less the weights)
        out["generation_peak_gib"] = (card.memory_gib - out["free_before_wake_gib"]
                                      + med("vllm_sleep_freed_gib") - 2 * pol.params / 2**30)
    vals = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines() if x.strip()] if (run / "validation.jsonl").exists() else []
    vals = [v for v in vals if "time_validation" in v]
    if vals:
        v = vals[-1]
        vseqs = v["prompts"] * v["samples"]  # every GPU's together (the token counts are of all of them)
        # The most sequences a GPU validated: rank 0's share (`sequences_by_rank`); rows without it were written before
        # validation was split over GPUs, when every GPU validated every prompt.
        gpu_seqs = max(v["sequences_by_rank"]) if "sequences_by_rank" in v else vseqs
        vprompt, vnew = v["tokens_prompt"] / vseqs, v["tokens_completion"] / vseqs
        vfloor = (planner.generation_floor(pol, card, gpu_seqs, vprompt, vnew)  # the floor as the planner's: all at once
                  + (planner.forward_floor(rm, card, gpu_seqs * (vprompt + vnew), vprompt + vnew) if rm else 0.0))
        out["validation"] = {"s": v["time_validation"], "generate_s": v["time_generate"], "reward_s": v["time_reward"],
                             "floor_s": vfloor, "checkpoint_s": v.get("time_checkpoint"), "sequences_gpu": gpu_seqs,
                             "every_gpu_all_prompts": world > 1 and "sequences_by_rank" not in v}
    e = planner.estimate(recipe, gpus=world, card=card, prompt_tokens=round(prompt), engine=engine)
    val_e = e
    if out.get("validation", {}).get("every_gpu_all_prompts"):  # compared with what that code did: every GPU all prompts
        import copy

        every = copy.deepcopy(recipe)  # on the run's GPUs (its memory: the trainer's shards beside each engine)
        every.validation.prompts = recipe.validation.prompts * world
        val_e = planner.estimate(every, gpus=world, card=card, prompt_tokens=round(prompt), engine=engine)
    # the run's only validation, after its first step, compiled the hf engine's decode step for its new batch sizes
    first = len(vals) == 1 and vals[0].get("step", 0) > 0
    validation_s = val_e.seconds["validation"] + (val_e.seconds["validation_compile"] if first else 0.0)
    out["predicted"] = {"step_s": e.step_s, **{k: e.seconds[k] for k, _ in PHASES}, "validation_s": validation_s,
                        "checkpoint_s": e.seconds["checkpoint"], "peak_gib": e.memory_gib["peak"]}
    return out


def print_run(m: dict) -> None:
    print(f"\n{m['run']} ({m['recipe']}, {m['gpus']} GPU(s), {m['engine']} engine, {m['card']}; median of "
          f"{m['steps_timed']} of {m['steps']} steps)")
    print("| phase | s | tokens/s | floor s | s / floor | MFU | predicted s | error |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in PHASES:
        ph = m["phases"][name]
        if not ph["s"]:
            continue
        fl = ph["floor_s"]
        mfu = f"{fl / ph['s']:.0%}" if name in ("reward", "reference", "train") else "–"
        pred = m["predicted"][name]
        print(f"| {name} | {ph['s']:.2f} | {ph['tokens_per_s'] or 0:,.0f} | {fl:.2f} | {ph['s'] / fl:.1f}x | {mfu} | "
              f"{pred:.2f} | {pred / ph['s'] - 1:+.0%} |" if fl else f"| {name} | {ph['s']:.2f} | – | – | – | – | {pred:.2f} | |")
    floors = sum(ph["floor_s"] for ph in m["phases"].values())
    p = m["predicted"]
    print(f"| step | {m['step_s']:.2f} | | {floors:.2f} | {m['step_s'] / floors:.1f}x | | {p['step_s']:.2f} | {p['step_s'] / m['step_s'] - 1:+.0%} |")
    if "validation" in m:
        v = m["validation"]
        name = "validation (every GPU validated every prompt: recorded before validation was split)" if v.get("every_gpu_all_prompts") else "validation"
        print(f"| {name} | {v['s']:.1f} | | {v['floor_s']:.1f} | {v['s'] / v['floor_s']:.1f}x | | {p['validation_s']:.1f} | "
              f"{p['validation_s'] / v['s'] - 1:+.0%} |")
        if v.get("checkpoint_s"):
            print(f"| checkpoint | {v['checkpoint_s']:.1f} | | | | | {p['checkpoint_s']:.1f} | {p['checkpoint_s'] / v['checkpoint_s'] - 1:+.0%} |")
    mem = f"peak memory (torch's counter) {m['peak_gib']:.1f} GiB"
    if "trainer_peak_gib" in m:
        mem += (f"; training (less vLLM's sleeping pool) {m['trainer_peak_gib']:.1f} GiB; free before waking vLLM "
                f"{m['free_before_wake_gib']:.1f} GiB, so generation ~{m['generation_peak_gib']:.1f} GiB")
    print(mem + f"; predicted peak {p['peak_gib']:.1f} GiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories, each optionally RUN@GPUS")
    parser.add_argument("--card", default="h100", help="h100 or h200: whose peak and bandwidth the floors use")
    parser.add_argument("--memory-gib", type=float, help="the memory the runs had a GPU, where less than the card's")
    parser.add_argument("--skip", type=int, default=2, help="leave out the first steps (compile, warm-up)")
    parser.add_argument("--calibrate", action="store_true", help="print floor / time of each phase over the runs")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    args = parser.parse_args()
    results = []
    for spec in args.runs:
        path, _, gpus = spec.partition("@")
        if not (Path(path) / "metrics.jsonl").is_file():
            sys.exit(f"error: {path}: no metrics.jsonl (a run directory written by tea train)")
        results.append(measure(Path(path), int(gpus) if gpus else None, args.card, args.skip, args.memory_gib))
        print_run(results[-1])
    if args.calibrate:
        print("\nefficiency (floor / time), by run:")
        for m in results:
            cells = ", ".join(f"{k}_{m['engine'] if k == 'generate' else ''}".rstrip("_") + f" {ph['floor_s'] / ph['s']:.3f}"
                              for k, ph in m["phases"].items() if ph["s"] and ph["floor_s"])
            print(f"  {m['run']}: {cells}; train s a micro-batch {m['phases']['train']['s'] / m['micro_batches']:.3f} "
                  f"({m['micro_batches']} of them)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
