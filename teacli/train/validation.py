"""Validation: the paper's selection score of the current weights (mean over the fixed validation prompts of the mean
of the top-k rewards of n samples), split over the ranks and merged into the result one process would compute, with
the reward-hacking watch over each prompt's best sample (teacli/monitors/hacking.py)."""

from __future__ import annotations

from typing import Any

from teacli.monitors import hacking
from teacli.session import generate_and_score
from teacli.train.batching import token_counts


def validation_share(val_prompts: list, rank: int, world_size: int) -> list:
    """The validation prompts rank `rank` of `world_size` validates: every world_size-th from index `rank` on
    (none where the ranks outnumber the prompts). The shares cover every prompt exactly once."""
    return val_prompts[rank::world_size]


def validation_sequences(recipe, val_prompts, world_size: int = 1) -> int:
    """Sequences of one validation call on the rank that generates the most: rank 0, whose share
    (`validation_share`) is ceil(prompts / world_size) prompts."""
    if not recipe.validation.enabled or not val_prompts:
        return 0
    return -(-len(val_prompts) // world_size) * recipe.validation.samples


def validate(rollout, reward, val_prompts, recipe, seed: int) -> dict[str, Any]:
    """The paper's selection score: mean over prompts of the mean of the top-k rewards of n samples
    (all of `val_prompts` in this process; `tea train` splits them over ranks: `validate_on_ranks`)."""
    return merge_validation([validation_part(rollout, reward, val_prompts, recipe, seed)], recipe)


def validation_part(rollout, reward, prompts, recipe, seed: int) -> dict[str, Any]:
    """What one rank's share of a validation contributes (`merge_validation` combines the ranks'): each
    prompt's rewards and best sample's text (the reward-hacking watch's pick), token counts and times."""
    v = recipe.validation
    if not prompts:  # more ranks than prompts: nothing to generate (the vllm engine still runs a pending sync check)
        if not getattr(rollout, "shares_weights", True):
            from teacli.rollout.base import sampling_from

            rollout.generate([], v.samples, sampling_from(recipe.rollout), seed)
        return {"rewards": [], "picks": [], "time_generate": 0.0, "time_reward": 0.0,
                "tokens_prompt_unique": 0, "tokens_prompt": 0, "tokens_completion": 0}
    _, prompt_ids, groups, rewards, t_gen, t_rew = generate_and_score(rollout, reward, prompts, recipe, v.samples, seed)
    picks = hacking.best_of_n([c.text for g in groups for c in g], rewards.flatten().tolist(), v.samples)
    return {"rewards": rewards.tolist(), "picks": picks, "time_generate": t_gen, "time_reward": t_rew,
            **token_counts(prompt_ids, groups)}


def merge_validation(parts: list[dict[str, Any]], recipe) -> dict[str, Any]:
    """The validation result from the ranks' parts (rank order; rank r validated prompts r, r + world, …):
    what one process computes from the same samples. The score and reward mean come from every prompt's
    rewards back in prompt order, token counts are summed, times are the slowest rank's (wall time), and
    the watch sees every prompt's pick in prompt order; the process's first validation is its baseline
    (the same on every rank: each merges the same parts)."""
    import torch

    v = recipe.validation
    world = len(parts)
    n = sum(len(p["rewards"]) for p in parts)
    order = [(i % world, i // world) for i in range(n)]  # prompt i: rank i % world's (i // world)-th
    rewards = torch.tensor([parts[r]["rewards"][j] for r, j in order], dtype=torch.float32).reshape(n, v.samples)
    picks = [parts[r]["picks"][j] for r, j in order]
    top = rewards.topk(min(v.top, v.samples), dim=1).values.mean(dim=1)
    watch = hacking.watch(picks, hacking.compile_patterns(v.watch_patterns), _WATCH_BASELINE.setdefault("picks", picks))
    tokens = {k: sum(p[k] for p in parts) for k in ("tokens_prompt_unique", "tokens_prompt", "tokens_completion")}
    return {"score": float(top.mean()), "prompts": n, "samples": v.samples, "top": v.top,
            "reward_mean": float(rewards.mean()),
            "rule": f"mean of top-{v.top} of {v.samples} samples, {n} prompts",
            "time_generate": max(p["time_generate"] for p in parts), "time_reward": max(p["time_reward"] for p in parts),
            **tokens, "sequences_by_rank": [len(p["rewards"]) * v.samples for p in parts], **watch}


_WATCH_BASELINE: dict[str, list[str]] = {}


def reset_watch_baseline() -> None:
    """Forget the watch's baseline: a run's is its own first validation, not an earlier run's in this process."""
    _WATCH_BASELINE.clear()


def validate_on_ranks(engine, rollout, reward, val_prompts, recipe, world, progress, stage: str) -> dict[str, Any]:
    """The validation score of the current weights, the same on every rank. Each rank generates and scores its
    share of the prompts (`validation_share`) and the parts are gathered (`merge_validation`); a rank with
    none still takes part in every collective (ZeRO-3's parameter gathering, the gather). Its progress
    (rank 0's sequences generated) goes to `progress`."""
    from teacli.train import backend

    share = validation_share(val_prompts, world.rank, world.world_size)
    total = validation_sequences(recipe, share)
    of = f" (this GPU's share of {len(val_prompts)})" if world.world_size > 1 else ""
    progress.stage(stage, 0, total, f"{len(share)} prompts{of} × {recipe.validation.samples} samples")
    reports = hasattr(rollout, "progress")  # the hf engine reports each batch; vllm generates in one call
    if reports:
        rollout.progress = lambda done, _total: progress.stage(stage, done, total)
    rollout.wake()
    try:
        with backend.generation_weights(engine, recipe.backend.zero_stage, rollout):
            # Fixed prompts and seeds: checkpoints are compared on the same samples' randomness. The seed is
            # the rank's (a share's samples depend on the number of ranks, as a step's rollouts do).
            part = validation_part(rollout, reward, share, recipe, seed=recipe.seed + 7 + 1_000_003 * world.rank)
    finally:
        if reports:
            rollout.progress = None
    if not reports:
        progress.stage(stage, total, total)
    # No sleep: the next thing the engine does is the next step's generation, with these same weights
    # (a level-2 sleep would discard them with no push to bring them back).
    return merge_validation(backend.all_gather_object(part), recipe)
