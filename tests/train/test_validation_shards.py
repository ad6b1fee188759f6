"""Validation split over ranks (teacli/train/validation.py): rank r validates prompts r, r + world, …, and the ranks'
parts merge into the result one process computes from the same samples. No model: a stand-in rollout and reward
whose samples depend only on the prompt, so every split sees the same samples."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from teacli.config import Recipe
from teacli.train import validation as loop
from teacli.types import Completion

SAMPLES = 4


class Rollout:
    """Prompt k's sample j: the word `pk` k + 1 times, then j words `w`; k + j completion tokens."""

    def generate(self, prompt_ids, n, sampling, seed):
        return [[Completion(token_ids=[7] * (ids[0] + j), text=" ".join([f"p{ids[0]}"] * (ids[0] + 1) + ["w"] * j), finished=True)
                 for j in range(n)] for ids in prompt_ids]


class Reward:
    """A fixed pseudo-random reward a text (the best sample of a prompt is not always its last)."""

    def score(self, prompts, responses):
        return [random.Random(t).uniform(-2, 2) for t in responses]


def prompts(count: int) -> list:
    return [(SimpleNamespace(id=f"p{k}"), [k, 1, 2]) for k in range(count)]  # prompt k: 3 tokens, the first k


def recipe(top: int = 2) -> Recipe:
    r = Recipe()
    r.validation.samples, r.validation.top, r.validation.watch_patterns = SAMPLES, top, ["p3"]
    return r


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("count", range(8))
def test_every_prompt_is_validated_by_exactly_one_rank(world, count):
    items = list(range(count))
    shares = [loop.validation_share(items, r, world) for r in range(world)]
    assert sorted(i for s in shares for i in s) == items  # each once, none lost, even with more ranks than prompts
    assert all(all(i % world == r for i in s) for r, s in enumerate(shares))  # deterministic: rank r's are r mod world
    assert [len(s) for s in shares] == [count // world + (r < count % world) for r in range(world)]
    # the most sequences a rank generates (the engine's KV cache and the progress display): rank 0's share
    assert loop.validation_sequences(recipe(), items, world) == len(shares[0]) * SAMPLES == -(-count // world) * SAMPLES


def expected(count: int, top: int) -> dict:
    """The unsharded result worked out by hand from the stand-ins' samples."""
    texts = [[" ".join([f"p{k}"] * (k + 1) + ["w"] * j) for j in range(SAMPLES)] for k in range(count)]
    rewards = [Reward().score(None, t) for t in texts]
    import torch

    rewards = [torch.tensor(r, dtype=torch.float32).tolist() for r in rewards]  # as scored: float32
    tops = [sum(sorted(r, reverse=True)[:top]) / top for r in rewards]
    picks = [t[max(range(SAMPLES), key=r.__getitem__)] for t, r in zip(texts, rewards)]
    return {"score": sum(tops) / count, "reward_mean": sum(map(sum, rewards)) / (count * SAMPLES), "prompts": count,
            "tokens_prompt_unique": 3 * count, "tokens_prompt": 3 * SAMPLES * count,
            "tokens_completion": sum(k + j for k in range(count) for j in range(SAMPLES)), "picks": picks}


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_merged_parts_equal_the_unsharded_validation(world, monkeypatch):
    """7 prompts over `world` ranks (8: rank 7 has none): the merged dict is the one-process validation's (score,
    reward mean, token counts, the watch over every prompt's pick in prompt order), times are the slowest rank's."""
    count, r = 7, recipe()
    monkeypatch.setattr(loop, "_WATCH_BASELINE", {})
    whole = loop.validate(Rollout(), Reward(), prompts(count), r, seed=0)
    want = expected(count, r.validation.top)
    for key in ("score", "reward_mean"):
        assert whole[key] == pytest.approx(want[key], rel=1e-6), key
    for key in ("prompts", "tokens_prompt_unique", "tokens_prompt", "tokens_completion"):
        assert whole[key] == want[key], key
    assert whole["watch_picks"] == count and whole["watch_pattern_share"] == sum("p3" in t for t in want["picks"]) / count == 1 / 7

    monkeypatch.setattr(loop, "_WATCH_BASELINE", {})
    parts = [loop.validation_part(Rollout(), Reward(), loop.validation_share(prompts(count), k, world), r, seed=k)
             for k in range(world)]
    for k, p in enumerate(parts):
        p["time_generate"], p["time_reward"] = 1.0 + k, 5.0 - k  # the slowest rank differs per phase
    merged = loop.merge_validation(parts, r)
    assert loop._WATCH_BASELINE["picks"] == want["picks"]  # every prompt's pick, in prompt order
    assert merged["sequences_by_rank"] == [SAMPLES * len(range(k, count, world)) for k in range(world)]
    assert merged["time_generate"] == world and merged["time_reward"] == 5.0
    same = {k: v for k, v in whole.items() if k not in ("time_generate", "time_reward", "sequences_by_rank")}
    assert {k: merged[k] for k in same} == same  # exactly: the same rewards, in the same order, in float32


def test_a_rank_without_prompts_generates_nothing():
    class Refuses:
        def generate(self, *args):
            raise AssertionError("generated for an empty share")

    part = loop.validation_part(Refuses(), Reward(), [], recipe(), seed=0)
    assert part["rewards"] == [] and part["picks"] == [] and part["tokens_completion"] == 0


def test_a_rank_without_prompts_still_calls_an_engine_with_its_own_weights():
    """The vllm engine (shares_weights False) is called with no prompts, so that a pending sync check takes part in
    the other ranks' ZeRO-3 gathers; it returns no groups and the part is empty."""
    calls = []

    class OwnWeights:
        shares_weights = False

        def generate(self, prompts, n, sampling, seed):
            calls.append((prompts, n, sampling.max_new_tokens, seed))
            return []

    r = recipe()
    part = loop.validation_part(OwnWeights(), Reward(), [], r, seed=5)
    assert calls == [([], r.validation.samples, r.rollout.max_new_tokens, 5)] and part["rewards"] == []
