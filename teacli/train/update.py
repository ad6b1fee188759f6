"""The update of one step: the policy gradient with stop-gradient advantages and β·KL to the reference, over exactly
the engine's gradient-accumulation count of micro-batches, hence one optimizer step (teacli/train/loss.py is the
loss itself; teacli/train/batching.py cuts and packs the micro-batches)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from teacli.padding import micro_batches
from teacli.train.batching import packed_micro_batches, pad_share, padding
from teacli.train.errors import TrainError

if TYPE_CHECKING:
    import torch

    from teacli.config import Recipe


def shares_prompts(recipe: "Recipe", engine, reference) -> bool:
    """Whether `train_step` runs each distinct prompt of a micro-batch once (optim.share_prompts, and the
    policy and the reference both allow it: logits = head(hidden), and any gradient checkpointing non-reentrant on
    full-attention layers, `logprobs.can_share_prompts`)."""
    from teacli.logprobs import can_share_prompts

    ref_ok = reference is None or isinstance(reference, str) or can_share_prompts(reference)  # str: "adapters-disabled"
    return recipe.optim.share_prompts and can_share_prompts(engine) and ref_ok


def _logprobs(model, batch: tuple, shared: bool) -> "torch.Tensor":
    """Completion log-probs [B, Tc] of a micro-batch packed by `pack_shared` (shared) or `pack`, with its completion
    positions (`logprobs.completion_index`) last."""
    from teacli.logprobs import shared_prompt_logprobs, token_logprobs

    *batch, index = batch
    if shared:
        *batch, splits = batch
        return shared_prompt_logprobs(model, *batch, completion_index=index, splits=splits)
    input_ids, attn, _, lp = batch
    return token_logprobs(model, input_ids, attn, lp, completion_index=index)


def _ref_logprobs(reference, engine, batch: tuple, shared: bool):
    import torch

    with torch.no_grad():
        if reference == "adapters-disabled":
            with engine.module.disable_adapter():
                return _logprobs(engine.module, batch, shared)
        return _logprobs(reference, batch, shared)


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


def train_step(engine, reference, recipe, prompt_ids, groups, advantages, pad_id, device, is_level: str = "off",
               denominator: float | None = None) -> dict[str, float]:
    """Forward/backward over the step's sequences in exactly gradient_accumulation_steps() micro-batches
    (length-sorted, each padded to its own longest sequence, or with shared prompts to its longest prompt and
    completion: `teacli.train.batching`), hence exactly one optimizer update.

    Adds `grad_norm` (the global norm before clipping), `optimizer_step` (the engine's update count) and the share of
    the tokens the micro-batches compute that is padding: `pad_frac_train`, and `pad_frac_reference` where a
    reference runs (on the same micro-batches).
    is_level (token/sequence): weight the policy-gradient terms by the truncated ratio of the
    trainer's to the sampler's log-probs (teacli.train.importance); "off": no correction.
    `groups` may be runs of a group's sequences (teacli.train.sharding) with `advantages` flat in their order;
    `denominator`: what the loss divides by (default this rank's sequence count; sharded, the step's P·m / ranks, so
    the ranks' averaged gradients are the mean over every sequence of the step).
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
    splits = recipe.optim.completion_splits
    batches = micro_batches([len(p) + len(c) for p, c in zip(seq_prompt, seq_comp)], n_micro, seq_group if shared else None,
                            deal=splits == "packed")
    packed = packed_micro_batches(seq_prompt, seq_comp, seq_adv, batches, shared, pad_id, device,
                                  seq_rollout_logp if is_level != "off" else None, splits)
    stats: dict = {}
    ref_time, grad_norm = _Timer(device), None
    engine.train()
    for k, (weight, batch, adv, rollout_logp) in enumerate(packed):
        cmask = batch[4] if shared else batch[2]
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
        loss, s = policy_loss(logp, cmask, adv, ref, recipe.kl.beta, recipe.kl.estimator, denominator or total, is_weights=weights)
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
    stats["pad_frac_train"] = pad_share(*padding(seq_prompt, seq_comp, batches, shared, splits))
    if reference is not None:
        stats["pad_frac_reference"] = stats["pad_frac_train"]
    if is_level != "off":
        stats.update(importance.is_stats(importance.merge_log_ratios(log_ratios), recipe.rollout.is_cap))
    return stats
