"""tea's training step against TRL's GRPOTrainer on the same workload, one after the other, in one invocation.

    # one GPU (issue 12's workload, --shape small-gpu): Llama-3.2-1B shape, random init, bf16
    python benchmarks/vs_trl.py --json vs_trl.json
    # one GPU, the paper's step (issue 45): uf_llama1b_tea's shapes, its 8B-shaped reward model on both sides
    python benchmarks/vs_trl.py --shape paper --json vs_trl_paper.json
    # CPU smoke runs: tiny models and shapes of the same structure
    python benchmarks/vs_trl.py --small
    python benchmarks/vs_trl.py --small --shape paper

Workload (--shape small-gpu, the default; issue 12): 4 prompts of 128 random tokens x m = 64 completions x 256 new tokens per step,
beta = 0.1 (per-token k3 KL to a frozen reference: kl.estimator grpo_k3, as TRL), temperature 1, no top-p/top-k, no vLLM: both generate with
transformers on the training GPU. The model is random-initialised from Llama-3.2-1B's shape (hidden
2048, 16 layers, 32/8 heads, vocabulary 128,256, tied embeddings); a random model almost never emits
EOS, so every completion has 256 tokens. The reward is a cheap deterministic function of the text.

  * tea: `teacli.train.update.train_step` over a DeepSpeed ZeRO-2 engine (bf16, fp32 master weights),
    generation by the `hf` rollout engine with its defaults (sdpa_gqa attention, bucketed static
    cache, torch.compile on CUDA), TEA advantages, fused training kernels per --tea-kernels
    (policy.kernels); gradient checkpointing per --tea-grad-ckpt
    (`auto` = the recipe rule of policy.gradient_checkpointing: auto, a number k = the first k layers;
    the settings give the layers checkpointed and the rule's memory estimate), micro-batch --tea-micro-batch.
  * TRL: `trl.GRPOTrainer` (optional benchmark dependency: `pip install trl`), bf16, gradient
    checkpointing, per-device batch --trl-micro-batch, gradient accumulation so that one optimizer
    step is one generation of the 4 x 64 completions, transformers generate (TRL's default).

With `--engine vllm` both sides generate with vLLM colocated on the training GPU instead (issue 19):

  * tea: the `vllm` rollout engine (one in-process `vllm.LLM`, sleep level 2 while training, the
    weights pushed after every update and checked against the trainer's, token-level importance
    correction: `rollout.is_correction: auto`; `--tea-is-correction off`: none, and vLLM asked for the
    log-probs of the sync check's completions only), memory share `auto`.
  * TRL: `GRPOConfig(use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True)` (level 2 too),
    `--trl-vllm-memory` of the GPU (TRL's default 0.3).

`--vllm-kwargs '{"async_scheduling": true}'` (JSON or YAML) passes more `vllm.LLM` arguments to tea's engine
(`rollout.vllm_kwargs`, docs/vllm.md); the settings line shows them. TRL's engine does not get them.

Each side then runs in its own child process, one after the other (vLLM keeps its state in process
globals; TRL's colocated engine reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, which the child gets).
tea's step then includes the push after the update (`sync_s`: waking the weights, pushing them,
re-scoring tokens for the sync check happens inside the next generation).

--shape paper (issue 45) is the paper's step as `tea train uf_llama1b_tea --rehearse` takes it
(recipes/uf_llama1b_tea.yaml and its bases, read when the script starts): rollout.prompts_per_step 8 prompts x
rollout.group_size m = 64 completions x rollout.max_new_tokens 512 new tokens, prompts of rehearsal.prompt_tokens
256 tokens after the chat template (the rehearsal's; data.max_prompt_tokens 1024 is the trainer's cap, and
`--prompt-len 1024` runs prompts at it), optim.micro_batch_size 32 on both sides, rollout.batch_size 512 sequences a
generate call, every layer checkpointed (policy.gradient_checkpointing: true), beta 0.1 with kl.estimator grpo_k3 as
above (the recipe's k2 is another element-wise function of the same log-probs). Both sides get the rehearsal's
stand-ins (`teacli.standins`): the policy of Llama-3.2-1B-Instruct's shipped config, the word-level stand-in
tokenizer and its chat template, the same stand-in prompts in the same order, and as the reward model a sequence
classifier of Skywork-Reward-V2-Llama-3.1-8B's config (8B, one label), random weights (the same on both sides:
`teacli.models.random_model` seeds them), bf16 on CUDA. A random policy almost never emits EOS, so every completion
has 512 tokens.

  * tea: `teacli.train.setup.setup` builds the session as `tea train` does (the recipe's policy.kernels,
    reward.kernels and reward.share_prompts: each group's prompt scored once), then each step runs
    `teacli.session.generate_and_score` (reward.batch_size 32 conversations a forward, by length), the recipe's
    TEA advantages (alpha 0.25, N_target 128), `train_step` and the push.
  * TRL: the classifier as `reward_funcs` (a PreTrainedModel) with the stand-in tokenizer as
    `reward_processing_classes`: TRL renders each conversation with that tokenizer's chat template and scores a
    generation batch's 512 conversations in one forward. `reward s` in its row is the time of those forwards
    (hooks on the model, synchronised).

Each side runs in a child process there too, so that the one that runs second finds the GPU as empty as the first
did. `--small --shape paper` is the same on toy configs of the two models (TINY_POLICY, TINY_REWARD) with 2 prompts
x m = 8 x 8 new tokens, 16-token prompts, micro-batches of 4 and reward batches of 4.

Each side runs --steps measured steps after one warm-up step (compilation happens there); the table
gives medians. MFU = 6 N tokens / time / 989e12 (H100 SXM and H200 dense bf16) over tea's backward+step phase,
N = parameters (tied embeddings once), tokens = the prompt and completion tokens the forward ran (with
optim.share_prompts a prompt once per micro-batch, not once per completion). Peak memory is
torch's max_memory_allocated over a step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_step import DENSE_BF16_FLOPS, grad_ckpt_setting, prompt_runs, tokenizer_for  # noqa: E402


def kv_cache_arg(text: str) -> "float | str":
    """--tea-kv-cache-gib: rollout.kv_cache_gib's value (a positive number of GiB or auto), checked as the recipe's key is."""
    from teacli.config import RecipeError, RolloutConfig, build, parse_yaml

    try:
        return build(RolloutConfig, {"kv_cache_gib": parse_yaml(text, "--tea-kv-cache-gib")}, {}, "rollout.").kv_cache_gib
    except RecipeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def vllm_kwargs_arg(text: str) -> dict:
    """The --vllm-kwargs option (here and in rollout_engines.py): a JSON or YAML mapping of `vllm.LLM` arguments
    for tea's vllm engine, read by the recipe loader and checked as rollout.vllm_kwargs is."""
    from teacli.config import RecipeError, check_vllm_kwargs, parse_yaml

    try:
        value = parse_yaml(text, "--vllm-kwargs")
        if not isinstance(value, dict):
            raise RecipeError(f"expected a mapping such as '{{\"async_scheduling\": true}}', got {text!r}")
        check_vllm_kwargs(value)
    except RecipeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def shapes(small: bool) -> dict:
    if small:
        return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    return dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)


def llama_config(small: bool):
    from transformers import LlamaConfig

    config = LlamaConfig(**shapes(small), max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=500000.0)
    config._attn_implementation = "sdpa"
    return config


# --shape small-gpu (issue 12's workload) and its --small version; --shape paper reads its values from PAPER_RECIPE.
WORKLOADS = {
    "small-gpu": dict(prompts=4, prompt_len=128, group_size=64, new_tokens=256, beta=0.1, gen_batch=256, tea_micro_batch=64,
                      trl_micro_batch=16, tea_grad_ckpt="auto"),
    "paper": None,
}
SMALL = {
    "small-gpu": dict(prompts=2, prompt_len=16, group_size=8, new_tokens=8, gen_batch=16, tea_micro_batch=8, trl_micro_batch=8),
    # the paper's structure at toy sizes: several micro-batches and reward batches a step
    "paper": dict(prompts=2, prompt_len=16, group_size=8, new_tokens=8, gen_batch=16, tea_micro_batch=4, trl_micro_batch=4,
                  reward_batch=4),
}
PAPER_RECIPE = Path(__file__).resolve().parent.parent / "recipes" / "uf_llama1b_tea.yaml"
# --small --shape paper: the shipped configs of the recipe's two models at toy sizes (`tiny_config`); the reward
# classifier is larger than the policy, as the 8B is than the 1B
TINY_POLICY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
TINY_REWARD = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


def workload(shape: str, small: bool) -> dict:
    """The flags' values for `shape` (a flag given on the command line keeps its own). paper: uf_llama1b_tea's step
    as its rehearsal runs it: rollout.prompts_per_step x rollout.group_size sequences of rehearsal.prompt_tokens
    prompt tokens (data.max_prompt_tokens stays the cap the trainer's memory rule reads) and rollout.max_new_tokens,
    rollout.batch_size sequences a generate call, optim.micro_batch_size on both sides, kl.beta,
    policy.gradient_checkpointing and reward.batch_size."""
    values = WORKLOADS[shape]
    if values is None:
        from teacli.config import load_recipe

        r = load_recipe(PAPER_RECIPE)
        values = dict(prompts=r.rollout.prompts_per_step, prompt_len=r.rehearsal.prompt_tokens, group_size=r.rollout.group_size,
                      new_tokens=r.rollout.max_new_tokens, beta=r.kl.beta, gen_batch=r.rollout.batch_size,
                      tea_micro_batch=r.optim.micro_batch_size, trl_micro_batch=r.optim.micro_batch_size,
                      tea_grad_ckpt=r.policy.gradient_checkpointing, reward_batch=r.reward.batch_size)
    return {**values, **(SMALL[shape] if small else {})}


def tiny_config(config: dict, sizes: dict) -> dict:
    """A shipped model config (teacli/standins) at the toy `sizes`, everything else kept (architecture, rope scaling,
    tied embeddings, labels): its special token ids keep their distance from the top of the vocabulary."""
    old, new = config["vocab_size"], sizes["vocab_size"]

    def move(ids):
        return [move(i) for i in ids] if isinstance(ids, list) else new - (old - ids)

    out = {**config, **sizes, "head_dim": sizes["hidden_size"] // sizes["num_attention_heads"]}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if config.get(key) is not None:
            out[key] = move(config[key])
    return out


def paper_recipe(args):
    """PAPER_RECIPE with this invocation's flags, as a rehearsal (`rehearsal.enabled`: stand-ins of its models and
    data, random weights of the models' shapes; `teacli.standins`). With --small, its two models are toy configs of
    the same architectures, written once under $TEA_CACHE/benchmarks/vs_trl/."""
    import json

    from teacli.cache import cache_dir
    from teacli.config import load_recipe
    from teacli.standins import known_models

    recipe = load_recipe(PAPER_RECIPE)
    if args.small:
        for section, sizes in ((recipe.policy, TINY_POLICY), (recipe.reward, TINY_REWARD)):
            config = tiny_config(json.loads(known_models()[section.name_or_path].read_text()), sizes)
            out = cache_dir() / "benchmarks" / "vs_trl" / f"tiny-{Path(section.name_or_path).name}"
            out.mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
            section.name_or_path = str(out)
    recipe.rehearsal.enabled, recipe.rehearsal.prompt_tokens = True, args.prompt_len
    recipe.rehearsal.eval_prompts = 1  # no held-out split is read here
    recipe.validation.enabled = False
    r = recipe.rollout
    r.prompts_per_step, r.group_size, r.max_new_tokens, r.batch_size = args.prompts, args.group_size, args.new_tokens, args.gen_batch
    r.engine = args.engine
    if args.engine == "vllm":
        r.vllm_kwargs, r.kv_cache_gib = args.vllm_kwargs, args.tea_kv_cache_gib or r.kv_cache_gib
    recipe.reward.batch_size = args.reward_batch
    recipe.kl.beta, recipe.kl.estimator = args.beta, "grpo_k3"  # TRL's per-token k3, so both sides compute the same loss
    recipe.optim.micro_batch_size, recipe.optim.share_prompts = args.tea_micro_batch, args.tea_share_prompts == "on"
    recipe.policy.gradient_checkpointing, recipe.policy.kernels = args.tea_grad_ckpt, args.tea_kernels
    return recipe


def reward_of(text: str) -> float:
    return (sum(map(ord, text[:64])) % 997) / 997.0


def prompts_for(step: int, args, vocab: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, vocab - 2, (args.prompts, args.prompt_len), generator=g).tolist()


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------
# tea


def _update_and_push(engine, reference, recipe, rollout, prompt_ids, groups, advantages, pad_id, device, is_level, args, profile,
                     n_params) -> dict:
    """tea's update (`train_step`) and the push of its weights to the rollout engine after it, timed: the row's fields
    both workloads share (the reference's and the backward's seconds, the push's, tokens, MFU, peak memory, the
    engine's sync and the correction's statistics)."""
    import torch

    from teacli.train import backend
    from teacli.train.update import train_step

    t2 = time.perf_counter()
    with _profiler(profile, args.profile, "training phase", device):
        stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, pad_id, device, is_level=is_level)
        sync(device)
    t3 = time.perf_counter()
    rollout.load_weights(backend.named_weights(engine.module, recipe.backend.zero_stage))  # a no-op for the hf engine
    sync(device)
    t4 = time.perf_counter()
    new_tokens = sum(len(c.token_ids) for g in groups for c in g)
    trained_tokens = new_tokens + prompt_runs(engine, reference, recipe, groups) * args.prompt_len
    backward = t3 - t2 - stats["time_ref_logprobs"]
    return {
        "ref_logprobs_s": stats["time_ref_logprobs"], "backward_step_s": backward, "sync_s": t4 - t3, "new_tokens": new_tokens,
        "mfu_backward_step": 6 * n_params * trained_tokens / backward / DENSE_BF16_FLOPS,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan"),
        **{k: v for k, v in rollout.stats().items() if k.startswith(("sync_", "vllm_", "gpu_"))},
        **{k: v for k, v in stats.items() if k.startswith("is_")},
    }


def run_tea(args, device) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    from teacli import models
    from teacli.advantages import compute_advantages
    from teacli.config import Recipe
    from teacli.kernels import apply_kernels, resolve_kernels
    from teacli.logprobs import resolved_kind
    from teacli.rollout.hf import HFEngine
    from teacli.train import backend
    from teacli.train.update import shares_prompts
    from teacli.types import SamplingConfig

    world = backend.init_world()
    config = llama_config(args.small)
    tokenizer = tokenizer_for(config.vocab_size)
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id

    recipe = Recipe()
    recipe.backend.zero_stage = 2
    recipe.backend.precision = "bf16" if device.type == "cuda" or backend.bf16_supported(device) else "fp32"
    recipe.optim.micro_batch_size = args.tea_micro_batch
    recipe.kl.beta, recipe.kl.estimator = args.beta, "grpo_k3"  # TRL's per-token k3, so both sides compute the same loss
    recipe.data.max_prompt_tokens, recipe.rollout.max_new_tokens = args.prompt_len, args.new_tokens
    recipe.policy.gradient_checkpointing = args.tea_grad_ckpt
    recipe.optim.share_prompts = args.tea_share_prompts == "on"
    seqs = args.prompts * args.group_size
    grad_accum = -(-seqs // args.tea_micro_batch)

    torch.manual_seed(0)
    policy = LlamaForCausalLM(config).to(device)
    checkpointing = backend.resolve_checkpointing(recipe, policy, world)
    models.set_gradient_checkpointing(policy, checkpointing.layers)
    dtype = torch.bfloat16 if recipe.backend.precision == "bf16" else torch.float32
    reference = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval().requires_grad_(False)
    reference.load_state_dict(policy.state_dict())
    recipe.policy.kernels = args.tea_kernels
    kernels = resolve_kernels(args.tea_kernels, policy, device)
    apply_kernels(policy, kernels, generates=True)
    apply_kernels(reference, kernels, generates=False)
    n_params = sum(p.numel() for p in policy.parameters())
    trainer_bytes = backend.model_state_bytes(recipe, policy, world)
    engine = backend.build_engine(policy, recipe, world, grad_accum, recipe.backend.precision)
    if args.engine == "vllm":
        from teacli.rollout.vllm_engine import VLLMEngine

        recipe.rollout.engine, recipe.rollout.vllm_kwargs = "vllm", args.vllm_kwargs
        recipe.rollout.kv_cache_gib = args.tea_kv_cache_gib
        is_level = args.tea_is_correction
        rollout = VLLMEngine(recipe.rollout, engine.module, tokenizer, seed=0, max_model_len=args.prompt_len + args.new_tokens,
                             trainer_bytes=trainer_bytes, sampler_logprobs=is_level != "off",
                             max_sequences=seqs)
        compiled, static = "vllm", "vllm"
    else:
        rollout = HFEngine(engine.module, tokenizer, batch_size=args.gen_batch)
        (compiled, static), is_level = rollout.resolved(device), "off"
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.new_tokens)

    rows = []
    for step in range(args.steps + 1):
        prompt_ids = prompts_for(step, args, config.vocab_size)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync(device)
        t0 = time.perf_counter()
        profile = args.profile and step == args.steps and device.type == "cuda"
        with _profiler(profile, args.profile and phase_path(args.profile, "generate"), "generation", device):
            rollout.wake()
            groups = rollout.generate(prompt_ids, args.group_size, sampling, seed=step)
            rollout.sleep()
            sync(device)
        t1 = time.perf_counter()
        rewards = torch.tensor([reward_of(c.text) for g in groups for c in g]).reshape(args.prompts, args.group_size)
        advantages = compute_advantages("tea", rewards.double()).float()
        t2 = time.perf_counter()
        update = _update_and_push(engine, reference, recipe, rollout, prompt_ids, groups, advantages, tokenizer.pad_token_id, device,
                                  is_level, args, profile, n_params)
        rows.append({"step": step, "step_s": time.perf_counter() - t0, "generate_s": t1 - t0, "reward_adv_s": t2 - t1, **update,
                     "gen_tok_per_s": update["new_tokens"] / (t1 - t0)})
        print(f"tea step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in rows[-1].items() if k != "step"), file=sys.stderr, flush=True)
    settings = {
        "precision": recipe.backend.precision, "zero": 2, "micro_batch": args.tea_micro_batch,
        "grad_ckpt_layers": checkpointing.layers, "mem_estimate_gib": (checkpointing.estimate or float("nan")) / 2**30,
        "kernels": kernels,
        "logprobs": resolved_kind(engine, device), "attention": getattr(rollout, "attention", "vllm"), "static_cache": static, "compile": compiled,
        "share_prompts": shares_prompts(recipe, engine, reference), "share_prefix": getattr(rollout, "share_prefix", "vllm prefix caching"),
        "params": n_params, "engine": args.engine, **({"vllm_kwargs": args.vllm_kwargs, "is_correction": is_level, "kv_cache_gib": args.tea_kv_cache_gib}
           if args.engine == "vllm" else {}),
    }
    if hasattr(rollout, "close"):
        rollout.close()
    del engine, policy, reference, rollout
    _free(device)
    return {"rows": rows, "settings": settings}


def run_tea_paper(args, device) -> dict:
    """--shape paper: tea's step as `tea train uf_llama1b_tea --rehearse` takes it, from the session the trainer sets up
    (`teacli.train.setup`: the stand-in policy, reference and 8B-shaped reward model, the hf or vllm engine), the
    step's prompts from its stand-in data stream; generation and scoring, the recipe's advantages, train_step, the push."""
    import torch

    from teacli.advantages import compute_advantages
    from teacli.kernels import resolve_kernels
    from teacli.logprobs import resolved_kind
    from teacli.session import generate_and_score
    from teacli.train import backend
    from teacli.train.batching import stream_prompts
    from teacli.train.setup import setup
    from teacli.train.update import shares_prompts

    world = backend.init_world()
    recipe = paper_recipe(args)
    is_level = args.tea_is_correction if args.engine == "vllm" else "off"
    s = setup(recipe, world, is_level, args.engine)
    engine, reference, rollout, reward = s.engine, s.reference, s.rollout, s.reward
    n_params = sum(p.numel() for p in engine.module.parameters())
    P, m = args.prompts, args.group_size
    rows = []
    for step in range(args.steps + 1):
        batch = stream_prompts(s.train_prompts, step * P, P, recipe.seed)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        scored = reward.tokens_scored
        sync(device)
        t0 = time.perf_counter()
        profile = args.profile and step == args.steps and device.type == "cuda"
        with _profiler(profile, args.profile and phase_path(args.profile, "generate"), "generation and scoring", device):
            rollout.wake()
            _, prompt_ids, groups, rewards, t_gen, t_rew = generate_and_score(rollout, reward, batch, recipe, m, seed=step)
            rollout.sleep()
        advantages = compute_advantages(recipe.advantage.name, rewards.double(), **recipe.advantage.params).float()
        update = _update_and_push(engine, reference, recipe, rollout, prompt_ids, groups, advantages, s.pad_id, device, is_level,
                                  args, profile, n_params)
        rows.append({"step": step, "step_s": time.perf_counter() - t0, "generate_s": t_gen, "reward_s": t_rew, **update,
                     "gen_tok_per_s": update["new_tokens"] / t_gen, "reward_tokens": reward.tokens_scored - scored})
        print(f"tea step {step}: " + ", ".join(f"{k}={v:.3f}" for k, v in rows[-1].items() if k != "step"), file=sys.stderr, flush=True)
    settings = {
        "recipe": recipe.name, "precision": backend.resolve_precision(recipe.backend.precision, device),
        "zero": recipe.backend.zero_stage, "micro_batch": recipe.optim.micro_batch_size,
        "grad_ckpt_layers": s.checkpointing.layers, "mem_estimate_gib": (s.checkpointing.estimate or float("nan")) / 2**30,
        "kernels": resolve_kernels(recipe.policy.kernels, engine.module, device), "logprobs": resolved_kind(engine, device),
        "attention": getattr(rollout, "attention", "vllm"), "share_prompts": shares_prompts(recipe, engine, reference),
        "share_prefix": getattr(rollout, "share_prefix", "vllm prefix caching"), "params": n_params, "engine": args.engine,
        "reward": f"{type(reward.model).__name__} {sum(p.numel() for p in reward.model.parameters()) / 1e9:.3g}B, random "
                  f"(stands in for {recipe.reward.name_or_path}), batch {reward.batch_size}, share_prompts {reward.share_prompts}",
    }
    if hasattr(rollout, "close"):
        rollout.close()
    del s, engine, reference, rollout, reward
    _free(device)
    return {"rows": rows, "settings": settings}


# ------------------------------------------------------------------------------------------------
# TRL


def run_trl(args, device) -> dict:
    import torch

    try:
        from datasets import Dataset
        from datasets.table import InMemoryTable
        from transformers import LlamaForCausalLM, TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        return {"skipped": f"TRL is not installed ({exc}); `pip install trl` to compare"}

    bf16 = device.type == "cuda"
    dtype = torch.bfloat16 if bf16 else torch.float32
    reward_model = reward_tokenizer = None
    with tempfile.TemporaryDirectory(prefix="tea_vs_trl_") as tmp:
        # TRL builds its reference model from the policy's path: save the random model once.
        if args.shape == "paper":
            from teacli.data.load import load_split
            from teacli.models import random_model
            from teacli.standins import stand_in
            from teacli.train.batching import stream_prompts
            from transformers import AutoTokenizer

            recipe = paper_recipe(args)
            loaded = stand_in(recipe)  # the directories tea's side loaded: the same configs, tokenizers and prompts
            random_model(loaded.policy.name_or_path, "causal_lm", dtype, device).save_pretrained(f"{tmp}/model")
            tokenizer = AutoTokenizer.from_pretrained(loaded.policy.name_or_path)
            # the same random weights as tea's reward model (random_model seeds them), scored by TRL in one forward a batch
            reward_model = random_model(loaded.reward.name_or_path, "reward", dtype, device)
            reward_tokenizer = AutoTokenizer.from_pretrained(loaded.reward.name_or_path)
            train = load_split(loaded.data.dir, loaded.data.train_split)
            # conversational prompts: TRL renders them with the policy's chat template, and the reward model's
            # conversations with its own, as tea does
            column = [list(p.messages) for step in range(args.steps + 1)
                      for p in stream_prompts(train, step * args.prompts, args.prompts, recipe.seed)]
        else:
            config = llama_config(args.small)
            tokenizer = tokenizer_for(config.vocab_size)
            config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
            torch.manual_seed(0)
            LlamaForCausalLM(config).to(dtype).save_pretrained(f"{tmp}/model")
            column = [" ".join(f"t{i}" for i in ids) for step in range(args.steps + 1) for ids in prompts_for(step, args, config.vocab_size)]
        tokenizer.save_pretrained(f"{tmp}/model")
        # An explicit fingerprint: hashing the table (Dataset.from_dict) fails with pyarrow's MonthDayNano
        # under dill on Python 3.12 (seen on the H200 machine); nothing here depends on datasets' cache.
        dataset = Dataset(InMemoryTable.from_pydict({"prompt": column}), fingerprint="tea-vs-trl")
        seqs = args.prompts * args.group_size
        mb = min(args.trl_micro_batch, seqs)
        cfg = GRPOConfig(
            output_dir=f"{tmp}/out", max_steps=args.steps + 1, learning_rate=1e-6, beta=args.beta,
            num_generations=args.group_size, max_completion_length=args.new_tokens,
            per_device_train_batch_size=mb, gradient_accumulation_steps=seqs // mb,
            temperature=1.0, top_p=1.0, top_k=0, gradient_checkpointing=True, bf16=bf16,
            model_init_kwargs={"dtype": torch.bfloat16 if bf16 else torch.float32, "attn_implementation": "sdpa"},
            report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
            use_cpu=device.type != "cuda", shuffle_dataset=False, dataloader_num_workers=0,
            **({"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": True,
                "vllm_gpu_memory_utilization": args.trl_vllm_memory, "vllm_max_model_length": args.prompt_len + args.new_tokens + 8}
               if args.engine == "vllm" else {}),
        )
        times: list[dict] = []

        class Timer(TrainerCallback):
            def on_step_begin(self, a, state, control, **kw):
                if not times or "end" in times[-1]:
                    sync(device)
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    times.append({"begin": time.perf_counter()})

            def on_step_end(self, a, state, control, **kw):
                sync(device)
                times[-1]["end"] = time.perf_counter()
                times[-1]["peak"] = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")

        def reward(completions, **kw):
            return [reward_of(c) for c in completions]

        if reward_model is not None:  # the reward model's forwards, timed into the step they run in
            def started(module, inputs):
                sync(device)
                times[-1]["reward_t0"] = time.perf_counter()

            def finished(module, inputs, output):
                sync(device)
                times[-1]["reward"] = times[-1].get("reward", 0.0) + time.perf_counter() - times[-1].pop("reward_t0")

            reward_model.register_forward_pre_hook(started)
            reward_model.register_forward_hook(finished)

        trainer = GRPOTrainer(model=f"{tmp}/model", reward_funcs=reward if reward_model is None else reward_model, args=cfg,
                              train_dataset=dataset, processing_class=tokenizer, callbacks=[Timer()],
                              **({} if reward_model is None else {"reward_processing_classes": reward_tokenizer}))
        trainer.train()
        logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
        rows = [{"step": i, "step_s": t["end"] - t["begin"], "peak_mem_gib": t["peak"], **({"reward_s": t["reward"]} if "reward" in t else {})}
                for i, t in enumerate(times)]
        counted = 0.0
        for row, log in zip(rows, logs):
            row["completion_len"] = log.get("completions/mean_length")
            # the prompt and completion tokens of the step (TRL logs a running count)
            row["tokens"], counted = float(log.get("num_tokens", "nan")) - counted, float(log.get("num_tokens", "nan"))
        settings = {"trl": __import__("trl").__version__, "micro_batch": mb, "grad_accum": seqs // mb, "grad_ckpt": True,
                    "precision": "bf16" if bf16 else "fp32",
                    "generation": f"vLLM colocate (sleep level 2, gpu_memory_utilization {args.trl_vllm_memory})" if args.engine == "vllm"
                    else "transformers generate",
                    **({"reward": f"{type(reward_model).__name__} {sum(p.numel() for p in reward_model.parameters()) / 1e9:.3g}B, "
                                  f"random, in reward_funcs (one forward of a generation batch's {seqs} conversations)"}
                       if reward_model is not None else {})}
        del trainer, reward_model
    _free(device)
    return {"rows": rows, "settings": settings}


def phase_path(path: str, phase: str) -> str:
    """--profile's file for another phase than training: profile.txt -> profile.generate.txt."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{phase}{p.suffix}"))


@contextlib.contextmanager
def _profiler(on: bool, path: str | None, phase: str, device=None):
    """torch.profiler over one phase of the last tea step: a table of where the GPU time goes, headed by
    the phase's wall time and the time the GPU spent in kernels (busy = kernels / wall: what is left is
    the GPU waiting for the CPU, launches, synchronisation)."""
    if not on:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        yield prof
        sync(device)
        wall = time.perf_counter() - start
    from torch.autograd import DeviceType

    averages = prof.key_averages()
    # what the table's "Self CUDA time total" sums: device events, not the annotations that wrap them (a CUDA
    # graph's replay is such an annotation, and its kernels are listed again one by one)
    kernels = sum(e.self_device_time_total for e in averages if e.device_type == DeviceType.CUDA and not e.is_user_annotation) / 1e6
    launches = sum(e.count for e in averages if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaLaunchKernelExC"))
    head = (f"{phase}: wall {wall:.3f} s under the profiler, GPU kernels {kernels:.3f} s (busy {kernels / wall:.0%}), "
            f"{launches} kernel or graph launches from the CPU")
    Path(path).write_text(head + "\n\n" + averages.table(sort_by="cuda_time_total", row_limit=40))
    print(f"{head}; the profile's table is in {path}", file=sys.stderr)


def _free(device) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------


def run_child(side: str) -> dict:
    """This script with --only SIDE in a child process (the same arguments otherwise): its results."""
    import socket
    import subprocess

    with socket.socket() as sock:  # a free port for the child's process group, released before it starts
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="tea_vs_trl_") as tmp:
        env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        argv = [a for a in sys.argv[1:] if a != "--json" and not a.endswith(".json")]
        proc = subprocess.run([sys.executable, __file__, *argv, "--only", side, "--json", f"{tmp}/{side}.json"], env=env)
        if proc.returncode != 0:
            return {"skipped": f"the {side} child process failed (exit {proc.returncode}; its output is above)"}
        return json.loads(Path(f"{tmp}/{side}.json").read_text())["results"][side]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=list(WORKLOADS), default="small-gpu",
                   help="the workload: small-gpu (issue 12's, the default) or paper (uf_llama1b_tea's step with its 8B-shaped "
                        "reward model on both sides); the flags below default to the shape's values")
    p.add_argument("--steps", type=int, default=3, help="measured steps per side (after one warm-up step)")
    p.add_argument("--prompts", type=int, default=None, help="prompts a step")
    p.add_argument("--prompt-len", type=int, default=None, help="tokens a prompt (paper: after the chat template)")
    p.add_argument("--group-size", type=int, default=None, help="m: completions per prompt")
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--beta", type=float, default=None)
    p.add_argument("--gen-batch", type=int, default=None, help="tea: sequences per generate call")
    p.add_argument("--reward-batch", type=int, default=None, help="--shape paper, tea: reward.batch_size")
    p.add_argument("--tea-micro-batch", type=int, default=None)
    p.add_argument("--tea-grad-ckpt", type=grad_ckpt_setting, default=None,
                   help="tea: policy.gradient_checkpointing: auto, true, false or a number of layers k (the first k)")
    p.add_argument("--tea-share-prompts", choices=["on", "off"], default="on",
                   help="tea: optim.share_prompts (on: a micro-batch runs each distinct prompt once, on a KV cache its completions "
                        "share; checkpointed layers or not). MFU counts the tokens the forward ran, so sharing lowers it at equal time")
    p.add_argument("--tea-kernels", choices=["auto", "eager", "liger", "compile"], default="auto",
                   help="tea: policy.kernels (default auto, the recipe default: liger where installed on CUDA; eager: the tables before issue 21)")
    p.add_argument("--trl-micro-batch", type=int, default=None)
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="generation on both sides: transformers (hf) or colocated vLLM")
    p.add_argument("--tea-is-correction", choices=["token", "off"], default="token",
                   help="--engine vllm: tea's rollout.is_correction (off: vLLM returns log-probs for the sync check's completions only)")
    p.add_argument("--tea-kv-cache-gib", type=kv_cache_arg, default=None,
                   help="--engine vllm: tea's rollout.kv_cache_gib (a number, or auto: what one step's sequences hold; "
                        "default: what the memory share leaves)")
    p.add_argument("--trl-vllm-memory", type=float, default=0.3, help="--engine vllm: TRL's vllm_gpu_memory_utilization")
    p.add_argument("--vllm-kwargs", type=vllm_kwargs_arg, default={},
                   help="--engine vllm: more vllm.LLM arguments for tea's engine (rollout.vllm_kwargs), JSON or YAML, "
                   "e.g. '{\"async_scheduling\": true}'")
    p.add_argument("--only", choices=["tea", "trl"], default=None, help="run one side only")
    p.add_argument("--small", action="store_true", help="tiny model and shapes (CPU smoke run)")
    p.add_argument("--json", default=None, help="also write every step's numbers here")
    p.add_argument("--profile", default=None, help="CUDA: write a torch.profiler table of tea's last training phase here, and of "
                   "its last generation beside it (profile.txt: profile.generate.txt), each headed by its wall and GPU-kernel time")
    args = p.parse_args()
    if args.vllm_kwargs and args.engine != "vllm":
        p.error("--vllm-kwargs: applies to --engine vllm only")
    for key, value in workload(args.shape, args.small).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.small:
        args.steps = min(args.steps, 2)

    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = {}
    if (args.engine == "vllm" or args.shape == "paper") and args.only is None:
        results = {side: run_child(side) for side in ("tea", "trl")}
    else:
        if args.only in (None, "tea"):
            results["tea"] = (run_tea_paper if args.shape == "paper" else run_tea)(args, device)
        if args.only in (None, "trl"):
            results["trl"] = run_trl(args, device)

    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    scorer = ("a reward model of uf_llama1b_tea's reward model's shape, random weights, on both sides" if args.shape == "paper"
              else "a function of the text")
    print(f"\n{name}, --shape {args.shape}{' --small' if args.small else ''}: {args.prompts} prompts x {args.prompt_len} tokens x "
          f"m={args.group_size} x {args.new_tokens} new tokens, beta={args.beta}, reward: {scorer}; median of {args.steps} steps "
          f"after 1 warm-up")
    med = {}
    for side, res in results.items():
        if "rows" in res:
            measured = res["rows"][1:] or res["rows"]
            med[side] = {k: statistics.median(r[k] for r in measured) for k in measured[0] if k != "step" and measured[0][k] is not None}
            print(f"{side}: " + ", ".join(f"{k}={v}" for k, v in res["settings"].items()))
        else:
            print(f"{side}: {res['skipped']}")
    print(f"\n| ({args.engine}) | step s | generate s | reward s | ref log-probs s | backward+step s | push s | generated tok/s | "
          f"MFU (backward+step) | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    if "tea" in med:
        t = med["tea"]
        reward_s = t.get("reward_s", t.get("reward_adv_s"))  # small-gpu: the reward function and the advantages
        print(f"| tea | {t['step_s']:.2f} | {t['generate_s']:.2f} | {reward_s:.2f} | {t['ref_logprobs_s']:.2f} | {t['backward_step_s']:.2f} | "
              f"{t['sync_s']:.2f} | {t['gen_tok_per_s']:,.0f} | {100 * t['mfu_backward_step']:.1f}% | {t['peak_mem_gib']:.1f} |")
        extra = {k: round(v, 4) for k, v in t.items() if k.startswith(("sync_logprob", "is_", "vllm_", "gpu_"))}
        if extra:
            print(f"tea vllm engine (medians): {extra}")
    if "trl" in med:
        t = med["trl"]
        reward_s = f"{t['reward_s']:.2f}" if "reward_s" in t else ""  # paper: its reward model's forwards
        print(f"| TRL GRPOTrainer | {t['step_s']:.2f} | | {reward_s} | | | | | | {t['peak_mem_gib']:.1f} |")
    if "tea" in med and "trl" in med:
        print(f"\ntea step / TRL step = {med['tea']['step_s'] / med['trl']['step_s']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "args": vars(args), "results": results, "medians": med}, f, indent=2)


if __name__ == "__main__":
    main()
