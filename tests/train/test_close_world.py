"""`tea train` under a launcher tears its process group down once every rank has finished (CI saw rank 1 of
tests/train/test_train_e2e.py::test_zero_two_processes[3] abort at interpreter exit after a complete run:
"terminate called without an active exception", exit -6, while the gloo group's threads still ran); a run
alone leaves the group as it is (in-process callers, such as the tests' one-process group, keep using it)."""

from __future__ import annotations

import contextlib
import types

import pytest


@pytest.mark.parametrize("world_size, want", [(2, ["train", "close_world"]), (1, ["train"])])
def test_the_process_group_is_torn_down_after_a_multi_process_run(monkeypatch, tmp_path, world_size, want):
    import torch
    from tiny_lm import tiny_recipe

    from teacli.config import recipe_from_dict
    from teacli.train import backend, loop

    events: list[str] = []
    world = backend.World(rank=0, world_size=world_size, local_rank=0, device=torch.device("cpu"))
    monkeypatch.setattr(backend, "init_world", lambda: world)
    monkeypatch.setattr(backend, "close_world", lambda: events.append("close_world"))
    monkeypatch.setattr(loop, "run_lock", lambda run, w: contextlib.nullcontext())
    monkeypatch.setattr(loop, "on_rank0", lambda w, fn, *args: fn(*args))
    monkeypatch.setattr(loop, "check_run_dir", lambda run, recipe: types.SimpleNamespace(step=0, changed={}))
    monkeypatch.setattr(loop, "_train_steps", lambda *args: events.append("train"))
    recipe = recipe_from_dict(tiny_recipe(tmp_path / "policy", tmp_path / "data"))
    loop.train(recipe, tmp_path / "run")
    assert events == want

