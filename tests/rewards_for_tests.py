"""Continuous, deterministic rewards (and a user advantage rule) for the tests that train or evaluate a
tiny model: the rule reward is nearly flat on a random model. `tea_env` puts tests/ on PYTHONPATH, so
recipes name them as `rewards_for_tests:length_reward`."""

import os
import time


def length_reward(prompts, responses):
    # Longer responses and more 'the' tokens score higher: a signal a tiny model can learn quickly.
    return [len(r.split()) / 8.0 + 0.5 * r.split().count("the") / 8.0 + 0.001 * (len(r) % 7) for r in responses]


def slow_length_reward(prompts, responses):
    time.sleep(0.4)  # gives a test time to kill the run mid-step
    return length_reward(prompts, responses)


def held_length_reward(prompts, responses):
    """length_reward that waits while the file $TEA_TEST_HOLD exists (at most 5 minutes), after touching
    $TEA_TEST_HOLD.waiting: a test holds a run mid-way, does something beside it, then lets it go on."""
    hold = os.environ.get("TEA_TEST_HOLD")
    if hold and os.path.exists(hold):
        open(hold + ".waiting", "w").close()
        deadline = time.time() + 300
        while os.path.exists(hold) and time.time() < deadline:
            time.sleep(0.05)
    return length_reward(prompts, responses)


def held_at_row_length_reward(prompts, responses):
    """length_reward that, once $TEA_TEST_METRICS has $TEA_TEST_HOLD_ROWS rows, touches $TEA_TEST_HOLD.waiting and
    waits (at most 5 minutes): a test stops a run inside an exact step, however slow the machine is."""
    metrics, rows = os.environ.get("TEA_TEST_METRICS"), int(os.environ.get("TEA_TEST_HOLD_ROWS", "0"))
    if metrics and rows and os.path.exists(metrics) and len(open(metrics).read().splitlines()) >= rows:
        open(os.environ["TEA_TEST_HOLD"] + ".waiting", "w").close()
        deadline = time.time() + 300
        while time.time() < deadline:
            time.sleep(0.05)
    return length_reward(prompts, responses)


def rank_rule(rewards, *, scale=1.0):
    """A user advantage rule by dotted path: centred within-group ranks."""
    ranks = rewards.argsort(-1).argsort(-1).to(rewards.dtype)
    return scale * (ranks - ranks.mean(-1, keepdim=True))


def nan_reward(prompts, responses):
    return [float("nan") if i == 3 else 0.5 for i in range(len(responses))]


_CALLS = {"n": 0}


def flaky_length_reward(prompts, responses):
    """length_reward that raises on the first $TEA_TEST_FLAKY_CALLS calls of the process (a served reward
    that fails, then recovers: `tea serve-rm` answers 500 and the client retries)."""
    _CALLS["n"] += 1
    if _CALLS["n"] <= int(os.environ.get("TEA_TEST_FLAKY_CALLS", "2")):
        raise RuntimeError(f"flaky reward: call {_CALLS['n']} fails on purpose")
    return length_reward(prompts, responses)


def interrupted_length_reward(prompts, responses):
    """length_reward whose call number $TEA_TEST_FAIL_AT (if set) raises ValueError: a run stopped by an
    error mid-way, resumed by running it again without the variable (the recipe stays the same)."""
    _CALLS["n"] += 1
    if str(_CALLS["n"]) == os.environ.get("TEA_TEST_FAIL_AT"):
        raise ValueError(f"interrupted on purpose at reward call {_CALLS['n']}")
    return length_reward(prompts, responses)


def half_flat_length_reward(prompts, responses):
    """length_reward, except that every response to about half of the prompts (by a hash of the prompt
    id) scores 1.0: their groups carry no signal, which rollout.dynamic_sampling drops."""
    import zlib

    scores = length_reward(prompts, responses)
    return [1.0 if zlib.crc32(p.id.encode()) % 2 else s for p, s in zip(prompts, scores)]


def slow_half_flat_length_reward(prompts, responses):
    time.sleep(0.4)  # gives a test time to kill the run mid-step
    return half_flat_length_reward(prompts, responses)


def constant_reward(prompts, responses):
    return [1.0] * len(responses)


def json_error_reward(prompts, responses):
    """A reward whose own parsing fails with a ValueError (json's), the kind that used to reach the user as a
    bare "error: Expecting property name ..." naming neither the reward nor where it was raised."""
    import json

    return [json.loads("{bad: 1}") for _ in responses]
