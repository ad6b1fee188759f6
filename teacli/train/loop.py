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

import dataclasses
import json
import math
import os
import random
import shutil
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.diagnostics import hacking
from teacli.rundir import RunDir, step_dir_name, with_traceback_file, write_text_atomic, writing
from teacli.train.checkpoint import save_hf_model
from teacli.train.errors import Interrupted, TrainError
from teacli.train.resume import Start, check_run_dir, check_selection, commit_run_dir, on_rank0, run_lock, say

if TYPE_CHECKING:
    import torch

    from teacli.config import Recipe
    from teacli.types import Completion, Prompt


# ------------------------------------------------------------------------------------------------
# Setup


@lru_cache(maxsize=2)
def prompt_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The data order of one pass over n prompts: a seeded permutation, identical on resume.

    Cached: every step reads the current epoch's order, which is shuffled once.
    """
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


def stream_prompts(prompts: list[Any], start: int, count: int, seed: int) -> list[Any]:
    """The prompts at positions [start, start + count) of the run's data stream: epoch after epoch
    of seeded permutations, so a position always names the same prompt (resume replays nothing twice)."""
    n = len(prompts)
    out = []
    for k in range(start, start + count):
        epoch, pos = divmod(k, n)
        out.append(prompts[prompt_order(n, seed, epoch)[pos]])
    return out


def encode_prompts(tokenizer, prompts: list["Prompt"], max_tokens: int) -> tuple[list[tuple["Prompt", list[int]]], list[int]]:
    """Chat-template each prompt: (prompt, token ids) of those within `max_tokens`, and the dropped ones' lengths."""
    from teacli.models import encode_chat

    kept, dropped = [], []
    for p in prompts:
        toks = list(encode_chat(tokenizer, p.messages, add_generation_prompt=True))
        if len(toks) > max_tokens:
            dropped.append(len(toks))
        else:
            kept.append((p, toks))
    return kept, dropped


def encode_splits(tokenizer, recipe: "Recipe") -> tuple[list[tuple["Prompt", list[int]]], list[tuple["Prompt", list[int]]], dict[str, Any]]:
    """The train split and the validation prompts, encoded and filtered once; what was dropped (data.json).

    Validation uses the first `validation.prompts` prompts of the val split that fit. Too few prompts
    left for a step (or for validation) is a TrainError naming the key.
    """
    from teacli.data.load import load_split

    d = recipe.data
    limit = d.max_prompt_tokens
    train, train_dropped = encode_prompts(tokenizer, load_split(d.dir, d.train_split), limit)
    val_all, val_dropped = encode_prompts(tokenizer, load_split(d.dir, d.val_split), limit) if recipe.validation.enabled else ([], [])
    val = val_all[: recipe.validation.prompts]
    report: dict[str, Any] = {"max_prompt_tokens": limit}
    for name, split, kept, dropped in (("train", d.train_split, train, train_dropped), ("validation", d.val_split, val_all, val_dropped)):
        report[name] = {"split": split, "prompts": len(kept) + len(dropped), "kept": len(kept), "dropped": len(dropped),
                        "longest_dropped_tokens": max(dropped, default=0)}
    needs = [("rollout.prompts_per_step", recipe.rollout.prompts_per_step, "train", train)]
    if recipe.validation.enabled:
        needs.append(("validation.prompts", recipe.validation.prompts, "validation", val_all))
    for key, need, name, kept in needs:
        if len(kept) < need:
            r = report[name]
            why = (f"; {r['dropped']} are longer than data.max_prompt_tokens={limit} (longest {r['longest_dropped_tokens']} tokens): "
                   f"raise data.max_prompt_tokens" if r["dropped"] else "")
            raise TrainError(f"{key}={need} needs {need} prompts, but data.{'train_split' if name == 'train' else 'val_split'} "
                             f"{r['split']!r} of data.dir has {r['kept']} of {r['prompts']} usable{why} or lower {key}")
    report["validation"]["used"] = len(val)
    return train, val, report


def dropped_warning(report: dict[str, Any]) -> str | None:
    """One line on what encode_splits dropped (None when nothing was)."""
    parts = [f"{report[n]['dropped']} of {report[n]['prompts']} {n} prompts" for n in ("train", "validation") if report[n]["dropped"]]
    if not parts:
        return None
    longest = max(report[n]["longest_dropped_tokens"] for n in ("train", "validation"))
    return (f"warning: dropped {' and '.join(parts)} longer than data.max_prompt_tokens={report['max_prompt_tokens']} tokens "
            f"after the chat template (longest {longest}); raise data.max_prompt_tokens to train on them")


def micro_batches(lengths: list[int], n: int, groups: list[int] | None = None) -> list[list[int]]:
    """Exactly `n` micro-batches of sequence indices: sorted by length (by group, then length, when
    `groups` is given: the sequences of a prompt stay together), then split evenly.

    Sizes differ by at most one (the shorter sequences get the larger batches); with fewer sequences
    than `n`, the last ones are empty. Exactly `n` backward passes make the last one DeepSpeed's
    gradient-accumulation boundary by construction, whatever the number of sequences.
    """
    key = (lambda i: lengths[i]) if groups is None else (lambda i: (groups[i], lengths[i]))
    order = sorted(range(len(lengths)), key=key)
    q, r = divmod(len(order), n)
    out, start = [], 0
    for k in range(n):
        size = q + (k < r)
        out.append(order[start : start + size])
        start += size
    return out


def _padded(rows: list[list[int]], pad_id: int, left: bool) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Token rows padded to the longest (at least 1 column) on the left or the right: ids and mask [R, W] (CPU)."""
    import torch

    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            cols = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, cols] = torch.tensor(r, dtype=torch.long)
            mask[i, cols] = 1
    return ids, mask


def pack(prompt_ids: list[list[int]], completions: list[list[int]], pad_id: int, device) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", int]:
    """Left-pad prompts and right-pad completions into one batch.

    Returns input_ids [B, Lp+Tc], attention_mask [B, Lp+Tc], completion mask [B, Tc], Lp.
    """
    import torch

    p_ids, p_mask = _padded(prompt_ids, pad_id, left=True)
    c_ids, c_mask = _padded(completions, pad_id, left=False)
    input_ids, attn = torch.cat([p_ids, c_ids], dim=1), torch.cat([p_mask, c_mask], dim=1)
    return input_ids.to(device), attn.to(device), c_mask.to(device), p_ids.shape[1]


def pack_shared(prompt_ids: list[list[int]], completions: list[list[int]], pad_id: int, device) -> tuple["torch.Tensor", ...]:
    """The sequences of `pack` with each distinct prompt once (for `logprobs.shared_prompt_logprobs`).

    Returns prompt ids and mask [U, Lp] (left-padded), row_of [B] (each sequence's prompt), completion
    ids and mask [B, Tc] (right-padded).
    """
    import torch

    distinct: dict[tuple[int, ...], int] = {}
    row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids]
    p_ids, p_mask = _padded([list(p) for p in distinct], pad_id, left=True)
    c_ids, c_mask = _padded(completions, pad_id, left=False)
    return tuple(t.to(device) for t in (p_ids, p_mask, torch.tensor(row_of), c_ids, c_mask))


def shares_prompts(recipe: "Recipe", engine, reference) -> bool:
    """Whether `train_step` runs each distinct prompt of a micro-batch once (optim.share_prompts, and the
    policy and the reference both allow it: no gradient checkpointing, logits = head(hidden))."""
    from teacli.logprobs import can_share_prompts

    ref_ok = reference is None or isinstance(reference, str) or can_share_prompts(reference)  # str: "adapters-disabled"
    return recipe.optim.share_prompts and can_share_prompts(engine) and ref_ok


def _setup(recipe: "Recipe", world, is_level: str, engine_name: str):
    """Models, reward, data, engines: everything the loop needs, built once. is_level: the resolved
    rollout.is_correction (the vllm engine returns every sampled token's log-prob only where it is on);
    engine_name: rollout.engine as resolved (`teacli.rollout.factory.recipe_engine`)."""
    import torch

    from teacli import models
    from teacli.kernels import apply_kernels, resolve_kernels
    from teacli.rewards import build_reward
    from teacli.rollout.base import stop_token_ids
    from teacli.rollout.factory import build_engine as build_rollout
    from teacli.train import backend

    precision = backend.resolve_precision(recipe.backend.precision, world.device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    loaded = recipe  # what is loaded: in a rehearsal, stand-ins of the recipe's models and data (recipe.yaml keeps the real names)
    if recipe.rehearsal.enabled:
        from teacli import standins

        say(world, standins.banner(recipe))
        try:
            loaded = standins.stand_in(recipe)
        except ValueError as exc:
            raise TrainError(str(exc)) from None
    tokenizer = models.load_tokenizer(loaded.policy)
    try:
        stop_token_ids(tokenizer, recipe.rollout.stop_tokens)  # before any model: a stop token that is not one token stops at once
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    train_prompts, val_prompts, data_report = encode_splits(tokenizer, loaded)  # before any model: a data error stops at once
    say(world, f"loading the policy {recipe.policy.name_or_path} on {world.device.type}" + (" (a stand-in: random weights)" if recipe.rehearsal.enabled else ""))
    policy = models.load_policy(loaded.policy, dtype=torch.float32, device=world.device)
    cpu_attention = recipe.policy.attn_implementation is None and world.device.type == "cpu"
    if cpu_attention:  # grouped K/V without copies, multi-query bf16 attention in fp32 (models.sdpa_gqa_attention)
        policy.set_attn_implementation(models.register_sdpa_gqa())
    what = recipe.reward.name_or_path or recipe.reward.function or recipe.reward.url
    say(world, f"loading the reward ({recipe.reward.kind}{f': {what}' if what else ''})")
    reward = build_reward(loaded.reward, device=world.device, tokenizer=tokenizer)
    # A reward model on this device: what it holds counts for `auto` checkpointing and for the vllm engine's plan.
    module = getattr(reward, "model", None)
    reward_bytes = (sum(p.numel() * p.element_size() for p in module.parameters() if p.device == world.device)
                    if isinstance(module, torch.nn.Module) else 0)
    try:
        checkpointing = backend.resolve_checkpointing(recipe, policy, world, held=reward_bytes)  # `auto`: the fewest layers that fit
        models.set_gradient_checkpointing(policy, checkpointing.layers)
        kernels = resolve_kernels(recipe.policy.kernels, policy, world.device)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    apply_kernels(policy, kernels, generates=True)  # before LoRA wraps the model and DeepSpeed the parameters
    reference = None
    if recipe.kl.beta > 0:
        if recipe.policy.lora.enabled:
            reference = "adapters-disabled"
        else:
            say(world, f"loading the reference policy (kl.beta={recipe.kl.beta:g})")
            reference = models.load_policy(loaded.policy, dtype=dtype, device=world.device)
            if cpu_attention:
                reference.set_attn_implementation(models.register_sdpa_gqa())
            reference.eval().requires_grad_(False)
            apply_kernels(reference, kernels, generates=False)
    if recipe.policy.lora.enabled:
        from teacli.lora import apply_lora

        policy = apply_lora(policy, recipe.policy.lora)

    P, m = recipe.rollout.prompts_per_step, recipe.rollout.group_size
    if P % world.world_size:
        raise TrainError(f"rollout.prompts_per_step={P} must be divisible by the number of processes ({world.world_size})")
    local_seqs = (P // world.world_size) * m
    grad_accum = -(-local_seqs // recipe.optim.micro_batch_size)
    trainer_bytes = backend.model_state_bytes(recipe, policy, world)  # before ZeRO-3 partitions the parameters
    # The vllm engine sizes itself from what this process will hold beside it: the trainer's states and a reward
    # model on this device (allocated already, and not part of the trainer's: without it, what the reward model
    # holds hides what the trainer allocates only at its first step, and the engine cannot wake at the second).
    trainer_bytes += reward_bytes
    say(world, f"building the trainer (DeepSpeed ZeRO-{recipe.backend.zero_stage}, {precision})")
    engine = backend.build_engine(policy, recipe, world, grad_accum, precision)
    say(world, f"building the {engine_name} rollout engine")
    rollout = build_rollout(
        dataclasses.replace(recipe.rollout, engine=engine_name), engine.module, tokenizer, policy=recipe.policy, seed=recipe.seed + world.rank,
        max_model_len=recipe.data.max_prompt_tokens + recipe.rollout.max_new_tokens, trainer_bytes=trainer_bytes,
        sampler_logprobs=is_level != "off",  # every sampled token's log-prob only where the correction reads them
        max_sequences=max(local_seqs, validation_sequences(recipe, val_prompts, world.world_size)),  # one call's most (rollout.kv_cache_gib: auto)
    )  # the options reach the vllm engine only (built after the trainer: it sizes itself from what is left)
    return tokenizer, engine, reference, reward, train_prompts, val_prompts, rollout, data_report, checkpointing


# ------------------------------------------------------------------------------------------------
# The step


def generate_and_score(rollout, reward, batch, recipe, n: int, seed: int):
    """n completions per prompt of `batch` ((prompt, token ids) pairs from encode_splits) and their rewards [P, n]."""
    import torch

    from teacli.rewards import checked_score
    from teacli.rollout.base import sampling_from

    sampling = sampling_from(recipe.rollout)
    prompts, prompt_ids = [p for p, _ in batch], [ids for _, ids in batch]
    t0 = time.perf_counter()
    groups: list[list[Completion]] = rollout.generate(prompt_ids, n, sampling, seed)
    t1 = time.perf_counter()
    flat_prompts = [p for p in prompts for _ in range(n)]
    flat_text = [c.text for g in groups for c in g]
    rewards = checked_score(reward, flat_prompts, flat_text).reshape(len(prompts), n).to(torch.float32)
    t2 = time.perf_counter()
    return prompts, prompt_ids, groups, rewards, t1 - t0, t2 - t1


def generate_step(rollout, reward, train_prompts, recipe, world, step: int, position: int):
    """This rank's groups of one step, from data position `position` (teacli.train.dynamic).

    Returns (Selection, the data position after the step, generation and reward seconds).
    Without rollout.dynamic_sampling: this rank's share of the P prompts at `position`, all kept.
    """
    import torch

    from teacli.train import backend, dynamic

    r = recipe.rollout
    local_P = r.prompts_per_step // world.world_size

    def run_round(start: int, count: int, k: int) -> dynamic.Round:
        batch = stream_prompts(train_prompts, start, count, recipe.seed)
        # Round 0's seed is the step's; extra rounds get their own streams.
        seed = recipe.seed * 1_000_003 + step * 131 + world.rank + k * 1_000_000_007
        prompts, prompt_ids, groups, rewards, t_gen, t_rew = generate_and_score(rollout, reward, batch, recipe, r.group_size, seed=seed)
        return dynamic.Round(prompts, prompt_ids, groups, rewards, t_gen, t_rew)

    rounds, position = dynamic.collect(
        run_round, want=local_P, position=position, world_size=world.world_size, rank=world.rank,
        max_extra_rounds=r.max_resample_rounds, dynamic=r.dynamic_sampling, reduce_max=backend.all_reduce_max,
    )
    if r.dynamic_sampling:
        sel = dynamic.select(rounds, local_P)
    else:
        (rd,) = rounds
        sel = dynamic.Selection(rd.prompts, rd.prompt_ids, rd.groups, rd.rewards, torch.zeros(len(rd.groups), dtype=torch.bool))
    return sel, position, sum(rd.time_generate for rd in rounds), sum(rd.time_reward for rd in rounds)


def _logprobs(model, batch: tuple, shared: bool) -> "torch.Tensor":
    """Completion log-probs [B, Tc] of a micro-batch packed by `pack_shared` (shared) or `pack`, with its completion
    positions (`logprobs.completion_index`) last."""
    from teacli.logprobs import shared_prompt_logprobs, token_logprobs

    *batch, index = batch
    if shared:
        return shared_prompt_logprobs(model, *batch, completion_index=index)
    input_ids, attn, _, lp = batch
    return token_logprobs(model, input_ids, attn, lp, completion_index=index)


def _ref_logprobs(reference, engine, batch: tuple, shared: bool):
    import torch

    with torch.no_grad():
        if reference == "adapters-disabled":
            with engine.module.disable_adapter():
                return _logprobs(engine.module, batch, shared)
        return _logprobs(reference, batch, shared)


def packed_micro_batches(seq_prompt: list, seq_comp: list, seq_adv: "torch.Tensor", batches: list[list[int]], shared: bool,
                         pad_id: int, device, seq_rollout_logp: list | None = None) -> list[tuple]:
    """(weight, batch, advantages, sampler log-probs) of every micro-batch, on `device`: the batch as `pack_shared`
    (shared) or `pack` builds it, plus its completion positions (`logprobs.completion_index`, found on the host); the
    sampler's log-probs (`importance.pack_rollout_logprobs`) where `seq_rollout_logp` is given, else None.

    Everything moves to the device before the first forward. A copy from the host's pageable memory waits for
    the device to finish its queue, and so does reading a value back: once a micro-batch, that left the GPU idle
    while the host built and launched the next one (the 1B paper recipe's training was host-bound at 8 sequences a
    micro-batch: docs/performance/2026-11-28-h200x2-micro/). A micro-batch left empty (fewer sequences than
    micro-batches) is a zero-weight pass over the first one's first sequence: the count stays the engine's."""
    from teacli.logprobs import completion_index
    from teacli.train.importance import pack_rollout_logprobs

    out = []
    for idx in batches:
        weight = 1.0 if idx else 0.0
        idx = idx or batches[0][:1]
        batch = (pack_shared if shared else pack)([seq_prompt[i] for i in idx], [seq_comp[i] for i in idx], pad_id, "cpu")
        cmask = batch[-1] if shared else batch[2]
        moved = tuple(t.to(device) if hasattr(t, "to") else t for t in (*batch, completion_index(cmask)))
        rollout = None
        if seq_rollout_logp is not None:
            rollout = pack_rollout_logprobs([seq_rollout_logp[i] for i in idx], cmask.shape[1], device)
        out.append((weight, moved, seq_adv[idx].to(device), rollout))
    return out


class _Timer:
    """Seconds spent in a phase that runs in pieces: CUDA events around each piece where the work is queued on a
    GPU (read once, at the end, without waiting in between), the host's clock elsewhere (its work is done when the
    call returns)."""

    def __init__(self, device) -> None:
        import torch

        self.cuda = torch.device(device).type == "cuda"
        self.pieces: list = []
        self.host = 0.0

    def __enter__(self):
        import torch

        if self.cuda:
            self.pieces.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self.pieces[-1][0].record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.pieces[-1][1].record()
        else:
            self.host += time.perf_counter() - self._t0

    def seconds(self) -> float:
        if not self.cuda:
            return self.host
        if self.pieces:
            self.pieces[-1][1].synchronize()
        return sum(start.elapsed_time(end) for start, end in self.pieces) / 1e3


def train_step(engine, reference, recipe, prompt_ids, groups, advantages, pad_id, device, is_level: str = "off") -> dict[str, float]:
    """Forward/backward over the step's sequences in exactly gradient_accumulation_steps() micro-batches
    (length-sorted, each padded to its own longest prompt and completion), hence exactly one optimizer update.

    Adds `grad_norm` (the global norm before clipping) and `optimizer_step` (the engine's update count).
    is_level (token/sequence): weight the policy-gradient terms by the truncated ratio of the
    trainer's to the sampler's log-probs (teacli.train.importance); "off": no correction.
    Nothing in the loop over micro-batches reads a value back from the device (`packed_micro_batches`): the host
    queues the next micro-batch while the device runs this one.
    """
    from teacli.train import backend, importance
    from teacli.train.loss import policy_loss

    seq_prompt = [prompt_ids[p] for p, g in enumerate(groups) for _ in g]
    seq_comp = [c.token_ids for g in groups for c in g]
    seq_adv = advantages.reshape(-1)
    seq_rollout_logp = [c.logprobs for g in groups for c in g]
    log_ratios: list = []
    total = len(seq_comp)
    if total == 0:
        raise ValueError("train_step: no sequences to train on")
    n_micro = engine.gradient_accumulation_steps()
    shared = shares_prompts(recipe, engine, reference)
    seq_group = [p for p, g in enumerate(groups) for _ in g]
    batches = micro_batches([len(p) + len(c) for p, c in zip(seq_prompt, seq_comp)], n_micro, seq_group if shared else None)
    packed = packed_micro_batches(seq_prompt, seq_comp, seq_adv, batches, shared, pad_id, device,
                                  seq_rollout_logp if is_level != "off" else None)
    stats: dict = {}
    ref_time, grad_norm = _Timer(device), None
    engine.train()
    for k, (weight, batch, adv, rollout_logp) in enumerate(packed):
        cmask = batch[-2] if shared else batch[2]
        ref = None
        if reference is not None:
            with ref_time:
                ref = _ref_logprobs(reference, engine, batch, shared)
        logp = _logprobs(engine, batch, shared)
        weights = None
        if rollout_logp is not None:
            weights, lr = importance.is_weights(logp, rollout_logp, cmask, is_level, recipe.rollout.is_cap, index=batch[-1])
            log_ratios.append(lr)
        # DeepSpeed divides by gradient_accumulation_steps; scale so the step averages over `total`.
        loss, s = policy_loss(logp, cmask, adv, ref, recipe.kl.beta, recipe.kl.estimator, total, is_weights=weights)
        engine.backward(loss * (weight * n_micro))
        if k == n_micro - 1:
            grad_norm = backend.pre_step_grad_norm(engine)
        engine.step()
        for key, v in s.items():
            stats[key] = stats.get(key, 0.0) + weight * v  # each term is already divided by `total`
    stats = {key: float(v) for key, v in stats.items()}  # read back once, after the last micro-batch
    t_ref = ref_time.seconds()
    if grad_norm is None:
        grad_norm = engine.get_global_grad_norm()
    stats["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
    stats["optimizer_step"] = backend.optimizer_steps(engine)
    if grad_norm is not None and not math.isfinite(stats["grad_norm"]):
        # bf16 without loss scaling applies a non-finite update as it is: stop before anything of this step is saved.
        raise TrainError(
            f"non-finite gradient norm ({stats['grad_norm']}) at optimizer step {stats['optimizer_step']}: the update is not "
            f"saved and a rerun resumes from the last checkpoint; usual causes are a NaN reward or an overflow in "
            f"policy.dtype={recipe.policy.dtype} (try float32, or a lower optim.lr)")
    stats["time_ref_logprobs"] = t_ref
    if is_level != "off":
        stats.update(importance.is_stats(importance.merge_log_ratios(log_ratios), recipe.rollout.is_cap))
    return stats


# ------------------------------------------------------------------------------------------------
# Validation and checkpoints


def validation_share(val_prompts: list, rank: int, world_size: int) -> list:
    """The validation prompts rank `rank` of `world_size` validates: every world_size-th from index `rank` on
    (none where the ranks outnumber the prompts). The shares cover every prompt exactly once."""
    return val_prompts[rank::world_size]


def validation_sequences(recipe, val_prompts, world_size: int = 1) -> int:
    """Sequences of one validation call on the rank that generates the most: rank 0, whose share
    (`validation_share`) is ceil(prompts / world_size) prompts."""
    if not recipe.validation.enabled or not val_prompts:
        return 0
    return -(-len(val_prompts) // world_size) * recipe.validation.samples


def validate(rollout, reward, val_prompts, recipe, seed: int) -> dict[str, Any]:
    """The paper's selection score: mean over prompts of the mean of the top-k rewards of n samples
    (all of `val_prompts` in this process; `tea train` splits them over ranks: `_validation`)."""
    return merge_validation([validation_part(rollout, reward, val_prompts, recipe, seed)], recipe)


def validation_part(rollout, reward, prompts, recipe, seed: int) -> dict[str, Any]:
    """What one rank's share of a validation contributes (`merge_validation` combines the ranks'): each
    prompt's rewards and best sample's text (the reward-hacking watch's pick), token counts and times."""
    v = recipe.validation
    if not prompts:  # more ranks than prompts: nothing to generate (the vllm engine still runs a pending sync check)
        if not getattr(rollout, "shares_weights", True):
            from teacli.rollout.base import sampling_from

            rollout.generate([], v.samples, sampling_from(recipe.rollout), seed)
        return {"rewards": [], "picks": [], "time_generate": 0.0, "time_reward": 0.0,
                "tokens_prompt_unique": 0, "tokens_prompt": 0, "tokens_completion": 0}
    _, prompt_ids, groups, rewards, t_gen, t_rew = generate_and_score(rollout, reward, prompts, recipe, v.samples, seed)
    picks = hacking.best_of_n([c.text for g in groups for c in g], rewards.flatten().tolist(), v.samples)
    return {"rewards": rewards.tolist(), "picks": picks, "time_generate": t_gen, "time_reward": t_rew,
            **token_counts(prompt_ids, groups)}


def merge_validation(parts: list[dict[str, Any]], recipe) -> dict[str, Any]:
    """The validation result from the ranks' parts (rank order; rank r validated prompts r, r + world, …):
    what one process computes from the same samples. The score and reward mean come from every prompt's
    rewards back in prompt order, token counts are summed, times are the slowest rank's (wall time), and
    the watch sees every prompt's pick in prompt order; the process's first validation is its baseline
    (the same on every rank: each merges the same parts)."""
    import torch

    v = recipe.validation
    world = len(parts)
    n = sum(len(p["rewards"]) for p in parts)
    order = [(i % world, i // world) for i in range(n)]  # prompt i: rank i % world's (i // world)-th
    rewards = torch.tensor([parts[r]["rewards"][j] for r, j in order], dtype=torch.float32).reshape(n, v.samples)
    picks = [parts[r]["picks"][j] for r, j in order]
    top = rewards.topk(min(v.top, v.samples), dim=1).values.mean(dim=1)
    watch = hacking.watch(picks, hacking.compile_patterns(v.watch_patterns), _WATCH_BASELINE.setdefault("picks", picks))
    tokens = {k: sum(p[k] for p in parts) for k in ("tokens_prompt_unique", "tokens_prompt", "tokens_completion")}
    return {"score": float(top.mean()), "prompts": n, "samples": v.samples, "top": v.top,
            "reward_mean": float(rewards.mean()),
            "rule": f"mean of top-{v.top} of {v.samples} samples, {n} prompts",
            "time_generate": max(p["time_generate"] for p in parts), "time_reward": max(p["time_reward"] for p in parts),
            **tokens, "sequences_by_rank": [len(p["rewards"]) * v.samples for p in parts], **watch}


_WATCH_BASELINE: dict[str, list[str]] = {}


def batch_reward_std(rewards: "torch.Tensor", how: str) -> float | None:
    """The population std of every rank's rewards [P, m] (each rank holds as many), for advantage.scale_rewards:
    batch; None for any other scale."""
    if how != "batch":
        return None
    from teacli.train import backend

    r = rewards.double()
    moments = backend.all_reduce_mean({"m1": float(r.mean()), "m2": float((r * r).mean())})
    return math.sqrt(max(moments["m2"] - moments["m1"] ** 2, 0.0))


def token_counts(prompt_ids: list[list[int]], groups: list[list[Completion]]) -> dict[str, int]:
    """Tokens a step's phases process: prompt tokens once per prompt (generation's prefill, with the prompt
    shared) and once per sequence (reference and training), and the completions' tokens."""
    return {"tokens_prompt_unique": sum(len(ids) for ids in prompt_ids),
            "tokens_prompt": sum(len(ids) * len(g) for ids, g in zip(prompt_ids, groups)),
            "tokens_completion": sum(len(c.token_ids) for g in groups for c in g)}


def save_checkpoint(run: RunDir, engine, tokenizer, recipe, world, step: int, extra_state: dict[str, Any]) -> Path:
    import torch

    from teacli.config import to_yaml
    from teacli.models import umask_modes
    from teacli.train import backend

    tmp = run.tmp_checkpoint(step)
    if world.is_main:
        with writing(tmp):
            tmp.mkdir(parents=True, exist_ok=True)
    backend.barrier()
    state = backend.full_state_dict(engine.module, recipe.backend.zero_stage, world.is_main)
    try:
        with writing(tmp):
            backend.save_engine_state(engine, str(tmp / "trainer"), tag="state")
            if world.is_main:
                save_hf_model(engine.module, state, tokenizer, tmp, recipe.policy.lora.enabled)
                (tmp / "recipe.yaml").write_text(to_yaml(recipe))
                torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
                write_text_atomic(tmp / "trainer_state.json", json.dumps({"step": step, **extra_state}, indent=2))
                umask_modes(tmp)  # safetensors writes 0600 whatever the umask: the checkpoint reads like any file written
                run.commit_checkpoint(step)
    except Exception as exc:
        # A full disk fails torch.save and safetensors with their own errors (not OSError); either way the
        # half-written checkpoint goes now (it would hold the space), and the run keeps its last complete one.
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) or not _is_write_error(exc):
            raise
        free = shutil.disk_usage(run.path).free / 2**20
        raise TrainError(
            f"writing checkpoint {tmp.name.removeprefix('.tmp_')} into {run.checkpoints} failed ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); {free:,.0f} MiB free on that disk. The partial "
            f"checkpoint was removed: free space and run the same command to resume from the last complete checkpoint"
        ) from None
    backend.barrier()
    return run.checkpoints / step_dir_name(step)


def _is_write_error(exc: Exception) -> bool:
    """torch.save's and safetensors' failures to write a file (a full disk gives 'unexpected pos' or 'os error 28')."""
    return type(exc).__name__ == "SafetensorError" or isinstance(exc, RuntimeError) and any(
        s in str(exc) for s in ("PytorchStreamWriter", "inline_container", "unexpected pos", "file write failed")
    )


# ------------------------------------------------------------------------------------------------
# The run


REWARD_ERROR_LOG = "reward_error.log"  # the traceback of the user's reward code that stopped the run


def train(recipe: "Recipe", run_dir: Path) -> Path:
    """Run (or resume) training of `recipe` into `run_dir`; returns the run directory.

    One `tea train` per run directory: rank 0 holds its lock for the whole run. A restart resumes from
    the last complete checkpoint; it refuses a recipe that changes the experiment and data that changed
    since the run started, and takes changed execution keys (the resume rules, teacli/train/resume.py).
    """
    from teacli.rollout.factory import AUTO_WITHOUT_CHOICE, recipe_engine
    from teacli.train import backend
    from teacli.train.importance import resolve_is_correction
    from teacli.train.progress import check_trackers

    check_trackers(recipe)  # an uninstalled tracker fails before any model is loaded
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    engine, why = recipe_engine(recipe, recipe.rollout.prompts_per_step // max(world_size, 1) * recipe.rollout.group_size)
    try:  # the importance correction the engine that will run needs (before any model is loaded)
        is_level = resolve_is_correction(recipe.rollout.is_correction, engine)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    if recipe.rollout.engine == "auto" and why not in AUTO_WITHOUT_CHOICE and os.environ.get("RANK", "0") == "0":
        print(f"rollout.engine auto: {engine} ({why})", file=sys.stderr, flush=True)
    world = backend.init_world()
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
        if start.step >= recipe.optim.steps:
            if (chosen := on_rank0(world, check_selection, run, recipe)) is not None:
                say(world, chosen)
            say(world, f"{run.path} is already complete at step {start.step} (optim.steps={recipe.optim.steps}); "
                        f"raise optim.steps to train further")
        else:
            from teacli.rewards import RewardError

            try:
                _train_steps(recipe, run, world, start, is_level, engine)
            except RewardError as exc:  # the user's reward failed: one line, its traceback beside the records
                log = world.is_main and run.recipe.exists()  # not into a directory a failed start leaves empty
                raise TrainError(with_traceback_file(str(exc), exc.details, run.path / REWARD_ERROR_LOG) if log else str(exc)) from None
            except SystemExit as exc:  # code the run called (a user's advantage rule, a library) exited: not a finished run
                raise TrainError(f"training of {run.path} stopped: code it called exited (sys.exit({exc.code!r})) without "
                                 f"finishing the run; rerun the command to resume from its last checkpoint") from None
    if world.world_size > 1:  # every rank finished: tear the group down now, or a rank can abort at interpreter exit
        backend.close_world()  # ("terminate called without an active exception", exit -6) after a complete run
    return run.path


def _train_steps(recipe: "Recipe", run: RunDir, world, resume: "Start", is_level: str, engine_name: str) -> None:
    """Set up, write the run's files (every check has passed by then), restore a resumed run's state, train."""
    import torch

    from teacli.advantages import compute_advantages, scale_advantages
    from teacli.advantages.tail import tail_check_stats
    from teacli.diagnostics.tail_check import TailCheck
    from teacli.train import backend
    from teacli.train.progress import Progress, metrics_sink

    torch.manual_seed(recipe.seed + world.rank)
    random.seed(recipe.seed + world.rank)
    _WATCH_BASELINE.clear()  # the watch's baseline is this run's first validation, not an earlier run's in this process

    try:
        tokenizer, engine, reference, reward, train_prompts, val_prompts, rollout, data_report, checkpointing = _setup(recipe, world, is_level, engine_name)
    except torch.OutOfMemoryError:
        free, total = torch.cuda.mem_get_info(world.device) if world.device.type == "cuda" else (0, 0)
        raise TrainError(
            f"out of GPU memory while loading the policy, reference, reward model and optimizer ({total / 2**30:.0f} GiB card, "
            f"{world.world_size} GPU(s)): shard the model states over more GPUs (backend.zero_stage: 3), move the optimizer "
            f"to CPU (backend.offload_optimizer: true), or put the reward model on another device (reward.device); "
            f"`tea train RECIPE --estimate` says what fits"
        ) from None
    for note in on_rank0(world, commit_run_dir, run, recipe, resume, data_report):
        say(world, note)
    if resume.restart:
        say(world, resume.note(run, recipe))
        if (chosen := on_rank0(world, check_selection, run, recipe)) is not None:  # stopped while choosing before
            say(world, chosen)
    if checkpointing.layers or checkpointing.estimate is not None:  # nothing on a CPU run that checkpoints nothing
        say(world, checkpointing.describe())
    # Recorded with every step (an execution key: a resumed run may change it), beside the measured peaks.
    memory = {"grad_ckpt_layers": checkpointing.layers}
    if checkpointing.estimate is not None:
        memory["mem_estimate_gib"] = checkpointing.estimate / 2**30
    if (warning := dropped_warning(data_report)) is not None:
        say(world, warning)
    start, position = resume.step, 0
    if resume.checkpoint is not None:
        path = resume.checkpoint
        say(world, f"loading the trainer state of {path.name} (weights, optimizer, RNG)")
        try:
            backend.load_engine_state(engine, str(path / "trainer"), tag="state")
            rng = torch.load(path / "rng.pt", weights_only=False)
        except (ValueError, RuntimeError, EOFError, OSError) as exc:
            raise TrainError(f"cannot resume from {path}: {exc}; move that checkpoint out of {run.checkpoints} to resume "
                             f"from the one before it, or start over in a new --run-dir") from None
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        state = json.loads((path / "trainer_state.json").read_text()) if (path / "trainer_state.json").exists() else {}
        position = int(state.get("data_position", start * recipe.rollout.prompts_per_step))
    # Engines with their own copy of the weights (vllm) get the trainer's, now and after every update.
    rollout.load_weights(backend.named_weights(engine.module, recipe.backend.zero_stage))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
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
            result = _validation(engine, rollout, reward, val_prompts, recipe, world, progress, "step 0 validation (untrained policy)")
            if world.is_main:
                sink.validation({"step": 0, **result})
                sink.note(f"step 0 (untrained policy): validation {result['score']:.4f}")
        for step in range(start, recipe.optim.steps):
            t_step = time.perf_counter()
            backend.peak_memory_gib(world.device)  # CUDA: count this step's peaks from here
            phase = "generation (rollout.batch_size, rollout.max_new_tokens)"
            scored = getattr(reward, "tokens_scored", None)  # a reward model counts the tokens it scores
            rollout.wake()
            with backend.generation_weights(engine, recipe.backend.zero_stage, rollout):
                sel, position, t_gen, t_rew = generate_step(rollout, reward, train_prompts, recipe, world, step, position)
            rollout.sleep()
            prompt_ids, groups, rewards = sel.prompt_ids, sel.groups, sel.rewards
            try:
                unscaled = compute_advantages(recipe.advantage.name, rewards.double(), **adv_params)
            except ValueError as exc:
                raise TrainError(f"advantage.name={recipe.advantage.name!r}: {exc}") from None
            advantages = scale_advantages(unscaled, rewards.double(), recipe.advantage.scale_rewards,
                                          batch_std=batch_reward_std(rewards, recipe.advantage.scale_rewards)).float()
            if sel.filled.any():  # dynamic sampling ran out of rounds: these groups only keep the step's shape
                advantages[sel.filled] = 0.0
            phase = "training (optim.micro_batch_size, policy.gradient_checkpointing)"
            peaks = [backend.peak_memory_gib(world.device)]
            t0 = time.perf_counter()
            stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, pad_id, world.device, is_level=is_level)
            t_train = time.perf_counter() - t0 - stats.pop("time_ref_logprobs")
            t_ref = time.perf_counter() - t0 - t_train
            peaks.append(backend.peak_memory_gib(world.device))
            t0 = time.perf_counter()
            rollout.load_weights(backend.named_weights(engine.module, recipe.backend.zero_stage))
            t_sync = time.perf_counter() - t0
            peaks.append(backend.peak_memory_gib(world.device))
            if peaks[0] is not None:  # CUDA: torch.cuda.max_memory_allocated of the step and of its training phase
                memory.update(gpu_peak_gib=max(peaks), gpu_peak_train_gib=peaks[1],
                              gpu_held_gib=torch.cuda.memory_allocated(world.device) / 2**30)  # what stays between steps
            lengths = torch.tensor([len(c.token_ids) for g in groups for c in g], dtype=torch.float32)
            elapsed = time.perf_counter() - t_step
            record = {
                "step": step + 1,
                "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max(dim=1).values.mean()),
                "reward_std": float(rewards.std(dim=1, correction=0).mean()),
                "adv_mean": float(advantages.mean()), "adv_std": float(advantages.std(correction=0)),
                "adv_std_unscaled": float(unscaled.std(correction=0)),  # before advantage.scale_rewards
                "adv_min": float(advantages.min()), "adv_max": float(advantages.max()),
                "adv_nonzero_frac": float((advantages.abs() > 1e-12).float().mean()),
                **stats,
                "lr": float(engine.get_lr()[0]),
                "gen_len_mean": float(lengths.mean()), "gen_finished_frac": float(sum(c.finished for g in groups for c in g) / lengths.numel()),
                "prompts": len(sel.groups),
                "time_generate": t_gen, "time_reward": t_rew, "time_ref_logprobs": t_ref, "time_train": t_train, "time_sync": t_sync,
                "time_step": elapsed, "tokens_per_s": float(lengths.sum()) * world.world_size / max(t_gen, 1e-9),
                **rollout.stats(),  # vllm: log-prob agreement with the trainer after the last push
                **sel.stats,  # dynamic sampling: rounds, dropped and filled groups
                **tail_check_stats(rewards),  # the groups' upper-tail QQ R² (docs/diagnostics.md)
                **memory,  # checkpointed layers; CUDA: the estimated and measured peaks (GiB)
                **token_counts(prompt_ids, groups),  # what each phase processed (benchmarks/phases.py: the floors)
                "world_size": world.world_size,
            }
            if scored is not None:
                record["tokens_reward"] = reward.tokens_scored - scored
            # The norm is global (the same on every rank), and so is whether the clip bound.
            record["grad_clipped"] = recipe.optim.max_grad_norm > 0 and stats["grad_norm"] > recipe.optim.max_grad_norm
            local, record = record, {"step": step + 1, **backend.all_reduce_mean({k: v for k, v in record.items() if k != "step"})}
            record["prompts"] = round(record["prompts"] * world.world_size)  # all ranks together
            record["optimizer_step"], record["grad_clipped"] = round(record["optimizer_step"]), record["grad_clipped"] > 0.5
            if recipe.rehearsal.enabled:
                record["rehearsal"] = True  # random weights: for time and memory only
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
                _checkpoint_and_validate(run, engine, rollout, tokenizer, reward, val_prompts, recipe, world, step + 1, sink, position, progress)
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
    if world.world_size > 1 and hasattr(rollout, "close"):
        rollout.close()  # vLLM's parallel groups go before the trainer's process group (train: backend.close_world)


def _checkpoint_and_validate(run, engine, rollout, tokenizer, reward, val_prompts, recipe, world, step, sink, position, progress) -> None:
    from teacli.train import backend

    if recipe.validation.enabled:
        t0 = time.perf_counter()
        result = _validation(engine, rollout, reward, val_prompts, recipe, world, progress, f"step {step} validation")
        result["time_validation"] = time.perf_counter() - t0
    # data_position: prompts of the data order consumed so far (step × P unless dynamic sampling drew more).
    t0 = time.perf_counter()
    save_checkpoint(run, engine, tokenizer, recipe, world, step, {"data_position": position})
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


def _validation(engine, rollout, reward, val_prompts, recipe, world, progress, stage: str) -> dict[str, Any]:
    """The validation score of the current weights, the same on every rank. Each rank generates and scores its
    share of the prompts (`validation_share`) and the parts are gathered (`merge_validation`); a rank with
    none still takes part in every collective (ZeRO-3's parameter gathering, the gather). Its progress
    (rank 0's sequences generated) goes to `progress`."""
    from teacli.train import backend

    share = validation_share(val_prompts, world.rank, world.world_size)
    total = validation_sequences(recipe, share)
    of = f" (this GPU's share of {len(val_prompts)})" if world.world_size > 1 else ""
    progress.stage(stage, 0, total, f"{len(share)} prompts{of} × {recipe.validation.samples} samples")
    reports = hasattr(rollout, "progress")  # the hf engine reports each batch; vllm generates in one call
    if reports:
        rollout.progress = lambda done, _total: progress.stage(stage, done, total)
    rollout.wake()
    try:
        with backend.generation_weights(engine, recipe.backend.zero_stage, rollout):
            # Fixed prompts and seeds: checkpoints are compared on the same samples' randomness. The seed is
            # the rank's (a share's samples depend on the number of ranks, as a step's rollouts do).
            part = validation_part(rollout, reward, share, recipe, seed=recipe.seed + 7 + 1_000_003 * world.rank)
    finally:
        if reports:
            rollout.progress = None
    if not reports:
        progress.stage(stage, total, total)
    # No sleep: the next thing the engine does is the next step's generation, with these same weights
    # (a level-2 sleep would discard them with no push to bring them back).
    return merge_validation(backend.all_gather_object(part), recipe)
