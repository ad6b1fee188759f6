"""Tiny models, tokenizers and recipes built in-process, for engine, trainer and CLI tests (no hub access).

A word-level tokenizer over a few sentences with a chat template that writes BOS itself, a
random Llama causal LM and a random Llama sequence classifier (hidden 64, 2 layers); the one
tiny-recipe dictionary every end-to-end test starts from, and the environment its subprocesses run in.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent

SENTENCES = [
    "the cat sat on the mat and looked at the dog",
    "a dog ran in the park with a red ball",
    "what is the capital of france paris is the capital",
    "write a short poem about the sea and the sky",
    "one two three four five six seven eight nine ten",
    "please answer in one sentence without commas",
    " ".join(f"w{i}" for i in range(200)),  # filler words: a vocabulary well above top_k = 50
]
SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the OS picks it): a launcher's --master_port or a server's. A port derived
    from the pid can be one another process holds."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tokenizer(chat_template: str | None = CHAT_TEMPLATE, pad: str | None = "<pad>"):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=SPECIALS))
    # Like Llama tokenizers, it adds BOS itself when add_special_tokens=True (encode_chat must not double it).
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", tok.token_to_id("<bos>"))])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token=pad,
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def llama_config(tokenizer, **overrides):
    from transformers import LlamaConfig

    values = dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=len(tokenizer), max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False,
    )
    values.update(overrides)
    return LlamaConfig(**values)


def make_causal_lm(tokenizer, seed: int = 0, **config):
    """`config` overrides llama_config's values (e.g. num_attention_heads=2 for vLLM's CPU kernels,
    which need a head size of at least 32)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(tokenizer, **config)).eval()
    with torch.no_grad():  # larger logits than the 0.02-std init: distinct, non-uniform next-token distributions
        model.lm_head.weight.mul_(8.0)
    return model


def make_reward_model(tokenizer, seed: int = 0):
    import torch
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    return LlamaForSequenceClassification(llama_config(tokenizer, num_labels=1)).eval()


def liger_stand_in(calls: dict[str, int], rotary: Any = None):
    """What liger-kernel's per-architecture patch does, on CPU (its kernels are Triton, CUDA only): new forwards bound
    on a Llama's RMSNorm and MLP instances and, given the eager `rotary`, the architecture module's rotary function
    swapped; each counts its calls in `calls` ("norm", "mlp", "rotary"). Use it as liger's table entry for "llama"."""
    import transformers.models.llama.modeling_llama as llama

    def counted(kind, fn):
        def call(*args, **kwargs):
            calls[kind] += 1
            return fn(*args, **kwargs)
        return call

    def patch(model=None, **kwargs):
        if rotary is not None:
            llama.apply_rotary_pos_emb = counted("rotary", rotary)
        for module in model.modules():
            if isinstance(module, llama.LlamaRMSNorm):
                module.forward = counted("norm", llama.LlamaRMSNorm.forward.__get__(module))
            elif isinstance(module, llama.LlamaMLP):
                module.forward = counted("mlp", llama.LlamaMLP.forward.__get__(module))

    return patch


def save(model, tokenizer, path: Path) -> Path:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# -- recipes and the environment of `tea` subprocesses -------------------------------------------

TINY_RECIPE: dict[str, Any] = {
    "name": "tiny",
    "policy": {"dtype": "float32", "gradient_checkpointing": False},
    "reward": {"kind": "python", "function": "rewards_for_tests:length_reward"},
    "rollout": {"engine": "hf", "prompts_per_step": 2, "group_size": 8, "max_new_tokens": 8, "batch_size": 16},
    "advantage": {"name": "grpo", "params": {}},
    "optim": {"steps": 4, "lr": 3.0e-3, "micro_batch_size": 8},
    "kl": {"beta": 0.05},
    "backend": {"zero_stage": 2, "precision": "fp32"},
    "checkpoint": {"save_every": 2},
    "validation": {"prompts": 4, "samples": 4, "top": 2},
    "logging": {"report_to": []},
}


def make_assets(root: Path) -> Path:
    """A tiny policy saved in root/policy and the built-in prompt set prepared in root/data: what the CLI tests train on."""
    from teacli.data.prepare import prepare

    tok = make_tokenizer()
    save(make_causal_lm(tok), tok, root / "policy")
    prepare("builtin", root / "data")
    return root


def tiny_recipe(policy_dir: Path, data_dir: Path, /, **overrides: Any) -> dict[str, Any]:
    """The tests' recipe for the tiny policy at `policy_dir` on the prepared prompts at `data_dir`.

    `section__key=value` sets one leaf (`optim__steps=2`); `section=value` replaces a whole section.
    """
    recipe = copy.deepcopy(TINY_RECIPE)
    recipe["policy"]["name_or_path"] = str(policy_dir)
    recipe["data"] = {"dir": str(data_dir)}
    for key, value in overrides.items():
        node = recipe
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return recipe


def write_recipe(path: Path, recipe: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(recipe))
    return path


def tea_env(tmp: Path | None = None, **extra: str) -> dict[str, str]:
    """Environment for a `tea` subprocess: tests/ importable (rewards_for_tests), a private TEA_CACHE,
    one thread, and no inherited launcher variables (each run starts its own process group)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    if tmp is not None:
        env["TEA_CACHE"] = str(tmp / "cache")
    env["OMP_NUM_THREADS"] = "1"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra)
    return env


def tiny_study(root: Path, steps: int = 1) -> dict[str, Any]:
    """A two-recipe study on make_assets(root)'s policy and data: root/tiny_grpo.yaml and root/tiny_tea.yaml (only the
    advantage rule differs), runs in root/runs, report in root/report; written to root/study.yaml and returned."""
    import yaml

    for rule in ("grpo", "tea"):
        recipe = tiny_recipe(
            root / "policy", root / "data", name=f"tiny_{rule}", advantage={"name": rule, "params": {}},
            rollout__max_new_tokens=6, rollout__batch_size=32, optim__steps=steps, optim__lr=1.0e-3, optim__micro_batch_size=16,
            kl={"beta": 0.1}, backend__zero_stage=0, checkpoint__save_every=1,
            validation={"prompts": 2, "samples": 2, "top": 1, "at_start": False}, eval={"split": "core250", "M": 4},
        )
        write_recipe(root / f"tiny_{rule}.yaml", recipe)
    study = {
        "name": "tiny", "recipes": ["tiny_grpo.yaml", "tiny_tea.yaml"], "baseline": "tiny_grpo",
        "eval": {"split": "core250", "n": 4}, "report": {"out": str(root / "report"), "bootstrap": 50},
        "runs_dir": str(root / "runs"),
    }
    (root / "study.yaml").write_text(yaml.safe_dump(study))
    return study


def kill_after(rec: Path, run: Path, tmp: Path, rows: int, timeout: float = 300, cmd: list[str] | None = None) -> None:
    """Start `tea train REC --run-dir RUN` (or `cmd`: the same under a launcher) and SIGKILL its process group once
    metrics.jsonl has `rows` lines."""
    import signal
    import subprocess
    import sys
    import time

    cmd = cmd or [sys.executable, "-m", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=tea_env(tmp), start_new_session=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= rows:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def assert_resumed_like(run: Path, reference: Path, steps: int, keys: tuple[str, ...]) -> None:
    """`run`, killed and resumed, logged steps 1 … `steps` with each of `keys` as the uninterrupted `reference` did
    (rel 1e-5), and its last checkpoint's weights are the reference's (atol 1e-5)."""
    import json

    import pytest
    import torch
    from safetensors.torch import load_file

    rows, ref = ([json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in (run, reference))
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for a, b in zip(rows, ref):
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
    last = f"step_{steps:06d}"
    final = load_file(str(run / "checkpoints" / last / "model.safetensors"))
    want = load_file(str(reference / "checkpoints" / last / "model.safetensors"))
    assert all(torch.allclose(final[k], want[k], atol=1e-5) for k in want)
