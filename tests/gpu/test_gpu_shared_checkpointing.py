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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_completions_in_split_forwards_match_one_forward(cuda, dtype):
    """optim.completion_splits on CUDA (sdpa, liger's fused head where installed, 2 of 4 layers checkpointed): the
    micro-batch's completions sorted by length in 4 forwards on the prompts' cache give the log-probs and gradients
    of one forward, tightly in float32 (TF32 off); in bf16 no further from the whole sequences than one forward is.
    The split run computes fewer tokens but each forward holds its own rows' copy of the prompts' keys and values: its
    peak stays within 1.25× one forward's. The same for them packed (one forward of rows under a 4D mask: the
    memory-efficient SDPA kernel with a mask on CUDA). Every run's rows are in the order the split and packed
    micro-batches run them (by completion length)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from teacli.logprobs import Packing, shared_prompt_logprobs, token_logprobs
    from teacli.models import set_gradient_checkpointing
    from teacli.train.batching import pack, packed_micro_batches

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(cuda, getattr(torch, dtype)).train()
    set_gradient_checkpointing(model, 2)
    import random

    rng = random.Random(0)
    prompts = [[rng.randrange(0, SHAPE["vocab_size"]) for _ in range(PROMPT - 37 * p)] for p in range(GROUPS)]
    seq_prompt = [prompts[p] for p in range(GROUPS) for _ in range(M)]
    seq_comp = [[rng.randrange(0, SHAPE["vocab_size"]) for _ in range(rng.randint(4, COMPLETION))] for _ in seq_prompt]
    # in the order the split and packed micro-batches run them (by completion length), so every run's rows line up
    order = sorted(range(len(seq_comp)), key=lambda i: len(seq_comp[i]))
    seq_prompt, seq_comp = [seq_prompt[i] for i in order], [seq_comp[i] for i in order]
    input_ids, attn, cmask, n_prompt = pack(seq_prompt, seq_comp, 0, cuda)
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(1)).to(cuda) * cmask
    rows = list(range(len(seq_comp)))

    def run(forward):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        logp = forward()
        (logp * weights).sum().backward()
        torch.cuda.synchronize()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        return logp.detach().float(), grads, torch.cuda.max_memory_allocated() - base

    def shared(splits):
        (_, batch, _, _), = packed_micro_batches(seq_prompt, seq_comp, torch.zeros(len(rows)), [rows], True, 0, cuda, splits=splits)
        *inputs, runs, index = batch
        assert isinstance(runs, Packing) if splits == "packed" else len(runs) == splits
        return lambda: shared_prompt_logprobs(model, *inputs, completion_index=index, splits=runs)

    whole = run(lambda: token_logprobs(model, input_ids, attn, n_prompt))
    one, split = run(shared(1)), run(shared(4))
    valid = cmask.bool()
    lp_split = float((split[0] - whole[0])[valid].abs().max())
    lp_one = float((one[0] - whole[0])[valid].abs().max())
    g_split, g_one = _rel(split[1], whole[1]), _rel(one[1], whole[1])
    print(f"\n{dtype}: against the whole sequences, log-prob max |diff| 4 forwards {lp_split:.3g}, one {lp_one:.3g}; "
          f"gradients' largest relative difference {g_split:.3g}, {g_one:.3g}; peak MiB {split[2] / 2**20:.0f}, {one[2] / 2**20:.0f}")
    assert (split[0][~valid] == 0).all() and split[0].isfinite().all()
    if dtype == "float32":
        assert float((split[0] - one[0]).abs().max()) < 1e-4 and _rel(split[1], one[1]) < 1e-4
    else:
        assert lp_split <= 2 * lp_one + 0.05 and g_split <= 2 * g_one + 1e-2  # bf16 log-probs of other shapes: ±0.016 seen
    # fewer tokens, but each forward holds its own rows' copy of the prompts' keys and values (H100: 5,078 MiB
    # against 4,609 in float32, 2,973 against 2,971 in bf16)
    assert split[2] <= one[2] * 1.25
    # packed (optim.completion_splits: packed): one forward of the completions laid end to end under a 4D mask
    packed = run(shared("packed"))
    lp_packed, g_packed = float((packed[0] - whole[0])[valid].abs().max()), _rel(packed[1], whole[1])
    print(f"{dtype} packed: log-prob max |diff| {lp_packed:.3g}, gradients {g_packed:.3g}, peak MiB {packed[2] / 2**20:.0f}")
    assert (packed[0][~valid] == 0).all() and packed[0].isfinite().all()
    if dtype == "float32":
        assert float((packed[0] - one[0]).abs().max()) < 1e-4 and _rel(packed[1], one[1]) < 1e-4
    else:
        assert lp_packed <= 2 * lp_one + 0.05 and g_packed <= 2 * g_one + 1e-2
