"""One sampling session: what samples and scores for a recipe (and a checkpoint), built in one place.

`tea train` (teacli/train/setup.py), `tea eval-bon` (teacli/eval/bon.py) and `tea diagnose alignment`
(teacli/diagnostics/alignment.py) all start from here; none builds a tokenizer, a prompt encoding, an engine or a
chunked scorer of its own:

  policy_config(policy, checkpoint)      the policy settings that load `checkpoint` (an HF directory whose LoRA
                                         adapters were merged on save), or the recipe's policy
  open_tokenizer(policy, stop_tokens)    the tokenizer, its rollout.stop_tokens checked before anything is written
  encode_prompts(tokenizer, prompts, n)  the chat-templated prompts within data.max_prompt_tokens, the dropped lengths
  Sampler.open(...)                      the policy, the reward and the generation engine on a device, awake
  generate_and_score(...)                n completions per prompt and their rewards [P, n]: a training step's
                                         and a validation's sampling
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from teacli.config import PolicyConfig, Recipe, RewardConfig, RolloutConfig
    from teacli.types import Completion, Prompt


def policy_config(policy: "PolicyConfig", checkpoint: Path | None) -> "PolicyConfig":
    """`policy` itself, or the settings that load `checkpoint` with its own tokenizer (adapters merged: no LoRA)."""
    if checkpoint is None:
        return policy
    return dataclasses.replace(policy, name_or_path=str(Path(checkpoint).resolve()), gguf_file=None, revision=None,
                               lora=dataclasses.replace(policy.lora, enabled=False))


def open_tokenizer(policy: "PolicyConfig", stop_tokens: list[str]):
    """The policy's tokenizer; ValueError when it cannot load or a stop token is not one token of it."""
    from teacli import models
    from teacli.rollout.base import stop_token_ids

    tokenizer = models.load_tokenizer(policy)
    stop_token_ids(tokenizer, stop_tokens)
    return tokenizer


def encode_prompts(tokenizer, prompts: list["Prompt"], max_tokens: int,
                   limit: int | None = None) -> tuple[list[tuple["Prompt", list[int]]], list[int]]:
    """Chat-template each prompt: (prompt, token ids) of those within `max_tokens`, and the dropped ones' lengths;
    with `limit`, stop once that many are kept."""
    from teacli.models import encode_chat

    kept, dropped = [], []
    for p in prompts:
        if limit is not None and len(kept) >= limit:
            break
        toks = list(encode_chat(tokenizer, p.messages, add_generation_prompt=True))
        if len(toks) > max_tokens:
            dropped.append(len(toks))
        else:
            kept.append((p, toks))
    return kept, dropped


@dataclass
class Sampler:
    """A policy, its generation engine and a reward, ready to sample and score (evaluation and diagnostics)."""

    model: Any
    engine: Any
    reward: Any
    sampling: Any  # teacli.types.SamplingConfig
    score_batch_size: int

    @classmethod
    def open(cls, recipe: "Recipe", policy: "PolicyConfig", tokenizer, device, *, rollout: "RolloutConfig | None" = None,
             reward: "RewardConfig | None" = None, dtype: Any = None) -> "Sampler":
        """Load `policy` on `device` (eval mode), build the reward (default recipe.reward) and the engine (default
        recipe.rollout; the vllm engine starts from placeholder weights and gets the policy's through load_weights,
        a no-op for the hf engine, which samples with the model itself). ValueError for a model or reward that
        cannot load."""
        from teacli import models
        from teacli.rewards import build_reward
        from teacli.rollout.base import sampling_from
        from teacli.rollout.factory import build_engine

        rollout = rollout or recipe.rollout
        models.allow_cudnn_attention(recipe.backend.cudnn_attention)
        model = models.load_policy(policy, dtype=dtype, device=device).eval()
        scorer = build_reward(reward or recipe.reward, device=device, tokenizer=tokenizer)
        engine = build_engine(rollout, model, tokenizer, policy=policy, seed=recipe.seed,
                              max_model_len=recipe.data.max_prompt_tokens + rollout.max_new_tokens,
                              sampler_logprobs=False)  # nothing here reads them (vllm: only the sync check's)
        engine.load_weights(model.named_parameters())
        engine.wake()
        return cls(model, engine, scorer, sampling_from(rollout), recipe.eval.score_batch_size)

    def generate(self, prompt_ids: list[list[int]], n: int, seed: int) -> list[list["Completion"]]:
        """n completions for each prompt, one group per prompt."""
        return self.engine.generate(prompt_ids, n, self.sampling, seed)

    def score(self, prompt: "Prompt", texts: list[str]) -> list[float]:
        """The rewards of `texts` answering `prompt`, scored eval.score_batch_size at a time."""
        from teacli.rewards import checked_score

        scores: list[float] = []
        for start in range(0, len(texts), self.score_batch_size):
            chunk = texts[start : start + self.score_batch_size]
            scores.extend(checked_score(self.reward, [prompt] * len(chunk), chunk).tolist())
        return scores

    def close(self) -> None:
        self.engine.sleep()


def generate_and_score(rollout, reward, batch, recipe, n: int, seed: int):
    """n completions per prompt of `batch` ((prompt, token ids) pairs from encode_splits) and their rewards [P, n]."""
    import torch

    from teacli.rewards import checked_score
    from teacli.rollout.base import sampling_from

    sampling = sampling_from(recipe.rollout)
    prompts, prompt_ids = [p for p, _ in batch], [ids for _, ids in batch]
    t0 = time.perf_counter()
    groups: list[list[Completion]] = rollout.generate(prompt_ids, n, sampling, seed)
    t1 = time.perf_counter()
    flat_prompts = [p for p in prompts for _ in range(n)]
    flat_text = [c.text for g in groups for c in g]
    rewards = checked_score(reward, flat_prompts, flat_text).reshape(len(prompts), n).to(torch.float32)
    t2 = time.perf_counter()
    return prompts, prompt_ids, groups, rewards, t1 - t0, t2 - t1
