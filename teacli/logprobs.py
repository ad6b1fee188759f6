"""The policy's token log-probabilities: what the trainer differentiates, the reference model
scores, and the vllm engine's sync check compares against. Shared by train/, rollout/ and the
diagnostics, so it lives below all of them.

The LM head and the log-softmax are the memory peak of a training step (a [tokens, vocabulary]
fp32 tensor: 4 GiB for 8k tokens of Llama-3's 128k vocabulary, plus its softmax for backward), so
they never run on the whole batch at once. The model is run up to its final hidden states (its
own forward, through any wrapper: DeepSpeed, peft), then the head is applied to the completion
tokens only (not the prompt, not the right padding), in one of two ways:

  * `liger`: liger-kernel's fused linear cross-entropy (reduction "none"; log-prob = −CE), which
    computes logits chunk by chunk and recomputes them in backward. Used for differentiated
    log-probs when liger-kernel is installed (`pip install 'teacli[liger]'`), the device is CUDA,
    and the head is a plain whole-weight `nn.Linear` (not a ZeRO-3 partition, not a LoRA-wrapped
    head). Without gradients (the reference model) the chunked path runs instead: liger's forward
    would compute input and weight gradients that nobody uses.
  * `chunked`: the same in torch: row chunks of at most `CHUNK_ELEMENTS` logits; when there are
    several, each chunk's head + log-softmax is checkpointed (only its hidden states are kept for
    backward). Everywhere else. Without gradients on CUDA each chunk's log-softmax is compiled
    (`_forward_chunk`).

Both give today's values (bf16/fp32 logits from the head, log-softmax in fp32) and gradients.
Models whose logits are not `head(hidden)` (final-logit softcapping, logit scaling) take the
plain path: the model's own logits for the completion positions, one row at a time.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from torch import Tensor

# Logits per chunk (rows x vocabulary): 2^28 fp32 values = 1 GiB (2,048 rows of a 128k vocabulary).
CHUNK_ELEMENTS = 1 << 28
FUSED_CHOICES = ("auto", "liger", "chunked", "plain")
# Config attributes that make logits something other than head(hidden): such models take the plain path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def token_logprobs(model, input_ids: "Tensor", attention_mask: "Tensor", n_prompt: int, *, fused: str = "auto",
                   completion_index: "Tensor | None" = None) -> "Tensor":
    """Log-probs of the completion tokens: input_ids [B, L] (left-padded prompt of n_prompt tokens,
    then completion) → [B, L − n_prompt] fp32, the log-prob of token t given everything before it.

    Completion positions whose attention_mask is 0 (right padding) are 0: they are not computed.
    `fused`: auto (liger where usable, else chunked), liger, chunked, or plain (the model's full
    logits, row-wise log-softmax; the reference the others are tested against).
    `completion_index`: `completion_index(attention_mask[:, n_prompt:])` computed where the mask was built
    (the host), on the model's device. Without it the positions are found on the device, which waits for it.
    """
    if fused not in FUSED_CHOICES:
        raise ValueError(f"fused: {fused!r} is not one of {', '.join(FUSED_CHOICES)}")
    use_nan_safe_sdpa_masks()
    position_ids = positions(attention_mask)
    head, decoder = _head_and_decoder(model)
    if fused == "plain" or head is None:
        return _plain(model, input_ids, attention_mask, position_ids, n_prompt)

    hidden = _hidden_states(model, decoder, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    hidden = hidden[:, n_prompt - 1 : -1]  # [B, T, H]: the states that predict the completion
    return _completion_logprobs(head, hidden, input_ids[:, n_prompt:], attention_mask[:, n_prompt:], fused, completion_index)


def shared_prompt_logprobs(
    model, prompt_ids: "Tensor", prompt_mask: "Tensor", row_of: "Tensor", completion_ids: "Tensor", completion_mask: "Tensor",
    *, fused: str = "auto", completion_index: "Tensor | None" = None,
    splits: "Sequence[tuple[int, int, Tensor | None]] | Packing | None" = None,
) -> "Tensor":
    """`token_logprobs` for sequences that share prompts, each prompt run through the model once.

    prompt_ids/prompt_mask [U, Lp]: the distinct prompts, left-padded; row_of [B]: sequence b's
    prompt; completion_ids/completion_mask [B, T]: right-padded completions. Returns [B, T] fp32
    (0 at padding), equal to `token_logprobs` on the concatenated sequences up to float rounding.

    The prompts run once with a KV cache; its keys and values are indexed to the B sequences and
    the completions run on top of them. Autograd follows the indexing, so every sequence's gradient
    reaches the prompt positions it attends to, summed over the sequences that share them, exactly
    as in the concatenated forward. With m completions per prompt this does the prompt's work once
    instead of m times. `completion_index`: as for `token_logprobs`, `completion_index(completion_mask)`.

    `splits`: the completions in consecutive runs of rows, each its own forward on the prompts' cache padded to its
    own width: (rows, width, `completion_index` of its mask [rows, width] or None) a run, in row order (rows sorted
    by length: `teacli.padding.split_sizes`, optim.completion_splits). The prompts still run once; a run's columns
    past its width are 0 in the result. Default: one run of every row at T. Or a `Packing`
    (`teacli.train.batching.pack_completions`): the completions run in one forward laid end to end in rows
    (`on_packed_prompt_cache`), where the model's attention takes a 4D mask (`packing_problem`; elsewhere one run
    of every row).

    Gradient-checkpointed layers (policy.gradient_checkpointing) keep the cache here: both passes' caches are
    recompute-safe (`prompt_cache`, `prefix_cache`), so the layer's recomputation in backward reads what its
    forward read. The prompt's keys and values leave a checkpointed layer through the cache, not its output:
    non-reentrant checkpointing records the forward's graph as usual (only its saved tensors are dropped and
    recomputed), so the completions' gradients reach them; reentrant checkpointing would not, and
    `can_share_prompts` refuses it. `can_share_prompts` says when this path applies.
    """
    import torch

    if fused not in FUSED_CHOICES:
        raise ValueError(f"fused: {fused!r} is not one of {', '.join(FUSED_CHOICES)}")
    use_nan_safe_sdpa_masks()
    head, decoder = _head_and_decoder(model)
    if fused == "plain" or head is None:
        raise ValueError("shared_prompt_logprobs needs a plain head(hidden) model (see can_share_prompts)")
    width = completion_ids.shape[1]
    outs, first = [], 0
    with _checkpointed_layers_keep_cache(model):
        cache = prompt_cache(model)
        last = _hidden_states(
            model, decoder, input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
            past_key_values=cache, use_cache=True,
        )[:, -1:]  # [U, 1, H]: predicts each prompt's first completion token
        if isinstance(splits, Packing) and packing_problem(model) is None:
            hidden = rows_of(last, row_of)
            if width > 1:
                packed = on_packed_prompt_cache(
                    lambda **inputs: _hidden_states(model, decoder, **inputs), model, cache, prompt_mask, splits,
                    completion_ids,
                )
                rest = rows_of(packed.reshape(-1, packed.shape[-1]), splits.gather)  # [B, T - 1, H]: unpacked
                hidden = torch.cat([hidden, rest], dim=1)
            return _completion_logprobs(head, hidden, completion_ids, completion_mask, fused, completion_index)
        if isinstance(splits, Packing):  # the model cannot take the packed rows' mask: one forward of every row
            splits = None
        for rows, cols, index in splits or ((len(row_of), width, completion_index),):
            run, first = slice(first, first + rows), first + rows
            ids, mask = completion_ids[run, :cols], completion_mask[run, :cols]
            hidden = rows_of(last, row_of[run])
            if cols > 1:  # the last completion token predicts nothing: it is not run
                rest = on_prompt_cache(
                    lambda **inputs: _hidden_states(model, decoder, **inputs), model, cache, prompt_mask, row_of[run],
                    ids[:, :-1], mask[:, :-1],
                )
                hidden = torch.cat([hidden, rest], dim=1)
            logp = _completion_logprobs(head, hidden, ids, mask, fused, index)
            outs.append(torch.nn.functional.pad(logp, (0, width - cols)) if cols < width else logp)
    return outs[0] if len(outs) == 1 else torch.cat(outs)


class Packing(NamedTuple):
    """Where a shared micro-batch's completions sit when they run packed (`optim.completion_splits: packed`): every
    completion but its last token (the last predicts nothing) laid end to end in R rows of width W = T − 1, a row
    holding one prompt's completions only (`teacli.padding.packed_layout`). Built on the host by
    `teacli.train.batching.pack_completions`."""

    prompt: "Tensor"  # [R] each row's prompt (an index into the micro-batch's distinct prompts)
    source: "Tensor"  # [R, W] the flat index into the completions' [B, T] of the token at each place (0 at padding)
    segment: "Tensor"  # [R, W] the sequence b whose token sits there (−1 at padding)
    offset: "Tensor"  # [R, W] that token's column in its completion (0 at padding)
    gather: "Tensor"  # [B, W] the flat index into [R × W] of completion b's token t (0 past its end)

    def to(self, device: Any) -> "Packing":
        return Packing(*(t.to(device) for t in self))

    @classmethod
    def lay(cls, rows: "Sequence[Sequence[int]]", spans: "Sequence[int]", prompt_of: "Sequence[int]", stride: int,
            width: int) -> "Packing":
        """The `Packing` (CPU tensors) of sequences b laid in `rows` (each row's sequence indices, in the order laid,
        as `teacli.padding.packed_rows` gives them): sequence b's first spans[b] tokens, read from a [B, stride]
        batch, end to end in rows of `width`; a row's prompt is its first sequence's, prompt_of[b]."""
        import torch

        prompt = torch.tensor([prompt_of[row[0]] for row in rows], dtype=torch.long)
        source = torch.zeros((len(rows), width), dtype=torch.long)
        segment = torch.full((len(rows), width), -1, dtype=torch.long)
        offset = torch.zeros((len(rows), width), dtype=torch.long)
        gather = torch.zeros((len(spans), width), dtype=torch.long)
        for r, row in enumerate(rows):
            start = 0
            for b in row:
                n, cols = spans[b], slice(start, start + spans[b])
                source[r, cols] = b * stride + torch.arange(n)
                segment[r, cols] = b
                offset[r, cols] = torch.arange(n)
                gather[b, :n] = r * width + start + torch.arange(n)
                start += n
        return cls(prompt, source, segment, offset, gather)


def packing_problem(model) -> str | None:
    """Why `model` cannot run packed completions (None: it can): their attention mask is a custom 4D mask, which
    transformers passes as it is to the attention function, which `sdpa` and tea's `sdpa_gqa` take boolean and `eager`
    additive (flash attention takes none, flex attention a block mask)."""
    impl = getattr(base_model(model).config, "_attn_implementation", None)
    return None if impl in ("sdpa", "sdpa_gqa", "eager") else f"its attention is {impl!r}, not sdpa or eager"


def on_packed_prompt_cache(forward: Any, model, cache: Any, prompt_mask: "Tensor", packing: Packing,
                           completion_ids: "Tensor") -> "Tensor":
    """`on_prompt_cache` for completions packed by `packing`: what `forward` returns for the packed rows [R, W, ...].

    Each row runs on its prompt's cache; a token attends to its prompt and, causally, to its own completion's tokens
    (a 4D mask; a padding place attends to the padding before it, so no row of the mask is empty), at the positions
    it has unpacked. The same states as unpacked, up to float rounding (`shared_prompt_logprobs` gathers them back)."""
    ids = completion_ids.reshape(-1)[packing.source]
    mask = packed_mask(model, packing.segment, prompt_mask[packing.prompt])
    start = prompt_mask.long().sum(-1)[packing.prompt][:, None]
    return forward(
        input_ids=ids, attention_mask=mask, position_ids=start + packing.offset,
        past_key_values=prefix_cache(model, cache, packing.prompt), use_cache=True,
    )


def packed_mask(model, segment: "Tensor", prompt: "Tensor | None" = None) -> "Tensor":
    """The 4D attention mask [R, 1, W, Lp + W] of rows of segments laid end to end (segment [R, W]: the segment at
    each place, equal ids one segment): a token attends, causally, to its own segment's earlier tokens, and to all
    of `prompt` [R, Lp] (each row's cached columns, 1 attends; none: Lp = 0). A padding place (segment −1) attends to
    the padding before it, so no row of the mask is empty. Boolean (True attends) for sdpa; additive for eager, which
    adds its mask to the scores."""
    import torch

    width = segment.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=segment.device).tril()
    mask = (segment[:, :, None] == segment[:, None, :]) & causal
    if prompt is not None:
        mask = torch.cat([prompt.bool()[:, None, :].expand(-1, width, -1), mask], dim=-1)
    mask = mask[:, None]  # [R, 1, W, Lp + W]
    if getattr(base_model(model).config, "_attn_implementation", None) == "eager":
        dtype = base_model(model).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=segment.device).masked_fill(~mask, torch.finfo(dtype).min)
    return mask


def unpacked_cache(cache: Any, index: "Tensor") -> Any:
    """`cache` of R rows of prompts laid end to end (every layer's keys and values [R, heads, W, d]), laid out as U
    left-padded rows in place: each layer's keys and values become [U, heads, Lp, d], column j of prompt u the packed
    place index[u, j] of the flat [R × W] (any place where prompt u is padding: its mask hides it). Returns `cache`."""

    def unpack(x: "Tensor") -> "Tensor":
        heads, d = x.shape[1], x.shape[3]
        return x.transpose(0, 1).reshape(heads, -1, d)[:, index].transpose(0, 1).contiguous()

    for layer in cache.layers:
        layer.keys, layer.values = unpack(layer.keys), unpack(layer.values)
    return cache


def on_prompt_cache(
    forward: Any, model, cache: Any, prompt_mask: "Tensor", row_of: "Tensor", ids: "Tensor", mask: "Tensor",
) -> "Tensor":
    """Continuations run on their prompts' KV cache: what `forward` (the model's, or its decoder's) returns for them.

    cache: the keys and values of U left-padded prompts (prompt_mask [U, Lp]), every layer; row_of [B]: sequence
    b's prompt; ids/mask [B, T]: the continuations, right-padded. The prompts' keys and values are indexed to the B
    sequences (`prefix_cache`: in each layer as it runs, not all layers up front), not recomputed; positions go on
    from each prompt's last. Shared by the policy's log-probs (`shared_prompt_logprobs`) and the reward model's
    scoring (teacli/rewards/hf.py)."""
    import torch

    shared = prefix_cache(model, cache, row_of)
    start = prompt_mask.long().sum(-1)[row_of][:, None]  # each sequence's first continuation position
    return forward(
        input_ids=ids, attention_mask=torch.cat([prompt_mask[row_of], mask], dim=1),
        position_ids=start + torch.arange(ids.shape[1], device=ids.device), past_key_values=shared, use_cache=True,
    )


def rows_of(x: "Tensor", index: "Tensor") -> "Tensor":
    """x[index] along the first dimension (index of any shape: the result is index.shape + x.shape[1:]), with a
    deterministic backward. Where an index repeats (m sequences reading one prompt's keys), the backward of
    `x[index]` (index_put_ with accumulate) sums the repeats in an order that changes from call to call on CPU (torch
    2.13: 19 of 19 gradients differed in their last bits for one row read 16 times), which made CPU training runs
    with shared prompts differ from step 2 on; `index_select`'s backward (index_add_) sums them in order."""
    return x.index_select(0, index.reshape(-1)).reshape(*index.shape, *x.shape[1:])


def completion_index(mask: "Tensor") -> "Tensor":
    """The flat positions (row-major, in [B × T]) where a completion mask [B, T] is nonzero: which rows of the
    hidden states get the LM head. Finding them on a GPU waits for it to catch up (the count decides the output's
    size), so the trainer computes them on the host with its masks and moves both together."""
    return mask.reshape(-1).nonzero().squeeze(1)


def positions(mask: "Tensor") -> "Tensor":
    """Position ids of a left-padded batch: counted from each row's first real token (0 on padding)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def new_cache(model) -> Any:
    """An empty transformers DynamicCache for `model`'s decoder (through DeepSpeed/peft wrappers)."""
    from transformers import DynamicCache

    return DynamicCache(config=base_model(model).config.get_text_config(decoder=True))


def cache_problem(model) -> str | None:
    """Why `model`'s decoder cache is not one plain full-attention key/value cache a layer (None: it is): a sliding
    window keeps only the last keys, chunked attention its chunk, linear and recurrent layers a state, so a suffix
    run on a prefix's cache would not see the whole prefix. What the shared-prompt paths (training, the reward
    model, the hf engine's cascade decode) need."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(new_cache(model), "layers", [])
    kinds = sorted({type(layer).__name__ for layer in layers if type(layer) is not DynamicLayer})
    text = base_model(model).config.get_text_config(decoder=True)
    if kinds or len(layers) != getattr(text, "num_hidden_layers", len(layers)):
        return f"its KV cache has {', '.join(kinds) or 'fewer'} layers, not one full-attention cache a layer"
    return None


def prompt_cache(model) -> Any:
    """`new_cache`, its full-attention layers recompute-safe for the prompt pass: each keeps the keys and values its
    layer's forward computes (DynamicLayer's values exactly, without DynamicLayer's copy of them), and a gradient-
    checkpointed layer's recomputation in backward, which calls the cache again, finds them kept and changes
    nothing (DynamicLayer would append them a second time, and the recomputation would attend to both)."""
    from transformers.cache_utils import DynamicLayer

    cache = new_cache(model)
    prompt_layer, _ = _cache_layers()
    cache.layers = [prompt_layer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def prefix_cache(model, cache: Any, rows: "Tensor") -> Any:
    """A cache for continuations of `cache`'s prompts: row b continues prompt rows[b]. A full-attention layer
    (DynamicLayer, or `prompt_cache`'s) is read-only: each `update` returns cat(prompt's keys[rows], new keys)
    and stores nothing, so a gradient-checkpointed layer's recomputation reads what its forward read; the
    index runs in the layer, so no layer's copy is held before it runs (or, checkpointed, after). The values are
    DynamicLayer's on `cache_rows`' copy, bit for bit. Other layers (sliding windows) get `cache_rows`' copy."""
    from transformers.cache_utils import DynamicLayer

    into = new_cache(model)
    if len(into.layers) != len(cache.layers):  # a cache that makes its layers as they are first written
        return cache_rows(cache, rows, into)
    prompt_layer, prefix_layer = _cache_layers()
    for index, (layer, target) in enumerate(zip(cache.layers, into.layers)):
        if type(layer) in (DynamicLayer, prompt_layer) and type(target) is DynamicLayer:
            into.layers[index] = prefix_layer(layer.keys, layer.values, rows)
        else:
            target.update(rows_of(layer.keys, rows), rows_of(layer.values, rows))
    return into


_CACHE_LAYERS: Any = None


def _cache_layers() -> tuple[Any, Any]:
    """The two DynamicLayer subclasses of `prompt_cache` and `prefix_cache` (built once: transformers is imported
    only when a cache is)."""
    global _CACHE_LAYERS
    if _CACHE_LAYERS is not None:
        return _CACHE_LAYERS
    import torch
    from transformers.cache_utils import DynamicLayer

    def hold(layer: Any, keys: "Tensor", values: "Tensor") -> None:
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        layer.keys, layer.values = keys, values

    class PromptLayer(DynamicLayer):
        kept = False

        def update(self, key_states: "Tensor", value_states: "Tensor", *args: Any, **kwargs: Any) -> tuple["Tensor", "Tensor"]:
            if not self.kept:  # the forward; a recomputation in backward finds them kept
                hold(self, key_states, value_states)
                self.kept = True
            return key_states, value_states

    class PrefixLayer(DynamicLayer):
        def __init__(self, keys: "Tensor", values: "Tensor", rows: "Tensor") -> None:
            super().__init__()
            hold(self, keys, values)  # [U, heads, Lp, d]
            self.rows = rows  # [B]

        def update(self, key_states: "Tensor", value_states: "Tensor", *args: Any, **kwargs: Any) -> tuple["Tensor", "Tensor"]:
            return (torch.cat([rows_of(self.keys, self.rows), key_states], dim=-2),
                    torch.cat([rows_of(self.values, self.rows), value_states], dim=-2))

    _CACHE_LAYERS = (PromptLayer, PrefixLayer)
    return _CACHE_LAYERS


def cache_rows(cache, rows: "Tensor", into: Any) -> Any:
    """`cache`'s keys and values at batch rows `rows` (repeats allowed), every layer, written into the empty
    cache `into` (`new_cache`, or a fresh StaticCache) and returned. Differentiable: autograd sums a
    repeated row's gradients."""
    for index, layer in enumerate(cache.layers):
        into.update(rows_of(layer.keys, rows), rows_of(layer.values, rows), index)
    return into


def can_share_prompts(model, fused: str = "auto") -> bool:
    """Whether `shared_prompt_logprobs` applies to `model`: logits = head(hidden), and where a layer is
    gradient-checkpointed, checkpointing that `shared_prompt_logprobs` can keep the cache through
    (`_checkpointing_keeps_cache`)."""
    head, _ = _head_and_decoder(model)
    if fused == "plain" or head is None:
        return False
    return not getattr(base_model(model), "is_gradient_checkpointing", False) or _checkpointing_keeps_cache(model)


def _checkpointing_keeps_cache(model) -> bool:
    """Whether the shared-prompt forward is right on `model`'s checkpointed layers: transformers' per-layer
    checkpointing (GradientCheckpointingLayer; the checkpointing of a model that has none, in its own loop, would
    drop the cache) in a transformers that lets a layer keep the cache (`_can_checkpoint_with_cache`: 5.17 and
    5.19 do), non-reentrant (reentrant checkpointing passes gradients only to the layer's tensor
    arguments, not to the prompt's keys and values it reads from the cache), and every layer's cache plain full
    attention (`prompt_cache` and `prefix_cache` make exactly those recompute-safe; a sliding window's is not)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    if not hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache"):  # older transformers: always drops it
        return False
    module = base_model(model)
    layers = [m for m in module.modules() if isinstance(m, GradientCheckpointingLayer)]
    checkpointed = [m for m in layers if m.gradient_checkpointing]
    if not checkpointed:
        return False
    for layer in checkpointed:
        func = getattr(layer, "_gradient_checkpointing_func", None)
        if getattr(func, "keywords", {}).get("use_reentrant", True) is not False:
            return False
    return cache_problem(model) is None


class _NoCachingWarning:
    """A logging filter: drops transformers' warnings that a checkpointed model and layer set use_cache=False (they
    do, and that is harmless: the layers still read the cache they are given; `_checkpointed_layers_keep_cache`)."""

    LOGGERS = ("transformers.utils.generic", "transformers.modeling_layers")

    def filter(self, record: Any) -> bool:
        return "incompatible with gradient checkpointing" not in str(record.msg)


@contextmanager
def _checkpointed_layers_keep_cache(model) -> Iterator[None]:
    """While the block runs, `model`'s gradient-checkpointed layers are given the KV cache (transformers drops it
    there unless the layer sets `_can_checkpoint_with_cache`, which it means for layers that only read it): the
    shared-prompt forward's caches are recompute-safe (`prompt_cache`, `prefix_cache`). A layer's recomputation in
    backward calls its forward with the arguments of the first call, so the flag is needed only while it runs.
    Nothing is changed where no layer is checkpointed; checkpointing that cannot keep it is a ValueError."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in base_model(model).modules() if isinstance(m, GradientCheckpointingLayer)
              and m.gradient_checkpointing and m.training and "_can_checkpoint_with_cache" not in vars(m)]
    if not layers:
        yield
        return
    if not _checkpointing_keeps_cache(model):
        raise ValueError("shared_prompt_logprobs: this model's gradient checkpointing cannot keep the prompts' KV cache "
                         "(see can_share_prompts)")
    import logging

    quiet = _NoCachingWarning()
    for name in quiet.LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache
        for name in quiet.LOGGERS:
            logging.getLogger(name).removeFilter(quiet)


def resolved_kind(model, device: Any, fused: str = "auto") -> str:
    """Which path `token_logprobs` takes for `model` on `device` (benchmarks report it)."""
    import torch

    head, _ = _head_and_decoder(model)
    if fused == "plain" or head is None:
        return "plain"
    return _resolve(fused, head, torch.empty(0, device=device))


def liger_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


# ------------------------------------------------------------------------------------------------


def base_model(model) -> Any:
    """The transformers PreTrainedModel inside a DeepSpeedEngine and/or a peft PeftModel (adapters live
    inside its modules, so its forward runs them)."""
    module = getattr(model, "module", model)  # DeepSpeedEngine
    if hasattr(module, "get_base_model"):  # peft PeftModel
        module = module.get_base_model()
    return module


_NAN_SAFE_MASKS = False


def nan_safe_sdpa_mask(*args: Any, **kwargs: Any) -> "Tensor | None":
    """transformers' `sdpa_mask`, except that a query row with no key to attend to attends to all keys.

    A left-padded position attends to nothing (its keys are padding, later keys are causally
    masked). On CUDA, torch's SDPA gives such a row 0 in the forward but NaN in the backward
    (torch 2.11 on an H100, a Llama-3.2-1B shape in bf16: 138 of 146 parameters' gradients non-finite
    with one left-padded row; fp32 and a 2-layer model stayed finite; tests/gpu/test_gpu_padding.py).
    The row's output feeds nothing (its key and value stay masked for every real query, and its
    position predicts no completion token), so unmasking it changes no log-prob and no gradient, and
    keeps both finite. Rows with any key are returned unchanged.
    """
    import torch
    from transformers.masking_utils import sdpa_mask

    mask = sdpa_mask(*args, **kwargs)
    if mask is None or mask.dtype != torch.bool:
        return mask
    return mask | ~mask.any(dim=-1, keepdim=True)


def use_nan_safe_sdpa_masks() -> None:
    """Make transformers build `sdpa` masks with `nan_safe_sdpa_mask`, for every model of this process
    (idempotent). Called by the log-prob functions, whose backward is where the NaN appears."""
    global _NAN_SAFE_MASKS
    if not _NAN_SAFE_MASKS:
        from transformers import AttentionMaskInterface

        AttentionMaskInterface.register("sdpa", nan_safe_sdpa_mask)
        _NAN_SAFE_MASKS = True


def _hidden_states(model, decoder, **inputs: Any) -> "Tensor":
    """The decoder's final hidden states [B, L, H] from the model's own forward (so DeepSpeed/peft
    wrappers run), its head asked for no position."""
    import torch

    captured: dict[str, Any] = {}

    def keep(_module, _args, output):
        captured["hidden"] = output[0] if isinstance(output, tuple) else output.last_hidden_state

    handle = decoder.register_forward_hook(keep)
    try:
        model(**inputs, logits_to_keep=torch.zeros(0, dtype=torch.long, device=inputs["input_ids"].device))
    finally:
        handle.remove()
    return captured["hidden"]


def _completion_logprobs(head, hidden: "Tensor", targets: "Tensor", mask: "Tensor", fused: str,
                         index: "Tensor | None" = None) -> "Tensor":
    """hidden [B, T, H] (the states that predict targets [B, T]) → log-probs [B, T] fp32, 0 where mask is 0.
    `index`: `completion_index(mask)` where the caller has it (on hidden's device)."""
    import torch

    if index is None:
        index = completion_index(mask)
    rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)  # [N, H], completion tokens only
    tok = targets.reshape(-1).index_select(0, index)
    kind = _resolve(fused, head, rows)
    # Without gradients liger would still compute its input/weight gradients in forward: chunked it is.
    grad = torch.is_grad_enabled() and rows.requires_grad
    flat = _liger(head, rows, tok) if kind == "liger" and grad else _chunked(head, rows, tok)
    out = torch.zeros(targets.numel(), dtype=torch.float32, device=targets.device)
    return out.index_copy(0, index, flat.float()).view(targets.shape)


def _head_and_decoder(model) -> tuple[Any, Any]:
    """(the LM head module, the decoder whose output feeds it), or (None, None) when the logits are
    not simply head(decoder output) or the model does not expose them."""
    import torch

    module = base_model(model)
    get_head, get_decoder = getattr(module, "get_output_embeddings", None), getattr(module, "get_decoder", None)
    if get_head is None or get_decoder is None:
        return None, None
    config = getattr(module, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    if any(getattr(c, a, None) not in (None, 1.0) for c in (config, text) if c is not None for a in _LOGIT_TRANSFORMS):
        return None, None
    head, decoder = get_head(), get_decoder()
    if not isinstance(head, torch.nn.Module) or not isinstance(decoder, torch.nn.Module):
        return None, None
    return head, decoder


def _resolve(fused: str, head, rows: "Tensor") -> str:
    import torch

    usable = (
        rows.device.type == "cuda" and type(head) is torch.nn.Linear and liger_available()
        and not hasattr(head.weight, "ds_id")  # a ZeRO-3 partition: only the module call gathers it
    )
    if fused == "liger" and not usable:
        raise ValueError("fused: 'liger' needs liger-kernel installed, a CUDA device and a plain nn.Linear head")
    return "liger" if fused in ("liger", "auto") and usable else "chunked"


def _chunk_logprobs(head, rows: "Tensor", targets: "Tensor") -> "Tensor":
    import torch

    logits = head(rows).float()
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


_COMPILED_CHUNK: Any = None


def _forward_chunk(head, rows: "Tensor") -> Any:
    """`_chunk_logprobs`, or where no gradient is taken on CUDA with a plain `nn.Linear` head (the reference model's
    log-probs), the same compiled (inductor, dynamic row counts): the fp32 copy of the logits, the gather and the
    log-sum-exp become one pass over the bf16 logits. Same values (the sums in another order); a 1B policy's head
    and log-softmax over 16k completion tokens took 15.5 ms instead of 31.4 on an H200 (benchmarks/decode_step.py)."""
    global _COMPILED_CHUNK
    import torch

    plain = type(head) is torch.nn.Linear and not hasattr(head.weight, "ds_id")
    if rows.device.type != "cuda" or not plain or (torch.is_grad_enabled() and rows.requires_grad):
        return _chunk_logprobs
    if _COMPILED_CHUNK is None:
        _COMPILED_CHUNK = torch.compile(_chunk_logprobs, dynamic=True)
    return _COMPILED_CHUNK


def _chunked(head, rows: "Tensor", targets: "Tensor") -> "Tensor":
    import torch
    from torch.utils.checkpoint import checkpoint

    vocab = head.out_features if hasattr(head, "out_features") else head.weight.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(1, vocab))
    # With several chunks each is checkpointed (backward recomputes its logits instead of keeping them
    # all); a single chunk is kept as it is (bounded already; recomputing would only cost time).
    recompute = torch.is_grad_enabled() and rows.requires_grad and rows.shape[0] > step
    chunk = _forward_chunk(head, rows)
    out = []
    for start in range(0, rows.shape[0], step):
        r, t = rows[start : start + step], targets[start : start + step]
        out.append(checkpoint(_chunk_logprobs, head, r, t, use_reentrant=False) if recompute else chunk(head, r, t))
    return torch.cat(out) if out else rows.new_zeros(0, dtype=torch.float32)


def _liger(head, rows: "Tensor", targets: "Tensor") -> "Tensor":
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss = LigerFusedLinearCrossEntropyLoss(reduction="none")
    return -loss(head.weight, rows, targets, head.bias)


def _plain(model, input_ids, attention_mask, position_ids, n_prompt: int) -> "Tensor":
    import torch

    n_completion = input_ids.shape[1] - n_prompt
    # Only the last n_completion + 1 positions need the LM head.
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
        logits_to_keep=n_completion + 1,
    ).logits
    logits = logits[:, -(n_completion + 1) : -1]  # predictions for the completion positions
    targets = input_ids[:, n_prompt:]
    out = []
    for row_logits, row_targets in zip(logits, targets):  # row by row: a whole-batch fp32 log-softmax is the memory peak
        row = row_logits.float()
        out.append(row.gather(-1, row_targets[:, None]).squeeze(-1) - torch.logsumexp(row, dim=-1))
    valid = attention_mask[:, n_prompt:].bool()
    return torch.stack(out).masked_fill(~valid, 0.0)
