"""policy.gradient_checkpointing: auto — the memory rule of train/backend.py, at its threshold."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_lm import make_causal_lm, make_tokenizer

from teacli.config import Recipe, RecipeError, load_recipe
from teacli.train import backend


def recipe(mb: int = 8) -> Recipe:
    r = Recipe()
    r.policy.gradient_checkpointing = "auto"
    r.optim.micro_batch_size, r.data.max_prompt_tokens, r.rollout.max_new_tokens = mb, 100, 28
    return r


def world(device: str) -> backend.World:
    return backend.World(rank=0, world_size=1, local_rank=0, device=torch.device(device))


def test_auto_turns_on_exactly_when_activations_exceed_half_the_free_memory(monkeypatch):
    model = make_causal_lm(make_tokenizer())  # hidden 64, 2 layers, intermediate 128
    n = sum(p.numel() for p in model.parameters())
    activations = 8 * (100 + 28) * 2 * 2 * (16 * 64 + 3 * 128)  # mb x tokens x layers x bf16 x (16 h + 3 i)
    states = 2 * n + 2 * n + 2 * n + 12 * n  # weights, reference (beta > 0), gradients, fp32 master + AdamW
    for total, expected in ((states + 2 * activations + 2, False), (states + 2 * activations - 2, True)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d, t=total: SimpleNamespace(total_memory=t))
        assert backend.gradient_checkpointing(recipe(), model, world("cuda")) is expected, total
    assert backend.gradient_checkpointing(recipe(), model, world("cpu")) is False  # never on CPU
    for setting in (True, False):
        r = recipe()
        r.policy.gradient_checkpointing = setting
        assert backend.gradient_checkpointing(r, model, world("cpu")) is setting


def test_recipe_accepts_auto_and_bools_only(tmp_path):
    base = "policy: {name_or_path: p, gradient_checkpointing: %s}\ndata: {dir: d}\n"
    for text, value in (("auto", "auto"), ("true", True), ("false", False)):
        (tmp_path / "r.yaml").write_text(base % text)
        assert load_recipe(tmp_path / "r.yaml").policy.gradient_checkpointing == value
    (tmp_path / "r.yaml").write_text(base % "sometimes")
    with pytest.raises(RecipeError, match="policy.gradient_checkpointing.*r.yaml"):
        load_recipe(tmp_path / "r.yaml")
    (tmp_path / "r.yaml").write_text("policy: {name_or_path: p}\ndata: {dir: d}\nrollout: {compile: maybe}\n")
    with pytest.raises(RecipeError, match="rollout.compile.*r.yaml"):
        load_recipe(tmp_path / "r.yaml")
