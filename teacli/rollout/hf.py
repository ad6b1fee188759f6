"""The `hf` rollout engine: the trainer's own module, sampled with generate's semantics in a decode loop of its own.

Sampling contract (shared with the vllm engine): each token is drawn from the policy's next-token
distribution with the recipe's temperature, then top-k (0 = off), then top-p, and nothing else.
transformers fills every generation setting we leave unset from the model's `generation_config`
(a checkpoint's `top_k: 50`, `repetition_penalty: 1.1`, `min_new_tokens`, ...), then from library
defaults (`top_k = 50`). We therefore pass a complete `GenerationConfig` and, during the call,
swap the model's own for a blank one, so a checkpoint cannot change what "on-policy" means.

Sequences are generated in batches of at most `batch_size` (each prompt repeated n times,
left-padded). Sampling draws from torch's global RNG, seeded per call inside `fork_rng`, so results
are reproducible given (inputs, seed, batch_size, engine settings) and the caller's RNG state is
left untouched.

Speed (issue 12), all through transformers' public hooks; the model's forward stays transformers':
  * `attention: sdpa_gqa` (default) runs the model, for the duration of the call, with the attention
    function `teacli.models.sdpa_gqa_attention` registered through `AttentionInterface`: SDPA with
    `enable_gqa=True` instead of copying the grouped K/V heads every layer and decode step.
  * `kv_cache: static` pre-allocates the KV cache (`StaticCache`) at a BUCKETED length: prompts are
    left-padded to a multiple of `cache_bucket` tokens and the cache holds that plus max_new_tokens,
    so every batch of a training run has the same shapes and a compiled decode step is reused.
    The extra left padding is masked: it changes no logit beyond float rounding.
  * `compile: true` compiles the decode forward (`torch.compile` with transformers' `CompileConfig`
    defaults: inductor, CUDA graphs); it needs the static cache. `auto` = on for CUDA only.
  * `share_prefix: true` (default) prefills each distinct prompt of a batch once (the m samples of a
    group share it) and copies its KV cache to its rows; generate then prefills only the last column.
  * The draw is an inverse-CDF lookup (`InverseCDFSampler`, the last logits processor, one uniform
    number per row) instead of generate's `torch.multinomial`, which on CPU draws an exponential
    variate per vocabulary entry. Same distribution; `sampler="multinomial"` keeps generate's own.
  * The decode loop is the engine's own (`_decode`), not `model.generate`'s: one call of the model's
    forward per token, then the contract's processors and the draw, exactly as generate runs them (the
    same tokens for a seed: tested against `model.generate`). What it drops is generate's per-token
    bookkeeping and its host synchronisation at every token (it reads the stop condition back from the
    GPU after each one); this loop checks it every `STOP_CHECK_EVERY` tokens, so the host queues the next
    tokens' work while the GPU runs. With `compile` the decode forward is `torch.compile`d as generate
    compiles it (mode reduce-overhead: one CUDA graph a token), and on CUDA the draw too
    (`inverse_cdf_tokens`, plain inductor: one fused pass over the logits). On an H100 the profiled decode
    step spent ~4 ms of GPU work in ~7 ms of wall time under generate (docs/performance.md).
    `loop="generate"` keeps transformers' generate (benchmarks compare the two).
  * `attention: cascade` (opt-in; on an H200, uf_llama1b_tea's step generated in 3.37 s against 3.72 with `sdpa_gqa`,
    after a first call of 118.6 s against 3.6: benchmarks/decode_step.py, results/performance/2026-11-29-h200/): with `share_prefix`, a
    batch whose rows share prompts decodes on a `teacli.models.CascadeCache`: each distinct prompt's KV once (the
    shared prefill's own cache, not copied to its rows) and a per-row cache of the rows' own columns (the prompt's
    last token and the drawn ones). Each decode step's attention (`teacli.models.cascade_attention`, registered
    through `AttentionInterface` for the decode loop only) is the exact log-sum-exp merge of the rows against their
    group's prompt (one GEMM per group and K/V head: the group's rows x the query heads sharing that K/V head as the
    queries, so the prompt's K/V is read once per group, not once per row) and against their own columns written so
    far. The static cache reads every column of max_cache_len, written or not, for every row; this reads the
    prompt once per group and the rows' columns up to the current segment's end (`CASCADE_SEGMENT` columns: a
    compiled graph needs static shapes, so each segment length compiles once, ceil(max_new_tokens / segment)
    graphs on the first call instead of one, each replayed for every later step in its segment). Hooked in without
    forking model code: the cache is passed as `past_key_values` (duck-typed: `update`, `get_seq_length`,
    `is_compileable`), and the attention function finds it through a keyword argument of the forward
    (`tea_cascade`), which transformers passes down to the attention function, and the layer through
    `module.layer_idx`. The prefills stay `sdpa_gqa`; batches without shared prompts (n = 1), `loop: generate`, the
    multinomial sampler and models with sliding-window or other non-full-attention layers take the path above.
    Positions are unchanged (counted from each row's first real token).
The cache is allocated per call and freed when it returns (nothing is held while the trainer runs).

Rehearsals only (`rehearsal.lengths: realistic`, teacli/standins): `response_lengths`, when set, gives each row
of a call a length drawn from the call's seed, and the decode loop ends the row with EOS at that position (EOS
is not drawn before it; a length past max_new_tokens is cut there without one). Random weights would otherwise
never stop. Off (None) everywhere else: sampling is exactly the contract above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from teacli.kernels import generating
from teacli.logprobs import base_model, cache_problem, cache_rows, new_cache, positions
from teacli.models import CASCADE, CascadeCache, attention_implementation
from teacli.rollout.base import cut_at_eos
from teacli.types import Completion, SamplingConfig

if TYPE_CHECKING:
    import torch


class HFEngine:
    """Batched sampling from an HF causal LM (possibly peft-wrapped), as `model.generate` samples (see the module docstring)."""

    shares_weights = True  # generates with the trainer's module: ZeRO-3 gathers its weights for generation

    def __init__(
        self, model: Any, tokenizer: Any, batch_size: int = 64, eos_token_ids: Iterable[int] | None = None, *,
        attention: str = "sdpa_gqa", kv_cache: str = "auto", compile: bool | str = "auto", cache_bucket: int = 64,
        share_prefix: bool = True, sampler: str = "inverse_cdf", loop: str = "tea",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"rollout.batch_size: must be >= 1, got {batch_size}")
        if attention not in ATTENTIONS:
            raise ValueError(f"rollout.attention: {attention!r} is not one of {', '.join(ATTENTIONS)}")
        if kv_cache not in ("auto", "static", "dynamic"):
            raise ValueError(f"rollout.kv_cache: {kv_cache!r} is not one of auto, static, dynamic")
        if compile not in ("auto", True, False):
            raise ValueError(f"rollout.compile: {compile!r} is not one of auto, true, false")
        if compile is True and kv_cache == "dynamic":
            raise ValueError("rollout.compile: true needs rollout.kv_cache: static (or auto): a dynamic cache changes shape every token")
        if cache_bucket < 1:
            raise ValueError(f"rollout.cache_bucket: must be >= 1, got {cache_bucket}")
        self.attention = attention
        self.kv_cache = kv_cache
        self.compile = compile
        self.cache_bucket = cache_bucket
        self.share_prefix = share_prefix
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
        self.sampler = sampler
        if loop not in LOOPS:
            raise ValueError(f"loop: {loop!r} is not one of {', '.join(LOOPS)}")
        self.loop = loop
        self.cascade_segment = CASCADE_SEGMENT  # attention cascade: see CascadeCache (tests and benchmarks set it)
        self._forward: Any = None
        self._pick: Any = None  # inverse_cdf_tokens, compiled on first use (`_draw_steps`)
        # Called after each batch of `generate` with (sequences done, sequences of the call): tea train's
        # validation progress. None: nothing is reported.
        self.progress: Callable[[int, int], None] | None = None
        # A rehearsal's drawn response lengths (the module docstring): (the call's seed, its rows) → each row's length,
        # EOS included. None: rows end where the policy samples EOS.
        self.response_lengths: Callable[[int, int], list[int]] | None = None
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        eos = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
        if not eos or any(e is None for e in eos):
            raise ValueError("the policy tokenizer has no eos token: generation could never stop (set one in the tokenizer)")
        self.eos_token_ids = eos
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else eos[0]

    # -- protocol ---------------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingConfig, seed: int
    ) -> list[list[Completion]]:
        """prompt_token_ids[P] → completions[P][n] (prompt-major), sampled with exactly `sampling`."""
        import torch

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if any(len(p) == 0 for p in prompt_token_ids):
            raise ValueError("an empty prompt (no tokens) cannot be generated from")
        flat = [ids for ids in prompt_token_ids for _ in range(n)]  # [P*n], prompt-major
        module = base_model(self.model)
        device = next(module.parameters()).device
        compiled, static = self.resolved(device)
        config = self._generation_config(sampling, compiled, device)
        processors = self._processors(sampling)
        stop = None if self.response_lengths is None else self.response_lengths(seed, len(flat))
        outputs: list[list[int]] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), generating(), _blank_generation_config(module), attention_implementation(module, self._attention_name()), _seeded(seed, device):
                for start in range(0, len(flat), self.batch_size):
                    batch = flat[start : start + self.batch_size]
                    ends = None if stop is None else stop[start : start + self.batch_size]
                    outputs.extend(self._generate_batch(batch, config, processors, device, module, static, compiled, ends))
                    if self.progress is not None:
                        self.progress(len(outputs), len(flat))
        finally:
            self.model.train(was_training)
        completions = [self._completion(ids) for ids in outputs]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompt_token_ids))]

    def load_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        """No-op: this engine generates with the trainer's module, which already has the new weights."""

    def sleep(self) -> None:
        """No-op: nothing is held between calls (the KV cache lives only inside `generate`)."""

    def wake(self) -> None:
        """No-op (see `sleep`)."""

    def stats(self) -> dict[str, float]:
        """Nothing to report: the engine samples from the trainer's own module."""
        return {}

    # -- helpers ----------------------------------------------------------------------------------

    def _attention_name(self) -> str | None:
        """The attention implementation of a call (None: the module's own). `cascade` runs `sdpa_gqa` outside the
        cascade decode loop (prefills, batches without shared prompts); `_generate_batch` switches for the loop."""
        if self.attention == "model":
            return None
        return "sdpa_gqa" if self.attention == "cascade" else self.attention

    def resolved(self, device: "torch.device") -> tuple[bool, bool]:
        """(compile the decode step, use the static cache) on `device`: `auto` compiles on CUDA only,
        and the static cache is used whenever compiling (or when asked for)."""
        compiled = self.compile is True or (self.compile == "auto" and device.type == "cuda")
        static = self.kv_cache == "static" or (self.kv_cache == "auto" and compiled)
        return compiled, static

    def _generation_config(self, sampling: SamplingConfig, compiled: bool = False, device: Any = None) -> Any:
        from transformers import GenerationConfig

        if sampling.temperature <= 0:
            raise ValueError(f"rollout.temperature: must be > 0 for sampling, got {sampling.temperature}")
        # inverse_cdf: do_sample=False, the draw is made by the last of `_processors` (InverseCDFSampler),
        # after which generate's argmax returns the drawn token; no warper of generate's own runs.
        # multinomial: generate's own warpers and torch.multinomial, every setting passed explicitly.
        own = {"do_sample": False} if self.sampler == "inverse_cdf" else {
            "do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k,  # 0 = off; set explicitly so the library default (50) never applies
        }
        return GenerationConfig(
            **own,
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=0,
            num_beams=1,
            num_return_sequences=1,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
            disable_compile=not compiled,
            compile_config=_compile_config(device) if compiled else None,
        )

    def _processors(self, sampling: SamplingConfig) -> Any:
        """The sampling contract as logits processors: temperature, then top-k, then top-p (each only
        when it changes something), then the draw (None for the multinomial sampler: generate's own)."""
        if self.sampler == "multinomial":
            return None
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        steps: list[Any] = []
        if sampling.temperature != 1.0:
            steps.append(TemperatureLogitsWarper(sampling.temperature))
        if sampling.top_k:
            steps.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1.0:
            steps.append(TopPLogitsWarper(sampling.top_p))
        return LogitsProcessorList([*steps, InverseCDFSampler()])

    def _generate_batch(
        self, batch: list[list[int]], config: Any, processors: Any, device: "torch.device", module: Any, static: bool = False,
        compiled: bool = False, ends: list[int] | None = None,
    ) -> list[list[int]]:
        """One left-padded batch; `static` = with a bucketed static cache. With `share_prefix`, a prompt that
        appears in several rows (the n samples of a group) is prefilled once (see `_shared_prefill`). `ends`: each
        row's drawn length (`response_lengths`), which only the engine's own decode loop applies."""
        import torch

        width = max(len(ids) for ids in batch)
        if static:
            width = -(-width // self.cache_bucket) * self.cache_bucket
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):  # left padding: every prompt ends at the last column
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        distinct: dict[tuple[int, ...], int] = {}
        row_of = [distinct.setdefault(tuple(ids), len(distinct)) for ids in batch]
        shared = self.share_prefix and len(distinct) < len(batch) and width > 1
        own_loop = self.loop == "tea" and self.sampler == "inverse_cdf"
        if shared and own_loop and self.attention == "cascade" and cache_problem(module) is None:
            prefix, first = _prompt_prefill(module, input_ids, attention_mask, row_of)
            cache = CascadeCache(prefix, row_of, attention_mask[first, :-1], config.max_new_tokens, self.cascade_segment)
            with attention_implementation(module, CASCADE):
                return self._decode(module, input_ids, attention_mask, cache, config.max_new_tokens, list(processors), compiled, ends).tolist()
        cache = None
        if static:
            from transformers import StaticCache

            cache = StaticCache(config=module.config.get_text_config(decoder=True), max_cache_len=width + config.max_new_tokens)
        if shared:
            cache = _shared_prefill(module, input_ids, attention_mask, row_of, cache)
        if own_loop:
            return self._decode(module, input_ids, attention_mask, cache, config.max_new_tokens, list(processors), compiled, ends).tolist()
        if ends is not None:
            raise ValueError("response_lengths (rehearsal.lengths: realistic) needs the engine's own decode loop (loop tea, sampler inverse_cdf)")
        extra = {"past_key_values": cache} if cache is not None else {}
        out = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config, logits_processor=processors, **extra
        )
        return out[:, width:].tolist()

    def _decode(
        self, module: Any, input_ids: "torch.Tensor", attention_mask: "torch.Tensor", cache: Any, max_new_tokens: int,
        processors: list[Any], compiled: bool, ends: list[int] | None = None,
    ) -> "torch.Tensor":
        """[rows, max_new_tokens] sampled tokens (pad after a row's EOS) for one left-padded batch: the prompt's
        uncached columns in one forward (all of them, or the last one after `_shared_prefill`), then one forward a
        token. Positions and masks are generate's: counted from each row's first real token, the 2D padding mask
        (a static cache gets it at its full length, so every decode step has the same shapes). `ends`: each row's
        drawn length (`response_lengths`): EOS at that token, none before. On a `CascadeCache` (`attention: cascade`)
        each forward first moves the cache to its column (`seek`) and passes no mask: the cascade attention takes its
        masks from the cache, which it finds as the keyword argument `tea_cascade`."""
        import inspect

        import torch

        rows, width = input_ids.shape
        device = input_ids.device
        if cache is None:
            cache = new_cache(module)
        static = bool(getattr(cache, "is_compileable", False))
        cascade = isinstance(cache, CascadeCache)
        mask = torch.cat([attention_mask, attention_mask.new_ones(rows, max_new_tokens)], dim=1)
        position = positions(mask)
        takes_cache_position = "cache_position" in inspect.signature(module.forward).parameters  # transformers 4.x

        def inputs(start: int, stop: int) -> dict[str, Any]:
            kwargs = {"attention_mask": mask if static else mask[:, :stop], "position_ids": position[:, start:stop],
                      "past_key_values": cache, "use_cache": True}
            if cascade:
                cache.seek(start - cache.prompt_len)
                kwargs.update(attention_mask=None, tea_cascade=cache)
            if takes_cache_position:
                kwargs["cache_position"] = torch.arange(start, stop, device=device)
            return kwargs

        eos = torch.tensor(self.eos_token_ids, device=device)
        pad = torch.tensor(self.pad_token_id, device=device)
        forward = self._compiled_forward(device) if compiled else _last_logits
        warpers, pick = self._draw_steps(processors, compiled and device.type == "cuda")
        past = cache.get_seq_length()  # the shared prefill's columns, or none
        last = None if ends is None else torch.tensor(ends, device=device) - 1  # each row's EOS position
        logits = module(input_ids=input_ids[:, past:], logits_to_keep=1, **inputs(past, width)).logits[:, -1, :]
        token, unfinished = _draw(logits, warpers, pick, torch.ones(rows, dtype=torch.bool, device=device), eos, pad, last)
        tokens = torch.empty((rows, max_new_tokens), dtype=torch.long, device=device)
        tokens[:, 0] = token
        with _recompile_limit(64 if compiled and cascade else 0):  # a graph per segment length (and batch shape)
            for t in range(1, max_new_tokens):
                if t % STOP_CHECK_EVERY == 0 and not bool(unfinished.any()):  # every row has ended: pad the rest
                    tokens[:, t:] = pad
                    break
                if compiled:
                    torch.compiler.cudagraph_mark_step_begin()  # the last replay's logits are read: its outputs may be reused
                logits = forward(module, token[:, None], inputs(width + t - 1, width + t))
                token, unfinished = _draw(logits, warpers, pick, unfinished, eos, pad, None if last is None else last - t)
                tokens[:, t] = token
        return tokens

    def _compiled_forward(self, device: "torch.device") -> Any:
        """`_last_logits` compiled once per engine (transformers' CompileConfig defaults: inductor, reduce-overhead =
        CUDA graphs; plain inductor on CPU). The static cache's tensors keep their addresses (transformers marks
        them static), so the graph is replayed in place. `cascade`: shapes specialized (dynamic=False), so each
        segment length of `CascadeCache` is its own static graph rather than one graph of symbolic length."""
        import torch

        if self._forward is None:
            options = _compile_config(device).to_dict()
            if self.attention == "cascade":
                options["dynamic"] = False
            self._forward = torch.compile(_last_logits, **options)
        return self._forward

    def _draw_steps(self, processors: list[Any], compiled: bool) -> tuple[list[Any], Callable[..., "torch.Tensor"]]:
        """(the warpers, the draw) of `_processors`' list: its last entry, `InverseCDFSampler`, is replaced by
        `inverse_cdf_tokens`, which returns the drawn tokens themselves (no −inf scores to write and argmax again),
        compiled when the decode forward is compiled on CUDA (one fused pass over the logits instead of a dozen
        eager ones: 0.19 ms against 1.15 ms a token at 512 rows of Llama-3's vocabulary on an H200, benchmarks/decode_step.py)."""
        import torch

        *warpers, sampler = processors
        if not isinstance(sampler, InverseCDFSampler):
            raise ValueError("the engine's decode loop draws with InverseCDFSampler, the processors' last entry")
        if not compiled:
            return warpers, inverse_cdf_tokens
        if self._pick is None:
            self._pick = torch.compile(inverse_cdf_tokens, dynamic=False)
        return warpers, self._pick

    def _completion(self, generated: list[int]) -> Completion:
        ids, finished = cut_at_eos(generated, self.eos_token_ids)
        return Completion(token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True), finished=finished)


ATTENTIONS = ("sdpa_gqa", "sdpa", "eager", "model", "cascade")  # model: the module's own (policy.attn_implementation)
CASCADE_SEGMENT = 128  # attention cascade: row columns a compiled decode graph reads (CascadeCache); 512 new tokens = 4 graphs
SAMPLERS = ("inverse_cdf", "multinomial")  # multinomial: generate's torch.multinomial (the engine before issue 12's CPU work)
LOOPS = ("tea", "generate")  # generate: transformers' model.generate (the engine before 2026-11-28); multinomial always uses it
STOP_CHECK_EVERY = 16  # decode steps between reads of "has every row ended?" (each read waits for the GPU)


def _last_logits(module: Any, token: "torch.Tensor", inputs: dict[str, Any]) -> "torch.Tensor":
    """The decode forward: every row's last token on the cache, the logits of the next."""
    return module(input_ids=token, **inputs).logits[:, -1, :]


def _draw(logits: "torch.Tensor", warpers: list[Any], pick: Callable[..., "torch.Tensor"], unfinished: "torch.Tensor",
          eos: "torch.Tensor", pad: "torch.Tensor", left: "torch.Tensor | None" = None) -> tuple["torch.Tensor", "torch.Tensor"]:
    """generate's sampling step with do_sample off: the contract's warpers on the fp32 logits, the draw (`pick`:
    `inverse_cdf_tokens` or its compiled self, on one uniform number a row, drawn as `InverseCDFSampler` draws it),
    pad for rows that have ended, and which rows are still unfinished after this token.

    left [rows] (a rehearsal's drawn lengths, `HFEngine.response_lengths`): tokens each row has left before its EOS;
    EOS is not drawn where it is above 0 and replaces the draw where it is 0. None: the draw as it is."""
    import torch

    scores = logits
    if left is not None:  # before the warpers (top-k keeps k tokens that are not EOS); out of place: the logits may be
        # a compiled forward's output buffer
        scores = scores.index_copy(1, eos, scores[:, eos].masked_fill((left > 0)[:, None], -float("inf")))
    if warpers:
        scores = scores.float()
        for warper in warpers:
            scores = warper(None, scores)
    drawn = pick(scores, _uniforms(scores))
    if left is not None:
        drawn = torch.where(left == 0, eos[0], drawn)
    token = torch.where(unfinished, drawn, pad)
    return token, unfinished & ~torch.isin(token, eos)


def _uniforms(scores: "torch.Tensor") -> "torch.Tensor":
    """The draw's randomness: one fp32 uniform number a row of `scores`, from torch's global generator (the same
    for the engine's loop and for `InverseCDFSampler` under generate)."""
    import torch

    return torch.rand((scores.shape[0], 1), device=scores.device, dtype=torch.float32)


DRAW_BLOCK = 256  # vocabulary entries a block of `inverse_cdf_tokens`' first level


def inverse_cdf_tokens(scores: "torch.Tensor", u: "torch.Tensor") -> "torch.Tensor":
    """Inverse-CDF sampling from softmax(scores), each row: scores [R, V] (any float dtype; −inf: probability 0),
    u [R, 1] uniform in [0, 1) → the tokens [R], token i with probability p_i, never one of probability 0.

    In two levels, so that no running sum is longer than ~500 terms: the unnormalized weights exp(s − max) in blocks of
    `DRAW_BLOCK` entries, the running sum of the block totals, the block in which u × total falls, then the running
    sum inside that block alone. One long cumsum over a 128k vocabulary was both the slowest kernel of the draw (a
    scan over the innermost dimension) and the least exact (its rounding grows with the length)."""
    import torch

    rows, vocab = scores.shape
    blocks = -(-vocab // DRAW_BLOCK)
    x = scores.float()
    if blocks * DRAW_BLOCK != vocab:
        x = torch.nn.functional.pad(x, (0, blocks * DRAW_BLOCK - vocab), value=-float("inf"))
    weights = (x - x.amax(-1, keepdim=True)).exp().view(rows, blocks, DRAW_BLOCK)
    upto = weights.sum(-1).cumsum(-1)  # [R, blocks]: the weight of every block up to and including this one
    total = upto[:, -1:]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # strictly below the total
    block = torch.searchsorted(upto, target, right=True)  # [R, 1]: the first block whose running sum exceeds it
    before = torch.where(block > 0, upto.gather(1, (block - 1).clamp_min(0)), torch.zeros_like(target))
    inner = weights.gather(1, block[:, :, None].expand(rows, 1, DRAW_BLOCK)).squeeze(1).cumsum(-1)  # [R, DRAW_BLOCK]
    within = torch.searchsorted(inner, target - before, right=True)
    # Rounding can put the target at or past the block's own sum: its last entry of positive weight, then.
    last = torch.searchsorted(inner, inner[:, -1:].contiguous(), right=False)
    return (block * DRAW_BLOCK + torch.minimum(within, last)).squeeze(1)


class InverseCDFSampler:
    """The draw, as generate's last logits processor: one uniform number per row, located in the
    cumulative distribution of softmax(scores) (`inverse_cdf_tokens`: token i with probability p_i,
    never a token of probability 0). Returns scores that are 0 at the drawn token and −inf elsewhere,
    so generate's greedy argmax returns it. The engine's own decode loop calls `inverse_cdf_tokens`
    directly, on the same uniform numbers.

    Why not generate's own `torch.multinomial`: on CPU it draws one exponential variate per vocabulary
    entry (3.1M for 64 rows of a 49k vocabulary: 82 ms a decode step, a third of the quickstart's
    generation); this draws one number per row (1.5 ms). The randomness is torch's global generator,
    seeded per call like before.
    """

    def __call__(self, input_ids: "torch.Tensor", scores: "torch.Tensor") -> "torch.Tensor":
        import torch

        drawn = inverse_cdf_tokens(scores, _uniforms(scores))[:, None]
        return torch.full_like(scores, -float("inf")).scatter_(-1, drawn, 0.0)


def _shared_prefill(module: Any, input_ids: "torch.Tensor", attention_mask: "torch.Tensor", row_of: list[int], cache: Any = None) -> Any:
    """The KV cache of every row's prompt but its last token, computed once per distinct prompt and
    copied to its rows (into `cache`, a fresh static cache, or a new dynamic one). `generate` then
    finds the prompt cached up to its last column and runs only that column as its prefill.

    The decoder runs without the LM head (no logits are needed), with position ids counted from each
    row's first real token, as generate counts them.
    """
    import torch

    prefix, _ = _prompt_prefill(module, input_ids, attention_mask, row_of)
    return cache_rows(prefix, torch.tensor(row_of, device=input_ids.device), into=cache if cache is not None else new_cache(module))


def _prompt_prefill(module: Any, input_ids: "torch.Tensor", attention_mask: "torch.Tensor", row_of: list[int]) -> tuple[Any, list[int]]:
    """(a DynamicCache of each distinct prompt but its last column, [P] rows in prompt order; the first row of each
    prompt), the decoder run without the LM head, positions counted from each prompt's first real token."""
    first = [row_of.index(u) for u in range(max(row_of) + 1)]
    ids, mask = input_ids[first, :-1], attention_mask[first, :-1]
    prefix = new_cache(module)
    module.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions(mask), past_key_values=prefix, use_cache=True)
    return prefix, first


@contextlib.contextmanager
def _recompile_limit(limit: int) -> Iterator[None]:
    """torch.compile's recompilations allowed per function raised to at least `limit` inside the block (0: as it is).
    `attention: cascade` compiles a graph per segment length, which with a run's other batch shapes can pass
    torch's default of 8, after which the decode step would silently run uncompiled."""
    if limit <= 0:
        yield
        return
    import torch._dynamo

    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
    with torch._dynamo.config.patch(**{name: max(limit, getattr(torch._dynamo.config, name))}):
        yield


def _compile_config(device: Any) -> Any:
    """transformers' CompileConfig defaults (inductor, mode reduce-overhead: CUDA graphs). transformers
    compiles only on accelerators unless told otherwise: `rollout.compile: true` on CPU sets its
    documented `_compile_all_devices` flag (useful for tests, rarely faster)."""
    from transformers import CompileConfig

    config = CompileConfig()
    if device is not None and device.type == "cpu":
        config = CompileConfig(mode="default")
        config._compile_all_devices = True
    return config


@contextlib.contextmanager
def _blank_generation_config(module: Any) -> Iterator[None]:
    """Hide the model's own generation_config for the duration of a call (see the module docstring)."""
    from transformers import GenerationConfig

    saved = getattr(module, "generation_config", None)
    module.generation_config = GenerationConfig()
    try:
        yield
    finally:
        module.generation_config = saved


@contextlib.contextmanager
def _seeded(seed: int, device: "torch.device") -> Iterator[None]:
    import torch

    # Only the CPU generator and the generating CUDA device's are forked and seeded.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
