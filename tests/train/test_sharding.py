"""A step over any number of ranks (teacli/train/sharding.py): prompts for generation, sequences for the update."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "train"))


def test_shares_are_contiguous_and_differ_by_at_most_one():
    from teacli.train.sharding import most_sequences, shares

    assert shares(8, 3) == [(0, 3), (3, 3), (6, 2)]
    assert shares(6, 3) == [(0, 2), (2, 2), (4, 2)]
    assert shares(2, 3) == [(0, 1), (1, 1), (2, 0)]
    assert most_sequences(8, 4, 6) == 6 and most_sequences(8, 4, 4) == 8  # ⌈32/6⌉; 32/4


def test_reshard_gives_each_rank_its_slice_of_the_steps_sequences_in_order():
    """Three ranks with 3, 3 and 2 groups of 4 (P = 8, m = 4): each takes ⌊32/3⌋ or ⌈32/3⌉ sequences, contiguous in
    rank-then-group order, as runs of one prompt each, with each sequence's own advantage."""
    import torch

    from teacli.train.sharding import reshard
    from teacli.types import Completion

    m, per_rank = 4, [3, 3, 2]
    ranks = []
    g = 0
    for count in per_rank:
        ids = [[100 + g + k] for k in range(count)]
        groups = [[Completion([g + k, j], f"{g + k}.{j}", True) for j in range(m)] for k in range(count)]
        adv = torch.tensor([[float(10 * (g + k) + j) for j in range(m)] for k in range(count)])
        ranks.append((ids, groups, adv))
        g += count
    gathered = [(ids, groups, adv.tolist()) for ids, groups, adv in ranks]
    slices = [reshard(*ranks[r], rank=r, ranks=3, gather=lambda mine: gathered) for r in range(3)]
    assert [len(adv) for _, _, adv in slices] == [11, 11, 10]
    flat = [(p[0], c.text, a) for ids, runs, adv in slices for p, run in zip(ids, runs) for c in run for a in [None]]
    texts = [t for _, t, _ in flat]
    assert texts == [f"{k}.{j}" for k in range(8) for j in range(m)]  # every sequence once, in order
    for ids, runs, adv in slices:
        k = 0
        for p, run in zip(ids, runs):
            assert all(c.token_ids[0] == p[0] - 100 for c in run)  # a run shares its prompt
            for c in run:
                assert adv[k] == 10 * c.token_ids[0] + c.token_ids[1]  # the sequence's own advantage
                k += 1
    assert [len(run) for run in slices[0][1]] == [4, 4, 3] and [len(run) for run in slices[1][1]] == [1, 4, 4, 2]


def test_the_ranks_sharded_gradients_average_to_the_full_batch_gradient(world):
    """The update's arithmetic: each of W = 3 shards' gradient with the loss divided by P·m/W, averaged over the
    shards (what the data-parallel all-reduce does), equals the gradient of the whole step's batch on one rank.
    Played on one engine at an lr too small to change a weight, shard after shard."""
    import torch
    from test_exact_steps import full_batch_gradient, make_batch
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.config import Recipe
    from teacli.train import backend
    from teacli.train.sharding import reshard
    from teacli.train.update import train_step

    tok = make_tokenizer()
    recipe = Recipe()
    recipe.backend.zero_stage, recipe.backend.precision, recipe.kl.beta = 0, "fp32", 0.1
    recipe.optim.micro_batch_size, recipe.optim.max_grad_norm, recipe.optim.lr = 4, 0.0, 1e-20
    reference = make_causal_lm(tok, seed=1).requires_grad_(False)  # a different model: a non-zero KL gradient
    engine = backend.build_engine(make_causal_lm(tok, seed=0), recipe, world, 3, "fp32")  # ⌈11 / 4⌉ micro-batches
    twin = make_causal_lm(tok, seed=0).to(torch.float32)
    P, m, W = 4, 8, 3  # 32 sequences: 11, 11, 10
    prompt_ids, groups = make_batch(P, m, seed=5, vocab=len(tok), eos=tok.eos_token_id)
    advantages = torch.randn(P, m, generator=torch.Generator().manual_seed(5))
    twin.load_state_dict(engine.module.state_dict())
    want = full_batch_gradient(twin, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id)
    seen: list[dict] = []
    engine.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append({n: p.grad.detach().clone() for n, p in engine.module.named_parameters()}))
    # generation's shares of the prompts (2, 1, 1 groups), then the update's shares of the sequences
    own = [(prompt_ids[a:b], groups[a:b], advantages[a:b]) for a, b in ((0, 2), (2, 3), (3, 4))]
    gathered = [(i, g, a.tolist()) for i, g, a in own]
    for r in range(W):
        ids, runs, adv = reshard(*own[r], rank=r, ranks=W, gather=lambda mine: gathered)
        train_step(engine, reference, recipe, ids, runs, adv, tok.pad_token_id, torch.device("cpu"), denominator=P * m / W)
    assert len(seen) == W
    for name, g in want.items():
        mean = sum(s[name] for s in seen) / W
        torch.testing.assert_close(mean, g, rtol=1e-4, atol=1e-6, msg=lambda msg: f"{name}: {msg}")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from tiny_lm import make_assets

    return make_assets(tmp_path_factory.mktemp("sharding_assets"))


@pytest.mark.slow
def test_three_ranks_train_four_prompts(assets, tmp_path):
    """`tea train` on 3 processes with P = 4 (not a multiple): ranks generate 2, 1 and 1 groups, train 11, 11 and 10
    sequences in one update each, and the step's record counts the 4 prompts."""
    from tiny_lm import free_port, tea_env, tiny_recipe, write_recipe

    rec = write_recipe(tmp_path / "r.yaml", tiny_recipe(
        assets / "policy", assets / "data", rollout__prompts_per_step=4, optim__steps=2, checkpoint__save_every=2,
        validation={"prompts": 3, "samples": 2, "top": 1, "at_start": False}, logging={"report_to": [], "per_rank": True}))
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "3", "--master_port", str(free_port()),
           "--module", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["prompts"], r["optimizer_step"]) for r in rows] == [(1, 4, 1), (2, 4, 2)]
    ranks = [json.loads(line) for line in (run / "ranks.jsonl").read_text().splitlines()]
    assert [r["prompts"] for r in ranks if r["step"] == 1] == [2, 1, 1]
    assert json.loads((run / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["data_position"] == 8
