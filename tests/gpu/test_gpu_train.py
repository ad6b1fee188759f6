"""GPU checks (run on a CUDA machine: `python -m pytest -m gpu tests/gpu`); skipped elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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

    rec = {
        "name": "gpu",
        "policy": {"name_or_path": str(assets / "policy"), "gradient_checkpointing": True},
        "reward": {"kind": "python", "function": "rewards_for_tests:length_reward"},
        "data": {"dir": str(assets / "data")},
        "rollout": {"engine": "hf", "prompts_per_step": 2, "group_size": 8, "max_new_tokens": 16},
        "advantage": {"name": "tea", "params": {}},
        "optim": {"steps": 2, "lr": 1.0e-3, "micro_batch_size": 8},
        "backend": {"zero_stage": stage, "precision": "auto"},
        "checkpoint": {"save_every": 2},
        "validation": {"prompts": 2, "samples": 4, "top": 2},
        "logging": {"tensorboard": False},
    }
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(rec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS / "train"), os.environ.get("PYTHONPATH", "")]))
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
