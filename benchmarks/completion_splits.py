"""What a shared micro-batch's completions cost run in k forwards, and what one more forward costs in tokens.

    # one GPU: the 1B paper recipe's micro-batch (half a group of 64: 32 completions) at realistic lengths
    python benchmarks/completion_splits.py
    # CPU smoke run: a tiny Llama
    python benchmarks/completion_splits.py --small
    # where a forward's time goes: the rehearsal's fixed lengths beside realistic ones, torch.profiler's top operators
    python benchmarks/completion_splits.py --lengths fixed,realistic --splits 1,4 --profile
    # a new micro-batch shape every pass, as a step's micro-batches are, under each attention backend order
    python benchmarks/completion_splits.py --fresh --splits 1 --sdpa default,no-cudnn,cudnn

`optim.completion_splits` runs a shared micro-batch's completions, sorted by length, in k forwards on their
prompt's cache, each padded to its own longest (`teacli.logprobs.shared_prompt_logprobs`' `splits`, cut by
`teacli.padding.split_sizes`). More forwards compute fewer padding tokens but each has a fixed cost (its kernel
launches, smaller matrix products); `auto` counts that cost as `teacli.padding.FORWARD_TOKENS` tokens a forward.
`packed` runs them in one forward laid end to end in rows of the longest's width (`teacli.logprobs.Packing`), under
a 4D attention mask: the padding of k forwards without their fixed costs, if the masked attention costs no more.
This times the trainer's two uses of a micro-batch side by side on one model, for each k: the policy's forward and
backward (train mode, the sum of the log-probs as the loss) and the reference's forward (no gradients).

The model is random-initialised from the policy's shape (tea's shipped config of --model: the Llama-3.2-1B of the
paper's 1B recipes), in bf16 on CUDA with `policy.kernels: auto` (liger where installed), without checkpointing.
The micro-batch: `--rows` completions of one prompt, lengths drawn as `rehearsal.lengths: realistic` draws them
(`teacli.planner.Lengths`, the prompt clipped to 1,024 tokens and the responses cut at `--max-new`), a draw per
`--draws` (seeds 0, 1, ...), times summed over the draws, each the median of `--repeats` after a warm-up.

`--lengths fixed` draws instead the rehearsal's fixed shape (a 256-token prompt, every completion `--max-new`
long: nothing to split, so k > 1 only adds forwards of equal widths); with both, a row per length mode and k, side by
side, with its time per computed token. `--profile` runs each setting's first draw once more under torch.profiler and
prints its 12 costliest operators by device time (self CPU time on CPU) and the host's and the device's totals: a
forward whose fixed cost is the host's launches shows host time near the wall time and the device idle between.

`--fresh` times each pass on a micro-batch of a new draw (its own prompt and completion widths, as a step's
micro-batches are), so that whatever is set up once per shape (an attention backend's plan for a new sequence
length) is in the time; without it a draw repeats, and that cost is in the warm-up only. `--sdpa` (comma list)
runs the whole table under each order of torch's scaled-dot-product-attention backends: `default` (torch's own,
printed), `no-cudnn` (flash, efficient, math), `cudnn` (cuDNN first), `efficient` (memory-efficient first).

Columns: the SDPA order, the lengths, k (forwards; `auto` is what split_sizes chose, per draw), tokens computed and the share that
is padding (`teacli.padding.micro_padding`), fwd+bwd ms and fwd ms (summed over the draws), and each per computed
token. The last lines fit time = a · tokens + b · forwards to each column of a length mode (least squares over the
integer k's) and print b / a: one more forward's cost in tokens, the number FORWARD_TOKENS stands for.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="meta-llama/Llama-3.2-1B-Instruct", help="a model tea ships the shape of")
    ap.add_argument("--rows", type=int, default=32, help="completions in the micro-batch (one prompt's)")
    ap.add_argument("--splits", default="1,2,3,4,6,8,auto,packed", help="comma list of k (forwards), auto and packed")
    ap.add_argument("--max-new", type=int, default=512, help="responses are cut at this many tokens")
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--small", action="store_true", help="a tiny Llama and short lengths (CPU smoke run)")
    ap.add_argument("--lengths", default="realistic", help="comma list of fixed and realistic")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's top operators for each setting")
    ap.add_argument("--fresh", action="store_true", help="each timed pass on a new draw (a new shape), not a repeat")
    ap.add_argument("--sdpa", default="default", help="comma list of SDPA backend orders: default, no-cudnn, cudnn, efficient")
    ap.add_argument("--json", help="write the rows here too")
    return ap.parse_args()


def build(args: argparse.Namespace):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cuda = torch.cuda.is_available()
    if args.small:
        config = AutoConfig.for_model("llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
    else:
        from teacli.standins import _config_for

        config = AutoConfig.for_model(**_config_for(args.model, "--model"))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to("cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32)
    from teacli.kernels import apply_kernels, resolve_kernels

    kind = resolve_kernels("auto", model, model.device)
    apply_kernels(model, kind, generates=False)
    return model, kind


def micro_batch(args: argparse.Namespace, seed: int, vocab: int, lengths: str) -> tuple[list[list[int]], list[list[int]]]:
    """One prompt's `rows` sequences: (prompts, completions) token ids of realistic or fixed lengths."""
    from teacli.planner import Lengths

    max_prompt = 64 if args.small else 1024
    if lengths == "fixed":
        p, r = [max_prompt // 4], [args.max_new] * args.rows
    else:
        p, r = Lengths().draw(1, args.rows, seed, max_prompt, args.max_new)
    if args.small:
        r = [max(1, x // 8) for x in r]
    rng = np.random.default_rng(seed)
    prompt = rng.integers(10, vocab, p[0]).tolist()
    return [prompt] * args.rows, [rng.integers(10, vocab, n).tolist() for n in r]


def timed(fn, repeats: int, cuda: bool, warm: bool = True) -> float:
    """The median of `repeats` calls of `fn` after a warm-up call (`warm`), each waited for; without `warm`, one cold
    call (`--fresh`: its shape is new)."""
    import torch

    if warm:
        fn()
    times = []
    for _ in range(repeats if warm else 1):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


SDPA_ORDERS = ("default", "no-cudnn", "cudnn", "efficient")


def sdpa_order(name: str):
    """A context that runs torch's scaled-dot-product attention with the backends of `name` (SDPA_ORDERS), in order."""
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    flash, eff, math, cudnn = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH,
                               SDPBackend.CUDNN_ATTENTION)
    orders = {"no-cudnn": [flash, eff, math], "cudnn": [cudnn, flash, eff, math], "efficient": [eff, flash, cudnn, math]}
    return contextlib.nullcontext() if name == "default" else sdpa_kernel(orders[name], set_priority=True)


def profile(fn, cuda: bool) -> str:
    """`fn` once under torch.profiler: its costliest operators and the host's and the device's totals."""
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    host = sum(e.self_cpu_time_total for e in events) / 1e3
    device = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e3 if cuda else 0.0
    table = events.table(sort_by=key, row_limit=12, max_name_column_width=60)
    return f"wall {wall * 1e3:.1f} ms, host (self CPU) {host:.1f} ms, device kernels {device:.1f} ms\n{table}"


def main() -> int:
    import torch

    from teacli.logprobs import shared_prompt_logprobs
    from teacli.padding import micro_padding
    from teacli.train.batching import packed_micro_batches

    args = parse()
    settings = [int(s) if s.isdigit() else s for s in args.splits.split(",")]
    if any(s not in ("auto", "packed") if isinstance(s, str) else s < 1 for s in settings):
        print(f"error: --splits: {args.splits!r} is not a comma list of k >= 1, auto and packed", file=sys.stderr)
        return 2
    modes = args.lengths.split(",")
    if any(m not in ("fixed", "realistic") for m in modes):
        print(f"error: --lengths: {args.lengths!r} is not a comma list of fixed and realistic", file=sys.stderr)
        return 2
    orders = args.sdpa.split(",")
    if any(o not in SDPA_ORDERS for o in orders):
        print(f"error: --sdpa: {args.sdpa!r} is not a comma list of {', '.join(SDPA_ORDERS)}", file=sys.stderr)
        return 2
    model, kind = build(args)
    cuda = model.device.type == "cuda"
    rows, fresh_seed = [], 1000
    for order, mode, setting in [(o, m, s) for o in orders for m in modes for s in settings]:
        seeds = list(range(args.draws))
        if args.fresh:  # seeds no earlier setting drew: shapes not seen before (widths may still repeat by chance)
            seeds, fresh_seed = list(range(fresh_seed, fresh_seed + args.draws * args.repeats)), fresh_seed + args.draws * args.repeats
        draws = [micro_batch(args, seed, model.config.vocab_size, mode) for seed in seeds]
        forwards = tokens = pad = 0
        train = ref = 0.0
        for number, (prompts, comps) in enumerate(draws):
            idx = list(range(len(comps)))
            (_, batch, _, _), = packed_micro_batches(prompts, comps, torch.zeros(len(comps)), [idx], True, 0, model.device,
                                                     splits=setting)
            *inputs, splits, index = batch
            forwards += 1 if setting == "packed" else len(splits)  # packed: one forward of the rows (a Packing)
            p, t = micro_padding([len(x) for x in prompts], [len(c) for c in comps], [0] * len(comps), [idx], True, setting)
            pad, tokens = pad + p, tokens + t

            def train_pass():
                model.train()
                model.zero_grad(set_to_none=True)
                with sdpa_order(order):
                    loss = shared_prompt_logprobs(model, *inputs, completion_index=index, splits=splits).sum()
                loss.backward()

            def ref_pass():
                model.eval()
                with torch.no_grad(), sdpa_order(order):
                    shared_prompt_logprobs(model, *inputs, completion_index=index, splits=splits)

            ref += timed(ref_pass, args.repeats, cuda, warm=not args.fresh)  # the trainer's order: the reference first
            train += timed(train_pass, args.repeats, cuda, warm=not args.fresh)
            if args.profile and number == 0:
                for name, fn in (("fwd+bwd", train_pass), ("fwd", ref_pass)):
                    print(f"\n{order} SDPA, {mode} lengths, k={setting}, {name}: {profile(fn, cuda)}", flush=True)
        rows.append({"sdpa": order, "lengths": mode, "splits": setting, "forwards": forwards / len(draws), "passes": len(draws), "tokens": tokens,
                     "pad_frac": pad / tokens, "train_ms": 1e3 * train, "ref_ms": 1e3 * ref})
        print(f"  {order} {mode} k={setting}: {rows[-1]}", file=sys.stderr, flush=True)

    device = torch.cuda.get_device_name() if cuda else "cpu"
    from torch.nn.attention import SDPBackend

    default = ", ".join(SDPBackend(i).name for i in torch._C._get_sdp_priority_order())
    how = (f"{args.draws * args.repeats} new draws each, timed once (--fresh)" if args.fresh else
           f"{args.draws} draws, medians of {args.repeats}")
    print(f"{args.model if not args.small else 'tiny llama'} on {device} ({kind} kernels), {args.rows} completions a "
          f"micro-batch, {' and '.join(modes)} lengths, {how}; torch's SDPA order (default): {default}")
    print("| SDPA | lengths | k | forwards | tokens computed | padding | fwd+bwd ms | fwd ms | fwd+bwd µs a token | fwd µs a token |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['sdpa']} | {r['lengths']} | {r['splits']} | {r['forwards']:.1f} | {r['tokens']:,} | {r['pad_frac']:.1%} | "
              f"{r['train_ms']:.1f} | {r['ref_ms']:.1f} | {1e3 * r['train_ms'] / r['tokens']:.2f} | "
              f"{1e3 * r['ref_ms'] / r['tokens']:.2f} |")
    for order, mode in [(o, m) for o in orders for m in modes]:
        fit = [r for r in rows if r["sdpa"] == order and r["lengths"] == mode and r["splits"] not in ("auto", "packed")]
        if len({r["forwards"] for r in fit}) < 2:
            continue
        x = np.array([[r["tokens"], r["forwards"] * r["passes"]] for r in fit], dtype=float)
        for column in ("train_ms", "ref_ms"):
            (a, b), *_ = np.linalg.lstsq(x, np.array([r[column] for r in fit]), rcond=None)
            print(f"{order} {mode} {column}: {a * 1e3:.3f} ms a thousand tokens + {b:.2f} ms a forward = "
                  f"{b / a if a > 0 else float('nan'):,.0f} tokens a forward")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "kernels": kind, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
