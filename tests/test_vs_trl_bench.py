"""benchmarks/vs_trl.py on CPU (--small): the recipe settings its flags set reach the trainer, and --shape paper runs
both sides with the same stand-in reward classifier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tiny_lm import tea_env  # noqa: E402


@pytest.mark.parametrize("flag, shared", [("on", True), ("off", False)])
def test_share_prompts_flag_reaches_the_trainer(tmp_path, flag, shared):
    """--tea-share-prompts: optim.share_prompts for tea's side (the MFU of backward + step counts the tokens the
    forward ran, so whether prompts were shared must be what the settings line and the JSON say)."""
    out = tmp_path / "vs_trl.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_trl.py"), "--small", "--only", "tea", "--steps", "1",
                           "--tea-share-prompts", flag, "--json", str(out)],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["args"]["tea_share_prompts"] == flag and result["results"]["tea"]["settings"]["share_prompts"] is shared
    assert f"share_prompts={shared}" in proc.stdout


def test_tiny_configs_keep_the_shipped_structure():
    """--small --shape paper: the recipe's two shipped configs at toy sizes keep their architecture, rope scaling, tied
    embeddings and labels, with every special id inside the smaller vocabulary."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import vs_trl
    from teacli.config import load_recipe
    from teacli.standins import known_models

    recipe = load_recipe(vs_trl.PAPER_RECIPE)
    for name, sizes in ((recipe.policy.name_or_path, vs_trl.TINY_POLICY), (recipe.reward.name_or_path, vs_trl.TINY_REWARD)):
        shipped = json.loads(known_models()[name].read_text())
        tiny = vs_trl.tiny_config(shipped, sizes)
        for key in ("architectures", "rope_scaling", "tie_word_embeddings", "num_labels", "model_type"):
            assert tiny.get(key) == shipped.get(key), key
        ids = [tiny[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if tiny.get(key) is not None]
        ids = [i for v in ids for i in (v if isinstance(v, list) else [v])]
        assert ids and all(0 <= i < sizes["vocab_size"] for i in ids)
        assert tiny["head_dim"] * tiny["num_attention_heads"] == tiny["hidden_size"]


@pytest.mark.slow
def test_paper_shape_runs_both_sides_with_the_reward_model(tmp_path):
    """--small --shape paper: tea and TRL each score with the toy reward classifier (its forwards timed on both sides),
    on prompts of the same length (TRL's token count is its 16 prompts' tokens and their completions'), one invocation."""
    pytest.importorskip("trl")
    out = tmp_path / "vs_trl.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_trl.py"), "--small", "--shape", "paper", "--steps", "1",
                           "--json", str(out)],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    args, tea, trl = result["args"], result["results"]["tea"], result["results"]["trl"]
    assert (args["prompts"], args["group_size"], args["prompt_len"], args["tea_micro_batch"], args["reward_batch"]) == (2, 8, 16, 4, 4)
    assert tea["settings"]["recipe"] == "uf_llama1b_tea" and tea["settings"]["micro_batch"] == 4
    assert tea["settings"]["reward"].startswith("LlamaForSequenceClassification")
    assert trl["settings"]["reward"].startswith("LlamaForSequenceClassification")
    for row in tea["rows"]:
        assert row["reward_s"] > 0 and row["reward_tokens"] > 2 * 8 * 16
    for row in trl["rows"]:
        assert row["reward_s"] > 0
        assert row["tokens"] == 2 * 8 * (16 + row["completion_len"])
    assert "tea step / TRL step = " in proc.stdout


def test_decode_loop_benchmark_compares_the_two_loops(tmp_path):
    """benchmarks/decode_loop.py --small: a row per loop and run (tea, generate, twice), and the two loops'
    greedy tokens equal (fp32 on the CPU, where they are the same computation)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_loop.py"), "--small", "--repeats", "1"],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in proc.stdout.splitlines() if line.startswith("| ") and "loop" not in line]
    assert rows == ["generate", "tea", "generate", "tea"]
    assert "greedy tokens equal: True" in proc.stdout


def test_decode_step_benchmark_prints_its_four_tables(tmp_path):
    """benchmarks/decode_step.py --small: the draw's rows (no compiled row off CUDA), the attention's two rows (the fold equal to the engine's attention within rounding), a generation row per
    variant, and the reference head's two rows with the same log-probs."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "decode_step.py"), "--small", "--repeats", "1"],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = proc.stdout.split("### ")[1:]
    assert [t.split(":")[0] for t in tables] == ["draw", "attention", "generation", "reference head"]
    rows = {t.split(":")[0]: [line.split("|")[1:-1] for line in t.splitlines() if line.startswith("| ") and "---" not in line][1:]
            for t in tables}
    assert [r[0].strip() for r in rows["draw"]] == ["before", "after, eager"]
    assert [r[0].strip() for r in rows["attention"]] == ["gqa", "folded"] and float(rows["attention"][1][3]) < 1e-5
    assert [r[0].strip() for r in rows["generation"]] == ["before", "draw", "fold", "draw + fold", "cascade"]
    delta = float(tables[2].split("first step's logits max |diff| ")[1].split(",")[0])
    assert delta < 1e-4  # float32 on CPU: the cascade's logits are the default's up to rounding
    assert [r[0].strip() for r in rows["reference head"]] == ["before (eager)", "after (eager)"]
    assert float(rows["reference head"][1][3]) == 0.0
