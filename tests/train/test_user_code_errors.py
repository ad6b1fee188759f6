"""`tea train` when the user's code fails inside a run: one line naming it, exit 2, never a silent exit 0
(a reward's `sys.exit(0)` used to end the run with exit 0 having trained nothing). In-process: the loop's
setup and steps are replaced by the part that calls the user's code, so no model is built."""

from __future__ import annotations

import contextlib
import sys
import textwrap
import types

import pytest
import torch
from typer.testing import CliRunner


@pytest.fixture
def run_with(monkeypatch, tmp_path):
    """tea train on a recipe whose reward is `train_user_rewards:<name>`; its steps only score three responses."""
    from tiny_lm import tiny_recipe, write_recipe

    from teacli.cli import app
    from teacli.train import backend, loop

    (tmp_path / "train_user_rewards.py").write_text(textwrap.dedent(
        """
        import sys

        def exits(prompts, responses):
            sys.exit(0)

        def keyerror(prompts, responses):
            return [{}["label"] for _ in responses]
        """
    ))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "train_user_rewards", raising=False)
    world = backend.World(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    monkeypatch.setattr(backend, "init_world", lambda: world)
    monkeypatch.setattr(loop, "run_lock", lambda run, w: contextlib.nullcontext())
    monkeypatch.setattr(loop, "on_rank0", lambda w, fn, *args: fn(*args))
    monkeypatch.setattr(loop, "check_run_dir", lambda run, recipe: types.SimpleNamespace(step=0, changed={}))

    def run(function: str, steps=None):
        def train_steps(recipe, run, world, start, is_level, engine_name, split=None):  # the run's files written, then the first reward call
            from teacli.rewards import build_reward, checked_score
            from teacli.types import Prompt

            run.path.mkdir(parents=True, exist_ok=True)
            run.recipe.write_text("name: r\n")
            prompt = Prompt(id="p0", messages=({"role": "user", "content": "q"},))
            checked_score(build_reward(recipe.reward), [prompt] * 3, ["a", "b", "c"])

        monkeypatch.setattr(loop, "_train_steps", steps or train_steps)
        rec = write_recipe(tmp_path / "r.yaml", tiny_recipe(tmp_path / "policy", tmp_path / "data", reward={"kind": "python", "function": function}))
        return CliRunner().invoke(app, ["train", str(rec), "--run-dir", str(tmp_path / "run")])

    return run


def test_a_reward_that_calls_sys_exit_fails_the_run_naming_the_function(run_with, tmp_path):
    res = run_with("train_user_rewards:exits")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    log = tmp_path / "run" / "reward_error.log"
    assert res.stderr.strip() == (f"error: the reward function train_user_rewards:exits called sys.exit(0) (scoring 3 responses); a reward "
                                  f"returns its scores or raises: the run stops here (its traceback: {log})")
    assert "sys.exit(0)" in log.read_text()


def test_a_reward_that_raises_is_one_line_naming_it_with_the_traceback_in_the_run(run_with, tmp_path):
    res = run_with("train_user_rewards:keyerror")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output, res.output
    log = tmp_path / "run" / "reward_error.log"
    assert res.stderr.strip() == f"error: the reward function train_user_rewards:keyerror raised KeyError: 'label' (its traceback: {log})"
    assert log.read_text().startswith("Traceback") and 'return [{}["label"] for _ in responses]' in log.read_text()


def test_any_exit_from_code_the_run_calls_is_a_failure(run_with, tmp_path):
    def steps(*args):
        raise SystemExit(0)  # e.g. a user's advantage rule

    res = run_with("train_user_rewards:keyerror", steps)
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == (f"error: training of {tmp_path / 'run'} stopped: code it called exited (sys.exit(0)) without "
                                  f"finishing the run; rerun the command to resume from its last checkpoint")
