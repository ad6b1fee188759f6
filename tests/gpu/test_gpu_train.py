"""GPU checks (run on a CUDA machine: `python -m pytest -m gpu tests/gpu`); skipped elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_causal_lm, make_tokenizer, save

    from teacli.data.prepare import prepare

    root = tmp_path_factory.mktemp("gpu_assets")
    tok = make_tokenizer()
    save(make_causal_lm(tok), tok, root / "policy")
    prepare("builtin", root / "data")
    return root


@pytest.mark.parametrize("stage", [2, 3])
def test_train_on_gpu_bf16(assets, tmp_path, stage):
    import torch

    from tiny_lm import tea_env, tiny_recipe, write_recipe

    rec = tiny_recipe(
        assets / "policy", assets / "data", name="gpu", policy={"name_or_path": str(assets / "policy"), "gradient_checkpointing": True},
        rollout__max_new_tokens=16, advantage={"name": "tea", "params": {}}, optim__steps=2, optim__lr=1.0e-3,
        kl={"beta": 0.1}, backend={"zero_stage": stage, "precision": "auto"}, checkpoint__save_every=2,
        validation={"prompts": 2, "samples": 4, "top": 2},
    )
    path = write_recipe(tmp_path / "r.yaml", rec)
    env = tea_env()
    n = min(2, torch.cuda.device_count()) if stage == 3 else 1
    if n > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "-m", "teacli.cli", "train", str(path), "--run-dir", str(tmp_path / "run")]
    else:
        cmd = [sys.executable, "-m", "teacli.cli", "train", str(path), "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "model.safetensors").exists()


def test_the_micro_batch_loop_reads_nothing_back(monkeypatch, teacli_syncs):
    """`train_step` queues micro-batch after micro-batch without waiting for the GPU: the synchronizing calls that tea's
    own code makes in a step (torch.cuda.set_sync_debug_mode's warnings, by the file that made them) are the same with
    8 micro-batches as with 2. Reading a loss statistic back, or copying a micro-batch from pageable host memory,
    inside the loop waits once a micro-batch (the 1B recipe's training was host-bound at 8 sequences a micro-batch).
    The micro-batches' packing, which moves them all before the first forward, runs outside the count."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sys.path.insert(0, str(TESTS))
    sys.path.insert(0, str(TESTS / "train"))
    from test_exact_steps import make_batch
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.config import Recipe
    from teacli.train import backend, update

    real = update.packed_micro_batches

    def packed_outside_the_count(*args, **kwargs):
        torch.cuda.set_sync_debug_mode(0)
        out = real(*args, **kwargs)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        return out

    monkeypatch.setattr(update, "packed_micro_batches", packed_outside_the_count)
    world = backend.init_world()
    tok = make_tokenizer()
    prompt_ids, groups = make_batch(4, 4, seed=0, vocab=len(tok), eos=tok.eos_token_id)  # 16 sequences
    advantages = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))

    def run(micro: int):
        recipe = Recipe()
        recipe.backend.zero_stage, recipe.backend.precision = 0, "bf16"
        recipe.optim.micro_batch_size, recipe.kl.beta = micro, 0.1
        reference = make_causal_lm(tok, seed=1).requires_grad_(False).to(world.device, torch.bfloat16)
        engine = backend.build_engine(make_causal_lm(tok, seed=0), recipe, world, 16 // micro, "bf16")
        args = (engine, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id, world.device)
        return lambda: update.train_step(*args)

    two, eight = teacli_syncs(run(8)), teacli_syncs(run(2))
    assert eight == two, f"tea's synchronizing calls with 2 micro-batches {dict(two)}, with 8 {dict(eight)}"


def test_one_step_off_on_gpu_bf16(assets, tmp_path):
    """rollout.max_staleness 1 on CUDA in bf16 (the background generation on its own stream, the transfer after the
    trainer's last kernel): at an lr too small to move a weight the ratios are 1 to bf16 rounding, and every batch
    after the first is one version behind."""
    from tiny_lm import tea_env, tiny_recipe, write_recipe

    rec = tiny_recipe(assets / "policy", assets / "data", name="gpu_off", rollout__max_new_tokens=16, rollout__max_staleness=1,
                      optim__steps=4, optim__lr=1e-20, kl={"beta": 0.1}, backend={"zero_stage": 2, "precision": "auto"},
                      checkpoint__save_every=2, validation={"prompts": 2, "samples": 4, "top": 2, "at_start": False})
    path = write_recipe(tmp_path / "r.yaml", rec)
    proc = subprocess.run([sys.executable, "-m", "teacli.cli", "train", str(path), "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=tea_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["staleness"] for r in rows] == [0, 1, 1, 1]
    for r in rows:
        assert abs(r["is_ratio_mean"] - 1) < 0.02 and r["is_truncated_frac"] < 0.01, r  # bf16: the trainer's packing differs
