"""The vllm engine beside a ZeRO-3 trainer: it generates with its own copy of the weights, so the trainer gathers
nothing for it (`backend.generation_weights`), and its sync check re-scores through the trainer's partitioned
module, whose every forward gathers layers from all ranks, so each rank runs the same number of forwards
(`collective_picks`). Pure functions: no vLLM, no GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from teacli.rollout.vllm_engine import VLLMEngine, collective_picks
from teacli.train import backend


def test_zero3_gathers_the_weights_only_for_an_engine_that_generates_with_the_trainers_module(monkeypatch):
    def no_deepspeed():
        raise AssertionError("gathered")

    monkeypatch.setattr(backend, "_deepspeed", no_deepspeed)
    with backend.generation_weights(object(), 3, SimpleNamespace(shares_weights=False)):
        pass  # the vllm engine: nothing gathered
    assert VLLMEngine.shares_weights is False
    from teacli.rollout.hf import HFEngine

    for rollout in (SimpleNamespace(shares_weights=True), None, HFEngine.__new__(HFEngine)):  # hf; an engine that does not say: gather
        with pytest.raises(AssertionError, match="gathered"):
            with backend.generation_weights(object(), 3, rollout):
                pass
    with backend.generation_weights(object(), 2, None):
        pass  # ZeRO-0/1/2: the weights are whole already


def test_the_sync_check_runs_the_same_number_of_forwards_on_every_rank():
    a, b, c = ("pa", "ca"), ("pb", "cb"), ("pc", "cc")
    # Without ZeRO-3 (forwards = 0): each pick once.
    assert collective_picks([a, b], [[1], [2]], 0) == [(*a, True), (*b, True)]
    # ZeRO-3: exactly 4 forwards; repeats are not counted twice.
    assert collective_picks([a, b, c], [[1], [2], [3]], 4) == [(*a, True), (*b, True), (*c, True), (*a, False)]
    assert collective_picks([a], [[1]], 4) == [(*a, True)] + [(*a, False)] * 3
    four = [a, b, c, ("pd", "cd")]
    assert collective_picks(four, [[1]] * 4, 4) == [(*p, True) for p in four]
    # No completion to check (every first sample empty): the first prompt alone, only to take part.
    assert collective_picks([], [[5, 6], [7]], 4) == [([5, 6], None, False)] * 4
    for n in range(0, 5):  # whatever a rank generated, 4 forwards
        assert len(collective_picks([a] * n, [[1]] * max(n, 1), 4)) == 4


def test_a_rank_with_no_prompts_still_runs_a_pending_sync_check():
    """A validation share can be empty (more ranks than prompts); the other ranks' checks gather from this one."""
    calls = []
    engine = VLLMEngine.__new__(VLLMEngine)
    engine.cfg = SimpleNamespace(verify_sync=True)
    engine._verify_pending, engine._last_check = True, {"sync_tokens_checked": 128.0}
    engine.check_sync = lambda prompts, groups: calls.append((prompts, groups)) or {}
    assert engine.generate([], 4, None, seed=0) == [] and calls == [([], [])]
    assert engine._verify_pending is False and engine._last_check == {"sync_tokens_checked": 128.0}  # the last real check stays
    assert engine.generate([], 4, None, seed=0) == [] and len(calls) == 1  # nothing pending: nothing run
