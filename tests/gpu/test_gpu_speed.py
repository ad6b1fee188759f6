"""GPU checks of issue 12's fast paths (`python -m pytest -m gpu tests/gpu`): the hf engine with
sdpa_gqa attention, the bucketed static cache and torch.compile; liger-kernel's fused log-probs."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tiny(cuda):
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.models import encode_chat

    tok = make_tokenizer()
    model = make_causal_lm(tok).to(cuda)
    questions = ["what is the capital of france", "write a short poem about the sea", "one two three"]
    prompts = [encode_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True) for q in questions]
    return tok, model, prompts


def test_compiled_static_sdpa_gqa_generation_matches_the_old_path(tiny, cuda):
    import torch
    from torch._dynamo.utils import counters

    from teacli.rollout.hf import HFEngine
    from teacli.types import SamplingConfig

    tok, model, prompts = tiny
    old = HFEngine(model, tok, batch_size=8, attention="sdpa", kv_cache="dynamic", compile=False)
    new = HFEngine(model, tok, batch_size=8)  # the defaults: sdpa_gqa, static cache, compile on CUDA
    assert new.resolved(cuda) == (True, True)
    greedy = SamplingConfig(temperature=1.0, top_p=1.0, top_k=1, max_new_tokens=24)
    want = [[c.token_ids for c in row] for row in old.generate(prompts, 3, greedy, seed=0)]
    for _ in range(2):  # the second call reuses the compiled decode step
        got = [[c.token_ids for c in row] for row in new.generate(prompts, 3, greedy, seed=0)]
        assert got == want
    assert counters["stats"]["unique_graphs"] > 0  # it did compile
    sampled = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=24)
    a = new.generate(prompts, 4, sampled, seed=5)
    b = new.generate(prompts, 4, sampled, seed=5)
    assert [[c.token_ids for c in r] for r in a] == [[c.token_ids for c in r] for r in b]  # reproducible
    assert all(c.finished == (c.token_ids[-1] == tok.eos_token_id) for r in a for c in r)
    torch.cuda.synchronize()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_liger_logprobs_match_the_chunked_and_full_logits(tiny, cuda, dtype):
    pytest.importorskip("liger_kernel")
    import torch

    from teacli.logprobs import resolved_kind, token_logprobs

    tok, model, _ = tiny
    model = type(model)(model.config).to(cuda, getattr(torch, dtype))
    model.load_state_dict(tiny[1].state_dict())
    model.train()
    assert resolved_kind(model, cuda) == "liger"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (4, 13), generator=g).to(cuda)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[2, 10:] = 0
    weights = torch.randn(4, 7, generator=g).to(cuda)
    results = {}
    for kind in ("plain", "chunked", "liger"):
        model.zero_grad(set_to_none=True)
        value = token_logprobs(model, ids, mask, 6, fused=kind)
        (value * weights).sum().backward()
        results[kind] = (value.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})
    # Relative error in norm: bf16 gradients differ elementwise by rounding (each path rounds its own
    # bf16 logits-gradient chunks), so elementwise tolerances would test bf16, not the computation.
    tol = {"float32": 1e-4, "bfloat16": 3e-2}[dtype]

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))

    for kind in ("chunked", "liger"):
        assert rel(results[kind][0], results["plain"][0]) < tol, kind
        errors = {name: rel(results[kind][1][name], grad) for name, grad in results["plain"][1].items()}
        assert max(errors.values()) < tol, (kind, errors)


def test_gradient_checkpointing_auto_is_off_for_a_small_model_on_a_big_gpu(tiny, cuda):
    from teacli.config import Recipe
    from teacli.train.backend import World, resolve_checkpointing

    recipe = Recipe()
    recipe.policy.gradient_checkpointing = "auto"
    world = World(rank=0, world_size=1, local_rank=0, device=cuda)
    assert resolve_checkpointing(recipe, tiny[1], world).layers == 0
    recipe.optim.micro_batch_size, recipe.data.max_prompt_tokens, recipe.rollout.max_new_tokens = 10**6, 10**4, 10**4
    assert resolve_checkpointing(recipe, tiny[1], world).layers == 1  # of 2: the least memory (the last layer is never worth it)


def test_the_compiled_draw_and_log_softmax_give_the_eager_results(cuda):
    """What runs compiled on CUDA against its eager self. The draw: on an even grid of u (as the CPU test) the compiled
    kernel is the softmax's quantile function (counts n·p_i within 2, never a −inf token); at the 1B recipe's shape,
    with the same u, the same token in all but a few rows (the sums round differently: 2 of 512 here). The reference's
    log-softmax: the same log-probs within fp32 rounding of the sums."""
    import torch

    import teacli.logprobs as logprobs
    from teacli.rollout.hf import DRAW_BLOCK, inverse_cdf_tokens

    compiled = torch.compile(inverse_cdf_tokens, dynamic=False)
    vocab = 3 * DRAW_BLOCK + 37
    scores = torch.randn(vocab, device=cuda, generator=torch.Generator(device=cuda).manual_seed(1), dtype=torch.float64) * 2
    scores[DRAW_BLOCK : 2 * DRAW_BLOCK - 9] = -float("inf")
    n = 20_000
    u = ((torch.arange(n, device=cuda, dtype=torch.float64) + 0.5) / n).float()[:, None]
    counts = torch.bincount(compiled(scores.bfloat16().expand(n, vocab), u), minlength=vocab).double()
    exact = scores.bfloat16().double().softmax(-1)
    assert (counts[exact == 0] == 0).all() and ((counts - n * exact).abs() <= 2).all()

    g = torch.Generator(device=cuda).manual_seed(0)
    logits = (torch.randn(512, 128256, device=cuda, generator=g) * 3).bfloat16()
    u = torch.rand(512, 1, device=cuda, generator=g)
    assert (compiled(logits, u) != inverse_cdf_tokens(logits, u)).sum().item() <= 10

    head = torch.nn.Linear(2048, 128256, bias=False, device=cuda, dtype=torch.bfloat16)
    rows = torch.randn(5000, 2048, device=cuda, dtype=torch.bfloat16)  # 3 chunks, the last a different size
    targets = torch.randint(0, 128256, (5000,), device=cuda)
    with torch.no_grad():
        assert logprobs._forward_chunk(head, rows) is not logprobs._chunk_logprobs  # compiled here
        got = logprobs._chunked(head, rows, targets)
        want = torch.cat([logprobs._chunk_logprobs(head, rows[s : s + 2048], targets[s : s + 2048]) for s in range(0, 5000, 2048)])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    rows.requires_grad_()
    assert logprobs._forward_chunk(head, rows) is logprobs._chunk_logprobs  # a gradient: eager
