"""The hf engine's decode step and the reference's log-softmax, before and after their 2026-11-28 changes, side by side.

    python benchmarks/decode_step.py            # one GPU: uf_llama1b_tea's generation (Llama-3.2-1B shape, random init, bf16)
    python benchmarks/decode_step.py --small    # CPU smoke run (tiny model)

Four tables, from one invocation:

  * **draw**: one decode step's draw over [rows, vocabulary] bf16 logits: `before` (the eager softmax, one cumsum
    over the vocabulary, the −inf scores and their argmax), `after, eager` (`teacli.rollout.hf.inverse_cdf_tokens`) and
    `after, compiled` (what the engine runs on CUDA). Milliseconds, median of 30 after 5 warm-ups, CUDA events.
  * **attention**: one layer's decode attention (one query a row) over the static cache: `gqa` (the engine's,
    `teacli.models.sdpa_gqa_attention`: SDPA with enable_gqa over the query heads) and `folded` (the query heads
    that share a K/V head folded into queries of that head, as decode kernels do; tried and slower with torch 2.11's
    SDPA kernels on an H200, so not adopted: kept here to show it).
  * **generation**: `HFEngine.generate` over the recipe's step (8 prompts of 256 tokens x 64 samples x 512 new
    tokens, one batch of 512) with each combination of the draw (before / the engine's) and the attention (gqa /
    folded), then the engine's default (`draw`) with `attention="cascade"` (a group's prompt KV read once, each
    row's written columns in segments of `--segment`; teacli/rollout/hf.py), each engine built afresh, in the order
    before, draw, fold, draw + fold, cascade, then again (the first call of each compiles; then the median of
    `--repeats` calls). Below the table: cascade against the default, the largest |difference| of the first step's
    logits (a separate one-token call of each, uncompiled) and the share of sampled tokens that agree (same seed;
    in bf16 a row's tokens part at its first draw that rounding flips, so agreement below 100% there is expected).
  * **reference head**: the LM head and log-softmax of a reference micro-batch (32 sequences x 512 completion
    tokens) in `teacli.logprobs._chunked`, eager (`before`) and compiled (`after`, what the reference runs on CUDA),
    with the largest difference between their log-probs.

Random weights almost never sample EOS, so every row generates all its tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import llama_config, sync, tokenizer_for  # noqa: E402


def before_pick(scores, u):
    """The draw before: softmax, one cumsum over the vocabulary, −inf scores with a 0 at the drawn token, argmax."""
    import torch

    cdf = torch.softmax(scores.float(), dim=-1).cumsum_(-1)
    total = cdf[:, -1:]
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    drawn = torch.searchsorted(cdf, target, right=True)
    return torch.full_like(cdf, -float("inf")).scatter_(-1, drawn, 0.0).argmax(-1)


def folded_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """The engine's attention, except that a decode step (one query) folds the G query heads sharing a K/V head into
    G queries of that head (the padding mask broadcasts over them)."""
    import torch

    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if q_len != 1 or heads == kv_heads:
        return ENGINE_ATTENTION(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, kv_heads, heads // kv_heads, dim), key, value, attn_mask=attention_mask, dropout_p=dropout,
        scale=scaling,
    )
    return out.reshape(batch, 1, heads, dim).to(query.dtype), None


ENGINE_ATTENTION = None  # teacli.models.attention.sdpa_gqa_attention, kept before the variants replace it


def timed(fn, device, n=30, warm=5) -> float:
    """Median milliseconds of fn() (CUDA events on a GPU, the host's clock on CPU)."""
    import torch

    for _ in range(warm):
        fn()
    sync(device)
    out = []
    for _ in range(n):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            start = time.perf_counter()
            fn()
            out.append((time.perf_counter() - start) * 1e3)
    return statistics.median(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="tiny model and shapes (CPU smoke run)")
    p.add_argument("--repeats", type=int, default=2, help="timed generate calls per variant (after the first)")
    p.add_argument("--segment", type=int, default=None, help="attention cascade: row columns a compiled graph reads (default: the engine's)")
    args = p.parse_args()

    import torch
    from transformers import LlamaForCausalLM

    import teacli.logprobs as logprobs
    import teacli.models.attention as gqa  # register_sdpa_gqa registers the sdpa_gqa_attention of this module
    import teacli.rollout.hf as hf
    from teacli.types import SamplingConfig

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = llama_config(args.small)
    tokenizer = tokenizer_for(config.vocab_size)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts_n, group, new_tokens, prompt_len = (2, 4, 8, 16) if args.small else (8, 64, 512, 256)
    rows, vocab = prompts_n * group, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"{name}, {dtype}, torch {torch.__version__}")

    # -- the draw ---------------------------------------------------------------------------------------------
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(rows, vocab, device=device, generator=g) * 3).to(dtype)
    u = torch.rand(rows, 1, device=device, generator=g)
    compiled = torch.compile(hf.inverse_cdf_tokens, dynamic=False)
    draws = {"before": before_pick, "after, eager": hf.inverse_cdf_tokens}
    if device.type == "cuda":
        draws["after, compiled"] = compiled
    print(f"\n### draw: [{rows}, {vocab}] logits\n\n| draw | ms | same token as before |\n|---|---|---|")
    want = before_pick(logits, u)
    for label, pick in draws.items():
        ms = timed(lambda: pick(logits, u), device)  # noqa: B023
        print(f"| {label} | {ms:.3f} | {(pick(logits, u) == want).float().mean().item():.1%} |")

    # -- one layer's decode attention -------------------------------------------------------------------------
    cache_len = -(-prompt_len // 64) * 64 + new_tokens  # the engine's static cache: bucketed prompt + new tokens
    q = torch.randn(rows, heads, 1, dim, device=device, dtype=dtype)
    k, v = (torch.randn(rows, kv_heads, cache_len, dim, device=device, dtype=dtype) for _ in range(2))
    mask = torch.ones(rows, 1, 1, cache_len, dtype=torch.bool, device=device)
    mask[:, ..., : cache_len // 8] = False  # some left padding, as the bucketed cache has
    module = torch.nn.Module()
    ref, _ = gqa.sdpa_gqa_attention(module, q, k, v, mask)
    print(f"\n### attention: one decode step of one layer, [{rows}, {heads}/{kv_heads} heads, 1 query, {cache_len} keys]\n")
    print("| attention | ms | GB/s of K/V read | max abs diff from gqa |\n|---|---|---|---|")
    kv_bytes = 2 * k.numel() * k.element_size()
    for label, fn in (("gqa", gqa.sdpa_gqa_attention), ("folded", folded_attention)):
        ms = timed(lambda: fn(module, q, k, v, mask), device)  # noqa: B023
        diff = (fn(module, q, k, v, mask)[0].float() - ref.float()).abs().max().item()
        print(f"| {label} | {ms:.3f} | {kv_bytes / ms / 1e6:,.0f} | {diff:.1e} |")

    # -- the engine's generation ------------------------------------------------------------------------------
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device, dtype).eval()
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, vocab - 2, (prompts_n, prompt_len), generator=gen).tolist()
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens)
    global ENGINE_ATTENTION
    real_steps = hf.HFEngine._draw_steps
    ENGINE_ATTENTION = engine_attention = gqa.sdpa_gqa_attention

    def before_steps(self, processors, compiled):
        return list(processors[:-1]), before_pick

    cascade = {"attention": "cascade"}
    variants = {"before": (before_steps, engine_attention, {}), "draw": (real_steps, engine_attention, {}),
                "fold": (before_steps, folded_attention, {}), "draw + fold": (real_steps, folded_attention, {}),
                "cascade": (real_steps, engine_attention, cascade)}
    results: dict[str, list[float]] = {}
    firsts: dict[str, float] = {}
    sampled: dict[str, list] = {}  # each variant's last call's tokens
    for label in [*variants, *variants]:
        steps, attention, options = variants[label]
        hf.HFEngine._draw_steps, gqa.sdpa_gqa_attention = steps, attention
        try:
            engine = hf.HFEngine(model, tokenizer, batch_size=rows, **options)
            if args.segment is not None:
                engine.cascade_segment = args.segment

            def call(engine=engine, label=label) -> float:
                sync(device)
                start = time.perf_counter()
                out = engine.generate(prompts, group, sampling, seed=0)
                sync(device)
                sampled[label] = [c.token_ids for row in out for c in row]
                return time.perf_counter() - start

            firsts.setdefault(label, call())
            results.setdefault(label, []).extend(call() for _ in range(args.repeats))
        finally:
            hf.HFEngine._draw_steps, gqa.sdpa_gqa_attention = real_steps, engine_attention
        print(f"{label}: {statistics.median(results[label]):.3f} s", file=sys.stderr, flush=True)
    tokens = rows * new_tokens
    base = statistics.median(results["before"])
    print(f"\n### generation: {prompts_n} prompts x {prompt_len} tokens x {group} samples x {new_tokens} new tokens, one batch\n")
    print("| variant | first call s | s a call (median) | ms a token | tokens/s | before / this |\n|---|---|---|---|---|---|")
    for label in variants:
        s = statistics.median(results[label])
        print(f"| {label} | {firsts[label]:.1f} | {s:.3f} | {s / new_tokens * 1e3:.2f} | {tokens / s:,.0f} | {base / s:.2f} |")
    firsts_logits = {}
    for label, options in (("draw", {}), ("cascade", cascade)):  # the first step's logits: one token, no compile
        seen: list = []
        hook = model.get_output_embeddings().register_forward_hook(lambda mod, inp, out: seen.append(out[:, -1].float()))  # noqa: B023
        try:
            hf.HFEngine(model, tokenizer, batch_size=rows, compile=False, **options).generate(
                prompts, group, SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=1), seed=0)
        finally:
            hook.remove()
        firsts_logits[label] = seen[0]
    delta = (firsts_logits["cascade"] - firsts_logits["draw"]).abs().max().item()
    pairs = [(a, b) for x, y in zip(sampled["draw"], sampled["cascade"]) for a, b in zip(x, y)]
    agree = sum(a == b for a, b in pairs) / max(len(pairs), 1)
    print(f"\ncascade against draw (the engine's default): first step's logits max |diff| {delta:.1e}, "
          f"sampled tokens equal {agree:.1%} ({len(pairs)} compared)")

    # -- the reference's head and log-softmax ---------------------------------------------------------------
    del engine
    seqs, completion = (4, 8) if args.small else (32, 512)
    hidden = torch.randn(seqs * completion, config.hidden_size, device=device, dtype=dtype)
    targets = torch.randint(0, vocab, (seqs * completion,), device=device)
    head = model.get_output_embeddings()
    with torch.no_grad():
        real_forward = logprobs._forward_chunk
        logprobs._forward_chunk = lambda head, rows: logprobs._chunk_logprobs
        try:
            eager_ms = timed(lambda: logprobs._chunked(head, hidden, targets), device, n=10, warm=3)
            eager = logprobs._chunked(head, hidden, targets)
        finally:
            logprobs._forward_chunk = real_forward
        after_ms = timed(lambda: logprobs._chunked(head, hidden, targets), device, n=10, warm=3)
        diff = (logprobs._chunked(head, hidden, targets) - eager).abs().max().item()
        matmul_ms = timed(lambda: [head(hidden[s : s + 2048]) for s in range(0, hidden.shape[0], 2048)], device, n=10, warm=3)
    print(f"\n### reference head: {seqs} x {completion} completion tokens, vocabulary {vocab}\n")
    print("| log-softmax | ms | of which the head's matmuls | max abs diff |\n|---|---|---|---|")
    kind = "eager" if logprobs._forward_chunk(head, hidden) is logprobs._chunk_logprobs else "compiled"
    print(f"| before (eager) | {eager_ms:.1f} | {matmul_ms:.1f} | |\n| after ({kind}) | {after_ms:.1f} | {matmul_ms:.1f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
