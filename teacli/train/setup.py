"""Setting up a training run: the session (tokenizer, encoded prompts, reward; teacli/session.py) plus what only
training has: the trainable policy under DeepSpeed, the frozen reference, and a rollout engine that samples from the
trainer's weights. `setup` returns it as one named object, built once; the loop (teacli/train/loop.py) only reads it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from teacli.session import encode_prompts, open_tokenizer
from teacli.train.errors import TrainError
from teacli.train.resume import say
from teacli.train.sharding import most_sequences
from teacli.train.validation import validation_sequences

if TYPE_CHECKING:
    from teacli.config import Recipe
    from teacli.types import Prompt


@dataclass
class TrainSession:
    """Everything a training run samples, scores and updates with."""

    tokenizer: Any
    pad_id: int
    engine: Any  # the DeepSpeed engine around the policy (engine.module: the policy, LoRA-wrapped where enabled)
    reference: Any  # the frozen reference policy; "adapters-disabled" (LoRA: the policy without its adapters); None at β = 0
    reward: Any  # teacli.rewards.Reward
    rollout: Any  # the generation engine (teacli.rollout): samples from the trainer's weights
    train_prompts: list[tuple["Prompt", list[int]]]  # the train split, chat-templated and filtered once
    val_prompts: list[tuple["Prompt", list[int]]]  # the fixed validation prompts
    data_report: dict[str, Any]  # what encoding dropped (data.json)
    checkpointing: Any  # backend.Checkpointing: the layers checkpointed and the memory estimate behind the choice
    sampler: Any = None  # rollout.max_staleness 1: (the policy's copy, an hf engine on it) that samples one step ahead


def encode_splits(tokenizer, recipe: "Recipe") -> tuple[list[tuple["Prompt", list[int]]], list[tuple["Prompt", list[int]]], dict[str, Any]]:
    """The train split and the validation prompts, encoded and filtered once; what was dropped (data.json).

    Validation uses the first `validation.prompts` prompts of the val split that fit. Too few prompts
    left for a step (or for validation) is a TrainError naming the key.
    """
    from teacli.data.load import load_split

    d = recipe.data
    limit = d.max_prompt_tokens
    train, train_dropped = encode_prompts(tokenizer, load_split(d.dir, d.train_split), limit)
    val_all, val_dropped = encode_prompts(tokenizer, load_split(d.dir, d.val_split), limit) if recipe.validation.enabled else ([], [])
    val = val_all[: recipe.validation.prompts]
    report: dict[str, Any] = {"max_prompt_tokens": limit}
    for name, split, kept, dropped in (("train", d.train_split, train, train_dropped), ("validation", d.val_split, val_all, val_dropped)):
        report[name] = {"split": split, "prompts": len(kept) + len(dropped), "kept": len(kept), "dropped": len(dropped),
                        "longest_dropped_tokens": max(dropped, default=0)}
    needs = [("rollout.prompts_per_step", recipe.rollout.prompts_per_step, "train", train)]
    if recipe.validation.enabled:
        needs.append(("validation.prompts", recipe.validation.prompts, "validation", val_all))
    for key, need, name, kept in needs:
        if len(kept) < need:
            r = report[name]
            why = (f"; {r['dropped']} are longer than data.max_prompt_tokens={limit} (longest {r['longest_dropped_tokens']} tokens): "
                   f"raise data.max_prompt_tokens" if r["dropped"] else "")
            raise TrainError(f"{key}={need} needs {need} prompts, but data.{'train_split' if name == 'train' else 'val_split'} "
                             f"{r['split']!r} of data.dir has {r['kept']} of {r['prompts']} usable{why} or lower {key}")
    report["validation"]["used"] = len(val)
    return train, val, report


def dropped_warning(report: dict[str, Any]) -> str | None:
    """One line on what encode_splits dropped (None when nothing was)."""
    parts = [f"{report[n]['dropped']} of {report[n]['prompts']} {n} prompts" for n in ("train", "validation") if report[n]["dropped"]]
    if not parts:
        return None
    longest = max(report[n]["longest_dropped_tokens"] for n in ("train", "validation"))
    return (f"warning: dropped {' and '.join(parts)} longer than data.max_prompt_tokens={report['max_prompt_tokens']} tokens "
            f"after the chat template (longest {longest}); raise data.max_prompt_tokens to train on them")


def open_inputs(recipe: "Recipe") -> tuple["Recipe", Any, tuple]:
    """What a run loads before any model, so that a wrong stop token or data error stops at once: the recipe as loaded
    (in a rehearsal, stand-ins of its models and data; recipe.yaml keeps the real names), the tokenizer and the
    encoded splits (`encode_splits`). The trainers and split placement's generation ranks both load them here, so
    their data orders agree. A TrainError names what is wrong."""
    loaded = recipe
    try:
        if recipe.rehearsal.enabled:
            from teacli import standins

            loaded = standins.stand_in(recipe)
        tokenizer = open_tokenizer(loaded.policy, recipe.rollout.stop_tokens)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    return loaded, tokenizer, encode_splits(tokenizer, loaded)


def setup(recipe: "Recipe", world, is_level: str, engine_name: str) -> TrainSession:
    """Models, reward, data, engines: everything the loop needs, built once. is_level: the resolved
    rollout.is_correction (the vllm engine returns every sampled token's log-prob only where it is on);
    engine_name: rollout.engine as resolved (`teacli.rollout.factory.recipe_engine`)."""
    import torch

    from teacli import models
    from teacli.kernels import apply_kernels, resolve_kernels
    from teacli.rewards import build_reward
    from teacli.rollout.factory import build_engine as build_rollout
    from teacli.train import backend

    precision = backend.resolve_precision(recipe.backend.precision, world.device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    if recipe.rehearsal.enabled:
        from teacli import standins

        say(world, standins.banner(recipe))
    loaded, tokenizer, (train_prompts, val_prompts, data_report) = open_inputs(recipe)
    models.allow_cudnn_attention(recipe.backend.cudnn_attention)
    say(world, f"loading the policy {recipe.policy.name_or_path} on {world.device.type}" + (" (a stand-in: random weights)" if recipe.rehearsal.enabled else ""))
    policy = models.load_policy(loaded.policy, dtype=torch.float32, device=world.device)
    cpu_attention = recipe.policy.attn_implementation is None and world.device.type == "cpu"
    if cpu_attention:  # grouped K/V without copies, multi-query bf16 attention in fp32 (models.sdpa_gqa_attention)
        policy.set_attn_implementation(models.register_sdpa_gqa())
    what = recipe.reward.name_or_path or recipe.reward.function or recipe.reward.url
    say(world, f"loading the reward ({recipe.reward.kind}{f': {what}' if what else ''})")
    reward = build_reward(loaded.reward, device=world.device, tokenizer=tokenizer)
    # A reward model on this device: what it holds counts for `auto` checkpointing and for the vllm engine's plan.
    module = getattr(reward, "model", None)
    reward_bytes = (sum(p.numel() * p.element_size() for p in module.parameters() if p.device == world.device)
                    if isinstance(module, torch.nn.Module) else 0)
    try:
        checkpointing = backend.resolve_checkpointing(recipe, policy, world, held=reward_bytes)  # `auto`: the fewest layers that fit
        models.set_gradient_checkpointing(policy, checkpointing.layers)
        kernels = resolve_kernels(recipe.policy.kernels, policy, world.device)
    except ValueError as exc:
        raise TrainError(str(exc)) from None
    apply_kernels(policy, kernels, generates=True)  # before LoRA wraps the model and DeepSpeed the parameters
    reference = None
    if recipe.kl.beta > 0:
        if recipe.policy.lora.enabled:
            reference = "adapters-disabled"
        else:
            say(world, f"loading the reference policy (kl.beta={recipe.kl.beta:g})")
            reference = models.load_policy(loaded.policy, dtype=dtype, device=world.device)
            if cpu_attention:
                reference.set_attn_implementation(models.register_sdpa_gqa())
            reference.eval().requires_grad_(False)
            apply_kernels(reference, kernels, generates=False)
    if recipe.policy.lora.enabled:
        from teacli.lora import apply_lora

        policy = apply_lora(policy, recipe.policy.lora)

    P, m = recipe.rollout.prompts_per_step, recipe.rollout.group_size
    if P % world.world_size and recipe.rollout.dynamic_sampling:
        raise TrainError(f"rollout.dynamic_sampling: rollout.prompts_per_step={P} must be divisible by the number of processes "
                         f"({world.world_size}): each rank draws its equal share of every round")
    if P < world.world_size:
        raise TrainError(f"rollout.prompts_per_step={P} is fewer than the number of processes ({world.world_size}): every rank "
                         f"generates at least one prompt's group")
    local_seqs = most_sequences(P, m, world.world_size)  # any P: the step's sequences are sharded (teacli/train/sharding.py)
    grad_accum = -(-local_seqs // recipe.optim.micro_batch_size)
    trainer_bytes = backend.model_state_bytes(recipe, policy, world)  # before ZeRO-3 partitions the parameters
    # The vllm engine sizes itself from what this process will hold beside it: the trainer's states and a reward
    # model on this device (allocated already, and not part of the trainer's: without it, what the reward model
    # holds hides what the trainer allocates only at its first step, and the engine cannot wake at the second).
    trainer_bytes += reward_bytes
    say(world, f"building the trainer (DeepSpeed ZeRO-{recipe.backend.zero_stage}, {precision})")
    engine = backend.build_engine(policy, recipe, world, grad_accum, precision)
    say(world, f"building the {engine_name} rollout engine")
    rollout = build_rollout(
        dataclasses.replace(recipe.rollout, engine=engine_name), engine.module, tokenizer, policy=recipe.policy, seed=recipe.seed + world.rank,
        max_model_len=recipe.data.max_prompt_tokens + recipe.rollout.max_new_tokens, trainer_bytes=trainer_bytes,
        sampler_logprobs=is_level != "off",  # every sampled token's log-prob only where the correction reads them
        max_sequences=max(local_seqs, validation_sequences(recipe, val_prompts, world.world_size)),  # one call's most (rollout.kv_cache_gib: auto)
    )  # the options reach the vllm engine only (built after the trainer: it sizes itself from what is left)
    sampler = None
    if recipe.rollout.max_staleness and recipe.rollout.colocated:  # split placement samples on ranks of its own
        from teacli.train.offpolicy import open_sampler

        say(world, "loading the sampler's copy of the policy (rollout.max_staleness: 1: one step off-policy)")
        sampler = open_sampler(recipe, loaded.policy, tokenizer, world.device, dtype, recipe.seed + world.rank, kernels)
    if recipe.rehearsal.enabled:  # rehearsal.lengths: realistic: each response ends at a drawn length (teacli/standins)
        standins.end_responses(recipe, rollout, *(sampler[1:] if sampler else ()))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TrainSession(tokenizer, pad_id, engine, reference, reward, rollout, train_prompts, val_prompts, data_report, checkpointing,
                        sampler)
