"""Attention: SDPA over the grouped K/V heads (`sdpa_gqa`), registered through transformers' public hooks
(`AttentionInterface`, `AttentionMaskInterface`), and switching a model's attention for a block of code.


Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


SDPA_GQA = "sdpa_gqa"
CPU_FP32_ATTENTION = True  # see sdpa_gqa_attention (benchmarks/quickstart_cpu.py turns it off for its `before` steps)


def sdpa_gqa_attention(
    module: Any, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", attention_mask: "torch.Tensor | None",
    dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any,
) -> tuple["torch.Tensor", None]:
    """transformers' `sdpa` attention without the K/V head repeat: query [B, H, q, D], key/value
    [B, H_kv, k, D] → [B, q, H, D], through `scaled_dot_product_attention(enable_gqa=True)`.

    transformers' own `sdpa` function expands K/V from H_kv to H heads (a copy of the whole cache
    per layer and decode step) whenever a mask is present, which is always the case for left-padded
    batches; SDPA broadcasts the groups itself. Same mask (transformers' `sdpa_mask`, made NaN-safe by
    `logprobs.nan_safe_sdpa_mask`), same causal rule: `is_causal` only when there is no mask and more
    than one query.

    On CPU, a bf16 attention over more than one query (a prefill, a training or scoring forward) runs
    in fp32 and is cast back: torch's CPU flash-attention backward is ~3x slower in bf16 than in fp32
    (16 x 130 tokens, SmolLM2's 9/3 heads: 54 ms against 17 ms per layer, torch 2.13). Whether or not
    autograd records, the same kernel runs, so a reference model and the policy with the same weights
    give identical log-probs (a KL of exactly 0 before the first update). Decode steps (one query) stay bf16.
    """
    import torch

    dtype = query.dtype
    upcast = CPU_FP32_ATTENTION and query.device.type == "cpu" and dtype == torch.bfloat16 and query.shape[2] > 1
    if upcast:
        query, key, value = query.float(), key.float(), value.float()
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    causal = causal and attention_mask is None and q_len > 1
    if causal and kv_len > q_len:  # prefill into an empty static cache: the rest of it is unwritten
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).to(dtype).contiguous(), None


def register_sdpa_gqa() -> str:
    """Register `sdpa_gqa` (attention and its mask function) with transformers; idempotent."""
    from transformers import AttentionInterface, AttentionMaskInterface

    from teacli.logprobs import nan_safe_sdpa_mask

    AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention)
    AttentionMaskInterface.register(SDPA_GQA, nan_safe_sdpa_mask)
    return SDPA_GQA


@contextlib.contextmanager
def attention_implementation(module: Any, name: str | None) -> Iterator[None]:
    """Run `module` (a transformers PreTrainedModel) with attention `name` inside the block, then
    restore its own. None = leave it as it is."""
    saved = getattr(module.config, "_attn_implementation", None)
    if name is None or name == saved:
        yield
        return
    if name == SDPA_GQA:
        register_sdpa_gqa()
    module.set_attn_implementation(name)
    try:
        yield
    finally:
        module.set_attn_implementation(saved)
