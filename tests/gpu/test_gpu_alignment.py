"""GPU check of `tea diagnose alignment`'s batched per-completion gradients (`python -m pytest -m gpu
tests/gpu/test_gpu_alignment.py`): on CUDA, in float32 as the diagnostic runs, the gradients from one
backward per micro-batch equal those of one backward per completion (tests/diagnostics/test_alignment.py
checks the same on CPU for Llama, Qwen3 and Gemma 3)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    vocab_size=49152, max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=0)


def test_batched_alignment_gradients_equal_the_loop_on_cuda(cuda):
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from teacli.diagnostics import alignment as AL

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(cuda).float().eval()
    _, chosen = AL.block_parameters(model, "-1")
    params = [p for _, p in chosen]
    rng = np.random.default_rng(0)
    comps = [rng.integers(1, 49152, size=int(k)).tolist() for k in rng.integers(20, 200, size=24)]
    args = (model, params, rng.integers(1, 49152, size=40).tolist(), comps, 0, 8, cuda)
    loop = AL.completion_gradients(*args, method="loop")
    batched = AL.completion_gradients(*args, method="batched")
    rel = ((batched - loop).norm(dim=1) / loop.norm(dim=1)).max().item()
    print(f"largest relative difference of a completion's gradient: {rel:.2e}")
    assert rel < 1e-4
