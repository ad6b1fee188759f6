"""benchmarks/reward_scoring.py on a tiny reward-model shape on CPU: one row a variant, the step's P × m
conversations at the rehearsal's lengths, and the same scores whatever the batch size, with the loop before and
with each group's prompt run once (reward.share_prompts)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "reward_scoring.py"


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
    model = tmp_path / "rm"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForSequenceClassification"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 3000, "bos_token_id": 1,
        "eos_token_id": 2, "pad_token_id": 0, "max_position_embeddings": 512, "tie_word_embeddings": False}))
    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    P, m, prompt, new = 2, 3, 12, 20
    bench.main(["uf_llama1b_tea", "--model", str(model), "--kernels", "eager", "--batch-sizes", "1,4", "--dtype", "float32",
                "--device", "cpu", "--repeats", "1", "--before", "--set", f"rollout.prompts_per_step={P}", "--set", f"rollout.group_size={m}",
                "--set", f"rollout.max_new_tokens={new}", "--set", f"rehearsal.prompt_tokens={prompt}"])
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines() if line.startswith("| eager")]
    assert [tuple(r[:3]) for r in rows] == [
        ("eager (loop before)", "1", "no"), ("eager (loop before)", "4", "no"),
        ("eager", "1", "no"), ("eager", "1", "yes"), ("eager", "4", "no"), ("eager", "4", "yes"),
    ]
    for r in rows:
        sequences, tokens, run = int(r[3]), int(r[4].replace(",", "")), int(r[5].replace(",", ""))
        assert sequences == P * m
        assert sequences * (prompt + new) < tokens < sequences * (prompt + new + 16)  # the words, and the chat template's tokens
        if r[2] == "yes":  # each of the P prompts (and its template's tokens) once, not m times
            assert tokens - run >= P * (m - 1) * prompt
        else:
            assert run == tokens
        assert float(r[-1]) < 1e-4  # every batch size, shared or not, scores what the loop before did at 1
