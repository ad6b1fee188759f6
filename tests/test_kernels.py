"""policy.kernels (teacli/kernels.py) on CPU: compiled decoder layers give the eager log-probs and
gradients (fp32, with gradient checkpointing, with LoRA), generation keeps the eager layers, and the
key's bad values are one-line errors. liger-kernel runs on CUDA only: tests/gpu/test_gpu_kernels.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

# Inductor reorders fp32 reductions (RMSNorm, matmul epilogues): equal to eager up to float rounding.
ATOL = 1e-5


def _batch(seed: int, rows: int, width: int):
    """A left-padded prompt of 6 columns + completion batch with right padding, and loss weights."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, 60, (rows, width), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding of the prompt
    mask[-1, width - 2 :] = 0  # right padding of a completion
    return ids, mask, torch.randn(rows, width - 6, generator=g)


def _logprobs_and_grads(model, batch):
    from teacli.logprobs import token_logprobs

    ids, mask, weights = batch
    model.zero_grad(set_to_none=True)
    value = token_logprobs(model, ids, mask, 6)
    (value * weights).sum().backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_equal(got, want):
    import torch

    assert torch.allclose(got[0], want[0], atol=ATOL, rtol=0), (got[0] - want[0]).abs().max()
    assert got[1].keys() == want[1].keys() and want[1]
    for name, grad in want[1].items():
        assert torch.allclose(got[1][name], grad, atol=ATOL, rtol=1e-4), (name, (got[1][name] - grad).abs().max())


def _pair(tok, *, checkpointing: bool, lora: bool = False):
    """(eager, compiled) copies of one tiny fp32 Llama, in train mode."""
    import torch
    from tiny_lm import make_causal_lm

    from teacli.config import LoraConfig
    from teacli.kernels import apply_kernels, decoder_layers, resolve_kernels

    models = []
    for kind in ("eager", "compile"):
        model = make_causal_lm(tok)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert resolve_kernels(kind, model, "cpu") == kind
        apply_kernels(model, kind, generates=True)
        assert len(decoder_layers(model)) == model.config.num_hidden_layers
        if lora:
            from teacli.lora import apply_lora

            model = apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8))
            with torch.no_grad():  # adapters that change the output: B starts at zero
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(len(name)))
        models.append(model.train())
    return models


def test_compiled_layers_equal_eager_with_and_without_checkpointing():
    import torch
    from torch._dynamo.utils import counters
    from tiny_lm import make_tokenizer

    torch._dynamo.reset()  # a graph compiled by an earlier test would be reused: count this test's own
    tok = make_tokenizer()
    batch = _batch(0, 3, 11)
    for checkpointing in (False, True):
        eager, compiled = _pair(tok, checkpointing=checkpointing)
        before = counters["stats"]["unique_graphs"]
        _assert_equal(_logprobs_and_grads(compiled, batch), _logprobs_and_grads(eager, batch))
        if not checkpointing:  # the first call compiled: one graph shared by both layers (regional compilation)
            assert counters["stats"]["unique_graphs"] - before == 1
    # The compiled path really ran: its layers' forward is the dispatcher, and eval mode is eager (no new graph).
    before = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        a = compiled.eval()(input_ids=batch[0][:, :7]).logits
        b = eager.eval()(input_ids=batch[0][:, :7]).logits
    assert counters["stats"]["unique_graphs"] == before
    assert torch.equal(a, b)  # eval mode runs the same eager modules


@pytest.mark.slow
def test_compiled_layers_equal_eager_with_lora_and_a_second_shape():
    from tiny_lm import make_tokenizer

    tok = make_tokenizer()
    eager, compiled = _pair(tok, checkpointing=True, lora=True)
    for batch in (_batch(1, 3, 11), _batch(2, 4, 15)):  # the second shape recompiles with dynamic sizes
        got, want = _logprobs_and_grads(compiled, batch), _logprobs_and_grads(eager, batch)
        assert all("lora_" in name for name in want[1])  # only the adapters train
        _assert_equal(got, want)


def test_generation_with_compiled_policy_uses_the_eager_layers():
    """The hf engine generates with the policy in eval mode: the same samples as the eager model, and
    nothing compiled (its own compiled decode step would otherwise nest ours)."""
    from torch._dynamo.utils import counters
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.kernels import apply_kernels
    from teacli.models import encode_chat
    from teacli.rollout.hf import HFEngine
    from teacli.types import SamplingConfig

    tok = make_tokenizer()
    prompts = [encode_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True) for q in ("the cat sat", "one two three")]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6)
    eager = HFEngine(make_causal_lm(tok), tok, batch_size=4).generate(prompts, 2, sampling, seed=3)
    model = apply_kernels(make_causal_lm(tok).train(), "compile", generates=True)
    before = counters["stats"]["unique_graphs"]
    got = HFEngine(model, tok, batch_size=4).generate(prompts, 2, sampling, seed=3)
    assert counters["stats"]["unique_graphs"] == before
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in g] for g in eager]
    assert model.training  # the engine restored train mode


def test_liger_patch_stays_out_of_generation(monkeypatch):
    """liger's kernels are Triton (CUDA only), so a stand-in does what its per-architecture patch does:
    binds new forwards on the RMSNorm and MLP instances and swaps the architecture module's rotary
    function, each counting its calls. The policy's training forward goes through them; the hf engine's
    generation does not (on a GPU it ran 3.3x slower through them) and samples what the eager model
    samples, also after the reference model's patch has put the rotary function back. The reference
    model's no-grad pass goes through all three, as the policy's training forward does (on an H100 the
    eager rotary there left a KL of -0.002 a sequence before the first update)."""
    import torch
    import transformers.models.llama.modeling_llama as llama
    from tiny_lm import liger_stand_in, make_causal_lm, make_tokenizer

    from teacli import kernels
    from teacli.models import encode_chat
    from teacli.rollout.hf import HFEngine
    from teacli.types import SamplingConfig

    calls = {"norm": 0, "mlp": 0, "rotary": 0}
    eager_rotary = llama.apply_rotary_pos_emb
    monkeypatch.setattr(kernels, "_liger_table", lambda: {"llama": liger_stand_in(calls, eager_rotary)})
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", eager_rotary)  # restored after the test
    monkeypatch.setattr(kernels, "_EAGER_GLOBALS", {})
    monkeypatch.setattr(kernels, "_GENERATING_ARCHS", set())

    tok = make_tokenizer()
    prompts = [encode_chat(tok, [{"role": "user", "content": q}], add_generation_prompt=True) for q in ("the cat sat", "one two three")]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6)
    want = HFEngine(make_causal_lm(tok), tok, batch_size=4, compile=False).generate(prompts, 2, sampling, seed=3)
    policy = kernels.apply_kernels(make_causal_lm(tok).train(), "liger", generates=True)
    reference = kernels.apply_kernels(make_causal_lm(tok).eval(), "liger", generates=False)  # swaps the rotary again

    ids, mask, _ = _batch(0, 2, 9)
    policy(input_ids=ids, attention_mask=mask).logits.sum().backward()  # the training forward: liger throughout
    assert min(calls.values()) > 0, calls
    before = dict(calls)
    with torch.no_grad():
        reference(input_ids=ids, attention_mask=mask)  # the reference's no-grad pass: the training forward's kernels
    assert all(calls[k] > before[k] for k in calls), (before, calls)  # rotary too: else the KL at step 1 is not 0
    trained = dict(calls)
    assert calls["norm"] > 0 and calls["mlp"] > 0
    got = HFEngine(policy, tok, batch_size=4, compile=False).generate(prompts, 2, sampling, seed=3)
    assert calls["norm"] == trained["norm"] and calls["mlp"] == trained["mlp"] and calls["rotary"] == trained["rotary"], calls
    assert [[c.token_ids for c in g] for g in got] == [[c.token_ids for c in g] for g in want]
    assert policy.training  # the engine restored train mode


def test_resolve_kernels_on_cpu():
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.kernels import resolve_kernels

    model = make_causal_lm(make_tokenizer())
    assert resolve_kernels("auto", model, "cpu") == "eager"  # today's CPU behaviour
    assert resolve_kernels("eager", model, "cpu") == "eager"
    with pytest.raises(ValueError, match=r"^policy.kernels: liger needs a CUDA device"):
        resolve_kernels("liger", model, "cpu")
    with pytest.raises(ValueError, match=r"^policy.kernels: 'fused' is not one of auto, eager, liger, compile"):
        resolve_kernels("fused", model, "cpu")
    model._no_split_modules = []  # a model whose repeated blocks tea cannot find
    with pytest.raises(ValueError, match=r"^policy.kernels: compile found no decoder layers in LlamaForCausalLM"):
        resolve_kernels("compile", model, "cpu")


def test_recipe_checks_of_policy_kernels(tmp_path):
    from teacli.config import EXECUTION_KEYS, RecipeError, load_recipe

    path = tmp_path / "r.yaml"
    path.write_text("policy: {name_or_path: p}\ndata: {dir: d}\n")
    assert load_recipe(path).policy.kernels == "auto"  # eager on CPU; liger where installed on CUDA (docs/performance.md)
    assert load_recipe(path, ["policy.kernels=compile"]).policy.kernels == "compile"
    with pytest.raises(RecipeError, match=r"policy.kernels.*'triton'"):
        load_recipe(path, ["policy.kernels=triton"])
    with pytest.raises(RecipeError, match=r"^policy.kernels: compile is not supported with backend.zero_stage 3"):
        load_recipe(path, ["policy.kernels=compile", "backend.zero_stage=3"])
    assert "policy.kernels" in EXECUTION_KEYS  # the same values, computed otherwise: a resume may change it


def test_a_generation_in_another_thread_leaves_this_threads_fused_kernels_on():
    """One step off-policy generates in a background thread while the trainer's forward runs in the main one: the
    switch to the eager functions (`kernels.generating`) holds only in the generating thread."""
    import threading

    from teacli import kernels

    pick = kernels._outside_generation(lambda: "fused", lambda: "eager")
    inside, release, seen = threading.Event(), threading.Event(), []

    def generate():
        with kernels.generating():
            seen.append(pick())
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=generate)
    thread.start()
    assert inside.wait(10)
    try:
        assert pick() == "fused"  # the trainer's thread, while the other generates
    finally:
        release.set()
        thread.join()
    assert seen == ["eager"]
    with kernels.generating():
        assert pick() == "eager"
