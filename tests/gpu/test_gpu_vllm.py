"""The vllm engine on CUDA (`python -m pytest -m gpu tests/gpu/test_gpu_vllm.py` on the GPU machine, with
vLLM's CUDA build importable; docs/vllm.md says how it was installed there). Skipped without either.

One engine for the engine-level tests (vLLM keeps its state in process globals): a tiny random Llama with
64-dimensional heads (what vLLM's GPU attention kernels take), bf16 on both sides, the recipe's defaults
(sleep level 2, CUDA graphs, memory share `auto`) and a 1 GiB KV cache. Then `tea train` / `tea eval-bon`
through the real CLI, each in its own process: ZeRO-2, ZeRO-3 with tied embeddings, LoRA; a skipped push
stopping the run; resume after kill -9; a KV cache that cannot hold one sequence; two GPUs when present.
Every check prints what it measured (log-prob gaps, memory, times): docs/vllm.md quotes those lines.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm", reason="needs vLLM's CUDA build (docs/vllm.md)")

from tiny_lm import kill_after, make_causal_lm, make_tokenizer, save, tea_env, tiny_recipe, write_recipe  # noqa: E402
from vllm_checks import chat_prompts, first_token_tv, ids_of, logprob_gaps, optimizer_step, sample  # noqa: E402

from teacli.config import RolloutConfig  # noqa: E402
from teacli.rollout.base import RolloutSyncError  # noqa: E402
from teacli.rollout.vllm_engine import SYNC_TOLERANCE, VLLMEngine  # noqa: E402

GiB = 2**30
# vLLM's CUDA attention kernels want a head size of 64 or more: 4 heads of 64, 2 KV heads.
SHAPE = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512, max_position_embeddings=512)
TOL = SYNC_TOLERANCE["bfloat16"]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok) -> list[list[int]]:
    return chat_prompts(tok)


@pytest.fixture(scope="module")
def fp32(tok):
    return make_causal_lm(tok, **SHAPE).cuda()


@pytest.fixture(scope="module")
def model(fp32):
    return copy.deepcopy(fp32).to(torch.bfloat16)


@pytest.fixture(scope="module")
def engine(model, tok):
    eng = VLLMEngine(RolloutConfig(engine="vllm", kv_cache_gib=1.0), model, tok, max_model_len=256)
    yield eng
    eng.close()


@pytest.fixture
def fresh(engine, model):
    """The shared engine holding `model`'s weights again after a test that pushed others."""
    yield engine
    engine.model = model
    engine.load_weights(model.named_parameters())
    engine.generate([[2, 5]], 1, sample(max_new_tokens=1), seed=0)  # consume the pending sync check


def gap_line(name: str, gaps: torch.Tensor) -> str:
    return f"{name}: mean {float(gaps.mean()):.4f}, p99 {float(gaps.quantile(0.99)):.4f}, max {float(gaps.max()):.4f} over {gaps.numel()} tokens"


# -- one engine ---------------------------------------------------------------------------------------


def test_bf16_logprobs_match_transformers_and_the_sync_check_passes(engine, model, prompts):
    out = engine.generate(prompts, n=16, sampling=sample(max_new_tokens=32), seed=0)
    assert all(len(row) == 16 for row in out)
    gaps = logprob_gaps(model, prompts, out)
    print(gap_line("GPU bf16 vLLM vs transformers", gaps))
    stats = engine.stats()
    print(f"sync check after the first push: {stats}")
    assert float(gaps.mean()) < TOL and stats["sync_logprob_mean_abs_diff"] < TOL and stats["sync_tokens_checked"] > 0
    assert stats["vllm_share_gib"] > 1.0


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 0.8), (1.3, 5, 0.95)])
def test_first_token_distribution_is_the_contract(engine, model, prompts, temperature, top_k, top_p):
    """2,000 first tokens against the contract computed from the trainer's bf16 logits. bf16 kernels differ
    slightly from transformers', so the bound has 0.03 of slack (the CPU fp32 test: 0.01) and a draw may
    fall just outside a top-p boundary: at most 1% of them."""
    tv, noise, outside = first_token_tv(engine, model, prompts[1], temperature, top_k, top_p)
    print(f"T={temperature} top_k={top_k} top_p={top_p}: TV {tv:.4f} (a correct sampler: {noise:.4f}), outside {outside:.4f}")
    assert outside <= 0.01
    assert tv < 1.5 * noise + 0.03, (tv, noise)


def test_sleep_frees_the_memory_and_wakes_to_the_same_samples(fresh, model, prompts, monkeypatch):
    before = ids_of(fresh.generate(prompts, n=8, sampling=sample(), seed=7))
    for level in (2, 1):
        monkeypatch.setattr(fresh.cfg, "sleep_level", level)
        free_awake = torch.cuda.mem_get_info()[0]
        fresh.sleep()
        freed = torch.cuda.mem_get_info()[0] - free_awake
        if level == 2:  # the weights are gone: generating before a push is refused, then the push brings them back
            with pytest.raises(RuntimeError, match="load_weights"):
                fresh.generate(prompts, n=1, sampling=sample(), seed=7)
            fresh.load_weights(model.named_parameters())
        fresh.wake()
        after = ids_of(fresh.generate(prompts, n=8, sampling=sample(), seed=7))
        stats = fresh.stats()
        print(f"sleep level {level}: freed {freed / GiB:.2f} GiB (engine: {stats['vllm_sleep_freed_gib']:.2f}); sleep "
              f"{stats['vllm_sleep_s'] * 1e3:.0f} ms, wake weights {stats['vllm_wake_weights_s'] * 1e3:.0f} ms, "
              f"KV cache {stats['vllm_wake_kv_cache_s'] * 1e3:.0f} ms")
        assert freed > 0.9 * GiB  # the 1 GiB KV cache at least, and the weights
        assert after == before, level


def test_a_push_after_an_optimizer_step_changes_the_samples_and_passes_the_check(fresh, fp32, tok, prompts):
    trained32 = copy.deepcopy(fp32)
    optimizer_step(trained32, tok, prompts, lr=1e-2)
    trained = trained32.to(torch.bfloat16)
    stale = fresh.generate(prompts, n=8, sampling=sample(max_new_tokens=16), seed=1)
    stale_gaps = logprob_gaps(trained, prompts, stale)
    fresh.model = trained
    fresh.load_weights(trained.named_parameters())
    out = fresh.generate(prompts, n=8, sampling=sample(max_new_tokens=16), seed=1)
    gaps = logprob_gaps(trained, prompts, out)
    print(gap_line("stale (no push) vs the trained policy", stale_gaps))
    print(gap_line("after the push", gaps) + f"; sync check {fresh.stats()['sync_logprob_mean_abs_diff']:.4f}")
    assert ids_of(out) != ids_of(stale)
    assert float(stale_gaps.mean()) > TOL  # the step moved the policy past the check's tolerance
    assert float(gaps.mean()) < TOL and fresh.stats()["sync_logprob_mean_abs_diff"] < TOL


def test_a_skipped_push_fails_the_sync_check(fresh, fp32, tok, prompts, monkeypatch):
    trained = copy.deepcopy(fp32)
    optimizer_step(trained, tok, prompts, lr=1e-2)
    trained = trained.to(torch.bfloat16)
    fresh.model = trained
    monkeypatch.setattr(fresh, "_push", lambda weights: sum(1 for _ in weights))  # consumes, pushes nothing
    fresh.load_weights(trained.named_parameters())
    with pytest.raises(RolloutSyncError, match="rollout.verify_sync"):
        fresh.generate(prompts, n=4, sampling=sample(), seed=0)


def test_lora_adapters_are_merged_into_the_push(fresh, model, prompts):
    from teacli.config import LoraConfig
    from teacli.lora import apply_lora

    peft = apply_lora(copy.deepcopy(model), LoraConfig(enabled=True, r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    fresh.model = peft
    fresh.load_weights(peft.named_parameters())
    out = fresh.generate(prompts, n=8, sampling=sample(), seed=2)
    adapted = logprob_gaps(peft, prompts, out)
    with peft.disable_adapter():
        base = logprob_gaps(peft, prompts, out)
    print(gap_line("LoRA merged: to the adapted policy", adapted) + "; " + gap_line("to the base", base))
    assert float(adapted.mean()) < TOL < float(base.mean())


def test_a_share_larger_than_what_is_free_stops_before_vllm_starts(model, tok, engine):
    with pytest.raises(ValueError, match=r"^rollout.gpu_memory_utilization: 0.99 .* set it to at most"):
        VLLMEngine(RolloutConfig(engine="vllm", gpu_memory_utilization=0.99), model, tok, max_model_len=256)
    with pytest.raises(ValueError, match=r"^rollout.kv_cache_gib: 100000 GiB"):
        VLLMEngine(RolloutConfig(engine="vllm", kv_cache_gib=100000.0), model, tok, max_model_len=256)


# -- tea train / eval-bon through the CLI -------------------------------------------------------------


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tok):
    from teacli.data.prepare import prepare

    root = tmp_path_factory.mktemp("vllm_gpu")
    save(make_causal_lm(tok, **SHAPE), tok, root / "policy")
    save(make_causal_lm(tok, **SHAPE, tie_word_embeddings=True), tok, root / "tied")
    prepare("builtin", root / "data")
    return root


def recipe(assets: Path, tmp: Path, *, policy: str = "policy", zero: int = 2, lora: bool = False, **overrides) -> Path:
    rec = tiny_recipe(
        assets / policy, assets / "data", name="vllm_gpu",
        policy={"name_or_path": str(assets / policy), "dtype": "bfloat16", "gradient_checkpointing": False,
                "lora": {"enabled": lora, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
        data__max_prompt_tokens=200, backend={"zero_stage": zero, "precision": "bf16"},
        rollout={"engine": "vllm", "prompts_per_step": 2, "group_size": 8, "max_new_tokens": 16, "kv_cache_gib": 1.0, "compile": False},
        optim__steps=3, optim__lr=3.0e-2 if lora else 3.0e-3, checkpoint__save_every=3,
    )
    for key, value in overrides.items():
        node = rec
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return write_recipe(tmp / "recipe.yaml", rec)


def tea(tmp: Path, *args: str, prefix: tuple[str, ...] = ("-m", "teacli.cli"), timeout: int = 600) -> subprocess.CompletedProcess:
    """`python PREFIX ARGS`: the CLI itself by default, or through a launcher or a patching script."""
    return subprocess.run([sys.executable, *prefix, *args], capture_output=True, text=True, env=tea_env(tmp), timeout=timeout)


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def check_run(run: Path, proc: subprocess.CompletedProcess, steps: int, label: str, min_freed_gib: float = 0.9) -> list[dict]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    got = rows(run)
    assert [r["step"] for r in got] == list(range(1, steps + 1))
    for r in got:  # every step generated with weights the sync check verified against the trainer's
        assert r["sync_tokens_checked"] > 0 and r["sync_logprob_mean_abs_diff"] < TOL, r
        assert r["vllm_sleep_freed_gib"] > min_freed_gib, r  # level 2: the KV cache and the weights were released
    ratios = (f"is_ratio mean/min/max {[(round(r['is_ratio_mean'], 4), round(r['is_ratio_min'], 3), round(r['is_ratio_max'], 3)) for r in got]}, "
              f"truncated {[round(r['is_truncated_frac'], 4) for r in got]}" if "is_ratio_mean" in got[0] else "no importance correction")
    print(f"{label}: sync mean gaps {[round(r['sync_logprob_mean_abs_diff'], 4) for r in got]}, max "
          f"{[round(r['sync_logprob_max_abs_diff'], 3) for r in got]}; {ratios}; share {got[0]['vllm_share_gib']:.1f} GiB, freed "
          f"{got[-1]['vllm_sleep_freed_gib']:.2f} GiB, free before wake {got[-1]['gpu_free_gib_before_wake']:.1f} GiB, sleep "
          f"{got[-1]['vllm_sleep_s'] * 1e3:.0f} ms, wake {got[-1]['vllm_wake_weights_s'] * 1e3:.0f} + {got[-1]['vllm_wake_kv_cache_s'] * 1e3:.0f} ms")
    return got


@pytest.fixture(scope="module")
def trained_run(assets, tmp_path_factory):
    """ZeRO-2, untied, CUDA graphs on (rollout.compile: auto): the run eval-bon evaluates below."""
    tmp = tmp_path_factory.mktemp("z2")
    proc = tea(tmp, "train", str(recipe(assets, tmp, rollout__compile="auto")), "--run-dir", str(tmp / "run"))
    return tmp / "run", proc


def test_tea_train_zero2(trained_run):
    run, proc = trained_run
    got = check_run(run, proc, 3, "ZeRO-2, CUDA graphs")
    assert got[-1]["kl_loss"] > 0
    assert "tea: vllm engine on cuda:0:" in proc.stderr


@pytest.mark.parametrize("zero,policy,lora", [(3, "tied", False), (2, "policy", True), (3, "policy", True)])
def test_tea_train_zero3_tied_and_lora(assets, tmp_path, zero, policy, lora):
    proc = tea(tmp_path, "train", str(recipe(assets, tmp_path, zero=zero, policy=policy, lora=lora)), "--run-dir", str(tmp_path / "run"))
    check_run(tmp_path / "run", proc, 3, f"ZeRO-{zero}, {policy}, lora={lora}")


def test_tea_train_with_an_auto_kv_cache_and_no_importance_correction(assets, tmp_path):
    """rollout.kv_cache_gib: auto sizes vLLM's KV cache to a step's sequences; is_correction: off asks vLLM for
    the sync check's log-probs only. Both train as the default engine does."""
    rec = recipe(assets, tmp_path, rollout__kv_cache_gib="auto", rollout__is_correction="off")
    proc = tea(tmp_path, "train", str(rec), "--run-dir", str(tmp_path / "run"))
    got = check_run(tmp_path / "run", proc, 3, "kv_cache_gib auto, is_correction off", min_freed_gib=0.0)
    assert "(rollout.kv_cache_gib auto: 16 sequences x " in proc.stderr  # 2 prompts x group_size 8
    assert all("is_ratio_mean" not in r for r in got)
    print("KV cache wake (s):", [round(r["vllm_wake_kv_cache_s"], 4) for r in got])


SKIP_PUSHES = r"""
import sys
from teacli.rollout.vllm_engine import VLLMEngine
real, calls = VLLMEngine._push, []
def push(self, weights):  # the first push (start-up) happens; later ones are dropped
    calls.append(1)
    return real(self, weights) if len(calls) == 1 else sum(1 for _ in weights)
VLLMEngine._push = push
sys.argv = ["tea", *sys.argv[1:]]
from teacli.cli import main
main()
"""


def test_tea_train_stops_when_a_push_is_skipped_zero3_tied(assets, tmp_path):
    rec = recipe(assets, tmp_path, zero=3, policy="tied", optim__lr=1e-2, validation__enabled=False)
    proc = tea(tmp_path, "train", str(rec), "--run-dir", str(tmp_path / "run"), prefix=("-c", SKIP_PUSHES))
    assert proc.returncode == 2, proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "rollout.verify_sync" in line
    assert len(rows(tmp_path / "run")) == 1  # step 1 generated with the start-up push; step 2 was caught


def test_eval_bon_with_vllm(trained_run, tmp_path):
    run, proc = trained_run
    assert proc.returncode == 0
    out = tea(tmp_path, "eval-bon", str(run), "--n", "8", "--split", "heldout")
    assert out.returncode == 0, out.stderr[-4000:]
    bon = json.loads((run / "eval" / "heldout-M8.bon.json").read_text())
    records = [json.loads(line) for line in (run / "eval" / "heldout-M8.jsonl").read_text().splitlines()]
    assert len(records) == 8 * len(bon["per_prompt"]) and bon["N"] == [1, 2, 4, 8]
    assert bon["mean"] == sorted(bon["mean"])  # best-of-N grows with N


def test_resume_after_kill_9_continues_as_the_uninterrupted_run(assets, tmp_path):
    rec = recipe(assets, tmp_path, optim__steps=4, checkpoint__save_every=2, reward__function="rewards_for_tests:slow_length_reward")
    reference = tmp_path / "reference"
    check_run(reference, tea(tmp_path, "train", str(rec), "--run-dir", str(reference)), 4, "resume: reference")
    run = tmp_path / "killed"
    kill_after(rec, run, tmp_path, rows=3, timeout=400)  # mid-step 4: after checkpoint 2, before checkpoint 4
    assert (run / "checkpoints" / "step_000002").is_dir() and not (run / "checkpoints" / "step_000004").exists()
    got = check_run(run, tea(tmp_path, "train", str(rec), "--run-dir", str(run)), 4, "resume: killed and resumed")
    want = rows(reference)
    diffs = [abs(a["reward_mean"] - b["reward_mean"]) for a, b in zip(got, want)]
    print(f"resume after kill -9: |reward_mean - reference| per step {diffs}; loss {[(a['loss'], b['loss']) for a, b in zip(got, want)]}")
    assert [r["optimizer_step"] for r in got] == [1, 2, 3, 4]
    assert max(diffs) < 1e-6


def test_a_kv_cache_that_cannot_hold_one_sequence_is_one_line_at_start_up(assets, tmp_path):
    proc = tea(tmp_path, "train", str(recipe(assets, tmp_path, rollout__kv_cache_gib=0.0001)), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    print(line)
    assert "rollout.kv_cache_gib" in line and "max_model_len" in line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun"])
def test_tea_train_on_two_gpus_zero3(assets, tmp_path, launcher):
    port = str(29700 + os.getpid() % 200 + (0 if launcher == "deepspeed" else 1))
    prefix = (("-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", port, "--module", "teacli.cli") if launcher == "deepspeed"
              else ("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port, "-m", "teacli.cli"))
    rec = recipe(assets, tmp_path, zero=3, rollout__prompts_per_step=4)
    proc = tea(tmp_path, "train", str(rec), "--run-dir", str(tmp_path / "run"), prefix=prefix)
    got = check_run(tmp_path / "run", proc, 3, f"2 GPUs ({launcher}), ZeRO-3")
    assert got[0]["prompts"] == 4
    assert "tea: vllm engine on cuda:1:" in proc.stderr + proc.stdout
