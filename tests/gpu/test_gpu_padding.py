"""GPU check of the NaN-safe attention mask (`python -m pytest -m gpu tests/gpu/test_gpu_padding.py`).

On an H100 (torch 2.11, transformers 5.17, 2026-11-27), the trainer's log-prob backward through
transformers' `sdpa` attention gave non-finite gradients in 138 of the 146 parameters of a
Llama-3.2-1B-shaped model in bf16 as soon as one row of the batch was left-padded: a padded query
attends to no key, and the SDPA backward makes NaN of it (fp32 and a 2-layer model stayed finite).
`teacli.logprobs.nan_safe_sdpa_mask` lets such rows attend to every key; they feed nothing, so the
values of the real rows are unchanged (tests/test_logprobs.py on CPU) and the gradients are finite.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                vocab_size=128256, max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=500000.0)


@pytest.mark.parametrize("shared", [False, True])
def test_left_padded_bf16_batches_give_finite_gradients(cuda, shared):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from teacli.logprobs import shared_prompt_logprobs, token_logprobs

    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_1B)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(cuda, torch.bfloat16).train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, LLAMA_1B["vocab_size"], (4, 320), generator=g).to(cuda)
    mask = torch.ones_like(ids)
    mask[0, :17] = 0  # a left-padded prompt
    mask[1, -20:] = 0  # a shorter completion
    if shared:  # two distinct prompts, the first left-padded, two completions each
        logp = shared_prompt_logprobs(model, ids[:2, :64], mask[:2, :64], torch.tensor([0, 0, 1, 1], device=cuda), ids[:, 64:], mask[:, 64:])
    else:
        logp = token_logprobs(model, ids, mask, 64)
    logp.sum().backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not p.grad.isfinite().all()]
    assert logp.isfinite().all() and not bad, f"non-finite gradients in {len(bad)} parameters, e.g. {bad[:3]}"
