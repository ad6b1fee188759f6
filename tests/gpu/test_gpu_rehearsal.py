"""The paper's memory plan on one GPU at a reduced shape: a Llama-3.2-1B-shaped policy, its reference and a
1B-shaped reward model, rehearsed (random weights, stand-in tokenizer and prompts) past the second step, where the
vllm engine's KV cache used to fail to wake. Run on a CUDA machine: `python -m pytest -m gpu tests/gpu`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_a_1b_policy_and_a_1b_reward_model_rehearse_past_the_second_step(cuda, tmp_path, engine):
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    import yaml

    from teacli.standins import CONFIGS
    from tiny_lm import tea_env

    rm = json.loads((CONFIGS / "meta-llama--Llama-3.2-1B-Instruct.json").read_text())
    rm.update(architectures=["LlamaForSequenceClassification"], num_labels=1, tie_word_embeddings=False, pad_token_id=128009)
    (tmp_path / "rm").mkdir()
    (tmp_path / "rm" / "config.json").write_text(json.dumps(rm))
    rec = tmp_path / "r.yaml"
    rec.write_text(yaml.safe_dump({"base": [str(CONFIGS.parent.parent / "recipes" / "uf_llama1b_tea.yaml")],
                                   "reward": {"name_or_path": str(tmp_path / "rm")},
                                   "rollout": {"engine": engine, "prompts_per_step": 4},
                                   "validation": {"prompts": 8, "samples": 16, "at_start": False},
                                   "checkpoint": {"save_every": 3}, "logging": {"report_to": []}}))
    out = subprocess.run([sys.executable, "-m", "teacli.cli", "train", str(rec), "--rehearse", "--steps", "3",
                          "--run-dir", str(tmp_path / "run")], env=tea_env(tmp_path), capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["rehearsal"] for r in rows)
    assert rows[-1]["tokens_completion"] > 0.95 * 4 * 64 * 512  # random weights seldom sample one of the 3 EOS ids
    if engine == "vllm":
        # the engine's KV cache is the step's sequences at their longest, or the cap where they would not fit (an 80 GB card)
        assert "(rollout.kv_cache_gib auto:" in out.stderr
        assert rows[-1]["gpu_free_gib_before_wake"] > rows[-1]["vllm_sleep_freed_gib"]
