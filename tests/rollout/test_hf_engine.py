"""The hf rollout engine on a tiny random Llama: shapes, EOS cut, seeding, the sampling contract."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import make_causal_lm, make_tokenizer

from teacli.config import RolloutConfig
from teacli.models import encode_chat
from teacli.rollout import RolloutEngine, build_engine, cut_at_eos, sampling_from
from teacli.rollout.hf import HFEngine
from teacli.types import SamplingConfig

QUESTIONS = ["what is the capital of france", "write a short poem about the sea", "one two three"]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return make_causal_lm(tok)


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    ids = [encode_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True) for q in QUESTIONS]
    assert len({len(p) for p in ids}) > 1  # different lengths: left padding is exercised
    return ids


def sample(**kw) -> SamplingConfig:
    return SamplingConfig(**{"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8, **kw})


def ids_of(out):
    return [[c.token_ids for c in row] for row in out]


def greedy(model, tok, prompt: list[int], max_new_tokens: int) -> list[int]:
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), generation_config=config)
    return cut_at_eos(out[0, len(prompt):].tolist(), [tok.eos_token_id])[0]


# -- the cut helper ---------------------------------------------------------------------------------


def test_cut_at_eos():
    assert cut_at_eos([5, 6, 3, 3, 3], [3]) == ([5, 6, 3], True)  # pad == eos after the first EOS
    assert cut_at_eos([5, 3, 0, 0], [3, 9]) == ([5, 3], True)
    assert cut_at_eos([9, 5], [3, 9]) == ([9], True)  # any of several EOS ids
    assert cut_at_eos([5, 6, 7], [3]) == ([5, 6, 7], False)
    assert cut_at_eos([], [3]) == ([], False)


# -- the engine -------------------------------------------------------------------------------------


def test_shapes_prompt_major_and_completion_fields(model, tok, prompts):
    engine = HFEngine(model, tok, batch_size=5)  # 3 prompts x 4 = 12 sequences: batches of 5, 5, 2
    assert isinstance(engine, RolloutEngine)
    reports = []
    engine.progress = lambda done, total: reports.append((done, total))  # tea train's validation progress
    out = engine.generate(prompts, n=4, sampling=sample(max_new_tokens=6), seed=0)
    assert reports == [(5, 12), (10, 12), (12, 12)]  # after each batch
    assert len(out) == 3 and all(len(row) == 4 for row in out)
    for row in out:
        for c in row:
            assert 1 <= len(c.token_ids) <= 6
            assert c.finished == (c.token_ids[-1] == tok.eos_token_id)
            assert tok.eos_token_id not in c.token_ids[:-1]
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            assert c.logprobs is None


def test_eos_stops_and_truncates(model, tok, prompts):
    """Bias the EOS logit so that some sequences stop early and others run to max_new_tokens."""
    eos = tok.eos_token_id
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out.index_add(-1, torch.tensor([eos]), torch.full((*out.shape[:-1], 1), 4.0)))
    try:
        out = HFEngine(model, tok, batch_size=16).generate(prompts, n=8, sampling=sample(max_new_tokens=10), seed=1)
    finally:
        handle.remove()
    flat = [c for row in out for c in row]
    finished = [c for c in flat if c.finished]
    unfinished = [c for c in flat if not c.finished]
    assert finished and unfinished
    assert {len(c.token_ids) for c in finished} != {10}  # stopped at various lengths
    for c in finished:
        assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]  # cut right after the FIRST eos
        assert "<eos>" not in c.text  # special tokens skipped
    for c in unfinished:
        assert len(c.token_ids) == 10 and eos not in c.token_ids


def test_pad_equal_to_eos(model, prompts):
    tok = make_tokenizer(pad=None)
    tok.pad_token = tok.eos_token
    out = HFEngine(model, tok, batch_size=4).generate(prompts, n=3, sampling=sample(), seed=0)
    for c in (c for row in out for c in row):
        assert tok.eos_token_id not in c.token_ids[:-1]


def test_same_seed_same_samples_and_n_samples_differ(model, tok, prompts):
    engine = HFEngine(model, tok, batch_size=6)
    a = ids_of(engine.generate(prompts, n=6, sampling=sample(), seed=123))
    b = ids_of(engine.generate(prompts, n=6, sampling=sample(), seed=123))
    c = ids_of(engine.generate(prompts, n=6, sampling=sample(), seed=124))
    assert a == b
    assert a != c
    for row in a:
        assert len({tuple(x) for x in row}) > 1  # the n samples of a prompt are not copies


def test_rng_state_and_train_mode_restored(model, tok, prompts):
    engine = HFEngine(model, tok)
    model.train()
    state = torch.get_rng_state()
    try:
        engine.generate(prompts[:1], n=2, sampling=sample(max_new_tokens=3), seed=7)
        assert model.training
        assert torch.equal(torch.get_rng_state(), state)
    finally:
        model.eval()


def test_low_temperature_and_top_k_1_are_greedy(model, tok, prompts):
    """Also checks prompt-major order: row i holds prompt i's samples."""
    engine = HFEngine(model, tok, batch_size=4)
    expected = [greedy(model, tok, p, 8) for p in prompts]
    cold = engine.generate(prompts, n=2, sampling=sample(temperature=1e-4), seed=3)
    top1 = engine.generate(prompts, n=2, sampling=sample(top_k=1), seed=3)
    for want, row_cold, row_top1 in zip(expected, cold, top1):
        assert [c.token_ids for c in row_cold] == [want, want]
        assert [c.token_ids for c in row_top1] == [want, want]


def test_top_p_small_is_greedy(model, tok, prompts):
    engine = HFEngine(model, tok, batch_size=4)
    out = engine.generate(prompts, n=2, sampling=sample(top_p=1e-6), seed=5)
    assert [row[0].token_ids for row in out] == [greedy(model, tok, p, 8) for p in prompts]


def test_model_generation_config_is_not_applied(model, tok, prompts):
    saved = model.generation_config
    # Settings the engine does not pass itself (min_p, suppress_tokens) are the ones the swap guards.
    model.generation_config = saved.__class__(
        top_k=1, min_p=0.999, suppress_tokens=[tok.eos_token_id], repetition_penalty=100.0, do_sample=False, max_new_tokens=1
    )
    try:
        out = HFEngine(model, tok).generate(prompts, n=8, sampling=sample(top_k=0), seed=0)
        assert model.generation_config.top_k == 1  # restored after the call
    finally:
        model.generation_config = saved
    for row in out:
        assert len({tuple(c.token_ids) for c in row}) > 1  # top_k=1 from the model would make them identical
        assert all(len(c.token_ids) > 1 or c.finished for c in row)  # its max_new_tokens=1 is ignored


def test_top_k_zero_is_off_and_top_k_is_honoured(model, tok, prompts):
    """At a huge temperature the next token is ~uniform over the vocabulary (250 tokens): 128 draws of
    the first token give ~100 distinct tokens with top-k off, and at most k with top-k on. A silent
    library default of top_k = 50 would cap the first count at 50."""
    assert len(tok) > 200
    engine = HFEngine(model, tok, batch_size=128)

    def distinct_first_tokens(top_k: int) -> int:
        out = engine.generate(prompts[:1], n=128, sampling=sample(temperature=1e3, top_k=top_k, max_new_tokens=1), seed=0)
        return len({c.token_ids[0] for c in out[0]})

    assert distinct_first_tokens(0) > 70
    assert distinct_first_tokens(20) <= 20


def test_sampling_from_recipe():
    cfg = RolloutConfig(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33)
    assert sampling_from(cfg) == SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33)


# -- build_engine -----------------------------------------------------------------------------------


def test_build_engine(model, tok, monkeypatch):
    engine = build_engine(RolloutConfig(engine="hf", batch_size=7), model, tok)
    assert isinstance(engine, HFEngine) and engine.batch_size == 7
    engine.sleep(), engine.wake(), engine.load_weights(model.named_parameters())  # no-ops

    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert isinstance(build_engine(RolloutConfig(engine="auto"), model, tok), HFEngine)


def test_build_engine_vllm_missing_is_a_clear_error(model, tok, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "teacli.rollout.vllm_engine", None)  # import fails as if absent
    with pytest.raises(ValueError, match="rollout.engine: 'vllm' is not available"):
        build_engine(RolloutConfig(engine="vllm"), model, tok)


# -- the fast path: sdpa_gqa attention, bucketed static cache (issue 12) ------------------------------

OLD = {"attention": "model", "kv_cache": "dynamic", "compile": False}  # the engine before issue 12
NEW = {"attention": "sdpa_gqa", "kv_cache": "static", "compile": False}


def test_sdpa_gqa_logits_equal_eager_on_ragged_left_padded_batches(model, tok, prompts):
    from teacli.models import attention_implementation

    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped K/V heads
    width = max(len(p) for p in prompts) + 3  # extra left padding on every row
    ids = torch.full((len(prompts), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = torch.tensor(p), 1
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        with attention_implementation(model, "eager"):
            eager = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
            assert model.config._attn_implementation == "eager"
        with attention_implementation(model, "sdpa_gqa"):
            gqa = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    assert model.config._attn_implementation == "sdpa"  # the model's own is restored
    real = mask.bool()
    torch.testing.assert_close(gqa[real], eager[real], rtol=1e-5, atol=1e-5)


def test_new_path_samples_what_the_old_path_samples(model, tok, prompts):
    """Greedy decoding identical, and for a fixed seed the same samples (same logits up to rounding,
    same RNG draws), with prompts of different lengths in one batch."""
    old, new = HFEngine(model, tok, batch_size=5, **OLD), HFEngine(model, tok, batch_size=5, **NEW)
    for kw in ({"top_k": 1}, {}, {"top_k": 20, "top_p": 0.9, "temperature": 0.8}):
        s = sample(max_new_tokens=24, **kw)
        assert ids_of(new.generate(prompts, n=4, sampling=s, seed=9)) == ids_of(old.generate(prompts, n=4, sampling=s, seed=9)), kw
    want = [greedy(model, tok, p, 24) for p in prompts]
    assert [row[0].token_ids for row in new.generate(prompts, n=1, sampling=sample(top_k=1, max_new_tokens=24), seed=0)] == want


def test_static_cache_length_is_bucketed(model, tok, prompts, monkeypatch):
    import transformers

    lengths = []
    real = transformers.StaticCache

    class Spy(real):
        def __init__(self, *a, **kw):
            lengths.append(kw["max_cache_len"])
            super().__init__(*a, **kw)

    monkeypatch.setattr(transformers, "StaticCache", Spy)
    engine = HFEngine(model, tok, batch_size=64, cache_bucket=16, **NEW)
    for p in prompts:  # three prompt widths, all under 16 tokens
        assert len(p) <= 16
        engine.generate([p], n=2, sampling=sample(max_new_tokens=5), seed=0)
    assert lengths == [16 + 5] * 3
    assert engine.resolved(torch.device("cpu")) == (False, True)
    assert HFEngine(model, tok).resolved(torch.device("cpu")) == (False, False)  # auto: no compile, dynamic cache on CPU
    assert HFEngine(model, tok).resolved(torch.device("cuda")) == (True, True)  # auto on CUDA


def exact_next_token_probs(model, ids, temperature, top_k, top_p) -> torch.Tensor:
    """The sampling contract written out: softmax(logits / T), then top-k, then top-p (renormalized)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double() / temperature
    if top_k:
        logits[logits < logits.topk(top_k).values[-1]] = -float("inf")
    probs = logits.softmax(-1)
    order = probs.argsort(descending=True)
    keep = probs[order].cumsum(0) - probs[order] < top_p
    mask = torch.zeros_like(probs, dtype=torch.bool)
    mask[order[keep]] = True
    probs = torch.where(mask, probs, torch.zeros_like(probs))
    return probs / probs.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 0.8), (1.3, 5, 0.95)])
def test_second_token_distribution_is_the_contract_on_the_static_path(model, tok, prompts, temperature, top_k, top_p):
    """2,000 second tokens, drawn in a decode step from the static cache: the contract's support,
    frequencies within sampling noise of it. The prefill's logits are biased towards one token, so
    every sample continues the same first token (the decode step's logits are the model's own)."""
    prompt, first = prompts[1], tok.convert_tokens_to_ids("paris")
    calls = []

    def bias_prefill(_module, _inputs, out):
        calls.append(out.shape)
        if len(calls) == 1:  # the prefill: one batch, so one prefill call
            out = out.clone()
            out[..., first] += 100.0
        return out

    engine = HFEngine(model, tok, batch_size=2000, cache_bucket=16, **NEW)
    handle = model.lm_head.register_forward_hook(bias_prefill)
    try:
        out = engine.generate([prompt], n=2000, sampling=sample(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=2), seed=11)
    finally:
        handle.remove()
    assert len(calls) == 2 and all(c.token_ids[0] == first for c in out[0])
    seconds = torch.tensor([c.token_ids[1] for c in out[0]])
    exact = exact_next_token_probs(model, prompt + [first], temperature, top_k, top_p)
    counts = torch.bincount(seconds, minlength=exact.numel()).double()
    assert exact[counts > 0].min() > 0  # never a token the contract excludes
    tv = 0.5 * float((counts / counts.sum() - exact).abs().sum())
    noise = 0.5 * float((2 * exact * (1 - exact) / (torch.pi * counts.sum())).sqrt().sum())  # E[TV] of a correct sampler
    assert tv < 1.5 * noise + 0.01, (tv, noise)


def test_bad_engine_settings_name_the_key(model, tok):
    for kw, key in (({"attention": "flash"}, "rollout.attention"), ({"kv_cache": "paged"}, "rollout.kv_cache"),
                    ({"compile": "yes"}, "rollout.compile"), ({"compile": True, "kv_cache": "dynamic"}, "rollout.compile"),
                    ({"cache_bucket": 0}, "rollout.cache_bucket")):
        with pytest.raises(ValueError, match=key):
            HFEngine(model, tok, **kw)


def test_build_engine_passes_the_speed_settings(model, tok):
    engine = build_engine(RolloutConfig(engine="hf", attention="eager", kv_cache="static", compile=False, cache_bucket=32), model, tok)
    assert (engine.attention, engine.kv_cache, engine.compile, engine.cache_bucket) == ("eager", "static", False, 32)


def test_fast_path_on_a_peft_wrapped_policy(model, tok, prompts):
    peft = pytest.importorskip("peft")
    import copy

    wrapped = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    s = sample(top_k=1, max_new_tokens=12)  # LoRA starts at zero: the base model's greedy completions
    want = ids_of(HFEngine(model, tok, batch_size=8, **OLD).generate(prompts, n=2, sampling=s, seed=0))
    assert ids_of(HFEngine(wrapped, tok, batch_size=8, **NEW).generate(prompts, n=2, sampling=s, seed=0)) == want
    assert wrapped.get_base_model().config._attn_implementation == "sdpa"  # restored


# -- the draw (InverseCDFSampler) and the shared prompt prefill (issue 12, CPU) -----------------------


def test_inverse_cdf_sampler_draws_softmax_of_the_scores():
    """200,000 draws per row: frequencies within sampling noise of softmax(scores), never a −inf token,
    and the returned scores are 0 at the drawn token and −inf elsewhere (generate's argmax takes it)."""
    from teacli.rollout.hf import InverseCDFSampler

    scores = torch.tensor([[2.0, 1.0, 0.0, -1.0, -float("inf"), 0.5], [-float("inf"), 3.0, -float("inf"), 3.0, 1.0, -float("inf")]])
    exact = scores.double().softmax(-1)  # the distribution written out
    rows = scores.repeat_interleave(100_000, dim=0)
    torch.manual_seed(0)
    out = InverseCDFSampler()(torch.zeros(rows.shape[0], 1, dtype=torch.long), rows)
    assert ((out == 0).sum(-1) == 1).all() and (out.isinf().sum(-1) == rows.shape[1] - 1).all()
    drawn = out.argmax(-1).view(2, -1)
    for r in range(2):
        freq = torch.bincount(drawn[r], minlength=6).double() / drawn.shape[1]
        assert (freq[exact[r] == 0] == 0).all()
        sd = (exact[r] * (1 - exact[r]) / drawn.shape[1]).sqrt()
        assert ((freq - exact[r]).abs() <= 5 * sd + 1e-12).all(), (freq, exact[r])


def test_inverse_cdf_sampler_never_draws_past_the_last_positive_token(monkeypatch):
    """A uniform number at the top of its range lands on the last token of positive probability, not
    on the zero-probability tail (nor past the vocabulary)."""
    from teacli.rollout.hf import InverseCDFSampler

    scores = torch.tensor([[0.0, 1.0, 2.0, -float("inf"), -float("inf")]])
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(*a, dtype=k.get("dtype")))  # the open bound itself
    assert InverseCDFSampler()(torch.zeros(1, 1, dtype=torch.long), scores).argmax(-1).item() == 2


def test_inverse_cdf_tokens_is_the_softmax_quantile_function_across_blocks():
    """u on an even grid of n points through [0, 1) (u_j = (j + ½)/n): token i is drawn for the u that fall in its
    interval of the CDF, so its count is n·p_i within 1 (plus fp32 rounding of the sums), for a vocabulary of three
    blocks and a bit, with a whole block and scattered tokens at −inf (never drawn) and a bf16 row."""
    from teacli.rollout.hf import DRAW_BLOCK, inverse_cdf_tokens

    vocab = 3 * DRAW_BLOCK + 37
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(vocab, generator=gen, dtype=torch.float64) * 2
    scores[DRAW_BLOCK : 2 * DRAW_BLOCK] = -float("inf")  # a block of probability 0
    scores[torch.randperm(vocab, generator=gen)[:200]] = -float("inf")
    scores[-1] = -float("inf")  # the padded last block ends in a zero
    for dtype in (torch.float32, torch.bfloat16):
        row = scores.to(dtype)
        exact = row.double().softmax(-1)  # the distribution written out
        n = 20_000
        u = ((torch.arange(n, dtype=torch.float64) + 0.5) / n).float()[:, None]
        counts = torch.bincount(inverse_cdf_tokens(row.expand(n, vocab), u), minlength=vocab).double()
        assert counts.shape[0] == vocab and counts.sum() == n
        assert (counts[exact == 0] == 0).all()
        assert ((counts - n * exact).abs() <= 1.5).all(), (counts - n * exact).abs().max()


def test_inverse_cdf_tokens_at_the_top_of_u_lands_on_the_last_positive_token():
    """u just below 1 lands on the last token of positive probability, in the middle of a block followed by a
    zero-probability tail, and u = 0 on the first."""
    from teacli.rollout.hf import DRAW_BLOCK, inverse_cdf_tokens

    scores = torch.full((1, 2 * DRAW_BLOCK + 5), -float("inf"))
    scores[0, 3] = 1.0
    scores[0, DRAW_BLOCK + 17] = 0.0  # the last positive token, mid-block
    top = torch.tensor([[torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)).item()]])
    assert inverse_cdf_tokens(scores, top).item() == DRAW_BLOCK + 17
    assert inverse_cdf_tokens(scores, torch.zeros(1, 1)).item() == 3


def test_inverse_cdf_tokens_never_rounds_into_a_zero_probability_token():
    """u just below the first block's share of the total: for some rows the block's own running sum rounds below
    the target (a sum and a cumsum of the same 256 terms differ in their last bits), and the search inside the block
    runs off its end, into the zero-probability tokens after it. Every draw must still be a token of positive
    probability."""
    from teacli.rollout.hf import DRAW_BLOCK, inverse_cdf_tokens

    scores = torch.randn(64, 4 * DRAW_BLOCK, generator=torch.Generator().manual_seed(0)) * 3
    scores[:, DRAW_BLOCK - 40 : 2 * DRAW_BLOCK] = -float("inf")
    weights = (scores - scores.amax(-1, keepdim=True)).exp().view(64, 4, DRAW_BLOCK)
    upto = weights.sum(-1).cumsum(-1)
    target = torch.nextafter(upto[:, :1], torch.zeros(1))  # the largest float below the first block's running sum
    u = target / upto[:, -1:]
    runs_off = weights[:, 0].cumsum(-1)[:, -1:] <= u * upto[:, -1:]
    assert runs_off.any()  # the case is exercised
    drawn = inverse_cdf_tokens(scores, u)
    assert torch.isfinite(scores.gather(1, drawn[:, None])).all()


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_shared_prompt_prefill_samples_what_the_unshared_engine_samples(model, tok, prompts, kv_cache):
    """Each distinct prompt of a batch is prefilled once (batch 7 splits the groups of 4 across batches)
    and its cache copied to its rows: the same samples for a seed, at several sampling settings."""
    calls = []
    handle = model.model.register_forward_pre_hook(lambda mod, args, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
    try:
        shared = HFEngine(model, tok, batch_size=7, kv_cache=kv_cache, cache_bucket=16)
        plain = HFEngine(model, tok, batch_size=7, kv_cache=kv_cache, cache_bucket=16, share_prefix=False)
        for kw in ({"top_k": 1}, {}, {"top_k": 20, "top_p": 0.9, "temperature": 0.8}):
            s = sample(max_new_tokens=12, **kw)
            calls.clear()
            got = ids_of(shared.generate(prompts, n=4, sampling=s, seed=5))
            prefills = [c for c in calls if c[1] > 1]
            assert [c[0] for c in prefills] == [2, 2]  # batches of 7 + 5 rows: prompts {0, 1} and {1, 2}
            assert got == ids_of(plain.generate(prompts, n=4, sampling=s, seed=5)), kw
    finally:
        handle.remove()


# -- the engine's own decode loop (2026-11-28) ---------------------------------------------------------


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
@pytest.mark.parametrize("share_prefix", [True, False])
def test_the_engines_decode_loop_samples_what_generate_samples(model, tok, prompts, kv_cache, share_prefix):
    """The loop that replaced `model.generate` (same forward, processors, draw and RNG use): for a seed, the same
    tokens as generate at several sampling settings, with ragged left-padded prompts, batches that split the
    groups, the shared prompt prefill on and off, and rows that end at EOS while others go on."""
    ours = HFEngine(model, tok, batch_size=7, kv_cache=kv_cache, cache_bucket=16, share_prefix=share_prefix)
    theirs = HFEngine(model, tok, batch_size=7, kv_cache=kv_cache, cache_bucket=16, share_prefix=share_prefix, loop="generate")
    ended = 0
    for kw in ({"top_k": 1}, {}, {"top_k": 20, "top_p": 0.9, "temperature": 0.8}):
        s = sample(max_new_tokens=24, **kw)
        got = ours.generate(prompts, n=4, sampling=s, seed=3)
        assert ids_of(got) == ids_of(theirs.generate(prompts, n=4, sampling=s, seed=3)), kw
        ended += sum(c.finished for row in got for c in row)
    assert 0 < ended < 3 * 12  # some completions ended at EOS, some ran to max_new_tokens


def test_the_decode_loop_stops_once_every_row_has_ended(model, tok, prompts):
    """Every row's first token is EOS (the LM head is biased to it): the loop notices at its first check
    (after STOP_CHECK_EVERY tokens), not after max_new_tokens forwards, and returns what generate returns."""
    from teacli.rollout.hf import STOP_CHECK_EVERY

    calls = []

    def eos_first(_module, _inputs, out):
        calls.append(out.shape)
        out = out.clone()
        out[..., tok.eos_token_id] += 100.0
        return out

    handle = model.lm_head.register_forward_hook(eos_first)
    try:
        got = HFEngine(model, tok, batch_size=12).generate(prompts, n=4, sampling=sample(max_new_tokens=64), seed=0)
        forwards = len(calls)
        want = HFEngine(model, tok, batch_size=12, loop="generate").generate(prompts, n=4, sampling=sample(max_new_tokens=64), seed=0)
    finally:
        handle.remove()
    assert forwards == STOP_CHECK_EVERY < 64  # the prefill and the decode steps up to the first check
    assert ids_of(got) == ids_of(want) == [[[tok.eos_token_id]] * 4] * 3
    assert all(c.finished for row in got for c in row)


@pytest.mark.parametrize("batch_size,kv_cache", [(12, "dynamic"), (5, "static")])
def test_drawn_response_lengths_end_each_row_there_and_the_loop_with_the_longest(model, tok, prompts, batch_size, kv_cache):
    """A rehearsal's `response_lengths` (rehearsal.lengths: realistic): row r of a call ends with EOS as its
    lengths[r]-th token even where the policy favours EOS earlier (the LM head is biased to it), a length past
    max_new_tokens is cut there without EOS, the lengths are drawn from the call's seed, and the decode loop stops
    once every row has ended (batches of 12 and, across batch boundaries, of 5 rows)."""
    from teacli.rollout.hf import STOP_CHECK_EVERY

    lengths = [3, 1, 5, 7, 2, 40, 4, 6, 1, 2, 3, 9]  # 3 prompts x 4 samples, prompt-major; 40 > max_new_tokens
    asked, calls = [], []
    engine = HFEngine(model, tok, batch_size=batch_size, kv_cache=kv_cache)
    engine.response_lengths = lambda seed, rows: asked.append((seed, rows)) or lengths[:rows]

    def eos_favoured(_module, _inputs, out):
        calls.append(out.shape)
        out = out.clone()
        out[..., tok.eos_token_id] += 5.0
        return out

    handle = model.lm_head.register_forward_hook(eos_favoured)
    try:
        out = engine.generate(prompts, n=4, sampling=sample(max_new_tokens=16), seed=7)
    finally:
        handle.remove()
    assert asked == [(7, 12)]
    flat = [c for row in out for c in row]
    assert [len(c.token_ids) for c in flat] == [min(n, 16) for n in lengths]
    for c, n in zip(flat, lengths):
        assert c.finished == (n <= 16) and (c.token_ids[-1] == tok.eos_token_id) == (n <= 16)
        assert tok.eos_token_id not in c.token_ids[:-1]
    if batch_size == 12:  # every row ends by its 9th token: the loop stops at its first check, not after 64 tokens
        lengths[5], calls[:] = 9, []
        handle = model.lm_head.register_forward_hook(eos_favoured)
        try:
            engine.generate(prompts, n=4, sampling=sample(max_new_tokens=64), seed=7)
        finally:
            handle.remove()
        assert len(calls) == STOP_CHECK_EVERY  # the prefill and the decode steps up to the first check
    engine.response_lengths = None  # off: the policy's own EOS (favoured) ends rows wherever it is drawn
    assert ids_of(engine.generate(prompts, n=4, sampling=sample(max_new_tokens=16), seed=7)) != ids_of(out)


@pytest.mark.slow
def test_the_compiled_decode_loop_generates_the_eager_tokens(model, tok, prompts):
    """rollout.compile on the CPU (inductor without CUDA graphs; on CUDA: tests/gpu/test_gpu_speed.py): the
    compiled decode forward gives the uncompiled loop's greedy tokens, and a seed's samples again on a second call."""
    from torch._dynamo.utils import counters

    greedy = sample(top_k=1, max_new_tokens=12)
    want = ids_of(HFEngine(model, tok, batch_size=8, kv_cache="static", compile=False).generate(prompts, n=2, sampling=greedy, seed=0))
    engine = HFEngine(model, tok, batch_size=8, kv_cache="static", compile=True)
    before = counters["stats"]["unique_graphs"]
    assert ids_of(engine.generate(prompts, n=2, sampling=greedy, seed=0)) == want
    assert counters["stats"]["unique_graphs"] > before  # it did compile
    s = sample(max_new_tokens=12)
    assert ids_of(engine.generate(prompts, n=2, sampling=s, seed=4)) == ids_of(engine.generate(prompts, n=2, sampling=s, seed=4))


def test_a_bad_decode_loop_is_refused(model, tok):
    with pytest.raises(ValueError, match="loop"):
        HFEngine(model, tok, loop="vllm")


# -- rollout.stop_tokens ----------------------------------------------------------------------------


def test_stop_tokens_end_a_completion_as_eos_does(model, tok, prompts):
    """A chat turn marker listed in rollout.stop_tokens (`<|user|>` here, like ChatML's `<|im_start|>`) ends a
    completion as EOS does: kept as its last token, the completion finished, the marker not in the text. Up to
    the marker, every completion is what the engine samples without the setting (same seed)."""
    turn = tok.convert_tokens_to_ids("<|user|>")
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out.index_add(-1, torch.tensor([turn]), torch.full((*out.shape[:-1], 1), 3.0)))
    try:
        runs = [build_engine(RolloutConfig(engine="hf", batch_size=16, stop_tokens=stop), model, tok)
                .generate(prompts, n=8, sampling=sample(max_new_tokens=10), seed=1) for stop in ([], ["<|user|>"])]
    finally:
        handle.remove()
    free, stopped = ([c for row in out for c in row] for out in runs)
    assert any(turn in c.token_ids[:-1] for c in free)  # without the setting the policy writes past the marker
    assert any(c.token_ids[-1] == turn for c in stopped) and any(not c.finished for c in stopped)
    for a, b in zip(free, stopped):
        want, found = cut_at_eos(a.token_ids, [tok.eos_token_id, turn])
        assert (b.token_ids, b.finished) == (want, found)
        assert "<|user|>" not in b.text


def test_stop_token_ids_are_eos_then_the_listed_tokens_and_refuse_what_is_not_one_token(tok):
    from teacli.rollout.base import stop_token_ids

    user, system = tok.convert_tokens_to_ids("<|user|>"), tok.convert_tokens_to_ids("<|system|>")
    assert stop_token_ids(tok) == [tok.eos_token_id]
    assert stop_token_ids(tok, ["<|user|>", "<|system|>", "<|user|>", "<eos>"]) == [tok.eos_token_id, user, system]
    with pytest.raises(ValueError, match=r"^rollout.stop_tokens: 'the sea' is 2 tokens of the policy's vocabulary \(\[\d+, \d+\]\), not one"):
        stop_token_ids(tok, ["the sea"])
    with pytest.raises(ValueError, match=r"^rollout.stop_tokens: '' is 0 tokens"):
        stop_token_ids(tok, [""])
    with pytest.raises(ValueError, match=r"^rollout.stop_tokens: 'qwertyuiop' is not in the policy's vocabulary"):
        stop_token_ids(tok, ["qwertyuiop"])
