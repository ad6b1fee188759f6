"""token_logprobs: the chunked head (never the whole [tokens, vocabulary] log-softmax) gives the
same values and gradients as the model's full logits, on ragged left-padded, right-padded batches."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import make_causal_lm, make_tokenizer

import teacli.logprobs as lp_mod
from teacli.logprobs import resolved_kind, token_logprobs

N_PROMPT, N_COMP = 6, 7


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 60, (4, N_PROMPT + N_COMP), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding of different widths
    mask[1, :1] = 0
    mask[2, N_PROMPT + 4 :] = 0  # right padding: completions of different lengths
    mask[3, N_PROMPT + 1 :] = 0
    return ids, mask


def independent_logprobs(model, ids, mask):
    """Each row on its own, unpadded, through the model's full logits and torch's log_softmax."""
    out = torch.zeros(ids.shape[0], N_COMP)
    for b in range(ids.shape[0]):
        keep = mask[b].bool()
        seq = ids[b, keep][None]
        n_prompt = int(mask[b, :N_PROMPT].sum())
        logits = model(input_ids=seq).logits[0].float().log_softmax(-1)
        n = seq.shape[1] - n_prompt
        out[b, :n] = logits[n_prompt - 1 : -1].gather(-1, seq[0, n_prompt:, None]).squeeze(-1)
    return out


def grads_of(model, kind, ids, mask, weights):
    model.zero_grad(set_to_none=True)
    value = token_logprobs(model, ids, mask, N_PROMPT, fused=kind)
    (value * weights).sum().backward()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tied", [False, True])
def test_chunked_equals_full_logits_values_and_gradients(tok, monkeypatch, tied):
    model = make_causal_lm(tok, tie_word_embeddings=tied).float().train()
    monkeypatch.setattr(lp_mod, "CHUNK_ELEMENTS", 5 * len(tok))  # 5 rows per chunk: 16 valid tokens → 4 chunks
    ids, mask = batch()
    weights = torch.randn(ids.shape[0], N_COMP, generator=torch.Generator().manual_seed(1))
    plain, g_plain = grads_of(model, "plain", ids, mask, weights)
    chunked, g_chunked = grads_of(model, "chunked", ids, mask, weights)
    valid = mask[:, N_PROMPT:].bool()
    with torch.no_grad():
        expected = independent_logprobs(model.eval(), ids, mask)
    torch.testing.assert_close(plain[valid], expected[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-6)
    assert (chunked[~valid] == 0).all() and (chunked[valid] < 0).all()
    assert g_plain.keys() == g_chunked.keys()
    assert tied or "lm_head.weight" in g_plain
    for name in g_plain:
        torch.testing.assert_close(g_chunked[name], g_plain[name], rtol=1e-4, atol=1e-6, msg=name)


def test_no_grad_path_and_kind(tok):
    model = make_causal_lm(tok).float()
    ids, mask = batch()
    with torch.no_grad():
        a = token_logprobs(model, ids, mask, N_PROMPT)
        b = token_logprobs(model, ids, mask, N_PROMPT, fused="plain")
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert resolved_kind(model, torch.device("cpu")) == "chunked"  # liger is CUDA-only
    with pytest.raises(ValueError, match="liger"):
        token_logprobs(model, ids, mask, N_PROMPT, fused="liger")
    with pytest.raises(ValueError, match="fused"):
        token_logprobs(model, ids, mask, N_PROMPT, fused="fast")


def test_softcapped_logits_take_the_plain_path(tok):
    model = make_causal_lm(tok).float()
    model.config.final_logit_softcapping = 30.0  # logits ≠ head(hidden): the chunked head would be wrong
    assert resolved_kind(model, torch.device("cpu")) == "plain"


def test_peft_wrapped_policy(tok):
    peft = pytest.importorskip("peft")
    model = make_causal_lm(tok).float().train()
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    ids, mask = batch()
    weights = torch.randn(ids.shape[0], N_COMP, generator=torch.Generator().manual_seed(2))
    plain, g_plain = grads_of(wrapped, "plain", ids, mask, weights)
    chunked, g_chunked = grads_of(wrapped, "chunked", ids, mask, weights)
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-6)
    assert g_plain and g_plain.keys() == g_chunked.keys()
    for name in g_plain:
        torch.testing.assert_close(g_chunked[name], g_plain[name], rtol=1e-4, atol=1e-6, msg=name)


# -- prompts shared by several sequences: each prompt runs once ---------------------------------------


def shared_batch():
    """Three prompts of different lengths (left padding), 2, 3 and 1 completions of ragged lengths
    (right padding, one of a single token), sequences of a prompt not adjacent."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(10, 60, (n,), generator=g).tolist() for n in (5, 8, 3)]
    owner = [0, 1, 0, 2, 1, 1]
    lengths = [4, 6, 1, 5, 3, 6]
    completions = [torch.randint(10, 60, (n,), generator=g).tolist() for n in lengths]
    return [prompts[o] for o in owner], completions


def assert_shared_equals_whole(shared, g_shared, whole, g_whole, cmask):
    """Shared-prompt log-probs (0 off the completions, negative on them) and their parameter gradients equal those of
    the whole sequences."""
    import torch

    valid = cmask.bool()
    assert (shared[~valid] == 0).all() and (shared[valid] < 0).all()
    torch.testing.assert_close(shared, whole, rtol=1e-5, atol=1e-5)
    assert g_whole.keys() == g_shared.keys() and "model.embed_tokens.weight" in g_shared
    for name in g_whole:
        torch.testing.assert_close(g_shared[name], g_whole[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("attention", ["sdpa", "sdpa_gqa", "eager"])
def test_shared_prompts_equal_concatenated_sequences(tok, attention):
    """Same log-probs and the same parameter gradients as running each prompt + completion whole."""
    from teacli.logprobs import can_share_prompts, shared_prompt_logprobs
    from teacli.models import attention_implementation
    from teacli.train.batching import pack, pack_shared

    model = make_causal_lm(tok).float().train()
    prompts, completions = shared_batch()
    input_ids, attn, cmask, lp = pack(prompts, completions, tok.pad_token_id, "cpu")
    p_ids, p_mask, row_of, c_ids, c_mask = pack_shared(prompts, completions, tok.pad_token_id, "cpu")
    assert p_ids.shape[0] == 3 and row_of.tolist() == [0, 1, 0, 2, 1, 1] and torch.equal(c_mask, cmask)
    assert can_share_prompts(model)
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(4))
    results = []
    with attention_implementation(model, attention):
        for run in (lambda: token_logprobs(model, input_ids, attn, lp), lambda: shared_prompt_logprobs(model, p_ids, p_mask, row_of, c_ids, c_mask)):
            model.zero_grad(set_to_none=True)
            value = run()
            (value * weights).sum().backward()
            results.append((value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (whole, g_whole), (shared, g_shared) = results
    assert_shared_equals_whole(shared, g_shared, whole, g_whole, cmask)


def test_shared_prompts_not_with_reentrant_checkpointing_or_plain_models(tok):
    from teacli.logprobs import can_share_prompts, shared_prompt_logprobs

    model = make_causal_lm(tok).float().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert can_share_prompts(model)  # non-reentrant, tea's: the shared path keeps the cache (issue 45)
    # Reentrant checkpointing passes gradients only to a layer's tensor arguments, not to the prompt's keys and values
    # it reads from the cache: not shared.
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    assert not can_share_prompts(model)
    one = torch.ones(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="can_share_prompts"):
        shared_prompt_logprobs(model, one, one, torch.zeros(1, dtype=torch.long), one, one)
    capped = make_causal_lm(tok).float()
    capped.config.final_logit_softcapping = 30.0
    assert not can_share_prompts(capped) and not can_share_prompts(make_causal_lm(tok), fused="plain")
    with pytest.raises(ValueError, match="can_share_prompts"):
        one = torch.ones(1, 2, dtype=torch.long)
        shared_prompt_logprobs(capped, one, one, torch.zeros(1, dtype=torch.long), one, one)


class TokenCount:
    """Counts the tokens each decoder layer's forward runs, and its calls in backward (a checkpointed layer's
    recomputation), through forward pre-hooks (a recomputation stops once it has what backward needs, before a
    forward hook would run)."""

    def __init__(self, model):
        from teacli.models import checkpointable_layers

        self.forward, self.backward, self.in_backward = 0, 0, False
        self.handles = [layer.register_forward_pre_hook(self.hook) for layer in checkpointable_layers(model)]

    def hook(self, _module, args):
        if self.in_backward:
            self.backward += 1
        else:
            self.forward += args[0].shape[0] * args[0].shape[1]

    def remove(self):
        for handle in self.handles:
            handle.remove()


def counted_backward(model, forward, weights):
    """forward()'s log-probs, the parameter gradients of their weighted sum, and the `TokenCount` of both passes."""
    model.zero_grad(set_to_none=True)
    count = TokenCount(model)
    value = forward()
    count.in_backward = True
    (value * weights).sum().backward()
    count.remove()
    return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, count


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("layers", [3, 1])
def test_shared_prompts_with_checkpointed_layers_equal_concatenated_sequences(tok, layers, attention):
    """Issue 45: with every layer (3 of 3) or the first one gradient-checkpointed, the shared-prompt path gives the
    log-probs and parameter gradients of the whole sequences (float32), the same as it gives without checkpointing,
    runs each prompt once (a forward hook counts the tokens every layer ran) and does recompute the checkpointed
    layers in backward, both passes. Left-padded prompts of 5, 8 and 3 tokens, three groups in the micro-batch.
    Before: transformers dropped the cache in a checkpointed layer and the completions did not see their prompt."""
    from teacli.logprobs import can_share_prompts, shared_prompt_logprobs
    from teacli.models import attention_implementation, set_gradient_checkpointing
    from teacli.train.batching import pack, pack_shared

    prompts, completions = shared_batch()
    input_ids, attn, cmask, lp = pack(prompts, completions, tok.pad_token_id, "cpu")
    p_ids, p_mask, row_of, c_ids, c_mask = pack_shared(prompts, completions, tok.pad_token_id, "cpu")
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(4))

    def run(model, forward):
        model.zero_grad(set_to_none=True)
        count = TokenCount(model)
        value = forward(model)
        count.in_backward = True
        (value * weights).sum().backward()
        count.remove()
        return value.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, count

    whole_run = lambda m: token_logprobs(m, input_ids, attn, lp)  # noqa: E731
    shared_run = lambda m: shared_prompt_logprobs(m, p_ids, p_mask, row_of, c_ids, c_mask)  # noqa: E731
    plain = make_causal_lm(tok, num_hidden_layers=3).float().train()
    model = make_causal_lm(tok, num_hidden_layers=3).float().train()
    set_gradient_checkpointing(model, layers)
    assert can_share_prompts(model)
    with attention_implementation(plain, attention), attention_implementation(model, attention):
        whole, g_whole, _ = run(model, whole_run)
        unckpt, g_unckpt, _ = run(plain, shared_run)
        shared, g_shared, count = run(model, shared_run)
    assert_shared_equals_whole(shared, g_shared, whole, g_whole, cmask)
    for name in g_whole:
        torch.testing.assert_close(g_shared[name], g_unckpt[name], rtol=1e-6, atol=1e-6, msg=name)
    torch.testing.assert_close(shared, unckpt, rtol=0, atol=1e-6)
    # every layer ran the 3 prompts once (8 columns) and the 6 completions' first 5 tokens, not 6 x (8 + 6)
    assert count.forward == 3 * (3 * 8 + 6 * 5) < 3 * 6 * (8 + 6) == input_ids.numel() * 3
    assert count.backward == 2 * layers  # each checkpointed layer recomputed once a pass: prompts, completions


def test_shared_reference_on_a_checkpointed_policy_in_train_mode(tok):
    """The reference's forward without gradients on the training policy (LoRA's adapters-disabled reference runs it in
    train mode, checkpointed layers and all): the shared path gives the whole sequences' log-probs."""
    from teacli.logprobs import shared_prompt_logprobs
    from teacli.models import set_gradient_checkpointing
    from teacli.train.batching import pack, pack_shared

    prompts, completions = shared_batch()
    input_ids, attn, _, lp = pack(prompts, completions, tok.pad_token_id, "cpu")
    p_ids, p_mask, row_of, c_ids, c_mask = pack_shared(prompts, completions, tok.pad_token_id, "cpu")
    model = make_causal_lm(tok, num_hidden_layers=3).float().train()
    set_gradient_checkpointing(model, 2)
    with torch.no_grad():
        whole = token_logprobs(model, input_ids, attn, lp)
        shared = shared_prompt_logprobs(model, p_ids, p_mask, row_of, c_ids, c_mask)
    torch.testing.assert_close(shared, whole, rtol=1e-5, atol=1e-5)


def test_nan_safe_sdpa_mask_unmasks_only_rows_with_no_key():
    """A left-padded query row attends to no key (its own and earlier keys are padding, later ones are
    causal-masked); on CUDA torch's SDPA backward gives NaN for such rows. The safe mask lets exactly
    those rows attend to every key and leaves every other row as transformers builds it."""
    from transformers.masking_utils import sdpa_mask

    attention = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]], dtype=torch.bool)
    kwargs = dict(batch_size=2, q_length=5, kv_length=5, attention_mask=attention, allow_is_causal_skip=False)
    plain, safe = sdpa_mask(**kwargs), lp_mod.nan_safe_sdpa_mask(**kwargs)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    want = causal & attention[:, None, :]  # [2, q, kv]: causal and key not padding
    assert torch.equal(plain[:, 0], want)
    assert not want[0, 0].any() and not want[0, 1].any()  # row 0's two padded queries see nothing
    want[0, :2] = True  # ... and see every key in the safe mask
    assert torch.equal(safe[:, 0], want)
    assert lp_mod.nan_safe_sdpa_mask(batch_size=1, q_length=4, kv_length=4, attention_mask=None) is None  # no padding: no mask


def test_log_prob_functions_use_the_nan_safe_mask_and_it_changes_no_value_or_gradient(tok, monkeypatch):
    from transformers import AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    ids, mask = batch()
    model = make_causal_lm(tok, seed=0).float()
    model.config._attn_implementation = "sdpa"
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "sdpa", sdpa_mask)
    monkeypatch.setattr(lp_mod, "_NAN_SAFE_MASKS", True)  # as before the fix: transformers' own mask
    plain = token_logprobs(model, ids, mask, N_PROMPT)
    plain.sum().backward()
    plain_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    monkeypatch.setattr(lp_mod, "_NAN_SAFE_MASKS", False)
    safe = token_logprobs(model, ids, mask, N_PROMPT)
    assert ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] is lp_mod.nan_safe_sdpa_mask
    safe.sum().backward()
    torch.testing.assert_close(safe, plain, rtol=0, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain_grads[n], rtol=1e-5, atol=1e-7, msg=lambda m: f"{n}: {m}")


def test_completion_positions_found_on_the_host_change_nothing(tok):
    """The trainer passes each micro-batch's completion positions (found on the host, where the masks are built) so
    the device need not be waited for to find them: the same log-probs and parameter gradients as without, for the
    whole sequences and the shared-prompt path."""
    from teacli.logprobs import completion_index, shared_prompt_logprobs
    from teacli.train.batching import pack, pack_shared

    model = make_causal_lm(tok).float().train()
    prompts, completions = shared_batch()
    input_ids, attn, cmask, lp = pack(prompts, completions, tok.pad_token_id, "cpu")
    p_ids, p_mask, row_of, c_ids, c_mask = pack_shared(prompts, completions, tok.pad_token_id, "cpu")
    index = completion_index(cmask)
    assert index.tolist() == [i for i, v in enumerate(cmask.reshape(-1).tolist()) if v]
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(5))
    runs = {
        "whole": lambda **k: token_logprobs(model, input_ids, attn, lp, **k),
        "shared": lambda **k: shared_prompt_logprobs(model, p_ids, p_mask, row_of, c_ids, c_mask, **k),
    }
    for name, run in runs.items():
        got = []
        for kwargs in ({}, {"completion_index": index}):
            model.zero_grad(set_to_none=True)
            value = run(**kwargs)
            (value * weights).sum().backward()
            got.append((value.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        assert torch.equal(got[0][0], got[1][0]), name
        assert (got[0][0][cmask == 0] == 0).all()
        for a, b in zip(got[0][1], got[1][1]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("layers", [0, 1, 3])
def test_completions_in_split_forwards_equal_whole_sequences(tok, layers):
    """optim.completion_splits: a micro-batch's completions sorted by length run in 3 forwards on the prompts' cache,
    each padded to its own longest, give the whole sequences' log-probs and parameter gradients (float32), with no
    layer checkpointed, the first, or all 3; the prompts still run once. shared_batch's completions of 4, 6, 1, 5, 3
    and 6 tokens, sorted 1, 3, 4, 5, 6, 6: the least-padding cut into 3 is [1 | 3, 4 | 5, 6, 6] (1 + 2·4 + 3·6 = 27
    tokens; every other cut computes 28 or more), so every layer runs the 3 prompts (8 columns) and 2·3 + 3·5
    completion tokens (a run of width 1 runs none: its last token predicts nothing), not 6·5 as in one forward."""
    from teacli.logprobs import shared_prompt_logprobs
    from teacli.models import set_gradient_checkpointing
    from teacli.train.batching import pack, packed_micro_batches

    prompts, completions = shared_batch()
    order = sorted(range(6), key=lambda i: len(completions[i]))
    assert order == [2, 4, 0, 3, 1, 5]
    prompts, completions = [prompts[i] for i in order], [completions[i] for i in order]
    input_ids, attn, cmask, lp = pack(prompts, completions, tok.pad_token_id, "cpu")
    (_, batch, _, _), = packed_micro_batches(prompts, completions, torch.zeros(6), [list(range(6))], True,
                                             tok.pad_token_id, "cpu", splits=3)
    *inputs, splits, index = batch
    assert [(rows, cols) for rows, cols, _ in splits] == [(1, 1), (2, 4), (3, 6)]
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(6))
    model = make_causal_lm(tok, num_hidden_layers=3).float().train()
    set_gradient_checkpointing(model, layers)
    whole, g_whole, _ = counted_backward(model, lambda: token_logprobs(model, input_ids, attn, lp), weights)
    split, g_split, count = counted_backward(
        model, lambda: shared_prompt_logprobs(model, *inputs, completion_index=index, splits=splits), weights)
    assert_shared_equals_whole(split, g_split, whole, g_whole, cmask)
    assert count.forward == 3 * (3 * 8 + 2 * 3 + 3 * 5)
    assert count.backward == layers * 3  # each checkpointed layer recomputed for the prompts and the two runs it ran


@pytest.mark.parametrize("attention", ["sdpa", "sdpa_gqa", "eager"])
@pytest.mark.parametrize("layers", [0, 3])
def test_packed_completions_equal_whole_sequences(tok, attention, layers):
    """optim.completion_splits: packed. shared_batch's completions (prompts 0, 1, 0, 2, 1, 1; 4, 6, 1, 5, 3 and 6
    tokens) run their first length − 1 tokens (3, 5, 0, 4, 2, 5) laid end to end in rows of width 5, a prompt's to a
    row, first-fit decreasing: prompt 0's [0] (the 1-token completion runs nothing), prompt 1's [1], [5], [4] (5 + 2
    > 5), prompt 2's [3]: 5 rows × 5 columns against 6 × 5 unpacked. Log-probs and parameter gradients equal the whole
    sequences' (float32), with no layer checkpointed and all 3, and under each attention that takes the 4D mask."""
    from teacli.logprobs import Packing, shared_prompt_logprobs
    from teacli.models import attention_implementation, set_gradient_checkpointing
    from teacli.train.batching import pack, packed_micro_batches

    prompts, completions = shared_batch()
    input_ids, attn, cmask, lp = pack(prompts, completions, tok.pad_token_id, "cpu")
    (_, batch, _, _), = packed_micro_batches(prompts, completions, torch.zeros(6), [list(range(6))], True,
                                             tok.pad_token_id, "cpu", splits="packed")
    *inputs, packing, index = batch
    assert isinstance(packing, Packing) and tuple(packing.segment.shape) == (5, 5)
    # the order packed_micro_batches sorts a micro-batch in: by completion length, stably (2, 4, 0, 3, 1, 5)
    order = [2, 4, 0, 3, 1, 5]
    lengths = [len(completions[i]) - 1 for i in order]
    for b, n in enumerate(lengths):  # every token of a completion but its last sits once, in order, in one row
        where = (packing.segment == b).nonzero()
        assert len(where) == n and (n == 0 or len(set(where[:, 0].tolist())) == 1)
        assert packing.offset[packing.segment == b].tolist() == list(range(n))
    row_of = inputs[2]
    assert packing.prompt.tolist() == row_of[packing.segment[:, 0]].tolist()  # a row is its first completion's prompt's
    assert sorted(packing.prompt.tolist()) == [0, 1, 1, 1, 2]
    weights = torch.randn(cmask.shape, generator=torch.Generator().manual_seed(6))
    model = make_causal_lm(tok, num_hidden_layers=3).float().train()
    set_gradient_checkpointing(model, layers)
    with attention_implementation(model, attention):
        whole, g_whole, _ = counted_backward(model, lambda: token_logprobs(model, input_ids, attn, lp), weights)
        packed, g_packed, count = counted_backward(
            model, lambda: shared_prompt_logprobs(model, *inputs, completion_index=index, splits=packing), weights[order])
    # packed_micro_batches ordered the micro-batch by completion length: back to shared_batch's order to compare
    unsorted = torch.empty_like(packed)
    unsorted[torch.tensor(order)] = packed
    assert_shared_equals_whole(unsorted, g_packed, whole, g_whole, cmask)
    assert count.forward == 3 * (3 * 8 + 5 * 5)  # the 3 prompts (8 columns), then 5 packed rows of 5, every layer
    assert count.backward == layers * 2


def test_shared_prompt_gradients_are_the_same_on_every_call():
    """One prompt read by 16 completions: the prompt's keys and values are indexed 16 times. Indexed as x[rows], the
    backward (index_put_ with accumulate) summed the repeats in a changing order on CPU, so every call's gradients
    differed in their last bits (all parameters, each of 3 calls) and CPU training with shared prompts diverged from
    step 2 on (README's quickstart scores changed from run to run). `rows_of` (index_select) sums them in order."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from teacli.logprobs import shared_prompt_logprobs
    from teacli.train.batching import pack_shared

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=576, intermediate_size=64, num_hidden_layers=1, num_attention_heads=9,
                         num_key_value_heads=3, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).float().train()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, 256, (70,), generator=g).tolist()] * 16
    completions = [torch.randint(5, 256, (n,), generator=g).tolist() for n in range(20, 36)]
    batch = pack_shared(prompts, completions, 0, "cpu")
    weights = torch.linspace(-1, 1, 35)
    grads = []
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        (shared_prompt_logprobs(model, *batch) * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for again in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], again))
