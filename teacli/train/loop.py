"""`tea train`: the grouped on-policy training loop, top to bottom.

One step (paper, "Training interface"): sample P prompts → m rollouts each from the current
policy → score with the reward model → advantages A = rule(rewards[P, m]) → the policy gradient
(1/m)·Σ A_i ∇log π(y_i|x) with A as stop-gradient weights, plus β·KL to the frozen reference →
one optimizer step. Every `save_every` steps: validate (128 prompts × 32 samples, mean of the
top-10 rewards per prompt) and save an HF checkpoint with the trainer state; the best validated
checkpoint is named in selected.json. Re-running on the same run directory resumes from the last
complete checkpoint with the same data order and RNG.

Multi-process: `prompts_per_step` is global; each rank takes its share of the step's prompts.
"""

from __future__ import annotations

import json
import random
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.rundir import RunDir, step_dir_name, write_text_atomic
from teacli.train.checkpoint import save_hf_model

if TYPE_CHECKING:
    import torch

    from teacli.config import Recipe
    from teacli.types import Completion, Prompt


class TrainError(RuntimeError):
    """A training problem the user can act on (named cause and recipe key)."""


# ------------------------------------------------------------------------------------------------
# Setup


@lru_cache(maxsize=2)
def prompt_order(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The data order of one pass over n prompts: a seeded permutation, identical on resume.

    Cached: every step reads the current epoch's order, which is shuffled once.
    """
    order = list(range(n))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return tuple(order)


def step_prompts(prompts: list["Prompt"], step: int, per_step: int, seed: int) -> list["Prompt"]:
    """The prompts of global step `step` (deterministic in step, so resume replays nothing twice)."""
    n = len(prompts)
    start = step * per_step
    out = []
    for k in range(start, start + per_step):
        epoch, pos = divmod(k, n)
        out.append(prompts[prompt_order(n, seed, epoch)[pos]])
    return out


def encode_prompts(tokenizer, prompts: list["Prompt"], max_tokens: int) -> tuple[list["Prompt"], list[list[int]], int]:
    """Chat-template each prompt; drop (and count) prompts over `max_tokens`."""
    from teacli.models import encode_chat

    kept, ids, skipped = [], [], 0
    for p in prompts:
        toks = encode_chat(tokenizer, p.messages, add_generation_prompt=True)
        if len(toks) > max_tokens:
            skipped += 1
            continue
        kept.append(p)
        ids.append(list(toks))
    return kept, ids, skipped


def pack(prompt_ids: list[list[int]], completions: list[list[int]], pad_id: int, device) -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor", int]:
    """Left-pad prompts and right-pad completions into one batch.

    Returns input_ids [B, Lp+Tc], attention_mask [B, Lp+Tc], completion mask [B, Tc], Lp.
    """
    import torch

    lp = max(len(p) for p in prompt_ids)
    tc = max(1, max(len(c) for c in completions))
    B = len(prompt_ids)
    input_ids = torch.full((B, lp + tc), pad_id, dtype=torch.long)
    attn = torch.zeros((B, lp + tc), dtype=torch.long)
    cmask = torch.zeros((B, tc), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completions)):
        input_ids[i, lp - len(p) : lp] = torch.tensor(p, dtype=torch.long)
        attn[i, lp - len(p) : lp] = 1
        if c:
            input_ids[i, lp : lp + len(c)] = torch.tensor(c, dtype=torch.long)
            attn[i, lp : lp + len(c)] = 1
            cmask[i, : len(c)] = 1
    return input_ids.to(device), attn.to(device), cmask.to(device), lp


def _setup(recipe: "Recipe", world):
    """Models, reward, data, engines: everything the loop needs, built once."""
    import torch

    from teacli import models
    from teacli.data.load import load_split
    from teacli.rewards import build_reward
    from teacli.rollout.factory import build_engine as build_rollout
    from teacli.train import backend

    precision = backend.resolve_precision(recipe.backend.precision, world.device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    tokenizer = models.load_tokenizer(recipe.policy)
    policy = models.load_policy(recipe.policy, dtype=torch.float32, device=world.device)
    if backend.gradient_checkpointing(recipe, policy, world):  # `auto`: only when memory needs it
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        policy.config.use_cache = False
    reference = None
    if recipe.kl.beta > 0:
        if recipe.policy.lora.enabled:
            reference = "adapters-disabled"
        else:
            reference = models.load_policy(recipe.policy, dtype=dtype, device=world.device)
            reference.eval().requires_grad_(False)
    if recipe.policy.lora.enabled:
        from teacli.lora import apply_lora

        policy = apply_lora(policy, recipe.policy.lora)

    train_prompts = load_split(recipe.data.dir, recipe.data.train_split)
    val_prompts = load_split(recipe.data.dir, recipe.data.val_split)[: recipe.validation.prompts]
    reward = build_reward(recipe.reward, device=world.device, tokenizer=tokenizer)

    P, m = recipe.rollout.prompts_per_step, recipe.rollout.group_size
    if P % world.world_size:
        raise TrainError(f"rollout.prompts_per_step={P} must be divisible by the number of processes ({world.world_size})")
    local_seqs = (P // world.world_size) * m
    grad_accum = -(-local_seqs // recipe.optim.micro_batch_size)
    engine = backend.build_engine(policy, recipe, world, grad_accum, precision)
    rollout = build_rollout(
        recipe.rollout, engine.module, tokenizer, policy=recipe.policy, seed=recipe.seed + world.rank,
        max_model_len=recipe.data.max_prompt_tokens + recipe.rollout.max_new_tokens,
    )  # the options reach the vllm engine only
    return tokenizer, engine, reference, reward, train_prompts, val_prompts, rollout


# ------------------------------------------------------------------------------------------------
# The step


def generate_and_score(rollout, tokenizer, reward, prompts, recipe, n: int, seed: int):
    """m completions per prompt and their rewards [P, n]; prompts over the length limit are dropped."""
    import torch

    from teacli.rewards import checked_score
    from teacli.types import SamplingConfig

    r = recipe.rollout
    sampling = SamplingConfig(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens)
    prompts, prompt_ids, skipped = encode_prompts(tokenizer, prompts, recipe.data.max_prompt_tokens)
    if not prompts:
        raise TrainError(f"every prompt of this batch exceeds data.max_prompt_tokens={recipe.data.max_prompt_tokens}")
    t0 = time.perf_counter()
    groups: list[list[Completion]] = rollout.generate(prompt_ids, n, sampling, seed)
    t1 = time.perf_counter()
    flat_prompts = [p for p in prompts for _ in range(n)]
    flat_text = [c.text for g in groups for c in g]
    rewards = checked_score(reward, flat_prompts, flat_text).reshape(len(prompts), n).to(torch.float32)
    t2 = time.perf_counter()
    return prompts, prompt_ids, groups, rewards, skipped, t1 - t0, t2 - t1


def _ref_logprobs(reference, engine, input_ids, attn, lp):
    import torch

    from teacli.logprobs import token_logprobs

    with torch.no_grad():
        if reference == "adapters-disabled":
            with engine.module.disable_adapter():
                return token_logprobs(engine.module, input_ids, attn, lp)
        return token_logprobs(reference, input_ids, attn, lp)


def train_step(engine, reference, recipe, prompt_ids, groups, advantages, pad_id, device) -> dict[str, float]:
    """Micro-batched forward/backward over the step's sequences, then one optimizer step."""
    from teacli.logprobs import token_logprobs
    from teacli.train.loss import policy_loss

    seq_prompt = [prompt_ids[p] for p, g in enumerate(groups) for _ in g]
    seq_comp = [c.token_ids for g in groups for c in g]
    seq_adv = advantages.reshape(-1)
    total = len(seq_comp)
    mb = recipe.optim.micro_batch_size
    stats: dict[str, float] = {}
    t_ref = 0.0
    engine.train()
    for start in range(0, total, mb):
        sl = slice(start, start + mb)
        input_ids, attn, cmask, lp = pack(seq_prompt[sl], seq_comp[sl], pad_id, device)
        t0 = time.perf_counter()
        ref = _ref_logprobs(reference, engine, input_ids, attn, lp) if reference is not None else None
        t_ref += time.perf_counter() - t0
        logp = token_logprobs(engine, input_ids, attn, lp)
        # DeepSpeed divides by gradient_accumulation_steps; scale so the step averages over `total`.
        loss, s = policy_loss(logp, cmask, seq_adv[sl].to(device), ref, recipe.kl.beta, recipe.kl.estimator, total)
        engine.backward(loss * engine.gradient_accumulation_steps())
        engine.step()
        for k, v in s.items():
            stats[k] = stats.get(k, 0.0) + v  # each term is already divided by `total`
    # ceil(total / micro_batch_size) == gradient_accumulation_steps, so the last call stepped.
    grad_norm = engine.get_global_grad_norm()
    stats["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
    stats["time_ref_logprobs"] = t_ref
    return stats


# ------------------------------------------------------------------------------------------------
# Validation and checkpoints


def validate(rollout, tokenizer, reward, val_prompts, recipe, seed: int) -> dict[str, Any]:
    """The paper's selection score: mean over prompts of the mean of the top-k rewards of n samples."""
    v = recipe.validation
    prompts, _, _, rewards, skipped, _, _ = generate_and_score(rollout, tokenizer, reward, val_prompts, recipe, v.samples, seed)
    top = rewards.topk(min(v.top, rewards.shape[1]), dim=1).values.mean(dim=1)
    return {"score": float(top.mean()), "prompts": len(prompts), "samples": v.samples, "top": v.top,
            "reward_mean": float(rewards.mean()), "skipped_prompts": skipped,
            "rule": f"mean of top-{v.top} of {v.samples} samples, {len(prompts)} prompts"}


def save_checkpoint(run: RunDir, engine, tokenizer, recipe, world, step: int, extra_state: dict[str, Any]) -> Path:
    import torch

    from teacli.config import to_yaml
    from teacli.train import backend

    tmp = run.tmp_checkpoint(step)
    if world.is_main:
        tmp.mkdir(parents=True, exist_ok=True)
    backend.barrier()
    state = backend.full_state_dict(engine.module, recipe.backend.zero_stage, world.is_main)
    backend.save_engine_state(engine, str(tmp / "trainer"), tag="state")
    if world.is_main:
        save_hf_model(engine.module, state, tokenizer, tmp, recipe.policy.lora.enabled)
        (tmp / "recipe.yaml").write_text(to_yaml(recipe))
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
        write_text_atomic(tmp / "trainer_state.json", json.dumps({"step": step, **extra_state}, indent=2))
        run.commit_checkpoint(step)
    backend.barrier()
    return run.checkpoints / step_dir_name(step)


# ------------------------------------------------------------------------------------------------
# The run


def train(recipe: "Recipe", run_dir: Path) -> Path:
    """Run (or resume) training of `recipe` into `run_dir`; returns the run directory."""
    import torch

    from teacli.advantages import compute_advantages
    from teacli.train import backend
    from teacli.train.progress import Progress, check_trackers, metrics_sink

    check_trackers(recipe)  # an uninstalled tracker fails before any model is loaded
    world = backend.init_world()
    run = RunDir(run_dir)
    resume = _prepare_run_dir(run, recipe, world)
    torch.manual_seed(recipe.seed + world.rank)
    random.seed(recipe.seed + world.rank)

    tokenizer, engine, reference, reward, train_prompts, val_prompts, rollout = _setup(recipe, world)
    start = 0
    if resume is not None:
        step_done, path = resume
        backend.load_engine_state(engine, str(path / "trainer"), tag="state")
        rng = torch.load(path / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        start = step_done
    # Engines with their own copy of the weights (vllm) get the trainer's, now and after every update.
    rollout.load_weights(backend.named_weights(engine.module, recipe.backend.zero_stage))
    P, m = recipe.rollout.prompts_per_step, recipe.rollout.group_size
    local_P = P // world.world_size
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    sink = metrics_sink(run, recipe, world, start)
    adv_params = dict(recipe.advantage.params)
    if recipe.advantage.name == "chow":
        adv_params["generator"] = torch.Generator().manual_seed(recipe.seed * 7919 + world.rank + start)
    progress = Progress(recipe.optim.steps, start, enabled=world.is_main, name=recipe.name)
    phase = "setup"
    try:
        has_baseline = backend.broadcast_object(any(r.get("step") == 0 for r in run.read_jsonl(run.validation)))
        if start == 0 and recipe.validation.enabled and recipe.validation.at_start and not has_baseline:
            # The untrained policy's score: the baseline every checkpoint is compared with.
            phase = "validation (validation.samples, rollout.batch_size)"
            result = _validation(engine, rollout, tokenizer, reward, val_prompts, recipe)
            if world.is_main:
                sink.validation({"step": 0, **result})
                sink.note(f"step 0 (untrained policy): validation {result['score']:.4f}")
        for step in range(start, recipe.optim.steps):
            t_step = time.perf_counter()
            phase = "generation (rollout.batch_size, rollout.max_new_tokens)"
            batch = step_prompts(train_prompts, step, P, recipe.seed)[world.rank * local_P : (world.rank + 1) * local_P]
            rollout.wake()
            with backend.generation_weights(engine, recipe.backend.zero_stage):
                prompts, prompt_ids, groups, rewards, skipped, t_gen, t_rew = generate_and_score(
                    rollout, tokenizer, reward, batch, recipe, m, seed=recipe.seed * 1_000_003 + step * 131 + world.rank
                )
            rollout.sleep()
            try:
                advantages = compute_advantages(recipe.advantage.name, rewards.double(), **adv_params).float()
            except ValueError as exc:
                raise TrainError(f"advantage.name={recipe.advantage.name!r}: {exc}") from None
            phase = "training (optim.micro_batch_size, policy.gradient_checkpointing)"
            t0 = time.perf_counter()
            stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, pad_id, world.device)
            t_train = time.perf_counter() - t0 - stats.pop("time_ref_logprobs")
            t_ref = time.perf_counter() - t0 - t_train
            t0 = time.perf_counter()
            rollout.load_weights(backend.named_weights(engine.module, recipe.backend.zero_stage))
            t_sync = time.perf_counter() - t0
            lengths = torch.tensor([len(c.token_ids) for g in groups for c in g], dtype=torch.float32)
            elapsed = time.perf_counter() - t_step
            record = {
                "step": step + 1,
                "reward_mean": float(rewards.mean()), "reward_max": float(rewards.max(dim=1).values.mean()),
                "reward_std": float(rewards.std(dim=1, correction=0).mean()),
                "adv_mean": float(advantages.mean()), "adv_std": float(advantages.std(correction=0)),
                "adv_min": float(advantages.min()), "adv_max": float(advantages.max()),
                "adv_nonzero_frac": float((advantages.abs() > 1e-12).float().mean()),
                **stats,
                "lr": float(engine.get_lr()[0]),
                "gen_len_mean": float(lengths.mean()), "gen_finished_frac": float(sum(c.finished for g in groups for c in g) / lengths.numel()),
                "skipped_prompts": skipped,
                "time_generate": t_gen, "time_reward": t_rew, "time_ref_logprobs": t_ref, "time_train": t_train, "time_sync": t_sync,
                "time_step": elapsed, "tokens_per_s": float(lengths.sum()) * world.world_size / max(t_gen, 1e-9),
                **rollout.stats(),  # vllm: log-prob agreement with the trainer after the last push
            }
            local, record = record, {"step": step + 1, **backend.all_reduce_mean({k: v for k, v in record.items() if k != "step"})}
            sink.write(record, local=local)
            progress.update(record)
            if (step + 1) % recipe.checkpoint.save_every == 0 or step + 1 == recipe.optim.steps:
                phase = "validation and checkpoint (validation.samples, rollout.batch_size)"
                _checkpoint_and_validate(run, engine, rollout, tokenizer, reward, val_prompts, recipe, world, step + 1, sink)
    except torch.OutOfMemoryError:
        raise TrainError(
            f"out of memory during {phase}: lower the recipe keys named there, or use backend.zero_stage: 3 "
            f"and backend.offload_optimizer: true; the run directory keeps its last complete checkpoint"
        ) from None
    finally:
        progress.close()
        sink.close()
    return run.path


def _checkpoint_and_validate(run, engine, rollout, tokenizer, reward, val_prompts, recipe, world, step, sink) -> None:
    from teacli.train import backend

    if recipe.validation.enabled:
        result = _validation(engine, rollout, tokenizer, reward, val_prompts, recipe)
    save_checkpoint(run, engine, tokenizer, recipe, world, step, {"data_position": step * recipe.rollout.prompts_per_step})
    if world.is_main:
        if recipe.validation.enabled:
            sink.validation({"step": step, **result})
            selected = run.update_selection()
            sink.note(f"step {step}: validation {result['score']:.4f}; selected step {selected['step']}")
        run.prune(recipe.checkpoint.keep_last)
    backend.barrier()


def _validation(engine, rollout, tokenizer, reward, val_prompts, recipe) -> dict[str, Any]:
    from teacli.train import backend

    rollout.wake()
    with backend.generation_weights(engine, recipe.backend.zero_stage):
        # Fixed prompts and seed: checkpoints are compared on the same samples' randomness.
        result = validate(rollout, tokenizer, reward, val_prompts, recipe, seed=recipe.seed + 7)
    rollout.sleep()
    return backend.broadcast_object(result)


def _prepare_run_dir(run: RunDir, recipe: "Recipe", world) -> tuple[int, Path] | None:
    """Create the run directory, or find where to resume; refuse to mix different recipes."""
    from teacli.config import to_yaml
    from teacli.train import backend

    resolved = to_yaml(recipe)
    resume = None
    if world.is_main:
        run.path.mkdir(parents=True, exist_ok=True)
        if run.recipe.exists() and run.recipe.read_text() != resolved:
            import difflib

            diff = "".join(difflib.unified_diff(run.recipe.read_text().splitlines(True), resolved.splitlines(True), "run recipe.yaml", "this recipe", n=0))
            raise TrainError(
                f"{run.recipe} holds a different recipe; resume with the same recipe or choose another --run-dir:\n{diff[:2000]}"
            )
        run.clean_partial()
        resume = run.latest_checkpoint()
        done = resume[0] if resume else 0
        run.truncate_after(run.metrics, done)
        run.truncate_after(run.validation, done)
        if not run.recipe.exists():
            write_text_atomic(run.recipe, resolved)
    backend.barrier()
    return backend.broadcast_object(resume)
