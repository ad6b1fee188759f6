"""`tea train`: the grouped on-policy training loop, top to bottom.

One step (paper, "Training interface"): sample P prompts → m rollouts each from the current
policy → score with the reward model → advantages A = rule(rewards[P, m]) → the policy gradient
(1/m)·Σ A_i ∇log π(y_i|x) with A as stop-gradient weights, plus β·KL to the frozen reference →
one optimizer step. The train and validation splits are chat-templated and filtered by
`data.max_prompt_tokens` once, at setup, so every step trains on exactly P prompts, and the step's
sequences are cut into exactly the engine's gradient-accumulation count of micro-batches: each
step is one optimizer update, whatever the lengths (metrics.jsonl `optimizer_step` == `step`).
Every `save_every` steps: validate (128 prompts × 32 samples, mean of the
top-10 rewards per prompt) and save an HF checkpoint with the trainer state; the best validated
checkpoint is named in selected.json. Re-running on the same run directory resumes from the last
complete checkpoint with the same data order and RNG.

The run directory (teacli/train/resume.py): rank 0 locks it for the whole run; a restart may change the
recipe's execution keys (config.EXECUTION_KEYS, recorded in resume.jsonl) but not what defines the
experiment, nor the train / val split files (their sha256 in data.json); the run's files are written
only once every check and the setup have passed (docs/training.md, "Resume").

Multi-process: `prompts_per_step` is global; each rank takes its share of the step's prompts. Validation
is split the same way: rank r validates the prompts r, r + world, r + 2·world, … and the ranks' rewards
and picks are gathered into one result, the one a single process would compute from the same samples.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.monitors import hacking
from teacli.rundir import RunDir, with_traceback_file
from teacli.session import generate_and_score
from teacli.train.batching import pad_share, stream_prompts, token_counts
from teacli.train.checkpoint import save_checkpoint
from teacli.train.errors import Interrupted, TrainError
from teacli.train.resume import Start, check_run_dir, check_selection, commit_run_dir, on_rank0, run_lock, say
from teacli.train.setup import TrainSession, dropped_warning, setup
from teacli.train.sharding import reshard, shares
from teacli.train.update import train_step
from teacli.train.validation import reset_watch_baseline, validate_on_ranks

if TYPE_CHECKING:
    import torch

    from teacli.config import Recipe


# ------------------------------------------------------------------------------------------------
# The run


REWARD_ERROR_LOG = "reward_error.log"  # the traceback of the user's reward code that stopped the run


def train(recipe: "Recipe", run_dir: Path, explicit: frozenset[str] = frozenset()) -> Path:
    """Run (or resume) training of `recipe` into `run_dir`; returns the run directory.

    One `tea train` per run directory: rank 0 holds its lock for the whole run. A restart resumes from
    the last complete checkpoint; it refuses a recipe that changes the experiment and data that changed
    since the run started, and takes changed execution keys (the resume rules, teacli/train/resume.py),
    rollout.colocated only where it is in `explicit` (the keys the recipe files or --set name).
    With rollout.colocated false the launch's last rollout.generation_ranks ranks generate (teacli/train/split.py).
    """
    from teacli.rollout.factory import AUTO_WITHOUT_CHOICE, recipe_engine
    from teacli.train import backend
    from teacli.train.importance import resolve_is_correction
    from teacli.train.progress import check_trackers

    check_trackers(recipe)  # an uninstalled tracker fails before any model is loaded
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    ro = recipe.rollout
    if not ro.colocated:  # split placement: what the launch must give it
        if world_size <= ro.generation_ranks:
            raise TrainError(f"rollout.generation_ranks: {ro.generation_ranks} generating rank(s) leave none of the launch's {world_size} "
                             f"process(es) to train (rollout.colocated: false); launch more processes (deepspeed --num_gpus N) or "
                             f"set rollout.colocated: true")
        if ro.generation_ranks > ro.prompts_per_step:
            raise TrainError(f"rollout.generation_ranks: {ro.generation_ranks} exceeds rollout.prompts_per_step={ro.prompts_per_step}: "
                             f"every generating rank generates at least one prompt's group")
        world_size -= ro.generation_ranks
    engine, why = recipe_engine(recipe, recipe.rollout.prompts_per_step // max(world_size, 1) * recipe.rollout.group_size)
    try:  # the importance correction the engine that will run needs (before any model is loaded)
        is_level = resolve_is_correction(recipe.rollout.is_correction, engine, recipe.rollout.max_staleness)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    if recipe.rollout.engine == "auto" and why not in AUTO_WITHOUT_CHOICE and os.environ.get("RANK", "0") == "0":
        print(f"rollout.engine auto: {engine} ({why})", file=sys.stderr, flush=True)
    engine = engine if ro.colocated else "hf"  # the trainers validate with the hf engine on their own module
    world, split = (backend.init_world(), None) if ro.colocated else backend.init_split_world(ro.generation_ranks)
    if split is not None and split.generator is not None:  # a generation rank: its whole run (teacli/train/split.py)
        return _generate(recipe, world, split, is_level, run_dir)
    if recipe.policy.kernels == "liger":  # the library and the device, before any model is loaded (the architecture: in setup)
        from teacli.kernels import require_liger

        try:
            require_liger(None, world.device)
        except ValueError as exc:
            raise TrainError(str(exc)) from None
    if world.device.type == "cpu":
        from teacli.models import keep_cpu_memory

        keep_cpu_memory()
    run = RunDir(run_dir)
    with run_lock(run, world):
        start = on_rank0(world, check_run_dir, run, recipe)
        if "rollout.colocated" in start.changed and "rollout.colocated" not in explicit:
            was = start.changed["rollout.colocated"][0]
            raise TrainError(f"rollout.colocated: {run.path} ran with generation {'colocated' if was else 'on ranks of its own'} "
                             f"(rollout.colocated: {str(was).lower()}), and this recipe leaves the key at its default; set it "
                             f"explicitly (--set rollout.colocated={str(not was).lower()}) to resume in the other placement")
        if start.step >= recipe.optim.steps:
            if split is not None and world.is_main:  # the generation ranks wait for a first step: there is none
                from teacli.train.split import Link

                Link(split.store, 0, 1 + split.generators, world.device).broadcast_object({"stop": True})
            if (chosen := on_rank0(world, check_selection, run, recipe)) is not None:
                say(world, chosen)
            say(world, f"{run.path} is already complete at step {start.step} (optim.steps={recipe.optim.steps}); "
                        f"raise optim.steps to train further")
        else:
            from teacli.rewards import RewardError

            try:
                _train_steps(recipe, run, world, start, is_level, engine, split)
            except RewardError as exc:  # the user's reward failed: one line, its traceback beside the records
                log = world.is_main and run.recipe.exists()  # not into a directory a failed start leaves empty
                raise TrainError(with_traceback_file(str(exc), exc.details, run.path / REWARD_ERROR_LOG) if log else str(exc)) from None
            except SystemExit as exc:  # code the run called (a user's advantage rule, a library) exited: not a finished run
                raise TrainError(f"training of {run.path} stopped: code it called exited (sys.exit({exc.code!r})) without "
                                 f"finishing the run; rerun the command to resume from its last checkpoint") from None
    if world.world_size > 1:  # every rank finished: tear the group down now, or a rank can abort at interpreter exit
        backend.close_world()  # ("terminate called without an active exception", exit -6) after a complete run
    return run.path


def _generate(recipe: "Recipe", world, split, is_level: str, run_dir: Path) -> Path:
    """A generation rank of split placement: its whole run; an error is said on stderr from this rank (the launch's
    rank 0, which reports errors, is a trainer) before it stops the launch."""
    from teacli.train.split import run_generator

    try:
        run_generator(recipe, world, split, is_level,
                      lambda rollout, reward, prompts, k, pos: generate_step(rollout, reward, prompts, recipe, world, k, pos))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"error: generation rank {world.rank} (rollout.colocated: false): {type(exc).__name__}: {first}", file=sys.stderr, flush=True)
        raise
    return run_dir


def _train_steps(recipe: "Recipe", run: RunDir, world, resume: "Start", is_level: str, engine_name: str, split=None) -> None:
    """Set up, write the run's files (every check has passed by then), restore a resumed run's state, train."""
    import torch

    from teacli.monitors.tail_check import TailCheck
    from teacli.train import backend
    from teacli.train.progress import Progress, metrics_sink

    torch.manual_seed(recipe.seed + world.rank)
    random.seed(recipe.seed + world.rank)
    reset_watch_baseline()
    s = _setup_or_explain(recipe, world, is_level, engine_name)
    start, position, memory = _begin(s, recipe, run, world, resume)
    # None on-policy (rollout.max_staleness 0) and colocated; split placement: the generation ranks' batches
    ahead = _one_step_ahead(s, recipe, world, is_level, resume) if split is None else _split_rollouts(s, recipe, world, split, resume, start, position)
    sink = metrics_sink(run, recipe, world, start)
    adv_params = dict(recipe.advantage.params)
    if recipe.advantage.name == "chow":
        adv_params["generator"] = torch.Generator().manual_seed(recipe.seed * 7919 + world.rank + start)
    progress = Progress(recipe.optim.steps, start, enabled=world.is_main, name=recipe.name)
    tail_check = TailCheck(recipe.advantage.tail_check_r2, recipe.advantage.tail_check_window, run.path, sink.note, world.is_main)
    phase, step = "setup", start
    try:
        has_baseline = backend.broadcast_object(any(r.get("step") == 0 for r in run.read_jsonl(run.validation)))
        if start == 0 and recipe.validation.enabled and recipe.validation.at_start and not has_baseline:
            # The untrained policy's score: the baseline every checkpoint is compared with.
            phase = "validation of the untrained policy (validation.samples, rollout.batch_size)"
            result = validate_on_ranks(s.engine, s.rollout, s.reward, s.val_prompts, recipe, world, progress,
                                       "step 0 validation (untrained policy)")
            if world.is_main:
                sink.validation({"step": 0, **result})
                sink.note(f"step 0 (untrained policy): validation {result['score']:.4f}")
        for step in range(start, recipe.optim.steps):
            t_step = time.perf_counter()
            backend.peak_memory_gib(world.device)  # CUDA: count this step's peaks from here
            # a reward model counts the tokens it scores (off-policy it also scores the next batch meanwhile)
            scored = reward_counts(s.reward) if ahead is None else None

            # 1. Rollouts: this rank's share of the P prompts × m samples, scored.               rewards [P/W, m]
            #    On-policy from the weights this step updates; one step off (rollout.max_staleness 1), the batch made
            #    while the last step trained, and the next one begun from these weights.
            phase = "generation (rollout.batch_size, rollout.max_new_tokens)"
            sel, position, rollout_times = step_rollouts(s, recipe, world, ahead, step, position)

            # 2. Advantages: the rule on each group's rewards, then advantage.scale_rewards.       [P/W, m]
            unscaled, advantages = step_advantages(recipe, sel, adv_params)

            # 3. The update: Σ A·∇log π + β·∇KL over the step's sequences (P·m/W a rank), one optimizer step.
            phase = "training (optim.micro_batch_size, policy.gradient_checkpointing)"
            peaks = [backend.peak_memory_gib(world.device)]
            t0 = time.perf_counter()
            stats = train_step(s.engine, s.reference, recipe, *train_shard(sel, advantages, recipe, world), s.pad_id, world.device,
                               is_level=is_level, denominator=train_denominator(recipe, world))
            t_train = time.perf_counter() - t0 - stats.pop("time_ref_logprobs")
            t_ref = time.perf_counter() - t0 - t_train
            peaks.append(backend.peak_memory_gib(world.device))

            # 4. The sampler gets the new weights (a no-op for an engine that samples from the trainer's module;
            #    split placement: broadcast to the generation ranks).
            t0 = time.perf_counter()
            weights = backend.named_weights(s.engine.module, recipe.backend.zero_stage)
            if split is not None:
                ahead.push(weights, version=step + 1)
            else:
                s.rollout.load_weights(weights)
            t_sync = time.perf_counter() - t0
            peaks.append(backend.peak_memory_gib(world.device))

            # 5. The step's record; every checkpoint.save_every steps, validation and a checkpoint.
            if peaks[0] is not None:  # CUDA: torch.cuda.max_memory_allocated of the step and of its training phase
                memory.update(gpu_peak_gib=max(peaks), gpu_peak_train_gib=peaks[1],
                              gpu_held_gib=torch.cuda.memory_allocated(world.device) / 2**30)  # what stays between steps
            times = {**rollout_times, "time_ref_logprobs": t_ref, "time_train": t_train, "time_sync": t_sync,
                     "time_step": time.perf_counter() - t_step}
            local, record = step_record(s, recipe, world, step, sel, unscaled, advantages, stats, times, memory, scored)
            sink.write(record, local=local)
            if world.is_main and record.get("dynamic_filled_groups", 0) > 0:
                sink.note(
                    f"step {step + 1}: dynamic sampling found too few informative groups in "
                    f"{1 + recipe.rollout.max_resample_rounds} rounds (rollout.max_resample_rounds); "
                    f"{record['dynamic_filled_groups']:g} uninformative group(s) per rank kept with advantage 0"
                )
            tail_check.observe(record)
            progress.update(record)
            if (step + 1) % recipe.checkpoint.save_every == 0 or step + 1 == recipe.optim.steps:
                phase = "validation and checkpoint (validation.samples, rollout.batch_size)"
                _checkpoint_and_validate(run, s.engine, s.rollout, s.tokenizer, s.reward, s.val_prompts, recipe, world, step + 1,
                                         sink, position, progress, ahead)
    except torch.OutOfMemoryError:
        raise TrainError(
            f"out of memory during {phase}: lower the recipe keys named there (they may change on resume), or use "
            f"backend.zero_stage: 3 and backend.offload_optimizer: true; the run directory keeps its last complete checkpoint"
        ) from None
    except KeyboardInterrupt:
        raise Interrupted(run, step + 1, phase.split(" (")[0]) from None
    finally:
        progress.close()
        sink.close()
        if ahead is not None:
            ahead.close()
    if world.world_size > 1 and hasattr(s.rollout, "close"):
        s.rollout.close()  # vLLM's parallel groups go before the trainer's process group (train: backend.close_world)


# ------------------------------------------------------------------------------------------------
# The step's parts


def step_rollouts(s: TrainSession, recipe: "Recipe", world, ahead, step: int, position: int):
    """The step's groups on this rank (a Selection), the data position after them, and their times and weights'
    version for metrics.jsonl. `ahead`: None on-policy; else where the batches come from, made while the last step
    trained: one step off-policy's OneStepAhead (teacli/train/offpolicy.py) or split placement's generation ranks
    (SplitRollouts, teacli/train/split.py)."""
    from teacli.train import backend

    if ahead is None:
        s.rollout.wake()
        with backend.generation_weights(s.engine, recipe.backend.zero_stage, s.rollout):
            sel, position, t_gen, t_rew = generate_step(s.rollout, s.reward, s.train_prompts, recipe, world, step, position)
        s.rollout.sleep()
        return sel, position, {"time_generate": t_gen, "time_reward": t_rew, "weights_version": step}
    weights = lambda: backend.named_weights(s.engine.module, recipe.backend.zero_stage)  # noqa: E731
    batch, waited = ahead.next_batch(step, position, weights, more=step + 1 < recipe.optim.steps)
    return batch.sel, batch.position, {**batch.times, "weights_version": batch.version, "staleness": step - batch.version,
                                       "time_wait_rollouts": waited}


def train_shard(sel, advantages, recipe: "Recipe", world) -> tuple:
    """(prompt ids, groups, advantages) this rank trains on: its own groups, or where the ranks hold unequal numbers
    of them (P not a multiple of W) its slice of the step's sequences (teacli/train/sharding.py)."""
    if recipe.rollout.prompts_per_step % world.world_size == 0:
        return sel.prompt_ids, sel.groups, advantages
    return reshard(sel.prompt_ids, sel.groups, advantages, world.rank, world.world_size)


def train_denominator(recipe: "Recipe", world) -> float | None:
    """What the loss divides by: None (this rank's sequences) where the ranks hold equal shares, else P·m / W."""
    P, W = recipe.rollout.prompts_per_step, world.world_size
    return None if P % W == 0 else P * recipe.rollout.group_size / W


def generate_step(rollout, reward, train_prompts, recipe, world, step: int, position: int):
    """This rank's groups of one step, from data position `position` (teacli.train.dynamic).

    Returns (Selection, the data position after the step, generation and reward seconds).
    Without rollout.dynamic_sampling: this rank's share of the P prompts at `position`, all kept.
    """
    import torch

    from teacli.train import backend, dynamic

    r = recipe.rollout

    def run_round(start: int, count: int, k: int) -> dynamic.Round:
        batch = stream_prompts(train_prompts, start, count, recipe.seed)
        # Round 0's seed is the step's; extra rounds get their own streams.
        seed = recipe.seed * 1_000_003 + step * 131 + world.rank + k * 1_000_000_007
        prompts, prompt_ids, groups, rewards, t_gen, t_rew = generate_and_score(rollout, reward, batch, recipe, r.group_size, seed=seed)
        return dynamic.Round(prompts, prompt_ids, groups, rewards, t_gen, t_rew)

    if r.dynamic_sampling:  # rounds agreed over the ranks (P a multiple of them)
        local_P = r.prompts_per_step // world.world_size
        rounds, position = dynamic.collect(
            run_round, want=local_P, position=position, world_size=world.world_size, rank=world.rank,
            max_extra_rounds=r.max_resample_rounds, dynamic=True, reduce_max=backend.all_reduce_max,
        )
        sel = dynamic.select(rounds, local_P)
    else:  # this rank's contiguous share of the step's P prompts (teacli/train/sharding.py)
        start, count = shares(r.prompts_per_step, world.world_size)[world.rank]
        rd = run_round(position + start, count, 0)
        rounds, position = [rd], position + r.prompts_per_step
        sel = dynamic.Selection(rd.prompts, rd.prompt_ids, rd.groups, rd.rewards, torch.zeros(len(rd.groups), dtype=torch.bool))
    return sel, position, sum(rd.time_generate for rd in rounds), sum(rd.time_reward for rd in rounds)


def step_advantages(recipe: "Recipe", sel, adv_params: dict[str, Any]) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The rule's advantages [P/W, m] of the step's groups (float64) and what the loss weighs with (float32): scaled
    by advantage.scale_rewards, zero for the groups dynamic sampling kept only to fill the step."""
    from teacli.advantages import compute_advantages, scale_advantages

    try:
        unscaled = compute_advantages(recipe.advantage.name, sel.rewards.double(), **adv_params)
    except ValueError as exc:
        raise TrainError(f"advantage.name={recipe.advantage.name!r}: {exc}") from None
    how = recipe.advantage.scale_rewards
    advantages = scale_advantages(unscaled, sel.rewards.double(), how, batch_std=batch_reward_std(sel.rewards, how)).float()
    if sel.filled.any():  # dynamic sampling ran out of rounds: these groups only keep the step's shape
        advantages[sel.filled] = 0.0
    return unscaled, advantages


def batch_reward_std(rewards: "torch.Tensor", how: str) -> float | None:
    """The population std of every rank's rewards [p_r, m] (ranks may hold different numbers of groups), for
    advantage.scale_rewards: batch; None for any other scale."""
    if how != "batch":
        return None
    from teacli.train import backend

    r = rewards.double()
    sums = backend.all_reduce_mean({"n": float(r.numel()), "s1": float(r.sum()), "s2": float((r * r).sum())})
    m1, m2 = sums["s1"] / sums["n"], sums["s2"] / sums["n"]
    return math.sqrt(max(m2 - m1 * m1, 0.0))


def reward_counts(reward) -> dict[str, int | None] | None:
    """What a reward model has counted so far (tokens scored, run, and padded in its batches; None for a count it does
    not keep); None for a reward that counts nothing. A step's record takes the difference of two of these."""
    if not hasattr(reward, "tokens_scored"):
        return None
    return {"tokens_reward": reward.tokens_scored, "tokens_reward_run": getattr(reward, "tokens_run", None),
            "tokens_reward_padded": getattr(reward, "tokens_padded", None)}


# metrics.jsonl values that are means over a rank's groups or sequences (rank-weighted where shares are unequal)
GROUP_MEANS = ("reward_mean", "reward_max", "reward_std", "adv_mean", "adv_std", "adv_std_unscaled", "adv_nonzero_frac",
               "gen_len_mean", "gen_finished_frac")


def step_record(s: TrainSession, recipe: "Recipe", world, step: int, sel, unscaled, advantages, stats: dict[str, float],
                times: dict[str, float], memory: dict[str, Any], scored: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """metrics.jsonl's line for `step` (0-based): this rank's values, and their mean over the ranks (what is written)."""
    import torch

    from teacli.advantages.tail import tail_check_stats
    from teacli.train import backend

    groups, rewards = sel.groups, sel.rewards
    lengths = torch.tensor([len(c.token_ids) for g in groups for c in g], dtype=torch.float32)
    record = {
        "step": step + 1,
        "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max(dim=1).values.mean()),
        "reward_std": float(rewards.std(dim=1, correction=0).mean()),
        "adv_mean": float(advantages.mean()), "adv_std": float(advantages.std(correction=0)),
        "adv_std_unscaled": float(unscaled.std(correction=0)),  # before advantage.scale_rewards
        "adv_min": float(advantages.min()), "adv_max": float(advantages.max()),
        "adv_nonzero_frac": float((advantages.abs() > 1e-12).float().mean()),
        **stats,
        "lr": float(s.engine.get_lr()[0]),
        "gen_len_mean": float(lengths.mean()), "gen_finished_frac": float(sum(c.finished for g in groups for c in g) / lengths.numel()),
        "prompts": len(sel.groups),
        **times, "tokens_per_s": float(lengths.sum()) * world.world_size / max(times["time_generate"], 1e-9),
        **s.rollout.stats(),  # vllm: log-prob agreement with the trainer after the last push
        **sel.stats,  # dynamic sampling: rounds, dropped and filled groups
        **tail_check_stats(rewards),  # the groups' upper-tail QQ R² (docs/diagnostics.md)
        **memory,  # checkpointed layers; CUDA: the estimated and measured peaks (GiB)
        **token_counts(sel.prompt_ids, groups),  # what each phase processed (benchmarks/phases.py: the floors)
        "world_size": world.world_size,
    }
    if scored is not None:  # the tokens the reward model scored this step, and those it ran (its shared prompts once)
        now = reward_counts(s.reward)
        record.update({k: now[k] - v for k, v in scored.items() if v is not None})
        if "tokens_reward_padded" in record:  # the padding its batches computed beside the tokens they ran
            record["pad_frac_reward"] = pad_share(record["tokens_reward_padded"], record["tokens_reward_run"] + record["tokens_reward_padded"])
    # The norm is global (the same on every rank), and so is whether the clip bound.
    record["grad_clipped"] = recipe.optim.max_grad_norm > 0 and stats["grad_norm"] > recipe.optim.max_grad_norm
    shared = {k: v for k, v in record.items() if k != "step"}
    if recipe.rollout.prompts_per_step % world.world_size:  # ranks hold unequal numbers of groups: weigh their means by it
        weight = len(groups) * world.world_size / recipe.rollout.prompts_per_step
        shared.update({k: shared[k] * weight for k in GROUP_MEANS if k in shared})
    local, record = record, {"step": step + 1, **backend.all_reduce_mean(shared)}
    record["prompts"] = round(record["prompts"] * world.world_size)  # all ranks together
    record["optimizer_step"], record["grad_clipped"] = round(record["optimizer_step"]), record["grad_clipped"] > 0.5
    if recipe.rehearsal.enabled:
        record["rehearsal"] = True  # random weights: for time and memory only
    return local, record


# ------------------------------------------------------------------------------------------------
# Setup, resume, validation and checkpoints


def _setup_or_explain(recipe: "Recipe", world, is_level: str, engine_name: str) -> TrainSession:
    """`setup`, with an out-of-memory while loading said as what to change."""
    import torch

    try:
        return setup(recipe, world, is_level, engine_name)
    except torch.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info(world.device) if world.device.type == "cuda" else (0, 0)
        raise TrainError(
            f"out of GPU memory while loading the policy, reference, reward model and optimizer ({total / 2**30:.0f} GiB card, "
            f"{world.world_size} GPU(s)): shard the model states over more GPUs (backend.zero_stage: 3), move the optimizer "
            f"to CPU (backend.offload_optimizer: true), or put the reward model on another device (reward.device); "
            f"`tea train RECIPE --estimate` says what fits"
        ) from None


def _one_step_ahead(s: TrainSession, recipe: "Recipe", world, is_level: str, resume: "Start"):
    """rollout.max_staleness 1: the rollouts made one step ahead from the sampler's copy of the policy, with a resumed
    run's batch in flight read from its checkpoint; None on-policy."""
    if not recipe.rollout.max_staleness:
        return None
    from teacli.train.offpolicy import OneStepAhead

    model, rollout = s.sampler
    ahead = OneStepAhead(model, rollout, lambda ro, k, pos: generate_step(ro, s.reward, s.train_prompts, recipe, world, k, pos),
                         s.pad_id, recipe.rollout.batch_size, behaviour=is_level != "off",
                         lora_module=s.engine.module if recipe.policy.lora.enabled else None)
    if resume.checkpoint is not None and ahead.load_pending(resume.checkpoint, world.rank) is None:
        say(world, f"{resume.checkpoint.name} keeps no batch in flight: the next batch is generated from its weights")
    return ahead


def _split_rollouts(s: TrainSession, recipe: "Recipe", world, split, resume: "Start", start: int, position: int):
    """rollout.colocated false: the training ranks' side of split placement, the generation ranks told where the run
    starts (a resumed run's batch in flight read from its checkpoint) and given the weights it starts from."""
    from teacli.train import backend
    from teacli.train.split import Link, SplitRollouts

    link = Link(split.store, 0, 1 + split.generators, world.device) if world.is_main else None
    rollouts = SplitRollouts(link, world, recipe.rollout.max_staleness, recipe.optim.steps, recipe.rollout.prompts_per_step,
                             lora_module=s.engine.module if recipe.policy.lora.enabled else None)
    if resume.checkpoint is not None and recipe.rollout.max_staleness and not rollouts.load_pending(resume.checkpoint):
        say(world, f"{resume.checkpoint.name} keeps no batch in flight: the next batch is generated from its weights")
    rollouts.begin(start, position, backend.named_weights(s.engine.module, recipe.backend.zero_stage))
    return rollouts


def _begin(s: TrainSession, recipe: "Recipe", run: RunDir, world, resume: "Start") -> tuple[int, int, dict[str, Any]]:
    """Write the run's files (every check has passed), say what was chosen, restore a resumed run's trainer state and
    give the sampler the trainer's weights. Returns the first step, the data position and the memory fields every
    step records."""
    import torch

    from teacli.train import backend

    for note in on_rank0(world, commit_run_dir, run, recipe, resume, s.data_report):
        say(world, note)
    if resume.restart:
        say(world, resume.note(run, recipe))
        if (chosen := on_rank0(world, check_selection, run, recipe)) is not None:  # stopped while choosing before
            say(world, chosen)
    if s.checkpointing.layers or s.checkpointing.estimate is not None:  # nothing on a CPU run that checkpoints nothing
        say(world, s.checkpointing.describe())
    # Recorded with every step (an execution key: a resumed run may change it), beside the measured peaks.
    memory: dict[str, Any] = {"grad_ckpt_layers": s.checkpointing.layers}
    if s.checkpointing.estimate is not None:
        memory["mem_estimate_gib"] = s.checkpointing.estimate / 2**30
    if (warning := dropped_warning(s.data_report)) is not None:
        say(world, warning)
    start, position = resume.step, 0
    if resume.checkpoint is not None:
        path = resume.checkpoint
        say(world, f"loading the trainer state of {path.name} (weights, optimizer, RNG)")
        try:
            backend.load_engine_state(s.engine, str(path / "trainer"), tag="state")
            rng = torch.load(path / "rng.pt", weights_only=False)
        except (ValueError, RuntimeError, EOFError, OSError) as exc:
            raise TrainError(f"cannot resume from {path}: {exc}; move that checkpoint out of {run.checkpoints} to resume "
                             f"from the one before it, or start over in a new --run-dir") from None
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        state = json.loads((path / "trainer_state.json").read_text()) if (path / "trainer_state.json").exists() else {}
        position = int(state.get("data_position", start * recipe.rollout.prompts_per_step))
    # Engines with their own copy of the weights (vllm) get the trainer's, now and after every update.
    s.rollout.load_weights(backend.named_weights(s.engine.module, recipe.backend.zero_stage))
    return start, position, memory


def _checkpoint_and_validate(run, engine, rollout, tokenizer, reward, val_prompts, recipe, world, step, sink, position, progress,
                             ahead=None) -> None:
    from teacli.train import backend

    if recipe.validation.enabled:
        if ahead is not None:
            ahead.hold()  # the next batch first: both would sample from the process's one random generator
        t0 = time.perf_counter()
        result = validate_on_ranks(engine, rollout, reward, val_prompts, recipe, world, progress, f"step {step} validation")
        result["time_validation"] = time.perf_counter() - t0
    # data_position: prompts of the data order consumed so far (step × P unless dynamic sampling drew more).
    t0 = time.perf_counter()
    # One step off-policy: the batch in flight is kept in the checkpoint (teacli/train/offpolicy.py).
    keep = None if ahead is None else (lambda directory: ahead.save_pending(directory, world.rank))
    save_checkpoint(run, engine, tokenizer, recipe, world, step, {"data_position": position}, keep)
    t_save = time.perf_counter() - t0
    if world.is_main:
        if recipe.validation.enabled:
            sink.validation({"step": step, **result, "time_checkpoint": t_save})
            selected = run.update_selection()
            sink.note(f"step {step}: validation {result['score']:.4f}; selected step {selected['step']}")
            for note in hacking.flagged(result):
                sink.note(f"step {step}: reward-hacking watch: {note}")
        run.prune(recipe.checkpoint.keep_last)
    backend.barrier()


