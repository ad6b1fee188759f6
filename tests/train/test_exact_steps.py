"""One optimizer update per step, always: the micro-batching of `train_step` and the setup-time prompt filter.

`train_step` runs on a real DeepSpeed engine (one-process gloo group, CPU) around a tiny Llama; its
gradient is read at the optimizer's step and compared with the plain full-batch gradient of the
same loss (all sequences in one unsorted, fully padded batch). The end-to-end test trains through
the real `tea train` on data with over-length prompts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))


def test_micro_batches_are_exactly_n_sorted_and_even():
    from teacli.padding import micro_batches

    lengths = [9, 3, 7, 3, 12, 5, 1]
    batches = micro_batches(lengths, 3)
    assert [len(b) for b in batches] == [3, 2, 2]
    assert sorted(i for b in batches for i in b) == list(range(7))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(lengths)  # grouped by length: each batch pads to similar sequences
    assert micro_batches(lengths, 1) == [sorted(range(7), key=lambda i: lengths[i])]
    assert [len(b) for b in micro_batches([4, 2], 4)] == [1, 1, 0, 0]  # fewer sequences than micro-batches
    for n in range(1, 12):
        assert len(micro_batches(lengths, n)) == n
    # With groups (shared prompts): a prompt's sequences stay together, by length within the group.
    groups = [1, 0, 1, 0, 0, 1, 2]
    batches = micro_batches(lengths, 3, groups)
    assert [i for b in batches for i in b] == [1, 3, 4, 5, 2, 0, 6] and [len(b) for b in batches] == [3, 2, 2]
    # Without groups the cut computes the fewest tokens (rows × longest) that no batch of the even cut exceeds: four
    # short sequences and two long ones in two micro-batches are [4 short] + [2 long] (4·1 + 2·10 = 24 tokens, the
    # even cut's largest batch alone is 3·10 = 30), with groups the even cut stays.
    assert micro_batches([10, 1, 1, 10, 1, 1], 2) == [[1, 2, 4, 5], [0, 3]]
    assert [len(b) for b in micro_batches([10, 1, 1, 10, 1, 1], 2, [0, 0, 0, 1, 1, 1])] == [3, 3]


def test_padding_is_the_share_of_the_packed_tokens():
    """Two sequences of 3 and 5 tokens packed whole (pack_tight) compute 2 × 5 = 10 tokens of which 2 are padding;
    sharing their 2-token prompt (pack_shared), 1 × 2 prompt + 2 × 3 completion = 8 tokens, 2 of them padding. An
    empty micro-batch's zero-weight pass over the first sequence counts as computed."""
    import torch

    from teacli.train.batching import pack_shared, pack_tight, pad_share, padding

    prompts, comps = [[7, 8], [7, 8]], [[5], [5, 6, 9]]
    assert padding(prompts, comps, [[0, 1]], shared=False) == (2, 10) and pad_share(2, 10) == 0.2
    ids, attn, cmask, lp = pack_tight(prompts, comps, 0, "cpu")
    assert ids.numel() == 10 and int((attn == 0).sum()) == 2
    assert ids.tolist() == [[0, 0, 7, 8, 5], [7, 8, 5, 6, 9]] and lp == 2 and cmask.tolist() == [[0, 0, 1], [1, 1, 1]]
    assert padding(prompts, comps, [[0, 1]], shared=True) == (2, 8)
    p_ids, p_mask, row_of, c_ids, c_mask = pack_shared(prompts, comps, 0, "cpu")
    assert p_ids.numel() + c_ids.numel() == 8 and int((p_mask == 0).sum() + (c_mask == 0).sum()) == 2
    assert padding(prompts, comps, [[0, 1], []], shared=False) == (2, 13)  # + the empty batch's pass over [7, 8, 5]
    assert pad_share(0, 0) == 0.0
    # the sampler's log-probs line up with pack_tight's right-aligned completions
    from teacli.train.batching import packed_micro_batches

    (_, batch, _, rollout), = packed_micro_batches(prompts, comps, torch.zeros(2), [[0, 1]], False, 0, "cpu",
                                                  [[-1.0], [-2.0, -3.0, -4.0]])
    assert rollout.tolist() == [[0.0, 0.0, -1.0], [-2.0, -3.0, -4.0]] and torch.equal(rollout != 0, batch[2].bool())


# ------------------------------------------------------------------------------------------------
# train_step on a DeepSpeed engine


def make_batch(n_prompts: int, m: int, seed: int, vocab: int, eos: int):
    """Prompts of different lengths and m completions each of lengths 1..9, some ending in EOS."""
    import random

    from teacli.types import Completion

    rng = random.Random(seed)
    prompt_ids = [[rng.randrange(8, vocab) for _ in range(rng.randint(3, 11))] for _ in range(n_prompts)]
    groups = []
    for _ in range(n_prompts):
        group = []
        for _ in range(m):
            toks = [rng.randrange(8, vocab) for _ in range(rng.randint(1, 9))]
            finished = rng.random() < 0.5
            if finished:
                toks[-1] = eos
            group.append(Completion(token_ids=toks, text="", finished=finished))
        groups.append(group)
    return prompt_ids, groups


def full_batch_gradient(model, reference, recipe, prompt_ids, groups, advantages, pad_id):
    """∇ of the step's loss with every sequence in one batch, in the original order, padded to the longest."""
    import torch

    from teacli.logprobs import token_logprobs
    from teacli.train.batching import pack
    from teacli.train.loss import policy_loss

    seq_prompt = [prompt_ids[p] for p, g in enumerate(groups) for _ in g]
    seq_comp = [c.token_ids for g in groups for c in g]
    input_ids, attn, cmask, lp = pack(seq_prompt, seq_comp, pad_id, torch.device("cpu"))
    with torch.no_grad():
        ref = token_logprobs(reference, input_ids, attn, lp)
    model.zero_grad()
    logp = token_logprobs(model, input_ids, attn, lp)
    loss, _ = policy_loss(logp, cmask, advantages.reshape(-1), ref, recipe.kl.beta, recipe.kl.estimator, len(seq_comp))
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def build(world, zero_stage: int, max_grad_norm: float, micro: int, nominal_seqs: int, checkpointed: int = 0):
    """`checkpointed`: the policy's first layers gradient-checkpointed (policy.gradient_checkpointing: k)."""
    import torch
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.config import Recipe
    from teacli.models import set_gradient_checkpointing
    from teacli.train import backend

    tok = make_tokenizer()
    recipe = Recipe()
    recipe.backend.zero_stage, recipe.backend.precision = zero_stage, "fp32"
    recipe.optim.micro_batch_size, recipe.optim.max_grad_norm, recipe.optim.lr = micro, max_grad_norm, 1e-3
    recipe.kl.beta = 0.1
    policy = make_causal_lm(tok, seed=0)
    set_gradient_checkpointing(policy, checkpointed)
    reference = make_causal_lm(tok, seed=1).requires_grad_(False)  # a different model: a non-zero KL gradient
    engine = backend.build_engine(policy, recipe, world, -(-nominal_seqs // micro), "fp32")
    twin = make_causal_lm(tok, seed=0).to(torch.float32)  # plain copy for the full-batch gradient
    return tok, recipe, engine, reference, twin


@pytest.mark.parametrize("share_prompts, checkpointed, splits", [(True, 0, 1), (False, 0, 1), (True, 2, 1), (True, 1, 1), (False, 2, 1),
                                                                 (True, 0, 3), (True, 1, 2), (True, 0, "packed"),
                                                                 (True, 2, "packed")])
def test_step_gradient_equals_the_full_batch_gradient_and_steps_once(world, share_prompts, checkpointed, splits, monkeypatch):
    """Whatever the sequence count (fewer than, equal to, or more than nominal), one update with the full-batch gradient;
    with each prompt run once per micro-batch (optim.share_prompts) or whole with each sequence; with every layer of
    the policy (2 of 2: policy.gradient_checkpointing: true) or the first gradient-checkpointed, or none (issue 45:
    checkpointing kept sharing off before); a shared micro-batch's completions in one forward or in up to 2 or 3,
    or packed end to end in rows (optim.completion_splits)."""
    import torch

    import teacli.logprobs
    from teacli.train import backend
    from teacli.train.update import shares_prompts, train_step

    tok, recipe, engine, reference, twin = build(world, zero_stage=0, max_grad_norm=0.0, micro=4, nominal_seqs=9,
                                                 checkpointed=checkpointed)
    recipe.optim.share_prompts, recipe.optim.completion_splits = share_prompts, splits
    assert shares_prompts(recipe, engine, reference) is share_prompts
    assert getattr(engine.module, "is_gradient_checkpointing", False) is bool(checkpointed)
    shared_calls = []
    real = teacli.logprobs.shared_prompt_logprobs
    monkeypatch.setattr(teacli.logprobs, "shared_prompt_logprobs", lambda *a, **k: shared_calls.append(a[1].shape[0]) or real(*a, **k))
    assert engine.gradient_accumulation_steps() == 3
    seen: list[dict[str, torch.Tensor]] = []
    engine.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append({n: p.grad.detach().clone() for n, p in engine.module.named_parameters()})
    )
    # 9 sequences (nominal), 2 (fewer than the 3 micro-batches), 15 (more: batches above micro_batch_size)
    for k, (n_prompts, m) in enumerate([(3, 3), (1, 2), (5, 3)]):
        prompt_ids, groups = make_batch(n_prompts, m, seed=k, vocab=len(tok), eos=tok.eos_token_id)
        advantages = torch.randn(n_prompts, m, generator=torch.Generator().manual_seed(k))
        twin.load_state_dict(engine.module.state_dict())
        want = full_batch_gradient(twin, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id)
        stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id, torch.device("cpu"))
        assert len(seen) == k + 1 and backend.optimizer_steps(engine) == k + 1 == stats["optimizer_step"]
        got = seen[-1]
        for name, g in want.items():
            # atol 5e-6: fp32 sums in another order (3 forwards against one); with transformers 5.19 one embedding
            # gradient element of ~4e-3 moved by 1.4e-6
            torch.testing.assert_close(got[name], g, rtol=1e-4, atol=5e-6, msg=lambda msg: f"{name}: {msg}")
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in want.values()]))
        assert stats["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
        assert stats["kl"] != 0.0 and stats["kl_loss"] > 0
    # Shared: policy and reference per micro-batch, with few distinct prompts each (sequences grouped by prompt).
    assert (len(shared_calls) == 2 * 3 * 3 and max(shared_calls) == 3) if share_prompts else not shared_calls  # 5 of 15: at most 3 groups of 3


def test_every_micro_batch_reaches_the_device_before_the_first_forward():
    """packed_micro_batches: each micro-batch as pack_tight / pack_shared builds it, its completion positions, its
    advantages and the sampler's log-probs (where the importance correction reads them), all on the device (the meta
    device stands in for a GPU here); an empty micro-batch is a zero-weight pass over the first one's first sequence."""
    import torch

    from teacli.train.batching import pack_shared, pack_tight, packed_micro_batches

    prompt_ids, groups = make_batch(2, 3, seed=1, vocab=50, eos=2)
    seq_prompt = [prompt_ids[p] for p, g in enumerate(groups) for _ in g]
    seq_comp = [c.token_ids for g in groups for c in g]
    adv = torch.arange(6, dtype=torch.float32)
    batches = [[0, 1, 2], [3, 4, 5], []]
    sampler = [[-0.5] * len(c) for c in seq_comp]
    for shared, packer in ((False, pack_tight), (True, pack_shared)):
        out = packed_micro_batches(seq_prompt, seq_comp, adv, batches, shared, 0, torch.device("meta"), sampler)
        assert [w for w, *_ in out] == [1.0, 1.0, 0.0]
        assert all(r is None for *_, r in packed_micro_batches(seq_prompt, seq_comp, adv, batches, shared, 0, torch.device("meta")))
        for (_, batch, a, rollout), idx in zip(out, [[0, 1, 2], [3, 4, 5], [0]]):
            want = packer([seq_prompt[i] for i in idx], [seq_comp[i] for i in idx], 0, "cpu")
            tensors = [t for t in batch if isinstance(t, torch.Tensor)]
            assert all(t.device.type == "meta" for t in tensors) and a.device.type == "meta" and a.shape == (len(idx),)
            assert [tuple(t.shape) for t in tensors[:-1]] == [tuple(t.shape) for t in want if isinstance(t, torch.Tensor)]
            mask = want[-1] if shared else want[2]
            assert tensors[-1].shape == (int(mask.sum()),)  # the completion positions: one a completion token
            assert rollout.device.type == "meta" and rollout.shape == mask.shape  # the sampler's, aligned with the mask
            if not shared:
                assert batch[3] == want[3]  # the prompt width stays a number


@pytest.mark.parametrize("max_grad_norm", [1.0e6, 1.0e-3])
def test_zero2_grad_norm_is_the_pre_clip_norm(world, max_grad_norm):
    import torch

    from teacli.train.update import train_step

    tok, recipe, engine, reference, twin = build(world, zero_stage=2, max_grad_norm=max_grad_norm, micro=3, nominal_seqs=8)
    prompt_ids, groups = make_batch(2, 4, seed=5, vocab=len(tok), eos=tok.eos_token_id)
    advantages = torch.randn(2, 4, generator=torch.Generator().manual_seed(5))
    twin.load_state_dict(engine.module.state_dict())
    want = full_batch_gradient(twin, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id)
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in want.values()])))
    stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id, torch.device("cpu"))
    assert stats["optimizer_step"] == 1
    assert stats["grad_norm"] == pytest.approx(norm, rel=1e-4)  # before the clip, also when the clip binds


# ------------------------------------------------------------------------------------------------
# tea train with over-length prompts


def _write_split(path: Path, contents: list[str]) -> None:
    rows = [{"id": f"{path.stem}-{i}", "messages": [{"role": "user", "content": c}], "source": "test"} for i, c in enumerate(contents)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from tiny_lm import make_causal_lm, make_tokenizer, save

    root = tmp_path_factory.mktemp("exact_steps")
    tok = make_tokenizer()
    save(make_causal_lm(tok), tok, root / "policy")
    data = root / "data"
    data.mkdir()
    # 36 words: 40 tokens with the chat template (<bos> <|user|> ... <eos> <|assistant|>), "again" makes 41 (> 16)
    long = " ".join(["the cat sat on the mat"] * 6)
    short = ["the cat sat", "a dog ran in the park", "one two three", "write a short poem", "please answer", "what is paris"]
    _write_split(data / "train.jsonl", [short[0], long, short[1], short[2], long + " again", short[3]])
    _write_split(data / "val.jsonl", [long, short[4], short[5], short[0], short[1]])
    return root


def _tea_train(assets: Path, tmp: Path, **overrides):
    from tiny_lm import tea_env, tiny_recipe, write_recipe

    rec = write_recipe(tmp / "recipe.yaml", tiny_recipe(assets / "policy", assets / "data", data__max_prompt_tokens=16, **overrides))
    cmd = [sys.executable, "-m", "teacli.cli", "train", str(rec), "--run-dir", str(tmp / "run")]
    return subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tmp), timeout=600)


def test_over_length_prompts_are_dropped_once_and_every_step_is_one_update(assets, tmp_path):
    # 4 usable train prompts, P = 3: steps wrap around epochs of the filtered list.
    proc = _tea_train(assets, tmp_path, rollout__prompts_per_step=3, rollout__group_size=4, optim__micro_batch_size=5,
                      optim__steps=4, checkpoint__save_every=2)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "run"
    warnings = [line for line in proc.stderr.splitlines() if "dropped" in line]
    assert len(warnings) == 1, proc.stderr
    assert ("dropped 2 of 6 train prompts and 1 of 5 validation prompts longer than data.max_prompt_tokens=16" in warnings[0]
            and "longest 41" in warnings[0] and "raise data.max_prompt_tokens" in warnings[0])
    data = json.loads((run / "data.json").read_text())
    import hashlib

    sha256 = hashlib.sha256((assets / "data" / "train.jsonl").read_bytes()).hexdigest()  # what a resume compares
    assert data["train"] == {"split": "train", "prompts": 6, "kept": 4, "dropped": 2, "longest_dropped_tokens": 41, "sha256": sha256}
    assert data["validation"]["dropped"] == 1 and data["validation"]["used"] == 4
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["prompts"] == 3 and r["optimizer_step"] == r["step"], r
        assert isinstance(r["grad_clipped"], bool) and r["grad_clipped"] == (r["grad_norm"] > 1.0) and r["grad_norm"] > 0
    val = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]
    assert all(v["prompts"] == 4 for v in val)


def test_too_few_prompts_left_is_a_one_line_error(assets, tmp_path):
    proc = _tea_train(assets, tmp_path, rollout__prompts_per_step=5)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if "rollout.prompts_per_step" in ln]
    assert line and "4 of 6 usable" in line[0] and "raise data.max_prompt_tokens" in line[0], proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_non_finite_gradient_norm_stops_the_step_with_one_line(world, zero_stage):
    """A NaN gradient (here from a NaN advantage) is a TrainError naming the step, not a NaN update that later
    steps and checkpoints carry on with silently (bf16 has no loss scaler to skip it)."""
    import torch

    from teacli.train.errors import TrainError
    from teacli.train.update import train_step

    tok, recipe, engine, reference, _ = build(world, zero_stage=zero_stage, max_grad_norm=1.0, micro=4, nominal_seqs=8)
    prompt_ids, groups = make_batch(2, 4, seed=7, vocab=len(tok), eos=tok.eos_token_id)
    advantages = torch.randn(2, 4, generator=torch.Generator().manual_seed(7))
    stats = train_step(engine, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id, torch.device("cpu"))
    assert stats["optimizer_step"] == 1 and stats["grad_norm"] > 0  # finite: the step goes through
    advantages[1, 2] = float("nan")
    with pytest.raises(TrainError, match=r"non-finite gradient norm \((nan|inf)\) at optimizer step 2: .*policy\.dtype=") as info:
        train_step(engine, reference, recipe, prompt_ids, groups, advantages, tok.pad_token_id, torch.device("cpu"))
    assert "\n" not in str(info.value)


def test_shared_micro_batches_keep_their_order_in_one_forward_and_sort_to_split():
    """optim.completion_splits 1 (the default) packs a shared micro-batch as before: its sequences in their order
    (grouped by prompt) and one forward as wide as its longest completion, wherever that sits; with 2 forwards the
    sequences are ordered by completion length, the two of one token in a forward of 1 column (2 + 3 = 5 tokens against
    [1 | 1, 3]'s 1 + 6) and the longest alone."""
    import torch

    from teacli.train.batching import packed_micro_batches

    prompts, comps = [[7, 8], [7, 8], [9]], [[5, 6, 7], [5], [4]]
    (_, one, _, _), = packed_micro_batches(prompts, comps, torch.zeros(3), [[0, 1, 2]], True, 0, "cpu")
    *_, c_ids, _, runs, _ = one
    assert c_ids.tolist() == [[5, 6, 7], [5, 0, 0], [4, 0, 0]] and [(r, c) for r, c, _ in runs] == [(3, 3)]
    (_, two, _, _), = packed_micro_batches(prompts, comps, torch.arange(3.0), [[0, 1, 2]], True, 0, "cpu", splits=2)
    *_, c_ids, _, runs, _ = two
    assert c_ids.tolist() == [[5, 0, 0], [4, 0, 0], [5, 6, 7]] and [(r, c) for r, c, _ in runs] == [(2, 1), (1, 3)]
