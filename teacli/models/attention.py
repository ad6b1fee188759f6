"""Attention: SDPA over the grouped K/V heads (`sdpa_gqa`), registered through transformers' public hooks
(`AttentionInterface`, `AttentionMaskInterface`), and switching a model's attention for a block of code. Also the
hf engine's cascade decode attention (`CascadeCache`, `cascade_attention`: rollout.attention `cascade`).


Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


SDPA_GQA = "sdpa_gqa"
CASCADE = "tea_cascade"  # the decode attention of `CascadeCache` (registered without a mask function: see there)
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


def allow_cudnn_attention(allowed: bool) -> None:
    """Whether torch's scaled-dot-product attention may use its cuDNN backend, for this process
    (backend.cudnn_attention). A process-wide flag of torch's: every SDPA call after it (the trainer's, the
    reference's, the reward model's) chooses among flash, memory-efficient and math only when it is off."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(allowed)


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
    elif name == CASCADE:
        register_cascade()
    module.set_attn_implementation(name)
    try:
        yield
    finally:
        module.set_attn_implementation(saved)


# -- cascade decode attention (rollout.attention: cascade) --------------------------------------------------------


class CascadeCache:
    """A decode KV cache for rows that share prompts (the m samples of a group), in two parts:

      * the group part: each distinct prompt's KV once, [P, H_kv, Lp, D] a layer (the shared prefill's own
        DynamicCache, not copied to rows), Lp = the left-padded prompt less its last column, with its padding mask
        [P, Lp] (every row of a group has its prompt's padding);
      * the row part: each row's own columns, [B, H_kv, C, D] a layer, preallocated: column 0 = the prompt's last
        token, column t = the token drawn at step t - 1 (C = max_new_tokens).

    Duck-typed for what a transformers decoder calls on `past_key_values` (`update`, `get_seq_length`,
    `is_compileable`); `update` writes the step's K/V at `column` (a device tensor, so a CUDA graph replays it) and
    returns the row part up to `end`, which `cascade_attention` merges with the group part that it finds through
    the `tea_cascade` keyword argument (this cache; transformers passes a forward's extra keyword arguments down to
    the attention function) and `module.layer_idx`.

    Only the written columns, under CUDA graphs: a compiled graph has static shapes, so the row part is read in
    segments: `end` = the current column rounded up to a multiple of `segment` (a Python int, which torch.compile
    specializes on: one graph per segment length, compiled the first time it is reached and replayed for every
    later step of that segment and every later call), the columns past the current one masked. The trade-off:
    ceil(C / segment) compilations on a run's first generation instead of one, and on average segment / 2
    unwritten columns read a step.

    `seek(column)` is called by the decode loop before each forward, outside any compiled region.
    """

    is_compileable = True

    def __init__(self, prefix: Any, row_of: list[int], prompt_mask: "torch.Tensor", columns: int, segment: int) -> None:
        import torch

        if segment < 1 or columns < 1:
            raise ValueError(f"CascadeCache: segment and columns must be >= 1, got {segment}, {columns}")
        self.group_keys = [layer.keys.contiguous() for layer in prefix.layers]
        self.group_values = [layer.values.contiguous() for layer in prefix.layers]
        groups, kv_heads, self.prompt_len, _ = self.group_keys[0].shape
        if max(row_of) + 1 != groups or prompt_mask.shape != (groups, self.prompt_len):
            raise ValueError(f"CascadeCache: {groups} prompts of {self.prompt_len} columns, rows of {max(row_of) + 1} "
                             f"prompts, a mask of {tuple(prompt_mask.shape)}")
        rows, device = len(row_of), self.group_keys[0].device
        self.keys = [k.new_zeros(rows, kv_heads, columns, k.shape[-1]) for k in self.group_keys]
        self.values = [v.new_zeros(rows, kv_heads, columns, v.shape[-1]) for v in self.group_values]
        # additive, fp32: 0 on the prompt's tokens, -inf on its left padding; [P, 1, 1, Lp] against [P, H_kv, m*G, Lp]
        self.group_bias = torch.zeros(prompt_mask.shape, dtype=torch.float32, device=device).masked_fill(
            ~prompt_mask.to(device=device, dtype=torch.bool), -float("inf"))[:, None, None, :]
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # the column the next forward writes
        self.columns, self.segment, self.position, self.end = columns, segment, 0, min(segment, columns)
        # Rows → the group layout [P, m] (m = the largest group): prompt-major rows of equal groups are that layout
        # as they are; otherwise `slots` gathers the rows into it (a short group's spare slots repeat its first row)
        # and `slot_of` gathers the rows' results back.
        self.group_size = max(row_of.count(u) for u in range(groups))
        self.uniform = row_of == [u for u in range(groups) for _ in range(self.group_size)]
        self.slots = self.slot_of = None
        if not self.uniform:
            members: list[list[int]] = [[] for _ in range(groups)]
            for row, u in enumerate(row_of):
                members[u].append(row)
            slot_of = [0] * rows
            for u, rows_u in enumerate(members):
                for j, row in enumerate(rows_u):
                    slot_of[row] = u * self.group_size + j
            self.slots = torch.tensor([rows_u[min(j, len(rows_u) - 1)] for rows_u in members for j in range(self.group_size)],
                                      device=device)
            self.slot_of = torch.tensor(slot_of, device=device)
        # bf16/fp16 K/V: fp32 scores straight from the GEMM (torch.bmm's out_dtype, CUDA), else both operands upcast
        self.f32_bmm = _bmm_out_dtype_works(self.group_keys[0])
        for t in (*self.group_keys, *self.group_values, *self.keys, *self.values, self.group_bias, self.column,
                  *(() if self.uniform else (self.slots, self.slot_of))):
            torch._dynamo.mark_static_address(t)  # fixed addresses: CUDA graphs read them in place, no copy a replay

    def seek(self, column: int) -> None:
        """The next forward writes row column `column` and reads the row part up to its segment's end."""
        if not 0 <= column < self.columns:
            raise ValueError(f"CascadeCache: column {column} outside its {self.columns} columns")
        self.column.fill_(column)
        self.position = column
        self.end = min(self.columns, -(-(column + 1) // self.segment) * self.segment)

    def update(self, key_states: "torch.Tensor", value_states: "torch.Tensor", layer_idx: int,
               cache_kwargs: dict[str, Any] | None = None) -> tuple["torch.Tensor", "torch.Tensor"]:
        """Write one decode step's K/V [B, H_kv, 1, D] at `column`; the row part [B, H_kv, end, D]."""
        if key_states.shape[2] != 1:
            raise ValueError(f"CascadeCache takes one token a row a forward, got {key_states.shape[2]}")
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self.column, key_states.to(keys.dtype))
        values.index_copy_(2, self.column, value_states.to(values.dtype))
        return keys[:, :, : self.end], values[:, :, : self.end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Columns before the next forward's: the prompt's (less its last) and the row columns written."""
        return self.prompt_len + self.position


def cascade_attention(
    module: Any, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", attention_mask: "torch.Tensor | None",
    dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any,
) -> tuple["torch.Tensor", None]:
    """One decode step's attention on a `CascadeCache` (`kwargs["tea_cascade"]`): query [B, H, 1, D] against
    its group's prompt K/V and against its own columns (key/value [B, H_kv, end, D], `CascadeCache.update`'s),
    merged exactly: out = (e^lse1 o1 + e^lse2 o2) / (e^lse1 + e^lse2), in fp32. → [B, 1, H, D].

    The group part is one batched GEMM per (prompt, K/V head): the group's m rows x the G query heads that share
    the K/V head folded into m*G queries, so the prompt's K/V is read once per group, not once per row. Scores are
    fp32 (as SDPA's kernels keep them), softmax and log-sum-exp in fp32, probabilities cast to the K/V dtype for
    the second GEMM (as flash attention does). A prompt that is all padding (a one-token prompt) has lse1 = -inf
    and weight 0. Without `tea_cascade` (a prefill, a batch without shared prompts) it is `sdpa_gqa_attention`.
    """
    import torch

    cache = kwargs.get("tea_cascade")
    if cache is None:
        return sdpa_gqa_attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    for unsupported in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(f"cascade attention does not implement {unsupported} (use rollout.attention: sdpa_gqa)")
    rows, heads, q_len, dim = query.shape
    kv_heads, end = key.shape[1], key.shape[2]
    if q_len != 1:
        raise ValueError(f"cascade attention is for decode steps (one query a row), got {q_len}")
    g, groups, m = heads // kv_heads, cache.group_bias.shape[0], cache.group_size
    scale = dim**-0.5 if scaling is None else scaling
    layer = module.layer_idx
    q = query.reshape(rows, kv_heads, g, dim)  # head h attends with K/V head h // g

    # the row's own columns: [B*H_kv, G, end], the columns past the current one masked
    s2 = _bmm_f32(q.reshape(rows * kv_heads, g, dim), key.reshape(rows * kv_heads, end, dim).transpose(1, 2), cache.f32_bmm) * scale
    written = torch.arange(end, device=query.device) <= cache.column
    s2 = s2.masked_fill(~written, -float("inf"))
    lse2 = torch.logsumexp(s2, dim=-1, keepdim=True)
    o2 = _bmm_f32((s2 - lse2).exp().to(value.dtype), value.reshape(rows * kv_heads, end, value.shape[-1]), cache.f32_bmm)
    o2, lse2 = o2.view(rows, kv_heads, g, -1), lse2.view(rows, kv_heads, g, 1)

    # the group's prompt: [P*H_kv, m*G, Lp], the m rows' G heads as queries of the group's K/V head
    gk, gv = cache.group_keys[layer], cache.group_values[layer]
    lp = gk.shape[2]
    qg = q if cache.uniform else q[cache.slots]  # [P*m, H_kv, G, D]
    qg = qg.view(groups, m, kv_heads, g, dim).transpose(1, 2).reshape(groups * kv_heads, m * g, dim)
    s1 = _bmm_f32(qg, gk.view(groups * kv_heads, lp, dim).transpose(1, 2), cache.f32_bmm) * scale
    s1 = s1.view(groups, kv_heads, m * g, lp) + cache.group_bias
    lse1 = torch.logsumexp(s1, dim=-1, keepdim=True)
    p1 = (s1 - lse1.clamp_min(torch.finfo(torch.float32).min)).exp()  # all padding: exp(-inf) = 0, not NaN
    o1 = _bmm_f32(p1.to(gv.dtype).view(groups * kv_heads, m * g, lp), gv.view(groups * kv_heads, lp, gv.shape[-1]), cache.f32_bmm)

    def to_rows(x: "torch.Tensor") -> "torch.Tensor":  # [P*H_kv, m*G, n] → [B, H_kv, G, n]
        n = x.shape[-1]
        x = x.view(groups, kv_heads, m, g, n).transpose(1, 2).reshape(groups * m, kv_heads, g, n)
        return x if cache.uniform else x[cache.slot_of]

    o1, lse1 = to_rows(o1), to_rows(lse1.view(groups * kv_heads, m * g, 1))
    top = torch.maximum(lse1, lse2)  # lse2 is finite: a row's column 0 is always written
    w1, w2 = (lse1 - top).exp(), (lse2 - top).exp()
    out = (w1 * o1 + w2 * o2) / (w1 + w2)
    return out.reshape(rows, 1, heads, -1).to(query.dtype), None


def _bmm_f32(a: "torch.Tensor", b: "torch.Tensor", out_dtype: bool) -> "torch.Tensor":
    """a @ b (batched) with an fp32 result: straight from the GEMM where `out_dtype` (bf16/fp16 on CUDA), else on
    fp32 operands (a no-op for fp32 tensors)."""
    import torch

    if out_dtype and a.dtype == b.dtype and a.dtype != torch.float32:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


def _bmm_out_dtype_works(like: "torch.Tensor") -> bool:
    """Whether `torch.bmm(..., out_dtype=torch.float32)` runs for tensors like `like` (CUDA bf16/fp16, torch >= 2.8)."""
    import torch

    if like.dtype not in (torch.bfloat16, torch.float16) or like.device.type != "cuda":
        return False
    try:
        a = torch.zeros(1, 1, 8, dtype=like.dtype, device=like.device)
        torch.bmm(a, a.transpose(1, 2), out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):
        return False
    return True


def register_cascade() -> str:
    """Register `cascade_attention` with transformers; idempotent. No mask function is registered for it: a
    decoder then builds no mask (transformers' mask functions return None for an attention they have no mask
    for), and the cascade takes its masks from its cache."""
    from transformers import AttentionInterface

    AttentionInterface.register(CASCADE, cascade_attention)
    return CASCADE

