"""GPU check of the shared-prompt forward on gradient-checkpointed layers (issue 45;
`python -m pytest -m gpu tests/gpu/test_gpu_shared_checkpointing.py`).

`optim.share_prompts` runs each group's prompt once into a KV cache and the completions on it; with checkpointed
layers (policy.gradient_checkpointing), each layer's recomputation in backward calls the caches again, which
`teacli.logprobs.prompt_cache` / `prefix_cache` make safe. On CPU in float32 the log-probs and gradients equal the
whole sequences' (tests/test_logprobs.py); here the same on CUDA with the recipe's kernels (sdpa; liger's fused head
where installed), on a Llama-3.2-1B-shaped model cut to 4 layers: float32 (TF32 off) tightly, and bf16 as the trainer
runs, where the shared and the whole-sequence paths round differently: the checkpointed shared path must stay as close
to the whole sequences as the uncheckpointed shared path is. The checkpointed shared path must also hold less at its
peak than the checkpointed whole sequences (the prompts run once).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
SHAPE = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=8,
             vocab_size=128256, max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=500000.0)
GROUPS, M, PROMPT, COMPLETION = 4, 8, 256, 128


def _batch(cuda):
    """GROUPS prompts of different lengths (left-padded to PROMPT), M completions each of different lengths (right-
    padded to COMPLETION): the whole sequences (pack) and the shared ones (pack_shared)."""
    import random

    from teacli.train.batching import pack, pack_shared

    rng = random.Random(0)
    prompts = [[rng.randrange(0, SHAPE["vocab_size"]) for _ in range(PROMPT - 37 * p)] for p in range(GROUPS)]
    seq_prompt = [prompts[p] for p in range(GROUPS) for _ in range(M)]
    seq_comp = [[rng.randrange(0, SHAPE["vocab_size"]) for _ in range(rng.randint(COMPLETION // 4, COMPLETION))]
                for _ in seq_prompt]
    return pack(seq_prompt, seq_comp, 0, cuda), pack_shared(seq_prompt, seq_comp, 0, cuda)


def _run(model, whole, shared, use_shared: bool, weights):
    """log-probs [B, T], every parameter's gradient of sum(weights · log-probs) in fp32, and the peak bytes allocated
    during the forward and backward."""
    import torch

    from teacli.logprobs import shared_prompt_logprobs, token_logprobs

    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    if use_shared:
        logp = shared_prompt_logprobs(model, *shared)
    else:
        input_ids, attn, _, n_prompt = whole
        logp = token_logprobs(model, input_ids, attn, n_prompt)
    (logp * weights).sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach().float(), grads, peak


def _rel(a: dict, b: dict) -> float:
    """The largest relative difference, ‖a − b‖ / ‖b‖, over the parameters."""
    return max(float((a[n] - b[n]).norm() / b[n].norm().clamp_min(1e-30)) for n in b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layers", [4, 2])
def test_shared_prompts_on_checkpointed_layers_match_whole_sequences(cuda, dtype, layers):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from teacli.logprobs import can_share_prompts
    from teacli.models import set_gradient_checkpointing

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(cuda, getattr(torch, dtype)).train()
    whole, shared = _batch(cuda)
    cmask = whole[2]
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(1)).to(cuda) * cmask
    plain_whole = _run(model, whole, shared, False, weights)
    plain_shared = _run(model, whole, shared, True, weights)
    set_gradient_checkpointing(model, layers)
    assert can_share_prompts(model)
    ckpt_whole = _run(model, whole, shared, False, weights)
    ckpt_shared = _run(model, whole, shared, True, weights)
    valid = cmask.bool()
    lp_err = float((ckpt_shared[0] - plain_whole[0])[valid].abs().max())
    lp_base = float((plain_shared[0] - plain_whole[0])[valid].abs().max())
    grad_err, grad_base = _rel(ckpt_shared[1], plain_whole[1]), _rel(plain_shared[1], plain_whole[1])
    print(f"\n{dtype}, {layers} of 4 layers checkpointed: log-prob max |diff| {lp_err:.3g} (unckeckpointed shared "
          f"{lp_base:.3g}); gradients' largest relative difference {grad_err:.3g} (unckeckpointed shared {grad_base:.3g}); "
          f"peak MiB: checkpointed shared {ckpt_shared[2] / 2**20:.0f}, whole {ckpt_whole[2] / 2**20:.0f}; "
          f"uncheckpointed shared {plain_shared[2] / 2**20:.0f}, whole {plain_whole[2] / 2**20:.0f}")
    assert ckpt_shared[0].isfinite().all() and all(g.isfinite().all() for g in ckpt_shared[1].values())
    if dtype == "float32":
        assert lp_err < 1e-4 and grad_err < 1e-4
    else:  # bf16: no further from the whole sequences than the uncheckpointed shared path (which tests/gpu/... pass)
        assert lp_err <= 2 * lp_base + 1e-2 and grad_err <= 2 * grad_base + 1e-2
    assert ckpt_shared[2] < ckpt_whole[2]
