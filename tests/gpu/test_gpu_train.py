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
