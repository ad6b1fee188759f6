"""rollout.attention `cascade` (teacli.models.CascadeCache, cascade_attention): a group's prompt K/V once, each row's
own columns, merged by log-sum-exp; against plain attention over the concatenated K/V and against the hf engine's
default attention."""

from __future__ import annotations

import types

import pytest
import torch
from test_hf_engine import QUESTIONS, model, tok  # noqa: F401  (the engine tests' tiny Llama: 4 query heads, 2 K/V heads)

from teacli.models import CascadeCache, encode_chat
from teacli.models.attention import cascade_attention, sdpa_gqa_attention
from teacli.rollout.hf import HFEngine
from teacli.types import SamplingConfig


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    ids = [encode_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True) for q in QUESTIONS]
    assert len({len(p) for p in ids}) == 3  # different lengths: each group's prompt has its own left padding
    return ids


def sample(**kw) -> SamplingConfig:
    return SamplingConfig(**{"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 20, **kw})


def ids_of(out):
    return [[c.token_ids for c in row] for row in out]


@pytest.fixture
def cascades(monkeypatch):
    """The CascadeCaches the engine builds, each with its count of `update` calls."""
    made: list[CascadeCache] = []
    init, update = CascadeCache.__init__, CascadeCache.update

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.updates = 0
        made.append(self)

    def counted_update(self, *args, **kwargs):
        self.updates += 1
        return update(self, *args, **kwargs)

    monkeypatch.setattr(CascadeCache, "__init__", counted_init)
    monkeypatch.setattr(CascadeCache, "update", counted_update)
    return made


# -- the attention function against plain attention ----------------------------------------------------------------


@pytest.mark.parametrize("row_of", [[0, 0, 0, 1, 1, 1, 2, 2, 2], [0, 1, 0, 2, 1, 1, 0, 2]], ids=["equal groups", "ragged, interleaved"])
def test_the_cascade_is_attention_over_the_concatenated_cache(row_of):
    """Each decode column (across segments of 4), each row: the cascade's output equals SDPA (enable_gqa) over
    [its prompt's K/V, its own columns written so far] with the prompt's left padding masked; prompts of different
    padding, one of them all padding (a one-token prompt: the group part gets weight 0), GQA 8/2 heads, float32."""
    g = torch.Generator().manual_seed(0)
    groups, kv_heads, heads, dim, lp, columns, segment = 3, 2, 8, 16, 7, 10, 4
    rows = len(row_of)
    gk, gv = (torch.randn(groups, kv_heads, lp, dim, generator=g) for _ in range(2))
    prompt_mask = torch.ones(groups, lp, dtype=torch.bool)
    prompt_mask[0, :2] = False
    prompt_mask[1, :] = False  # all padding
    prompt_mask[2, :5] = False
    prefix = types.SimpleNamespace(layers=[types.SimpleNamespace(keys=gk, values=gv)])
    cache = CascadeCache(prefix, row_of, prompt_mask, columns, segment)
    assert cache.uniform == (row_of == sorted(row_of))
    module = types.SimpleNamespace(layer_idx=0, is_causal=True)
    row_k, row_v = (torch.randn(rows, kv_heads, columns, dim, generator=g) for _ in range(2))
    index = torch.tensor(row_of)
    for column in range(columns):
        cache.seek(column)
        assert cache.end == min(columns, (column // segment + 1) * segment)
        key, value = cache.update(row_k[:, :, column : column + 1], row_v[:, :, column : column + 1], 0)
        assert key.shape[2] == cache.end
        query = torch.randn(rows, heads, 1, dim, generator=g)
        got, _ = cascade_attention(module, query, key, value, None, scaling=dim**-0.5, tea_cascade=cache)
        full_k = torch.cat([gk[index], row_k[:, :, : column + 1]], dim=2)
        full_v = torch.cat([gv[index], row_v[:, :, : column + 1]], dim=2)
        full_mask = torch.cat([prompt_mask[index], torch.ones(rows, column + 1, dtype=torch.bool)], dim=1)[:, None, None, :]
        want, _ = sdpa_gqa_attention(module, query, full_k, full_v, full_mask, scaling=dim**-0.5)
        assert got.shape == want.shape == (rows, 1, heads, dim)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the unwritten columns are masked, not zero-valued keys: a wrong mask would have changed the outputs above
    assert torch.equal(cache.keys[0], row_k)


def test_without_the_cascade_keyword_it_is_sdpa_gqa():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 4, 3, 8, generator=g), torch.randn(2, 2, 3, 8, generator=g), torch.randn(2, 2, 3, 8, generator=g)
    module = types.SimpleNamespace(layer_idx=0, is_causal=True)
    torch.testing.assert_close(cascade_attention(module, q, k, v, None)[0], sdpa_gqa_attention(module, q, k, v, None)[0], rtol=0, atol=0)


# -- the engine ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [12, 7], ids=["whole groups", "groups split across batches"])
def test_the_cascade_engine_samples_what_the_default_engine_samples(model, tok, prompts, batch_size, cascades):
    """Same seed, same tokens as rollout.attention sdpa_gqa (static cache), three prompts of different lengths x 4
    samples, at several sampling settings, with segments of 4 columns (20 new tokens: 5 segment lengths), in batches
    of whole groups (the group layout as it is) and of 7 rows (groups split: the gathered layout). The prompt's K/V
    is held once per distinct prompt, and every decode forward ran on the cascade."""
    plain = HFEngine(model, tok, batch_size=batch_size, kv_cache="static", cache_bucket=16)
    cascade = HFEngine(model, tok, batch_size=batch_size, kv_cache="static", cache_bucket=16, attention="cascade")
    cascade.cascade_segment = 4
    layers = model.config.num_hidden_layers
    for kw in ({"top_k": 1}, {}, {"top_k": 20, "top_p": 0.9, "temperature": 0.8}):
        s = sample(**kw)
        cascades.clear()
        got = ids_of(cascade.generate(prompts, n=4, sampling=s, seed=3))
        assert got == ids_of(plain.generate(prompts, n=4, sampling=s, seed=3)), kw
        assert [c.group_keys[0].shape[0] for c in cascades] == ([3] if batch_size == 12 else [2, 2])
        assert all(c.updates == layers * s.max_new_tokens for c in cascades)  # 20 forwards a batch: none stopped early
    assert cascades[0].uniform == (batch_size == 12)
    assert model.config._attn_implementation != "tea_cascade"  # restored after the call


def test_a_one_token_prompt_beside_longer_ones(model, tok, prompts, cascades):
    """A group whose prompt is a single token has an all-padding prompt part (its own column is the whole context)."""
    bos = [tok.bos_token_id]
    batch = [bos, prompts[0], prompts[2]]
    s = sample(max_new_tokens=10)
    plain = HFEngine(model, tok, batch_size=6, kv_cache="static", cache_bucket=16)
    cascade = HFEngine(model, tok, batch_size=6, kv_cache="static", cache_bucket=16, attention="cascade")
    assert ids_of(cascade.generate(batch, n=2, sampling=s, seed=1)) == ids_of(plain.generate(batch, n=2, sampling=s, seed=1))
    assert len(cascades) == 1 and not bool(cascades[0].group_bias[0].isfinite().any())


def test_without_shared_prompts_the_engine_takes_the_default_path(model, tok, prompts, cascades):
    """n = 1 (every row its own prompt) and share_prefix off: no cascade, the default engine's tokens."""
    s = sample(max_new_tokens=8)
    plain = HFEngine(model, tok, batch_size=8, kv_cache="static", cache_bucket=16)
    for kw in ({}, {"share_prefix": False}):
        cascade = HFEngine(model, tok, batch_size=8, kv_cache="static", cache_bucket=16, attention="cascade", **kw)
        n = 1 if not kw else 2
        assert ids_of(cascade.generate(prompts, n=n, sampling=s, seed=2)) == ids_of(plain.generate(prompts, n=n, sampling=s, seed=2))
    assert cascades == []


@pytest.mark.slow
def test_the_compiled_cascade_generates_the_eager_tokens(model, tok, prompts):
    """rollout.compile on the CPU (inductor, no CUDA graphs): the compiled cascade decode gives the default engine's
    tokens, compiling one graph per segment length (12 new tokens in segments of 4: columns 1-3, 4-7, 8-11; the
    first forward, column 0, runs uncompiled as the engine's first forward always does)."""
    from torch._dynamo.utils import counters

    s = sample(max_new_tokens=12)
    want = ids_of(HFEngine(model, tok, batch_size=12, kv_cache="static", cache_bucket=16).generate(prompts, n=4, sampling=s, seed=0))
    engine = HFEngine(model, tok, batch_size=12, kv_cache="static", cache_bucket=16, attention="cascade", compile=True)
    engine.cascade_segment = 4
    before = counters["stats"]["unique_graphs"]
    assert ids_of(engine.generate(prompts, n=4, sampling=s, seed=0)) == want
    assert counters["stats"]["unique_graphs"] - before == 3
    assert ids_of(engine.generate(prompts, n=4, sampling=s, seed=0)) == want
    assert counters["stats"]["unique_graphs"] - before == 3  # the second call recompiles nothing
