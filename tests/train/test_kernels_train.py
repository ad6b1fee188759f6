"""policy.kernels in the trainer (CPU, a real one-process DeepSpeed engine): `train_step` over compiled
decoder layers computes the eager gradient under ZeRO-2, with each prompt run once on a KV cache
(optim.share_prompts); `liger` asked for on CPU is refused before any model is loaded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from test_exact_steps import full_batch_gradient, make_batch  # noqa: E402


@pytest.mark.slow
def test_train_step_with_compiled_layers_has_the_eager_gradient_under_zero2(world):
    import torch
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.config import Recipe
    from teacli.kernels import apply_kernels
    from teacli.train import backend
    from teacli.train.update import shares_prompts, train_step

    tok = make_tokenizer()
    recipe = Recipe()
    recipe.backend.zero_stage, recipe.backend.precision, recipe.policy.kernels = 2, "fp32", "compile"
    recipe.optim.micro_batch_size, recipe.optim.max_grad_norm, recipe.kl.beta = 4, 1.0e6, 0.1
    policy = apply_kernels(make_causal_lm(tok, seed=0), "compile", generates=True)
    reference = apply_kernels(make_causal_lm(tok, seed=1).requires_grad_(False), "compile", generates=False)
    engine = backend.build_engine(policy, recipe, world, 2, "fp32")
    twin, twin_ref = make_causal_lm(tok, seed=0), make_causal_lm(tok, seed=1).requires_grad_(False)  # eager
    for k, share in enumerate((True,)):  # whole sequences: tests/test_kernels.py
        recipe.optim.share_prompts = share
        assert shares_prompts(recipe, engine, reference) is share
        prompt_ids, groups = make_batch(2, 4, seed=k, vocab=len(tok), eos=tok.eos_token_id)
        advantages = torch.randn(2, 4, generator=torch.Generator().manual_seed(k))
        twin.load_state_dict(engine.module.state_dict())
        want = full_batch_gradient(twin.train(), twin_ref, recipe, prompt_ids, groups, advantages, tok.pad_token_id)
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in want.values()])))
        stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id, torch.device("cpu"))
        assert stats["optimizer_step"] == k + 1
        assert stats["grad_norm"] == pytest.approx(norm, rel=1e-4), share  # ZeRO-2 received the eager gradient


def test_liger_on_cpu_is_refused_before_any_model_is_loaded(world, tmp_path):
    from tiny_lm import tiny_recipe

    from teacli.config import recipe_from_dict
    from teacli.train.errors import TrainError
    from teacli.train.loop import train

    recipe = recipe_from_dict(tiny_recipe(tmp_path / "no-policy", tmp_path / "no-data", policy__kernels="liger"))
    with pytest.raises(TrainError) as err:
        train(recipe, tmp_path / "run")
    assert str(err.value) == "policy.kernels: liger needs a CUDA device (its kernels are Triton); use eager, compile or auto"
    assert not (tmp_path / "run").exists()  # nothing written


def test_a_stop_token_that_is_not_one_token_is_refused_before_any_model_is_loaded(world, tmp_path):
    """rollout.stop_tokens is checked against the policy's tokenizer right after it loads: one line naming the
    key, nothing written (the policy directory holds only a tokenizer: no model is needed to refuse it)."""
    from tiny_lm import make_tokenizer, tiny_recipe

    from teacli.config import recipe_from_dict
    from teacli.data.prepare import prepare
    from teacli.train.errors import TrainError
    from teacli.train.loop import train

    make_tokenizer().save_pretrained(tmp_path / "policy")
    prepare("builtin", tmp_path / "data")
    recipe = recipe_from_dict(tiny_recipe(tmp_path / "policy", tmp_path / "data", rollout__stop_tokens=["<|user|>", "the sea"]))
    with pytest.raises(TrainError) as err:
        train(recipe, tmp_path / "run")
    assert str(err.value).startswith("rollout.stop_tokens: 'the sea' is 2 tokens of the policy's vocabulary")
    assert not (tmp_path / "run").exists()
