"""Deterministic rewards for the eval-bon tests (a slow one gives a test time to kill an evaluation)."""

import time


def length_reward(prompts, responses):
    return [len(r.split()) / 8.0 + 0.5 * r.split().count("the") / 8.0 + 0.001 * (len(r) % 7) for r in responses]


def slow_length_reward(prompts, responses):
    time.sleep(0.3)
    return length_reward(prompts, responses)
