"""Time `tea diagnose alignment`'s per-completion gradients both ways, side by side, and print a table.

    python benchmarks/alignment_grads.py                                  # SmolLM2-135M shape, CPU or the GPU
    python benchmarks/alignment_grads.py --completions 64 --batch 16 --completion-tokens 256
    python benchmarks/alignment_grads.py --model tiny                     # the tests' 2-layer Llama (seconds)

`loop`: one forward per micro-batch and one backward per completion (the diagnostic's only way before);
`batched`: one forward and one backward per micro-batch, each completion's gradient from the block's
Linear and RMSNorm inputs and output gradients (`alignment.completion_gradients`). Both on the same
random-initialised model (the SmolLM2-135M-Instruct shape by default: 30 layers, hidden 576; no
download), the last block, float32 as the diagnostic runs, random prompt and completion tokens
(completion lengths spread over [L/2, L]). Columns: wall seconds, seconds per completion, the loop's
time over this row's, and the largest relative difference of a completion's gradient to the loop's.
"""

from __future__ import annotations

import argparse
import time


def build(model: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if model == "tiny":
        sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=512)
    else:  # SmolLM2-135M-Instruct's config
        sizes = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**sizes, max_position_embeddings=2048, pad_token_id=0)).float().eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--completions", type=int, default=32, help="K: completions of one prompt")
    parser.add_argument("--batch", type=int, default=8, help="completions per forward (--grad-batch-size)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--completion-tokens", type=int, default=128, help="L: the longest completion")
    parser.add_argument("--device", default="auto", help="auto (cuda when available) | cpu | cuda")
    args = parser.parse_args()

    import numpy as np
    import torch

    from teacli.diagnostics import alignment as AL

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    model = build(args.model).to(device)
    block, chosen = AL.block_parameters(model, "-1")
    params = [p for _, p in chosen]
    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    prompt = rng.integers(1, vocab, size=args.prompt_tokens).tolist()
    lengths = rng.integers(max(1, args.completion_tokens // 2), args.completion_tokens + 1, size=args.completions)
    comps = [rng.integers(1, vocab, size=int(k)).tolist() for k in lengths]
    print(f"model={args.model} block={block} ({sum(p.numel() for p in params):,} parameters) device={device} "
          f"threads={torch.get_num_threads()} K={args.completions} batch={args.batch} prompt={args.prompt_tokens} "
          f"completions={lengths.min()}-{lengths.max()} tokens")
    print("| method | seconds | s / completion | loop / this | max rel. diff to loop |")
    print("|---|---:|---:|---:|---:|")
    AL.completion_gradients(model, params, prompt, comps[:args.batch], 0, args.batch, device, method="batched")  # warm-up
    results = {}
    for method in ("loop", "batched"):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        G = AL.completion_gradients(model, params, prompt, comps, 0, args.batch, device, method=method)
        if device.type == "cuda":
            torch.cuda.synchronize()
        results[method] = (time.perf_counter() - start, G)
    loop_s, loop_G = results["loop"]
    for method, (sec, G) in results.items():
        rel = ((G - loop_G).norm(dim=1) / loop_G.norm(dim=1).clamp_min(1e-30)).max().item()
        print(f"| {method} | {sec:.2f} | {sec / args.completions:.4f} | {loop_s / sec:.1f}x | {rel:.1e} |")


if __name__ == "__main__":
    main()
