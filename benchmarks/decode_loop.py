"""The hf engine's decode loop against transformers' `model.generate`, same engine otherwise, side by side.

    python benchmarks/decode_loop.py            # one GPU: vs_trl's generation (Llama-3.2-1B shape, random init, bf16)
    python benchmarks/decode_loop.py --small    # CPU smoke run (tiny model)

4 prompts of 128 random tokens x 64 samples x 256 new tokens a call, in one batch of 256 (the generation of
one benchmarks/vs_trl.py step). `HFEngine(loop="tea")` (the default since 2026-11-28) and
`HFEngine(loop="generate")` alternate, each built afresh, twice (tea, generate, tea, generate): the first call
of each compiles on CUDA, then the median of 3 calls. Last, whether the two loops' greedy tokens agree for 2
prompts x 4 rows: in bf16 on a random-initialised model the logits are nearly flat, so rounding differences
between the two compiled graphs can flip an argmax (the exact comparison is tests/rollout/test_hf_engine.py's,
in fp32).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_trl import llama_config, sync, tokenizer_for  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="tiny model and shapes (CPU smoke run)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per loop (after the first)")
    args = p.parse_args()

    import torch
    from transformers import LlamaForCausalLM

    from teacli.rollout.hf import HFEngine
    from teacli.types import SamplingConfig

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = llama_config(args.small)
    tokenizer = tokenizer_for(config.vocab_size)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = LlamaForCausalLM(config).to(device, dtype)
    prompts_n, group, new_tokens, prompt_len = (2, 4, 8, 16) if args.small else (4, 64, 256, 128)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, config.vocab_size - 2, (prompts_n, prompt_len), generator=g).tolist()
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens)
    greedy = SamplingConfig(temperature=1.0, top_p=1.0, top_k=1, max_new_tokens=new_tokens)
    tokens = prompts_n * group * new_tokens

    def call(engine) -> float:
        sync(device)
        start = time.perf_counter()
        engine.generate(prompts, group, sampling, seed=0)
        sync(device)
        return time.perf_counter() - start

    rows, ids = [], {}
    for loop in ("generate", "tea", "generate", "tea"):
        engine = HFEngine(model, tokenizer, batch_size=prompts_n * group, loop=loop)
        first = call(engine)
        per_call = statistics.median(call(engine) for _ in range(args.repeats))
        ids[loop] = [[c.token_ids for c in row] for row in engine.generate(prompts[:2], 4, greedy, seed=0)]
        rows.append((loop, first, per_call))
        print(f"loop={loop}: first call {first:.1f} s, then {per_call:.3f} s a call ({tokens / per_call:,.0f} tok/s)", file=sys.stderr, flush=True)

    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"\n{name}: {prompts_n} prompts x {prompt_len} tokens x {group} samples x {new_tokens} new tokens, one batch, {dtype}")
    print("\n| loop | first call s | s a call (median of %d) | tokens/s |\n|---|---|---|---|" % args.repeats)
    for loop, first, per_call in rows:
        print(f"| {loop} | {first:.1f} | {per_call:.3f} | {tokens / per_call:,.0f} |")
    best = {loop: min(r[2] for r in rows if r[0] == loop) for loop in ("generate", "tea")}
    print(f"\ntea loop / generate: {best['tea'] / best['generate']:.2f} (best of each); greedy tokens equal: {ids['tea'] == ids['generate']}")


if __name__ == "__main__":
    main()
