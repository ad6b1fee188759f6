"""The vllm engine's memory plan on a GPU shared with the trainer (`teacli.memory.memory_plan`):
pure arithmetic, so it runs without vLLM or a GPU. Expected values are worked out here from the rule in its
docstring: the trainer leaves free − max(0, trainer_bytes − allocated); auto takes 90% of that (50% without
sleep); a fixed share must fit in it; a fixed KV cache plus the weights must fit in the share."""

from __future__ import annotations

import pytest

from teacli.memory import kv_bytes_per_token, memory_plan  # imports no vLLM: this runs in the main suite

G = 2**30
# An 80 GiB card; the trainer has 10 GiB allocated, will hold 14 GiB after its first step; 60 GiB free now.
CARD = dict(free=60 * G, total=80 * G, allocated=10 * G, trainer_bytes=14 * G, weights_bytes=1 * G)


def test_auto_is_ninety_percent_of_what_the_trainer_leaves_with_sleep_and_half_without():
    leaves = 60 - (14 - 10)  # GiB
    kwargs, line = memory_plan("auto", None, True, **CARD)
    assert kwargs == {"gpu_memory_utilization": pytest.approx(0.9 * leaves / 80)}
    assert "auto" in line and f"{leaves:.1f} GiB the trainer leaves" in line
    kwargs, _ = memory_plan("auto", None, False, **CARD)
    assert kwargs["gpu_memory_utilization"] == pytest.approx(0.5 * leaves / 80)


def test_a_trainer_that_already_holds_its_state_leaves_what_is_free():
    kwargs, line = memory_plan("auto", None, True, **{**CARD, "allocated": 20 * G})
    assert kwargs["gpu_memory_utilization"] == pytest.approx(0.9 * 60 / 80)
    assert "first step" not in line


def test_a_fixed_share_that_fits_is_passed_as_it_is_and_one_that_does_not_names_the_key_and_what_fits():
    kwargs, _ = memory_plan(0.5, None, True, **CARD)  # 40 GiB of the 56 the trainer leaves
    assert kwargs == {"gpu_memory_utilization": 0.5}
    with pytest.raises(ValueError, match=r"^rollout.gpu_memory_utilization: 0.9 .* 72.0 GiB.* leaves 56.0 GiB.* at most 0.70, or to auto"):
        memory_plan(0.9, None, True, **CARD)


def test_a_fixed_kv_cache_sets_vllms_bytes_and_must_fit_the_share_with_the_weights():
    kwargs, line = memory_plan("auto", 8.0, True, **CARD)
    assert kwargs["kv_cache_memory_bytes"] == 8 * G and "8 GiB (rollout.kv_cache_gib)" in line
    assert kwargs["gpu_memory_utilization"] * 80 * G <= CARD["free"]  # vLLM's own start-up check passes
    share = 0.9 * 56  # 50.4 GiB: 50 GiB of KV cache + 1 GiB of weights do not fit
    with pytest.raises(ValueError, match=rf"^rollout.kv_cache_gib: 50 GiB .* 1.00 GiB of weights exceed the engine's {share:.1f} GiB"):
        memory_plan("auto", 50.0, True, **CARD)


def test_auto_kv_cache_holds_one_calls_sequences_capped_at_half_the_share_after_the_weights():
    """rollout.kv_cache_gib: auto: 512 sequences x 384 tokens x 32 KiB a token = 6 GiB, +25% = 7.5 GiB, fixed as
    vLLM's KV cache (the share, 0.9 x 56 = 50.4 GiB, keeps its size: vLLM's start-up check reads it). When one
    call's sequences would take more than half of the share after the 1 GiB of weights, (50.4 - 1) / 2 = 24.7 GiB,
    or the sequences are not known, the cache is that half: a cache of the whole share (null) is what failed to wake
    once a trainer held more than its estimate."""
    kwargs, line = memory_plan("auto", "auto", True, **CARD, kv_needed=(512, 384, 32 * 1024))
    assert kwargs["kv_cache_memory_bytes"] == int(7.5 * G)
    assert kwargs["gpu_memory_utilization"] == pytest.approx(0.9 * 56 / 80)
    assert "7.50 GiB (rollout.kv_cache_gib auto: 512 sequences x 384 tokens x 32 KiB, +25%)" in line
    half = (0.9 * 56 - 1) / 2
    kwargs, line = memory_plan("auto", "auto", True, **CARD, kv_needed=(512, 2048, 32 * 1024))  # 40 GiB > 24.7
    assert kwargs["kv_cache_memory_bytes"] == pytest.approx(half * G, abs=1)
    assert "= 40.0 GiB at their longest, capped at 50% of the share after the weights" in line
    kwargs, line = memory_plan("auto", "auto", True, **CARD)
    assert kwargs["kv_cache_memory_bytes"] == pytest.approx(half * G, abs=1) and "not known" in line


def test_kv_bytes_per_token_of_standard_and_grouped_query_configs():
    import torch
    from transformers import LlamaConfig

    # Llama-3.2-1B: 16 layers, 8 KV heads of 64 (2048 / 32): 16 x 8 x 64 x 2 (K and V) x 2 bytes = 32 KiB
    llama = LlamaConfig(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8)
    assert kv_bytes_per_token(llama, torch.bfloat16) == 32 * 1024
    assert kv_bytes_per_token(llama, torch.float32) == 64 * 1024
    # no num_key_value_heads: every head has its own K and V; an explicit head_dim wins over hidden / heads
    mha = LlamaConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, head_dim=128)
    mha.num_key_value_heads = None
    assert kv_bytes_per_token(mha, torch.bfloat16) == 2 * 4 * 128 * 2 * 2
    assert kv_bytes_per_token(object(), torch.bfloat16) is None


def test_sampled_logprobs_read_flat_and_classic_vllm_logprobs_alike():
    """The sampled tokens' log-probs come out the same from vLLM's FlatLogprobs (flat lists with start/end
    indices per position; the sampled token's entry found by its id) and from the classic list of
    {token id: Logprob}; positions past the cut ids (an EOS) are ignored."""
    from types import SimpleNamespace

    from teacli.rollout.vllm_engine import sampled_logprobs

    ids = [5, 9, 5]
    # position 1 carries a second entry (as with logprobs=k > 0): the sampled token's is the one read
    entries = [[(5, -0.25)], [(2, -0.5), (9, -1.5)], [(5, -3.0)], [(0, -0.1)]]
    classic = [{tok: SimpleNamespace(logprob=lp) for tok, lp in pos} for pos in entries]
    starts, ends, tokens, values = [], [], [], []
    for pos in entries:
        starts.append(len(tokens))
        tokens += [tok for tok, _ in pos]
        values += [lp for _, lp in pos]
        ends.append(len(tokens))
    flat = SimpleNamespace(start_indices=starts, end_indices=ends, token_ids=tokens, logprobs=values)
    assert sampled_logprobs(classic, ids) == sampled_logprobs(flat, ids) == [-0.25, -1.5, -3.0]
