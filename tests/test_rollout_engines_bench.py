"""benchmarks/rollout_engines.py's sweep arguments: the Llama shapes it builds (parameter counts derived here from
the published sizes) and the --prompts list."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # rollout_engines imports vs_trl from beside it
    spec = importlib.util.spec_from_file_location("rollout_engines", BENCH / "rollout_engines.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def llama_params(hidden, inter, layers, heads, kv_heads, vocab, tied):
    """Embedding, per layer (q, k, v, o projections, gate/up/down, two RMSNorm weights), final norm, head."""
    head_dim = hidden // heads
    per_layer = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * inter + 2 * hidden
    return vocab * hidden + layers * per_layer + hidden + (0 if tied else vocab * hidden)


@pytest.mark.parametrize("model, sizes", [
    ("llama1b", (2048, 8192, 16, 32, 8, 128256, True)),     # Llama-3.2-1B: 1.24 B
    ("llama3b", (3072, 8192, 28, 24, 8, 128256, True)),     # Llama-3.2-3B: 3.21 B
    ("llama8b", (4096, 14336, 32, 32, 8, 128256, False)),   # Llama-3.1-8B: 8.03 B
])
def test_llama_shapes_have_the_published_sizes(bench, model, sizes):
    import torch
    from transformers import LlamaForCausalLM

    config = bench.llama_shape(model, small=False)
    assert config.head_dim == sizes[0] // sizes[3]
    with torch.device("meta"):
        n = sum(p.numel() for p in LlamaForCausalLM(config).parameters())
    assert n == llama_params(*sizes)


def test_prompt_counts(bench):
    assert bench.prompt_counts("256") == [256] and bench.prompt_counts("32,128,512") == [32, 128, 512]
    for bad in ("0", "8,x", "", "-4"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.prompt_counts(bad)
