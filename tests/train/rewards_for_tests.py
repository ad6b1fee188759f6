"""Continuous, deterministic rewards for trainer tests (the rule reward is nearly flat on a random model)."""

import time


def length_reward(prompts, responses):
    # Longer responses and more 'the' tokens score higher: a signal a tiny model can learn quickly.
    return [len(r.split()) / 8.0 + 0.5 * r.split().count("the") / 8.0 + 0.001 * (len(r) % 7) for r in responses]


def slow_length_reward(prompts, responses):
    time.sleep(0.4)  # gives a test time to kill the run mid-step
    return length_reward(prompts, responses)


def rank_rule(rewards, *, scale=1.0):
    """A user advantage rule by dotted path: centred within-group ranks."""
    ranks = rewards.argsort(-1).argsort(-1).to(rewards.dtype)
    return scale * (ranks - ranks.mean(-1, keepdim=True))


def nan_reward(prompts, responses):
    return [float("nan") if i == 3 else 0.5 for i in range(len(responses))]
