"""Time a few real training steps of a Llama-3.2-1B-shaped policy and print a table by phase.

    # one GPU, ZeRO-2
    python benchmarks/train_step.py --zero 2
    # two GPUs, ZeRO-3
    torchrun --nproc_per_node 2 benchmarks/train_step.py --zero 3

Standard workload (the issue's): 4 prompts of 128 tokens x m = 64 completions x 256 new tokens
per step, beta = 0.1 (kl.estimator k2), bf16 with fp32 master weights, gradient checkpointing of every layer (--grad-ckpt), TEA advantages,
eager attention. The model is random-initialised from Llama-3.2-1B's shape (hidden 2048,
16 layers, 32/8 heads, vocab 128,256, tied embeddings), so no download is needed; the reward is a
cheap deterministic function of the text (the reward-model phase is not what this measures).
The step itself is the trainer's: `teacli.train.update.train_step` over a DeepSpeed engine from
`teacli.train.backend`, generation by the `hf` rollout engine (under ZeRO-3 with gathered weights).
`--small` shrinks everything for a CPU smoke run. `--grad-ckpt` is `policy.gradient_checkpointing`
(default true: every layer; false; a number k: the first k layers; auto: the recipe rule, from
`--micro-batch` and the step's prompt + new tokens); the settings line names the layers checkpointed
and, on CUDA, the rule's estimate of the training peak beside the measured `peak_train_gib`
(`torch.cuda.max_memory_allocated` of the training phase) and `peak_mem_gib` (the whole step), so
a table of settings is one invocation per value:

    for k in 0 2 4 8 16; do python benchmarks/train_step.py --micro-batch 64 --grad-ckpt $k; done
 `--kernels` is `policy.kernels` (teacli/kernels.py),
applied to the policy and the reference; the settings line names the resolved choice, and the table
adds the MFU of backward + step: 6 · N · tokens the forward ran / time / 989 TFLOP/s (the dense bf16
peak of an H100 SXM and of an H200).

Under a launcher (world size N > 1) `--prompts` is the step's total, P/N a process, and each row is the
mean over ranks, as before, plus the slowest rank's `generate_s_max`, `backward_step_s_max` and
`step_s_max` (`backend.all_reduce_max_stats`): the mean hides stragglers, and a rank that finishes
generating early waits for the slowest in its first backward's gradient all-reduce, so generation
stragglers show as generate_s_max - generate_s and inside backward_step_s. Once per invocation, before the
steps, the benchmark also times the collective itself (`allreduce_s`, in the JSON and the settings line):
`torch.distributed.all_reduce` of a tensor of the model's parameter count in the engine's communication
dtype (bf16; fp32 without bf16), the median of 5 after 2 warm-ups, the slowest rank's. all_reduce and not
reduce-scatter, because that is what DeepSpeed 0.19's ZeRO-2 runs: with its defaults (reduce_scatter and
use_multi_rank_bucket_allreduce on, overlap_comm off for stage 2) every micro-batch's backward
all-reduces the gradient buckets on the compute stream (stage 2 communicates at every micro-step, not only
at the accumulation boundary), then the optimizer step all-gathers the updated bf16 partitions (half an
all-reduce's traffic). So a step's gradient traffic is about `micro_batches_per_rank` x allreduce_s.
`benchmarks/scaling.py` runs this script on 1, 2 and 4 GPUs and tabulates it (issue 21).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

DENSE_BF16_FLOPS = 989e12  # H100 SXM and H200: the same dense bf16 peak


def grad_ckpt_setting(text: str) -> "bool | int | str":
    """A command-line value of policy.gradient_checkpointing: auto, true, false or a number of layers."""
    named = {"auto": "auto", "true": True, "false": False}
    if text in named:
        return named[text]
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not auto, true, false or a number of layers")


def allreduce_seconds(numel: int, dtype, device, repeats: int = 5, warmup: int = 2) -> list[float]:
    """This rank's wall time of `repeats` all-reduces of a `numel`-element tensor (after `warmup` untimed
    ones), each started after a barrier so that no rank's time includes waiting for the others to arrive."""
    import torch
    import torch.distributed as dist

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    t = torch.zeros(numel, dtype=dtype, device=device)
    times = []
    for _ in range(warmup + repeats):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        sync()
        times.append(time.perf_counter() - t0)
    del t
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return times[warmup:]


def prompt_runs(engine, reference, recipe, groups) -> int:
    """How many prompts the training forward ran: one per sequence, or with optim.share_prompts one per
    distinct prompt of each micro-batch (MFU counts the tokens actually computed)."""
    from teacli.padding import micro_batches
    from teacli.train.update import shares_prompts

    seq_group = [p for p, g in enumerate(groups) for _ in g]
    if not shares_prompts(recipe, engine, reference):
        return len(seq_group)
    lengths = [len(c.token_ids) for g in groups for c in g]
    return sum(len({seq_group[i] for i in b}) for b in micro_batches(lengths, engine.gradient_accumulation_steps(), seq_group) if b)


def tokenizer_for(vocab: int):
    """A word-level tokenizer whose ids cover the whole vocabulary ('t0' ... 't<vocab-1>')."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    # eos = the last id: a random model emits it with probability ~1/vocab per token.
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"t{vocab - 1}", pad_token=f"t{vocab - 2}", unk_token="t0")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zero", type=int, default=2)
    p.add_argument("--steps", type=int, default=3, help="measured steps (after one warm-up step)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--group-size", type=int, default=64, help="m: completions per prompt")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--gen-batch", type=int, default=256)
    p.add_argument("--attn", default="eager")
    p.add_argument("--grad-ckpt", type=grad_ckpt_setting, default=True,
                   help="policy.gradient_checkpointing: true (default: every layer), false, k (the first k layers) or auto")
    p.add_argument("--kernels", choices=["auto", "eager", "liger", "compile"], default="eager",
                   help="policy.kernels for the policy and the reference (default eager, the recipe default and the tables before issue 21)")
    p.add_argument("--small", action="store_true", help="tiny shapes for a CPU smoke run")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from teacli import models
    from teacli.advantages import compute_advantages
    from teacli.config import Recipe
    from teacli.kernels import apply_kernels, resolve_kernels
    from teacli.rollout.hf import HFEngine
    from teacli.train import backend
    from teacli.train.update import train_step
    from teacli.types import SamplingConfig

    world = backend.init_world()
    if args.small:
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    else:
        shape = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    config = LlamaConfig(**shape, max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=500000.0)
    config._attn_implementation = args.attn
    tokenizer = tokenizer_for(config.vocab_size)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id

    recipe = Recipe()
    recipe.backend.zero_stage = args.zero
    recipe.backend.precision = "bf16" if world.device.type == "cuda" or backend.bf16_supported(world.device) else "fp32"
    recipe.optim.micro_batch_size = args.micro_batch
    recipe.kl.beta = 0.1  # kl.estimator: the default, k2
    recipe.policy.kernels = args.kernels
    recipe.policy.gradient_checkpointing = args.grad_ckpt
    recipe.data.max_prompt_tokens, recipe.rollout.max_new_tokens = args.prompt_len, args.new_tokens  # what `auto` sizes
    local_prompts = args.prompts // world.world_size
    local_seqs = local_prompts * args.group_size
    grad_accum = -(-local_seqs // args.micro_batch)

    torch.manual_seed(0)
    policy = LlamaForCausalLM(config).to(world.device)
    checkpointing = backend.resolve_checkpointing(recipe, policy, world)
    models.set_gradient_checkpointing(policy, checkpointing.layers)
    dtype = torch.bfloat16 if recipe.backend.precision == "bf16" else torch.float32
    reference = LlamaForCausalLM(config).to(device=world.device, dtype=dtype).eval().requires_grad_(False)
    reference.load_state_dict(policy.state_dict())
    kernels = resolve_kernels(args.kernels, policy, world.device)
    apply_kernels(policy, kernels, generates=True)
    apply_kernels(reference, kernels, generates=False)
    n_params = sum(p.numel() for p in policy.parameters())
    engine = backend.build_engine(policy, recipe, world, grad_accum, recipe.backend.precision)
    rollout = HFEngine(engine.module, tokenizer, batch_size=args.gen_batch)
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.new_tokens)
    allreduce_s = None
    if world.world_size > 1:
        own = statistics.median(allreduce_seconds(n_params, dtype, world.device))
        allreduce_s = backend.all_reduce_max_stats({"allreduce_s": own})["allreduce_s"]

    def sync():
        if world.device.type == "cuda":
            torch.cuda.synchronize()

    rows = []
    for step in range(args.steps + 1):
        g = torch.Generator().manual_seed(1000 + step * world.world_size + world.rank)
        prompt_ids = torch.randint(0, config.vocab_size - 2, (local_prompts, args.prompt_len), generator=g).tolist()
        if world.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        t0 = time.perf_counter()
        with backend.generation_weights(engine, args.zero, rollout):
            t_gather = time.perf_counter() - t0
            groups = rollout.generate(prompt_ids, args.group_size, sampling, seed=step)
            sync()
        t1 = time.perf_counter()
        texts = [c.text for grp in groups for c in grp]
        rewards = torch.tensor([(sum(map(ord, t[:64])) % 997) / 997.0 for t in texts]).reshape(local_prompts, args.group_size)
        t2 = time.perf_counter()
        advantages = compute_advantages("tea", rewards.double()).float()
        peak_generate = backend.peak_memory_gib(world.device)
        stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, tokenizer.pad_token_id, world.device)
        sync()
        t3 = time.perf_counter()
        new_tokens = sum(len(c.token_ids) for grp in groups for c in grp)
        trained_tokens = new_tokens + prompt_runs(engine, reference, recipe, groups) * args.prompt_len
        backward = t3 - t2 - stats["time_ref_logprobs"]
        row = {
            "step": step,
            "generate_s": t1 - t0 - t_gather,
            "sync_gather_s": t_gather,
            "reward_s": t2 - t1,
            "ref_logprobs_s": stats["time_ref_logprobs"],
            "backward_step_s": backward,
            "mfu_backward_step": 6 * n_params * trained_tokens / backward / DENSE_BF16_FLOPS,
            "step_s": t3 - t0,
            "new_tokens": new_tokens * world.world_size,
            "gen_tokens_per_s": new_tokens * world.world_size / max(t1 - t0 - t_gather, 1e-9),
            "peak_train_gib": peak_train if (peak_train := backend.peak_memory_gib(world.device)) is not None else float("nan"),
            "peak_mem_gib": max(peak_generate, peak_train) if peak_generate is not None else float("nan"),
        }
        slowest = {f"{k}_max": row[k] for k in ("generate_s", "backward_step_s", "step_s")}
        keys = [k for k in row if k != "step"] + (list(slowest) if world.world_size > 1 else [])
        rows.append(backend.all_reduce_mean(row) | backend.all_reduce_max_stats(slowest) | {"step": step})
    if world.is_main:
        measured = rows[1:] or rows
        device = torch.cuda.get_device_name() if world.device.type == "cuda" else "cpu"
        print(f"\n{device} x{world.world_size}, ZeRO-{args.zero}, {recipe.backend.precision}, attn={args.attn}, "
              f"kernels={kernels} (--kernels {args.kernels}), micro-batch {args.micro_batch}, {checkpointing.describe()}, {args.prompts} prompts x {args.prompt_len} tok x m={args.group_size} x {args.new_tokens} new tokens; "
              f"median of {len(measured)} steps after 1 warm-up")
        if allreduce_s is not None:
            print(f"all_reduce of {n_params:,} {str(dtype).removeprefix('torch.')} elements (the gradient, once per micro-batch "
                  f"under ZeRO-2; micro-batches a rank: {grad_accum}): {allreduce_s:.4f} s, median of 5")
        print("| phase | median |\n|---|---|")
        for k in keys:
            value = statistics.median(r[k] for r in measured)
            print(f"| {k} | {100 * value:.1f}% |" if k.startswith("mfu") else f"| {k} | {value:.3f} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": device, "world_size": world.world_size, "zero": args.zero, "args": vars(args),
                           "grad_ckpt_layers": checkpointing.layers, "mem_estimate_gib": (checkpointing.estimate or float("nan")) / 2**30,
                           "n_params": n_params, "micro_batches_per_rank": grad_accum,
                           "allreduce_s": allreduce_s, "allreduce_dtype": str(dtype).removeprefix("torch."),
                           "rows": rows}, f, indent=2)
    backend.close_world()


if __name__ == "__main__":
    main()
