"""HFRewardModel on a tiny random LlamaForSequenceClassification: batching, pooling, templates."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import make_reward_model, make_tokenizer, save

from teacli.config import RewardConfig
from teacli.rewards import build_reward, checked_score
from teacli.rewards.hf import HFRewardModel, score_by_length
from teacli.types import Prompt

PROMPTS = [
    Prompt(id="p0", messages=({"role": "user", "content": "what is the capital of france"},)),
    Prompt(id="p1", messages=({"role": "system", "content": "please answer in one sentence"}, {"role": "user", "content": "a dog ran"})),
    Prompt(id="p2", messages=({"role": "user", "content": "write a short poem about the sea and the sky and the cat"},)),
]
RESPONSES = ["paris", "the dog ran in the park with a red ball", "", "the sea the sky", "one two three four five six seven", "cat"]


def batch():
    prompts = [PROMPTS[i % 3] for i in range(len(RESPONSES))]
    return prompts, RESPONSES


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    tok = make_tokenizer()
    return save(make_reward_model(tok), tok, tmp_path_factory.mktemp("rm"))


@pytest.fixture(scope="module")
def rm(rm_dir) -> HFRewardModel:
    return HFRewardModel.from_pretrained(str(rm_dir), dtype="float32", device="cpu", batch_size=4)


def unbatched(rm: HFRewardModel, prompts, responses) -> torch.Tensor:
    """The model's own forward on one unpadded example at a time, pooled at the last token."""
    pad = rm.model.config.pad_token_id
    rm.model.config.pad_token_id = None  # batch of 1 without a pad id: transformers pools at position -1
    try:
        with torch.no_grad():
            return torch.tensor([float(rm.model(torch.tensor([rm.encode(p, r)]), use_cache=False).logits[0, 0]) for p, r in zip(prompts, responses)])
    finally:
        rm.model.config.pad_token_id = pad


def test_scores_equal_unbatched_scores(rm):
    prompts, responses = batch()
    scores = rm.score(prompts, responses)
    assert scores.shape == (len(responses),) and scores.dtype == torch.float32 and scores.device.type == "cpu"
    assert len({len(rm.encode(p, r)) for p, r in zip(prompts, responses)}) > 3  # padding in every batch
    torch.testing.assert_close(scores, unbatched(rm, prompts, responses), atol=1e-5, rtol=1e-5)
    assert scores.std() > 0


@pytest.mark.parametrize("batch_size", [1, 2, 5, 64])
def test_batching_and_tokenizer_padding_side_do_not_matter(rm, batch_size):
    prompts, responses = batch()
    reference = rm.score(prompts, responses)
    old = rm.batch_size, rm.tokenizer.padding_side
    rm.batch_size, rm.tokenizer.padding_side = batch_size, "left"
    try:
        torch.testing.assert_close(rm.score(prompts, responses), reference, atol=1e-5, rtol=1e-5)
    finally:
        rm.batch_size, rm.tokenizer.padding_side = old


def test_every_batch_is_packed_before_the_first_forward():
    """score_by_length packs (and moves) every batch before the first forward: a copy from the host's pageable memory
    between two forwards waits for the GPU to finish the first. Longest first, in original order at the end."""
    events = []

    def pack(batch):
        events.append("pack")
        return (torch.tensor([float(len(ids)) for ids in batch]),)

    def forward(lengths):
        events.append("forward")
        return 10 * lengths

    encoded = [[7] * n for n in (3, 1, 4, 1, 5)]
    scores = score_by_length(torch.nn.Linear(1, 1), encoded, 2, pack, forward)
    assert events == ["pack"] * 3 + ["forward"] * 3
    assert scores.tolist() == [30.0, 10.0, 40.0, 10.0, 50.0] and scores.dtype == torch.float32


def test_batches_compute_the_fewest_tokens_and_none_more_than_the_longest_rows():
    """As many batches as batch_size rows make, cut where they compute the fewest tokens (rows × longest) with none
    above batch_size of the longest rows (3·10 = 30): lengths 10, 10, 1, 1, 1, 1 in batches of 3 are [10, 10] +
    [1, 1, 1, 1] (2·10 + 4·1 = 24 tokens, no padding), not [10, 10, 1] + [1, 1, 1] (30 + 3 = 33, 9 of them padding);
    the batch of short rows holds more than batch_size of them."""
    sizes = []

    def pack(batch):
        sizes.append([len(ids) for ids in batch])
        return (torch.tensor([float(len(ids)) for ids in batch]),)

    scores = score_by_length(torch.nn.Linear(1, 1), [[7] * n for n in (1, 10, 1, 1, 10, 1)], 3, pack, lambda x: x)
    assert sizes == [[10, 10], [1, 1, 1, 1]] and scores.tolist() == [1.0, 10.0, 1.0, 1.0, 10.0, 1.0]


def test_a_decoder_pooled_by_tea_scores_without_the_attention_mask(rm, monkeypatch):
    """The right-padded batch of a decoder tea pools itself runs without a mask (causal attention: no real token sees the
    padding after it), and its scores are still the unbatched ones (test_scores_equal_unbatched_scores). Whole
    conversations: the shared prompts' path needs its mask for the prefixes' padding (test_hf_shared.py)."""
    assert rm._own_pooling
    monkeypatch.setattr(rm, "share_prompts", False)
    seen = []
    real = rm.model.base_model.forward

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attention_mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(rm.model.base_model, "forward", spy)
    prompts, responses = batch()
    torch.testing.assert_close(rm.score(prompts, responses), unbatched(rm, prompts, responses), atol=1e-5, rtol=1e-5)
    assert seen and all(m is None for m in seen)


@pytest.mark.parametrize("own_pooling", [True, False])
def test_scoring_keeps_no_kv_cache_even_where_the_config_asks_for_one(rm, monkeypatch, own_pooling):
    """Skywork's reward model's config says use_cache: true; scoring must not build a cache (it holds every layer's
    keys and values for the whole forward, and makes a compiled forward recompile). Whole conversations: keeping a group's
    prefix is the point of the shared prompts' path (test_hf_shared.py)."""
    from transformers import cache_utils

    monkeypatch.setattr(rm, "share_prompts", False)
    def no_cache(*args, **kwargs):
        raise AssertionError("the reward forward built a KV cache")

    monkeypatch.setattr(rm.model.config, "use_cache", True)
    monkeypatch.setattr(rm, "_own_pooling", own_pooling)
    monkeypatch.setattr(cache_utils.DynamicCache, "__init__", no_cache)
    prompts, responses = batch()
    torch.testing.assert_close(rm.score(prompts, responses), unbatched(rm, prompts, responses), atol=1e-5, rtol=1e-5)


def test_template_is_the_rms_own_and_bos_is_not_doubled(rm):
    ids = rm.encode(PROMPTS[0], "paris")
    tok = rm.tokenizer
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
    text = tok.decode(ids)
    assert text.startswith("<bos> <|user|> what is the capital of france <eos> <|assistant|> paris <eos>")


def test_pad_equal_to_eos_still_scores_the_last_token():
    """A Llama RM tokenizer without a pad token: pad becomes eos, which also ends every turn.
    transformers' own pooling would then read the token before the final eos."""
    tok = make_tokenizer(pad=None)
    model = make_reward_model(tok)
    model.config.pad_token_id = None
    rm = HFRewardModel(model, tok, batch_size=3)
    assert tok.pad_token_id == tok.eos_token_id == model.config.pad_token_id
    prompts, responses = batch()
    torch.testing.assert_close(rm.score(prompts, responses), unbatched(rm, prompts, responses), atol=1e-5, rtol=1e-5)


def test_truncation_keeps_bos_and_the_end():
    tok = make_tokenizer()
    rm = HFRewardModel(make_reward_model(tok), tok, max_length=8)
    full = HFRewardModel(make_reward_model(tok), tok).encode(PROMPTS[2], "the sea the sky")
    cut = rm.encode(PROMPTS[2], "the sea the sky")
    assert len(full) > 8 and len(cut) == 8
    assert cut[0] == tok.bos_token_id and cut[1:] == full[-7:]
    assert rm.score([PROMPTS[2]], ["the sea the sky"]).shape == (1,) and rm.truncated == 2  # encode above, score here


def test_build_reward_hf_and_checked_score(rm_dir):
    cfg = RewardConfig(kind="hf", name_or_path=str(rm_dir), dtype="float32", device="cpu", batch_size=2)
    reward = build_reward(cfg)
    assert isinstance(reward, HFRewardModel) and reward.name == str(rm_dir)
    prompts, responses = batch()
    assert checked_score(reward, prompts, responses).shape == (len(responses),)


def test_dtype_auto_and_device(rm_dir):
    from teacli.models import resolve_dtype

    reward = build_reward(RewardConfig(kind="hf", name_or_path=str(rm_dir), device="auto"), device="cpu")
    assert reward.model.dtype == resolve_dtype("auto", "cpu") and reward.device.type == "cpu"
    assert reward.score(*batch()).dtype == torch.float32


def test_missing_reward_model_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"reward.name_or_path: no such directory"):
        build_reward(RewardConfig(kind="hf", name_or_path=str(tmp_path / "nope")))


def test_reward_tokenizer_without_template_is_an_error():
    tok = make_tokenizer(chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        HFRewardModel(make_reward_model(tok), tok)


def test_reward_kernels_apply_to_the_reward_model(rm_dir, rm, monkeypatch):
    """reward.kernels: liger patches the reward model as it patches the policy (here a stand-in of liger's patch,
    its kernels being CUDA only, that counts its RMSNorm and MLP calls) and scores what the eager model scores; on a
    machine where liger cannot run, asking for it is one line naming reward.kernels."""
    from tiny_lm import liger_stand_in

    from teacli import kernels

    calls = {"norm": 0, "mlp": 0}

    with pytest.raises(ValueError, match=r"^reward.kernels: liger needs a CUDA device"):
        build_reward(RewardConfig(kind="hf", name_or_path=str(rm_dir), dtype="float32", device="cpu", kernels="liger"))
    monkeypatch.setattr(kernels, "_liger_table", lambda: {"llama": liger_stand_in(calls)})
    monkeypatch.setattr(kernels, "liger_problem", lambda model, device: None)
    fused = build_reward(RewardConfig(kind="hf", name_or_path=str(rm_dir), dtype="float32", device="cpu", kernels="liger", batch_size=4))
    prompts, responses = batch()
    torch.testing.assert_close(fused.score(prompts, responses), rm.score(prompts, responses), rtol=0, atol=0)
    assert calls["norm"] > 0 and calls["mlp"] > 0, calls


def test_reward_kernels_auto_is_eager_on_cpu_and_liger_where_it_runs(rm_dir, rm, monkeypatch):
    """reward.kernels defaults to auto, resolved as policy.kernels' auto: liger where liger-kernel is installed, the
    device is CUDA and liger's table has the architecture, else eager. On a CPU always eager: the reward model is not
    patched and scores what it scored before the default changed. Where liger can run (a stand-in of its patch, with
    its problems cleared as on a GPU) auto patches the model and scores what eager scores; checked without CUDA."""
    from tiny_lm import liger_stand_in

    from teacli import kernels
    from teacli.config import EXECUTION_KEYS

    assert RewardConfig().kernels == "auto" and "reward.kernels" in EXECUTION_KEYS  # the same scores: a resume may change it
    calls = {"norm": 0, "mlp": 0}
    monkeypatch.setattr(kernels, "_liger_table", lambda: {"llama": liger_stand_in(calls)})
    model = rm.model
    assert kernels.resolve_kernels("auto", model, "cpu", "reward.kernels") == "eager"
    assert kernels.resolve_kernels("auto", model, "cuda", "reward.kernels") == "liger"  # the device is only inspected
    monkeypatch.setattr(kernels, "_liger_table", lambda: {"mistral": liger_stand_in(calls)})
    assert kernels.resolve_kernels("auto", model, "cuda", "reward.kernels") == "eager"  # an architecture liger lacks
    monkeypatch.setattr(kernels, "_liger_table", lambda: "is not installed (pip install 'teacli[liger]')")
    assert kernels.resolve_kernels("auto", model, "cuda", "reward.kernels") == "eager"  # liger-kernel not installed

    monkeypatch.setattr(kernels, "_liger_table", lambda: {"llama": liger_stand_in(calls)})
    prompts, responses = batch()
    cfg = RewardConfig(kind="hf", name_or_path=str(rm_dir), dtype="float32", device="cpu", batch_size=4)
    on_cpu = build_reward(cfg)
    assert calls == {"norm": 0, "mlp": 0}  # eager on a CPU: nothing patched
    torch.testing.assert_close(on_cpu.score(prompts, responses), rm.score(prompts, responses), rtol=0, atol=0)
    monkeypatch.setattr(kernels, "liger_problem", lambda model, device: None)  # as on a GPU with liger installed
    fused = build_reward(cfg)
    torch.testing.assert_close(fused.score(prompts, responses), rm.score(prompts, responses), rtol=0, atol=0)
    assert calls["norm"] > 0 and calls["mlp"] > 0, calls
