"""reward.share_prompts: an hf reward model runs each group's common token prefix once and the responses on its KV
cache. The scores must be the unshared ones (computed here, by the same model with sharing off), whatever the
batching, the padding and the groups' order; a group whose rows do not share a long enough prefix is scored whole;
and the prefix tokens run once per group (counted at the decoder's input)."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import make_reward_model, make_tokenizer

from teacli.rewards import hf
from teacli.rewards.hf import HFRewardModel, shared_prefixes, sharing_problem
from teacli.types import Prompt

PROMPTS = [
    Prompt(id="p0", messages=({"role": "user", "content": "what is the capital of france"},)),
    Prompt(id="p1", messages=({"role": "system", "content": "please answer in one sentence"}, {"role": "user", "content": "a dog ran"})),
    Prompt(id="p2", messages=({"role": "user", "content": "write a short poem about the sea and the sky and the cat"},)),
]
# responses of many lengths (0 to 13 words): every batch is padded
RESPONSES = ["paris", "the dog ran in the park with a red ball", "", "the sea the sky", "one two three four five six seven",
             "cat", "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13", "the cat sat", "a red ball", "nine ten", "w4 w5 w6 w7 w8"]


def groups_of(m: int = 5) -> tuple[list[Prompt], list[str]]:
    """Three prompts × m responses, the rows of a prompt interleaved with the others' (as no caller orders them)."""
    prompts = [PROMPTS[i % 3] for i in range(3 * m)]
    return prompts, [RESPONSES[(7 * i + 3) % len(RESPONSES)] for i in range(3 * m)]


def reward_model(batch_size: int = 4, attention: str = "sdpa", **kwargs) -> HFRewardModel:
    tok = make_tokenizer()
    model = make_reward_model(tok)
    model.set_attn_implementation(attention)
    return HFRewardModel(model, tok, batch_size=batch_size, **kwargs)


def unshared(rm: HFRewardModel, prompts, responses) -> torch.Tensor:
    old = rm.share_prompts
    rm.share_prompts = False
    try:
        return rm.score(prompts, responses)
    finally:
        rm.share_prompts = old


def common_prefix(rows: list[list[int]]) -> int:
    """The longest common prefix of `rows`, less at least each row's last token, worked out token by token."""
    k = 0
    while all(len(r) > k + 1 for r in rows) and len({r[k] for r in rows}) == 1:
        k += 1
    return k


def test_shared_prefixes_are_the_rows_common_tokens():
    encoded = [
        [1, 2, 3, 4, 5, 6, 7],  # key a: common prefix 1..5 (a response starting alike extends it past the prompt)
        [1, 2, 3, 4, 5, 9],
        [1, 2, 3, 4, 5, 6, 8, 8],
        [1, 2, 3, 4, 5, 6],  # key b: one row a prefix of the other: k stops before its last token
        [1, 2, 3, 4, 5, 6, 7, 7],
        [1, 2, 9, 9, 9, 9, 9],  # key c: the template merged tokens at the boundary: too short a prefix
        [1, 2, 8, 9, 9, 9, 9],
        [1, 2, 3, 4, 5, 6],  # key d: alone
    ]
    keys = ["a", "a", "a", "b", "b", "c", "c", "d"]
    groups, alone = shared_prefixes(encoded, keys, min_prefix=3)
    assert groups == [([0, 1, 2], 5), ([3, 4], 5)] and alone == [5, 6, 7]
    assert shared_prefixes(encoded, keys, min_prefix=6) == ([], list(range(8)))  # no group shares 6 tokens
    same = [[4, 5, 6, 7]] * 3
    assert shared_prefixes(same, ["x"] * 3, min_prefix=1) == ([([0, 1, 2], 3)], [])  # identical rows: all but the last token


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("batch_size", [1, 2, 3, 5, 64])
def test_shared_scores_equal_unshared_scores(batch_size, attention):
    """Groups of 5 rows of different lengths, interleaved; batches of 2, 3 and 5 split groups (and blocks of groups),
    1 runs each response alone on its prefix, 64 holds the whole call."""
    rm = reward_model(batch_size, attention)
    assert rm.share_prompts
    prompts, responses = groups_of()
    expected = unshared(rm, prompts, responses)
    scored, run = rm.tokens_scored, rm.tokens_run
    got = rm.score(prompts, responses)
    assert rm.tokens_run - run < rm.tokens_scored - scored  # it did share
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert got.std() > 0 and got.dtype == torch.float32


def test_pad_equal_to_eos_and_left_padding_side():
    """pad = eos (a Llama tokenizer without a pad token), and a tokenizer that pads on the left: the shared path pads
    its own tensors and reads the last real token either way."""
    tok = make_tokenizer(pad=None)
    tok.padding_side = "left"
    model = make_reward_model(tok)
    model.config.pad_token_id = None
    rm = HFRewardModel(model, tok, batch_size=3)
    prompts, responses = groups_of()
    torch.testing.assert_close(rm.score(prompts, responses), unshared(rm, prompts, responses), atol=1e-5, rtol=1e-5)


def test_a_group_that_shares_too_little_is_scored_whole(monkeypatch):
    """Truncation keeps each conversation's end: a long prompt's rows then share only BOS and are scored whole,
    beside a short prompt's group that still shares. Two prompts under one id share only the template's first tokens:
    scored whole too, and shared (MIN_SHARED_PREFIX 1) they still score the same, the prefix being the tokens' own."""
    rm = reward_model(batch_size=3, max_length=16)
    short = Prompt(id="s", messages=({"role": "user", "content": "what is the capital of france"},))
    long = Prompt(id="l", messages=({"role": "user", "content": " ".join(f"w{i}" for i in range(30))},))
    prompts = [short, long] * 4
    responses = ["paris", "the dog ran", "cat", "the sea the sky", "", "one two", "nine ten", "w1"]
    encoded = [rm.encode(p, r) for p, r in zip(prompts, responses)]
    groups, alone = shared_prefixes(encoded, [p.id for p in prompts], hf.MIN_SHARED_PREFIX)
    assert [rows for rows, _ in groups] == [[0, 2, 4, 6]] and alone == [1, 3, 5, 7]
    assert common_prefix([encoded[i] for i in alone]) == 1 and rm.truncated > 0
    torch.testing.assert_close(rm.score(prompts, responses), unshared(rm, prompts, responses), atol=1e-5, rtol=1e-5)

    rm = reward_model(batch_size=3)
    twins = [PROMPTS[0], Prompt(id="p0", messages=PROMPTS[2].messages)] * 3
    answers = responses[:6]
    encoded = [rm.encode(p, r) for p, r in zip(twins, answers)]
    assert 1 <= common_prefix(encoded) < hf.MIN_SHARED_PREFIX
    assert shared_prefixes(encoded, [p.id for p in twins], hf.MIN_SHARED_PREFIX) == ([], list(range(6)))
    expected = unshared(rm, twins, answers)
    monkeypatch.setattr(hf, "MIN_SHARED_PREFIX", 1)
    assert shared_prefixes(encoded, [p.id for p in twins], 1)[0] == [(list(range(6)), common_prefix(encoded))]
    torch.testing.assert_close(rm.score(twins, answers), expected, atol=1e-5, rtol=1e-5)


def test_each_group_runs_its_prefix_once():
    """Every token the decoder runs, counted at its input (real tokens: the mask's columns of this call): each group's
    prefix once, then each response's remaining tokens once; with sharing off, every conversation whole."""
    rm = reward_model(batch_size=2)
    prompts, responses = groups_of(m=6)
    encoded = [rm.encode(p, r) for p, r in zip(prompts, responses)]
    rows = {p.id: [i for i, q in enumerate(prompts) if q.id == p.id] for p in PROMPTS}
    k = {key: common_prefix([encoded[i] for i in group]) for key, group in rows.items()}
    assert min(k.values()) >= hf.MIN_SHARED_PREFIX

    runs: list[list[int]] = []  # the real tokens of each row of each decoder call
    pad = rm.tokenizer.pad_token_id

    def count(_module, _args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4:  # prefixes end to end in rows, then the row's padding (pad tokens):
            for row, own in zip(ids.tolist(), mask[:, 0, :, -ids.shape[1] :]):  # one starts where a token does not see the one before
                while row and row[-1] == pad:
                    row = row[:-1]
                sees = own if own.dtype == torch.bool else own == 0
                cuts = [0] + [t for t in range(1, len(row)) if not sees[t, t - 1]] + [len(row)]
                runs.extend(row[a:b] for a, b in zip(cuts, cuts[1:]))
            return
        # unshared batches run without a mask, right-padded: their real tokens are all but the trailing pads
        mask = (ids != pad).long().flip(1).cummax(1).values.flip(1) if mask is None else mask[:, -ids.shape[1] :]
        runs.extend([int(t) for t, m in zip(row, keep) if m] for row, keep in zip(ids.tolist(), mask.tolist()))

    handle = rm.model.base_model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        got = rm.score(prompts, responses)
        shared_runs, runs[:] = list(runs), []
        expected = unshared(rm, prompts, responses)
    finally:
        handle.remove()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    prefixes = sorted(encoded[group[0]][: k[key]] for key, group in rows.items())
    suffixes = sorted(encoded[i][k[p.id] :] for i, p in enumerate(prompts))
    assert sorted(shared_runs) == sorted(prefixes + suffixes)  # each prefix exactly once, each suffix once, nothing else
    assert sum(map(len, shared_runs)) == sum(map(len, encoded)) - sum((len(g) - 1) * k[key] for key, g in rows.items())
    assert sorted(map(len, runs)) == sorted(map(len, encoded))  # unshared: every conversation whole (right padding not run as real)
    assert rm.tokens_run == sum(map(len, shared_runs)) + sum(map(len, encoded))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_short_prompts_share_a_row_and_score_as_unshared(attention):
    """A block's prompts run end to end in rows as wide as its longest: two short prompts beside a long one take one
    row (each attending only to itself, at its own positions), the long one another, and the scores are the whole
    conversations'."""
    rm = reward_model(8, attention)
    long = Prompt(id="l", messages=({"role": "user", "content": " ".join(f"w{i % 13 + 1}" for i in range(30))},))
    short = [Prompt(id=f"s{i}", messages=({"role": "user", "content": text},))
             for i, text in enumerate(["the dog ran in the park with a red ball", "one two three four five six seven"])]
    prompts = [p for p in (long, *short) for _ in range(4)]
    responses = [RESPONSES[i % len(RESPONSES)] for i in range(len(prompts))]
    shapes = []
    handle = rm.model.base_model.register_forward_pre_hook(
        lambda _m, _a, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)) if kwargs.get("past_key_values") is not None
        and kwargs["past_key_values"].get_seq_length() == 0 else None, with_kwargs=True)
    try:
        got = rm.score(prompts, responses)
    finally:
        handle.remove()
    torch.testing.assert_close(got, unshared(rm, prompts, responses), atol=1e-5, rtol=1e-5)
    assert len(shapes) == 1 and shapes[0][0] == 2  # one prefix pass, of two rows for three prompts


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("batch_size", [1, 2, 5, 64])
def test_packed_responses_score_as_unshared(batch_size, attention):
    """reward.pack_responses: a group's responses laid end to end in rows (each attending to its prefix and its own
    earlier tokens only) score what whole conversations score, in fewer rows than responses; batches of 1 and 2 rows
    split a block's packed rows, 64 holds the call."""
    rm = reward_model(batch_size, attention, pack_responses=True)
    assert rm.share_prompts and rm.pack_responses
    prompts, responses = groups_of(m=6)
    expected = unshared(rm, prompts, responses)
    rows = []
    handle = rm.model.base_model.register_forward_pre_hook(
        lambda _m, _a, kwargs: rows.append(kwargs["input_ids"].shape[0]) if kwargs.get("past_key_values") is not None
        and kwargs["attention_mask"].dim() == 4 else None, with_kwargs=True)
    try:
        got = rm.score(prompts, responses)
    finally:
        handle.remove()
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert 0 < sum(rows) < len(responses)  # packed: fewer rows than responses, and every one ran on a 4D mask
    assert all(r <= batch_size for r in rows)


def test_packed_responses_pad_less_and_count_it():
    """Packed, the responses' padding is what the rows' width leaves (`tokens_padded` = every token the decoder's calls
    ran less the real ones), less than right-padded batches leave: group u's responses of 13, 11 − u and 2 + u tokens,
    twice each, pack into full rows of 13, where 18 rows of 7 lengths in 5 batches must put unequal lengths together;
    a model whose attention takes no 4D mask does not pack."""
    prompts = [PROMPTS[i % 3] for i in range(18)]
    lengths = [(12, 10 - i % 3, 1 + i % 3)[i // 3 % 3] for i in range(18)]  # words; each response ends in one more token
    responses = [" ".join(f"w{(i + t) % 13 + 1}" for t in range(n)) for i, n in enumerate(lengths)]  # each its own first word
    padded = {}
    for pack in (False, True):
        rm = reward_model(batch_size=4, pack_responses=pack)
        ran = []
        handle = rm.model.base_model.register_forward_pre_hook(lambda _m, _a, kwargs: ran.append(kwargs["input_ids"].numel()),
                                                               with_kwargs=True)
        try:
            rm.score(prompts, responses)
        finally:
            handle.remove()
        assert rm.tokens_padded == sum(ran) - rm.tokens_run
        padded[pack] = rm.tokens_padded
    assert padded[True] < padded[False]  # the same prompts (and their padding) either way
    tok = make_tokenizer()
    flex = make_reward_model(tok)
    flex.config._attn_implementation = "flex_attention"
    assert not HFRewardModel(flex, tok, pack_responses=True).pack_responses


@pytest.mark.parametrize("share", [True, False])
def test_tokens_padded_is_what_the_batches_ran_beyond_the_real_tokens(share):
    """`tokens_padded` (metrics.jsonl pad_frac_reward): every token the decoder's calls ran (their input's size), less
    the real ones (`tokens_run`), shared or not."""
    rm = reward_model(batch_size=3, share_prompts=share)
    ran = []
    handle = rm.model.base_model.register_forward_pre_hook(lambda _m, _a, kwargs: ran.append(kwargs["input_ids"].numel()),
                                                           with_kwargs=True)
    try:
        rm.score(*groups_of(m=5))
    finally:
        handle.remove()
    assert rm.tokens_padded > 0 and rm.tokens_padded == sum(ran) - rm.tokens_run


def test_score_texts_and_single_responses_are_scored_whole():
    rm = reward_model()
    texts = [rm.tokenizer.decode(rm.encode(PROMPTS[0], r)) for r in RESPONSES[:4]]
    rm.score_texts(texts)
    rm.score(PROMPTS, RESPONSES[:3])  # one response a prompt
    assert rm.tokens_run == rm.tokens_scored


def test_where_the_cache_does_not_apply_the_model_scores_whole_conversations(monkeypatch, tmp_path):
    """A sliding-window layer keeps only its last keys; flash-attention's masks are not the ones tested here; a model
    tea does not pool itself runs its own forward; compiled layers would compile again for the cache's shapes."""
    import dataclasses

    from tiny_lm import save

    from teacli.config import RewardConfig, is_execution_key
    from teacli.rewards import build_reward

    windowed = reward_model()
    windowed.model.config.sliding_window = 4
    assert "DynamicSlidingWindowLayer" in sharing_problem(windowed.model)
    tok = windowed.tokenizer
    rm = HFRewardModel(windowed.model, tok, batch_size=3)
    assert not rm.share_prompts
    prompts, responses = groups_of()
    scored = rm.tokens_scored
    rm.score(prompts, responses)
    assert rm.tokens_run == rm.tokens_scored - scored  # whole conversations

    flash = make_reward_model(tok)
    monkeypatch.setattr(flash.config, "_attn_implementation", "flash_attention_2")
    assert "flash_attention_2" in sharing_problem(flash) and not HFRewardModel(flash, tok).share_prompts
    own = HFRewardModel(make_reward_model(tok), tok)
    monkeypatch.setattr(hf, "_is_generic_classifier", lambda model: False)
    assert not HFRewardModel(make_reward_model(tok), tok).share_prompts and own.share_prompts

    path = save(make_reward_model(tok), tok, tmp_path / "rm")
    assert not HFRewardModel.from_pretrained(str(path), dtype="float32", device="cpu", kernels="compile").share_prompts
    cfg = RewardConfig(kind="hf", name_or_path=str(path), dtype="float32", device="cpu")
    assert cfg.share_prompts and not build_reward(dataclasses.replace(cfg, share_prompts=False)).share_prompts
    assert is_execution_key("reward.share_prompts")  # the same scores: a resumed run may change it
