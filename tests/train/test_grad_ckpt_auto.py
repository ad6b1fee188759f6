"""policy.gradient_checkpointing: true, false, a number of layers k, or auto — the memory rule of
teacli/memory.py and train/backend.py (the fewest checkpointed layers whose estimate fits), the selective checkpointing of
models.set_gradient_checkpointing (the gradients of the whole model, with and without LoRA), what it
means for shared prompts, and the recipe key."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from tiny_lm import make_causal_lm, make_tokenizer, tiny_recipe

from teacli.config import LoraConfig, Recipe, RecipeError, load_recipe, recipe_from_dict
from teacli import memory
from teacli.models import checkpointable_layers, set_gradient_checkpointing
from teacli.train import backend

# The Llama-3.2-1B shape of the formula's calibration: 64 sequences of 384 tokens.
TOKENS, LAYERS, HIDDEN, INTER = 64 * 384, 16, 2048, 8192


def recipe(mb: int = 8) -> Recipe:
    r = Recipe()
    r.policy.gradient_checkpointing = "auto"
    r.optim.micro_batch_size, r.data.max_prompt_tokens, r.rollout.max_new_tokens = mb, 100, 28
    return r


def world(device: str) -> backend.World:
    return backend.World(rank=0, world_size=1, local_rank=0, device=torch.device(device))


def card(monkeypatch, total: int, others: int = 0, mine: int = 0) -> None:
    """A CUDA device of `total` bytes where other processes hold `others` and this one `mine`."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _d: SimpleNamespace(total_memory=total))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda _d: (total - others - mine, total))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda _d: mine)


def test_activation_estimate_counts_a_checkpointed_layer_by_its_input():
    full = TOKENS * 2 * (16 * HIDDEN + 3 * INTER)  # bytes one uncheckpointed layer keeps (bf16)
    kept = TOKENS * 2 * HIDDEN  # a checkpointed layer: its input
    assert memory.activation_bytes(TOKENS, LAYERS, HIDDEN, INTER) == LAYERS * full == 45_097_156_608  # the docs' 45.1 GB
    for k in range(1, LAYERS):
        assert memory.activation_bytes(TOKENS, LAYERS, HIDDEN, INTER, k) == (LAYERS - k) * full + k * kept
    # All checkpointed: backward recomputes one layer while every input is held.
    assert memory.activation_bytes(TOKENS, LAYERS, HIDDEN, INTER, LAYERS) == full + LAYERS * kept


def test_auto_picks_the_fewest_layers_whose_estimate_fits():
    full, kept = TOKENS * 2 * (16 * HIDDEN + 3 * INTER), TOKENS * 2 * HIDDEN
    pick = lambda budget: memory.auto_checkpoint_layers(budget, TOKENS, LAYERS, HIDDEN, INTER)  # noqa: E731
    assert pick(LAYERS * full) == 0  # fits without checkpointing: off, as before
    assert pick(LAYERS * full - 1) == 1  # just over the line: one layer, not all
    for k in range(1, LAYERS):
        at_k = (LAYERS - k) * full + k * kept
        assert pick(at_k) == k and pick(at_k + 1) == k and pick(at_k - 1) == k + 1 - (k == LAYERS - 1), k
    # Nothing fits: the least memory, which is all but the last layer (checkpointing it too only adds its input).
    assert pick(0) == LAYERS - 1 == min(range(LAYERS + 1), key=lambda k: memory.activation_bytes(TOKENS, LAYERS, HIDDEN, INTER, k))
    assert memory.auto_checkpoint_layers(0, TOKENS, 1, HIDDEN, INTER) == 0  # one layer: recomputing it never helps


def test_the_h100_case_the_rule_was_changed_for():
    """The 1B shape with a reference model on an 80 GB H100 (79.2 GiB as torch reports it), micro-batch 64 x 384
    tokens: half of what the model states leave made `auto` checkpoint 6 layers, but the step ran without any
    at a 46.6 GiB training peak and was the fastest of 0, 2, 4, 6 (benchmarks/grad_ckpt.py, docs/performance.md).
    3/4 of it holds the whole estimate (45.1 GB)."""
    n, total = 1_235_814_400, int(79.2 * 2**30)
    states = n * (2 + 2 + 2 + 12)
    estimate = memory.activation_bytes(TOKENS, LAYERS, HIDDEN, INTER)
    assert (total - states) // 2 < estimate <= int((total - states) * memory.ACTIVATION_SHARE)
    pick = lambda share: memory.auto_checkpoint_layers(int((total - states) * share), TOKENS, LAYERS, HIDDEN, INTER)  # noqa: E731
    assert (pick(0.5), pick(memory.ACTIVATION_SHARE)) == (6, 0)


def test_auto_on_a_card_checkpoints_the_layers_the_budget_needs(monkeypatch):
    model = make_causal_lm(make_tokenizer())  # hidden 64, 2 layers, intermediate 128
    n = sum(p.numel() for p in model.parameters())
    tokens = 8 * (100 + 28)  # micro-batch x (max_prompt_tokens + max_new_tokens)
    full, kept = tokens * 2 * (16 * 64 + 3 * 128), tokens * 2 * 64
    states = 2 * n + 2 * n + 2 * n + 12 * n  # weights, reference (beta > 0), gradients, fp32 master + AdamW
    # Budget = 3/4 of what the states leave: 2 full layers fit exactly, then one short of it, then of 1 + 1 kept.
    for budget, layers in ((2 * full, 0), (2 * full - 1, 1), (full + kept, 1), (full + kept - 1, 1)):
        card(monkeypatch, states + -(-4 * budget // 3))  # the smallest card whose 3/4 is `budget` (rounded down)
        got = backend.resolve_checkpointing(recipe(), model, world("cuda"))
        assert (got.layers, got.of, got.states, got.budget) == (layers, 2, states, budget), budget
        assert got.activations == (2 - layers) * full + layers * kept and got.estimate == states + got.activations
        assert "policy.gradient_checkpointing: auto" in got.describe() and "(budget " in got.describe()
        assert "75% of the " in got.describe()
    # Beside a vllm engine that stays awake through training (rollout.sleep off), the activations get half.
    span = -(-8 * full // 3)  # 3/4 of it holds both layers; half of it one and a kept input
    card(monkeypatch, states + span)
    for engine, sleep, share, layers in (("hf", False, 0.75, 0), ("vllm", True, 0.75, 0), ("vllm", False, 0.5, 1), ("auto", False, 0.5, 1)):
        r = recipe()
        r.rollout.engine, r.rollout.sleep = engine, sleep
        got = backend.resolve_checkpointing(r, model, world("cuda"))
        assert (backend.activation_share(r), got.budget, got.layers) == (share, int(span * share), layers), (engine, sleep)
    assert backend.resolve_checkpointing(recipe(), model, world("cpu")).layers == 0  # never on CPU
    for setting, layers in ((True, 2), (False, 0), (0, 0), (1, 1), (2, 2)):
        r = recipe()
        r.policy.gradient_checkpointing = setting
        assert backend.resolve_checkpointing(r, model, world("cpu")) == backend.Checkpointing(setting, layers, 2)
    r.policy.gradient_checkpointing = 3
    with pytest.raises(ValueError, match=r"^policy.gradient_checkpointing: 3 layers, but LlamaForCausalLM has 2 decoder layers"):
        backend.resolve_checkpointing(r, model, world("cpu"))


def test_auto_budgets_what_this_process_may_use_not_the_whole_card(monkeypatch):
    """Memory another process holds is not this run's, and a reward model beside the policy takes its share first:
    the budget is 3/4 of (free + what this process holds) − model states − the reward model's bytes."""
    model = make_causal_lm(make_tokenizer())
    states = backend.model_state_bytes(recipe(), model, world("cuda"))
    G = 2**30
    card(monkeypatch, 80 * G, others=60 * G, mine=1 * G)  # 20 GiB this process may use, 1 of it already its own
    got = backend.resolve_checkpointing(recipe(), model, world("cuda"))
    assert (got.total, got.budget) == (20 * G, int((20 * G - states) * 0.75))
    assert "of the 20.0 GiB this process may use" in got.describe()
    got = backend.resolve_checkpointing(recipe(), model, world("cuda"), held=4 * G)  # a 4 GiB reward model on the device
    assert (got.held, got.budget) == (4 * G, int((16 * G - states) * 0.75)) and "and 4.0 GiB of reward model" in got.describe()
    card(monkeypatch, 80 * G)  # nothing else on the card: the whole card, as before
    assert backend.resolve_checkpointing(recipe(), model, world("cuda")).total == 80 * G
    card(monkeypatch, 80 * G, others=79 * G)  # less than the states: a budget of 0, all but the last layer checkpointed
    got = backend.resolve_checkpointing(recipe(), model, world("cuda"), held=4 * G)
    assert got.budget == 0 and got.layers == 1


def _gradients(model, batch) -> dict[str, torch.Tensor]:
    from teacli.logprobs import token_logprobs

    ids, mask, n_prompt, weights = batch
    model.zero_grad(set_to_none=True)
    (token_logprobs(model, ids, mask, n_prompt) * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointing_the_first_k_layers_keeps_the_gradients(lora):
    from teacli.lora import apply_lora

    tok = make_tokenizer()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, len(tok), (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    batch = (ids, mask, 5, torch.randn(3, 7, generator=g))
    config = LoraConfig(enabled=True, r=4, alpha=8)
    want = None
    for k in (0, 1, 3):  # of L = 3
        model = make_causal_lm(tok, num_hidden_layers=3).float()
        set_gradient_checkpointing(model, k)
        assert [layer.gradient_checkpointing for layer in checkpointable_layers(model)] == [i < k for i in range(3)]
        if lora:
            model = apply_lora(model, config)
        calls = []
        handles = [layer.register_forward_pre_hook(lambda m, a: calls.append(m)) for layer in checkpointable_layers(model)]
        grads = _gradients(model.train(), batch)
        for h in handles:
            h.remove()
        assert len(calls) == 3 + k  # each checkpointed layer ran again in backward: the recompute happened
        if lora:
            assert grads and all("lora_" in n for n in grads)
        if want is None:
            want = grads
            continue
        assert grads.keys() == want.keys()
        for name, grad in want.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-7, msg=f"k={k} {name}")


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointed_layers_share_prompts(lora):
    """Any number of checkpointed layers keeps optim.share_prompts' shared KV cache (issue 45; before, a checkpointed
    layer dropped it and sharing was off): with k = 1 and 3 of 3 layers, with and without LoRA, the shared path gives
    the whole sequences' log-probs and gradients; LoRA's reference (the policy in train mode, adapters disabled, no
    gradients) its log-probs too."""
    from teacli.logprobs import can_share_prompts, shared_prompt_logprobs, token_logprobs
    from teacli.lora import apply_lora

    tok = make_tokenizer()
    g = torch.Generator().manual_seed(1)
    prompts, completions = torch.randint(10, len(tok), (2, 5), generator=g), torch.randint(10, len(tok), (4, 4), generator=g)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :2] = 0  # a left-padded prompt
    row_of = torch.tensor([0, 1, 0, 1])
    whole, mask = torch.cat([prompts[row_of], completions], 1), torch.cat([prompt_mask[row_of], torch.ones_like(completions)], 1)
    weights = torch.randn(4, 4, generator=g)
    for k in (1, 3):
        model = make_causal_lm(tok, num_hidden_layers=3).float()
        set_gradient_checkpointing(model, k)
        if lora:
            model = apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8))
            with torch.no_grad():  # adapters that change the model (B starts at 0): the reference differs from it
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0.0, 0.05, generator=g)
        model.train()
        assert can_share_prompts(model)
        got = []
        for run in (lambda: token_logprobs(model, whole, mask, 5),
                    lambda: shared_prompt_logprobs(model, prompts, prompt_mask, row_of, completions, torch.ones_like(completions))):
            model.zero_grad(set_to_none=True)
            value = run()
            (value * weights).sum().backward()
            got.append((value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        (want, g_want), (shared, g_shared) = got
        torch.testing.assert_close(shared, want, rtol=1e-5, atol=1e-5, msg=f"k={k}")
        assert g_want and g_shared.keys() == g_want.keys() and (not lora or all("lora_" in n for n in g_want))
        for name in g_want:
            torch.testing.assert_close(g_shared[name], g_want[name], rtol=1e-4, atol=1e-5, msg=f"k={k} {name}")
        if lora:
            with torch.no_grad(), model.disable_adapter():
                ref_whole = token_logprobs(model, whole, mask, 5)
                ref_shared = shared_prompt_logprobs(model, prompts, prompt_mask, row_of, completions, torch.ones_like(completions))
            torch.testing.assert_close(ref_shared, ref_whole, rtol=1e-5, atol=1e-5)
            assert not torch.allclose(ref_whole, want, atol=1e-4)  # the adapters were off
        set_gradient_checkpointing(model if not lora else model.get_base_model(), 0)
        assert can_share_prompts(model)


def test_recipe_accepts_auto_bools_and_a_number_of_layers(tmp_path):
    base = "policy: {name_or_path: p, gradient_checkpointing: %s}\ndata: {dir: d}\n"
    for text, value in (("auto", "auto"), ("true", True), ("false", False), ("0", 0), ("4", 4)):
        (tmp_path / "r.yaml").write_text(base % text)
        loaded = load_recipe(tmp_path / "r.yaml").policy.gradient_checkpointing
        assert loaded == value and type(loaded) is type(value)
    for text, why in (("sometimes", "has the wrong type"), ("-1", "out of range: must be >= 0"), ("2.5", "has the wrong type")):
        (tmp_path / "r.yaml").write_text(base % text)
        with pytest.raises(RecipeError, match=f"^policy.gradient_checkpointing: .*{why}.*r.yaml") as err:
            load_recipe(tmp_path / "r.yaml")
        assert "\n" not in str(err.value)
    (tmp_path / "r.yaml").write_text("policy: {name_or_path: p}\ndata: {dir: d}\nrollout: {compile: maybe}\n")
    with pytest.raises(RecipeError, match="rollout.compile.*r.yaml"):
        load_recipe(tmp_path / "r.yaml")


def test_train_checkpoints_k_layers_and_refuses_more_than_the_model_has(world, tmp_path):
    from tiny_lm import make_assets

    from teacli.train.errors import TrainError
    from teacli.train.loop import train

    assets = make_assets(tmp_path / "assets")
    rec = lambda layers: recipe_from_dict(tiny_recipe(  # noqa: E731
        assets / "policy", assets / "data", policy__gradient_checkpointing=layers, optim__steps=1, validation__enabled=False))
    with pytest.raises(TrainError) as err:
        train(rec(3), tmp_path / "bad")
    assert str(err.value) == ("policy.gradient_checkpointing: 3 layers, but LlamaForCausalLM has 2 decoder layers; "
                              "use 0 to 2, true (all), false or auto")
    train(rec(1), tmp_path / "run")
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["grad_ckpt_layers"] == 1 and "gpu_peak_gib" not in row  # the peaks are CUDA's only
