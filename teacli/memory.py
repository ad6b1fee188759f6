"""Byte arithmetic of models, trainer states, activations and KV caches: one rule for each, used by the trainer's
gradient-checkpointing choice (teacli/train/backend.py), the vllm engine's memory plan (teacli/rollout/vllm_engine.py)
and the cost planner's predictions (teacli/planner.py), which therefore cannot disagree.

Pure functions of counts and sizes (no recipe, no model, no device): the callers read those and pass the numbers.
Imports only the standard library.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_GiB = 2**30


# ------------------------------------------------------------------------------------------------
# The trainer: model states and activations


def state_bytes(n_all: int, n_train: int, world_size: int, *, zero_stage: int, kl_beta: float, lora: bool,
                offload_optimizer: bool) -> int:
    """Estimated bytes one rank's trainer holds between steps, from parameter counts (all, trainable), the number of
    ranks and the recipe's backend.zero_stage, kl.beta, policy.lora.enabled and backend.offload_optimizer.

    Per parameter: 2 bytes of weights (bf16), 2 more for the reference model's copy (kl.beta > 0, without LoRA: with
    LoRA the reference is the policy with its adapters off), and for trainable ones 2 of gradient and 12 of optimizer
    state (fp32 master weights and AdamW's two moments; none on the GPU with offload_optimizer), each divided over the
    ranks as the ZeRO stage partitions it (3: weights, 2: gradients, 1: optimizer state).
    """
    w = world_size
    weights = 2 * n_all / (w if zero_stage == 3 else 1)
    if kl_beta > 0 and not lora:
        weights += 2 * n_all
    grads = 2 * n_train / (w if zero_stage >= 2 else 1)
    optim = 0 if offload_optimizer else 12 * n_train / (w if zero_stage >= 1 else 1)
    return int(weights + grads + optim)


def activation_bytes(tokens: int, layers: int, hidden: int, intermediate: int, checkpointed: int = 0) -> int:
    """Estimated bf16 activation bytes that backward needs of one micro-batch of `tokens` tokens through
    `layers` decoder layers, the first `checkpointed` of them gradient-checkpointed.

    An uncheckpointed layer keeps 2 bytes × (16·hidden + 3·intermediate) per token (calibrated on the
    Llama-3.2-1B shape: 45.1 GB = 42.0 GiB for 64 × 384 tokens and no checkpointing, against a measured
    40 GiB); a checkpointed one keeps only its input, 2 bytes × hidden per token. While backward recomputes
    a checkpointed layer, that layer's full activations exist again; checkpointing the first layers puts the
    recompute after the others' activations are freed (teacli.models.set_gradient_checkpointing), so it
    adds to the peak only when every layer is checkpointed: one full layer then. The head's log-softmax is
    chunked (teacli/logprobs.py) and not counted.
    """
    full = tokens * 2 * (16 * hidden + 3 * intermediate)
    kept = tokens * 2 * hidden
    return max(layers - checkpointed, 1) * full + checkpointed * kept


# policy.gradient_checkpointing auto fits one micro-batch's activations into this share of the memory the model
# states leave. The rest is for what the estimate does not count: the hf engine's KV cache, compiled graphs, the
# allocator's fragmentation. Measured on an H100 (docs/performance.md): the 1B shape without checkpointing peaked at
# 46.6 GiB of 79.2 (liger) where the estimate said 62.7 (0.74x); eager, at the calibration point, 0.95x. With
# rollout.sleep off the vllm engine keeps its share (half of what the states leave: AUTO_SHARE below) through
# training, and the activations get the other half.
ACTIVATION_SHARE = 0.75
AWAKE_ENGINE_ACTIVATION_SHARE = 0.5


def activation_share(engine: str, sleep: bool) -> float:
    """The share of the memory the model states leave that `auto` fits the activations into, for rollout.engine
    `engine` and rollout.sleep `sleep`: a vllm engine (or auto, which may be one) kept awake holds the other half."""
    return AWAKE_ENGINE_ACTIVATION_SHARE if engine != "hf" and not sleep else ACTIVATION_SHARE


def activation_budget(total: int, held: int, engine: str, sleep: bool) -> int:
    """Bytes `auto` may give one micro-batch's activations: `activation_share` of `total` (the memory the process may
    use) left after `held` (model states, other models)."""
    return max(0, int((total - held) * activation_share(engine, sleep)))


def auto_checkpoint_layers(budget: int, tokens: int, layers: int, hidden: int, intermediate: int) -> int:
    """The fewest layers (checkpointed from the first) whose `activation_bytes` fit in `budget` bytes; when
    none fits, the number with the smallest estimate (the least memory there is to have).

    Never all of them when fewer fit: with every layer checkpointed, backward recomputes the last one while
    all the others' inputs are still held, which is the peak of leaving the last one alone, plus its input.
    """
    estimates = [activation_bytes(tokens, layers, hidden, intermediate, k) for k in range(layers + 1)]
    fits = [k for k, e in enumerate(estimates) if e <= budget]
    return fits[0] if fits else min(range(layers + 1), key=estimates.__getitem__)


# ------------------------------------------------------------------------------------------------
# The vllm engine beside the trainer: its share of the GPU and its KV cache


# rollout.gpu_memory_utilization: auto = this share of the memory the trainer leaves. With sleep, the
# 10% kept back absorbs what the trainer's allocator keeps between steps; without sleep, the trainer's
# activations must fit beside the engine.
AUTO_SHARE = {True: 0.9, False: 0.5}
# rollout.kv_cache_gib: auto = one call's sequences at their longest, plus this margin (vLLM's 16-token
# blocks round each sequence up; the prompt blocks prefix caching shares make it smaller).
KV_AUTO_MARGIN = 1.25
# ... and at most this share of the engine's share after the weights: the rest stays free for vLLM's activations
# and CUDA graphs while it generates, and for whatever the trainer holds beyond its estimate while it sleeps
# (a cache sized from the whole share failed to wake at the paper's 1B + 8B reward model step on an 80 GB card).
KV_AUTO_CAP = 0.5


def memory_plan(
    utilization: "float | str", kv_cache_gib: "float | str | None", sleep: bool, *, free: int, total: int, allocated: int,
    trainer_bytes: int, weights_bytes: int, kv_needed: "tuple[int, int, int] | None" = None,
) -> tuple[dict[str, Any], str]:
    """vLLM's memory arguments on one GPU beside the trainer → (kwargs, a line saying what was chosen).

    free, total: the device's memory now (bytes); allocated: what this process's torch holds;
    trainer_bytes: what the trainer will hold between steps (`state_bytes`), some of
    which (AdamW's moments without ZeRO, gradient buffers) it allocates only at its first step.
    The trainer leaves `free − max(0, trainer_bytes − allocated)`. The engine's share is
    `utilization` × total, or for 'auto' `AUTO_SHARE[sleep]` × what the trainer leaves; a share
    larger than what the trainer leaves, or a `kv_cache_gib` that with the weights exceeds the
    share, is a ValueError naming the key and the value that fits. vLLM 0.26 itself refuses to
    start when less than `gpu_memory_utilization` × total is free, and with `kv_cache_memory_bytes`
    reads gpu_memory_utilization for that check only. `kv_cache_gib` 'auto' with `kv_needed` (sequences,
    tokens each, KV bytes a token) fixes the KV cache at what those sequences hold at once, plus
    `KV_AUTO_MARGIN`, capped at `KV_AUTO_CAP` of the share after the weights (the cap itself where the
    sequences are not known); null lets vLLM size it from the whole share.
    """
    later = max(0, trainer_bytes - allocated)
    leaves = max(0, free - later)
    where = f"{free / _GiB:.1f} GiB free now" + (f", less {later / _GiB:.1f} GiB the trainer allocates at its first step" if later else "")
    if utilization == "auto":
        share = AUTO_SHARE[sleep] * leaves
        how = f"auto: {AUTO_SHARE[sleep]:.0%} of the {leaves / _GiB:.1f} GiB the trainer leaves ({where})"
    else:
        share = float(utilization) * total
        if share > leaves:
            raise ValueError(
                f"rollout.gpu_memory_utilization: {utilization:g} of this GPU's {total / _GiB:.1f} GiB is {share / _GiB:.1f} GiB, but "
                f"the trainer leaves {leaves / _GiB:.1f} GiB ({where}); set it to at most {math.floor(leaves / total * 100) / 100:.2f}, or to auto"
            )
        how = f"rollout.gpu_memory_utilization {utilization:g} of {total / _GiB:.1f} GiB"
    kwargs: dict[str, Any] = {"gpu_memory_utilization": share / total}
    kv = f"what remains after the weights ({weights_bytes / _GiB:.2f} GiB) and activations"
    if kv_cache_gib == "auto":
        cap = int(max(0, share - weights_bytes) * KV_AUTO_CAP)
        if kv_needed is None:
            kwargs["kv_cache_memory_bytes"] = cap
            return kwargs, (f"{share / _GiB:.1f} GiB ({how}); KV cache: {cap / _GiB:.2f} GiB (rollout.kv_cache_gib auto: "
                            f"{KV_AUTO_CAP:.0%} of the share after the weights; the sequences per call are not known here)")
        seqs, tokens, per_token = kv_needed
        needed = int(seqs * tokens * per_token * KV_AUTO_MARGIN)
        what = f"{seqs} sequences x {tokens} tokens x {per_token / 1024:.0f} KiB, +{KV_AUTO_MARGIN - 1:.0%}"
        if needed > cap:
            kwargs["kv_cache_memory_bytes"] = cap
            return kwargs, (f"{share / _GiB:.1f} GiB ({how}); KV cache: {cap / _GiB:.2f} GiB (rollout.kv_cache_gib auto: {what} "
                            f"= {needed / _GiB:.1f} GiB at their longest, capped at {KV_AUTO_CAP:.0%} of the share after the weights; "
                            "vLLM allocates blocks as sequences grow and runs the rest when blocks free up)")
        kwargs["kv_cache_memory_bytes"] = needed
        return kwargs, f"{share / _GiB:.1f} GiB ({how}); KV cache: {needed / _GiB:.2f} GiB (rollout.kv_cache_gib auto: {what})"
    if kv_cache_gib is not None:
        if kv_cache_gib * _GiB + weights_bytes > share:
            raise ValueError(
                f"rollout.kv_cache_gib: {kv_cache_gib:g} GiB of KV cache and {weights_bytes / _GiB:.2f} GiB of weights exceed the "
                f"engine's {share / _GiB:.1f} GiB ({how}); lower rollout.kv_cache_gib or raise rollout.gpu_memory_utilization"
            )
        kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * _GiB)
        kv = f"{kv_cache_gib:g} GiB (rollout.kv_cache_gib)"
    return kwargs, f"{share / _GiB:.1f} GiB ({how}); KV cache: {kv}"


def kv_bytes_per_token(config: Any, dtype: "torch.dtype") -> int | None:
    """K and V bytes one token takes in every layer of a standard decoder (layers x KV heads x head size x 2 x the
    dtype's bytes), from a transformers config; None where the config does not say (e.g. a multimodal config)."""
    config = getattr(config, "text_config", None) or config
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads and getattr(config, "hidden_size", None) else None)
    if not (layers and kv_heads and head_dim):
        return None
    return int(layers * kv_heads * head_dim * 2 * dtype.itemsize)
