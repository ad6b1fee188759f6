"""benchmarks/reward_scoring.py on a tiny reward-model shape on CPU: one row a variant, the step's P × m
conversations at the rehearsal's lengths, and the same scores whatever the batch size, with the loop before and
with each group's prompt run once (reward.share_prompts)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "reward_scoring.py"


def tiny_reward_model(tmp_path: Path) -> Path:
    """A 2-layer Llama sequence classifier's config.json in tmp_path/rm (random weights: a rehearsal's stand-in)."""
    model = tmp_path / "rm"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForSequenceClassification"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 3000, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": 0, "max_position_embeddings": 2048, "tie_word_embeddings": False}))
    return model


def load():
    spec = importlib.util.spec_from_file_location("reward_scoring", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("args, names", [
    (["nosuch_recipe"], "no recipe file or name 'nosuch_recipe'"),
    (["uf_llama1b_tea", "--card", "a100"], "--card: 'a100'"),
    (["uf_llama1b_tea", "--model", "nosuch/model"], "reward.name_or_path: no shape is known for 'nosuch/model'"),
])
def test_bad_input_is_one_error_naming_it(args, names, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as exit_:
        load().main(args)
    assert exit_.value.code == 2 and names in capsys.readouterr().err.splitlines()[-1]


def test_reward_scoring_benchmark_rows(tmp_path, monkeypatch, capsys):
    bench = load()
    model = tiny_reward_model(tmp_path)
    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    P, m, prompt, new = 2, 3, 12, 20
    bench.main(["uf_llama1b_tea", "--model", str(model), "--kernels", "eager", "--batch-sizes", "1,4", "--dtype", "float32",
                "--device", "cpu", "--repeats", "1", "--before", "--set", f"rollout.prompts_per_step={P}", "--set", f"rollout.group_size={m}",
                "--set", f"rollout.max_new_tokens={new}", "--set", f"rehearsal.prompt_tokens={prompt}"])
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines() if line.startswith("| eager")]
    assert [tuple(r[:3]) for r in rows] == [
        ("eager (loop before)", "1", "off"), ("eager (loop before)", "4", "off"),
        ("eager", "1", "off"), ("eager", "1", "on"), ("eager", "4", "off"), ("eager", "4", "on"),
    ]
    for r in rows:
        sequences, tokens, run = int(r[3]), int(r[4].replace(",", "")), int(r[5].replace(",", ""))
        assert sequences == P * m
        assert sequences * (prompt + new) < tokens < sequences * (prompt + new + 16)  # the words, and the chat template's tokens
        if r[2] == "on":  # each of the P prompts (and its template's tokens) once, not m times
            assert tokens - run >= P * (m - 1) * prompt
        else:
            assert run == tokens
        assert float(r[-1]) < 1e-4  # every batch size, shared or not, scores what the loop before did at 1


def test_realistic_lengths_and_packed_responses(tmp_path, monkeypatch, capsys):
    """--lengths realistic draws the step's lengths as the rehearsal does (prompts and responses of many lengths);
    --share packed scores what whole conversations score, running the same tokens as `on` (its padding differs: with
    groups of 8 rows as wide as the longest leave more of it, the planner's 64 less)."""
    bench = load()
    model = tiny_reward_model(tmp_path)
    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    bench.main(["uf_llama1b_tea", "--model", str(model), "--kernels", "eager", "--batch-sizes", "4", "--dtype", "float32",
                "--device", "cpu", "--repeats", "1", "--share", "off,on,packed", "--lengths", "realistic",
                "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=8"])
    out = capsys.readouterr().out
    assert "lengths realistic" in out
    rows = {r[2]: r for r in ([c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines() if line.startswith("| eager"))}
    assert list(rows) == ["off", "on", "packed"]
    assert rows["on"][5] == rows["packed"][5] != rows["off"][5]  # the same tokens run, each prompt once
    assert float(rows["on"][6].rstrip("%")) > 0 and rows["packed"][6] != rows["on"][6]
    assert all(float(r[-1]) < 1e-4 for r in rows.values())
