"""GPU check of `policy.gradient_checkpointing: auto` (issue 21; `python -m pytest -m gpu -s
tests/gpu/test_gpu_checkpointing.py`): on this card, at the smallest micro-batch of full-length sequences
for which the rule checkpoints some but not all layers of a Llama-3.2-1B-shaped policy, one real training
step (a DeepSpeed ZeRO-2 engine, bf16, a reference model for the KL term) fits in the card's memory, and
its measured peak (torch.cuda.max_memory_allocated of the training phase) is within a factor of
FACTOR of the rule's estimate (model states + activations). Both are printed: the numbers the
docs/performance.md table of the rule's behaviour is made of.

FACTOR is not a measured tolerance: the one calibration so far (a whole model without checkpointing,
docs/performance.md) predicted 42.0 GiB of activations against 40 GiB measured; the model-state part
leaves out DeepSpeed's own buffers and the head's log-softmax chunks (1 GiB each), and the first
selective measurement is this test.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                vocab_size=128256, max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=500000.0)
PROMPT, NEW = 128, 256  # tokens: the recipe's worst case, which every sequence here reaches
FACTOR = 1.5


def test_auto_checkpoints_some_layers_and_the_step_fits(cuda):
    import random

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from teacli import models
    from teacli.config import Recipe
    from teacli.train import backend
    from teacli.train.update import shares_prompts, train_step
    from teacli.types import Completion

    world = backend.init_world()
    recipe = Recipe()
    recipe.policy.gradient_checkpointing = "auto"
    recipe.backend.zero_stage, recipe.backend.precision, recipe.kl.beta = 2, "bf16", 0.1
    recipe.data.max_prompt_tokens, recipe.rollout.max_new_tokens = PROMPT, NEW
    config = LlamaConfig(**LLAMA_1B)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    policy = LlamaForCausalLM(config).to(cuda)
    for mb in range(1, 1025):  # the smallest micro-batch where auto checkpoints 0 < k < L layers
        recipe.optim.micro_batch_size = mb
        plan = backend.resolve_checkpointing(recipe, policy, world)
        if plan.layers:
            break
    assert 0 < plan.layers < plan.of, plan
    models.set_gradient_checkpointing(policy, plan.layers)
    reference = LlamaForCausalLM(config).to(cuda, torch.bfloat16).eval().requires_grad_(False)
    engine = backend.build_engine(policy, recipe, world, 1, "bf16")  # one micro-batch: one optimizer step
    # whole sequences: the estimate's tokens (shared prompts run on checkpointed layers too since issue 45)
    recipe.optim.share_prompts = False
    assert not shares_prompts(recipe, engine, reference)

    rng = random.Random(0)
    prompt_ids = [[rng.randrange(10, config.vocab_size - 2) for _ in range(PROMPT)] for _ in range(mb)]
    groups = [[Completion([rng.randrange(10, config.vocab_size - 2) for _ in range(NEW)], "", False)] for _ in range(mb)]
    advantages = torch.randn(mb, 1)
    backend.peak_memory_gib(cuda)
    stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, 0, cuda)
    torch.cuda.synchronize()
    measured = backend.peak_memory_gib(cuda)
    estimate, total = plan.estimate / 2**30, plan.total / 2**30
    print(f"\n{torch.cuda.get_device_name()}: micro-batch {mb} x {PROMPT + NEW} tokens; {plan.describe()}; "
          f"measured training peak {measured:.1f} GiB = {measured / estimate:.2f} x the estimate")
    assert stats["optimizer_step"] == 1
    assert measured < total
    assert estimate / FACTOR < measured < estimate * FACTOR, (measured, estimate)
