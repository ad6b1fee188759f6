"""One step off-policy rollouts (`rollout.max_staleness: 1`, teacli/train/offpolicy.py): the keys' checks, the weight
transfer, and `tea train` end to end on a tiny Llama built in-process (CPU, gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_assets

    return make_assets(tmp_path_factory.mktemp("offpolicy_assets"))


def recipe(assets: Path, tmp: Path, name: str = "recipe", **overrides) -> Path:
    from tiny_lm import tiny_recipe, write_recipe

    overrides.setdefault("validation__at_start", False)
    return write_recipe(tmp / f"{name}.yaml", tiny_recipe(assets / "policy", assets / "data", **overrides))


def tea_train(rec: Path, run: Path, tmp: Path, *, launcher: list[str] | None = None, check: bool = True):
    from tiny_lm import tea_env

    cmd = [*(launcher or [sys.executable, "-m"]), "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tmp), timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def metrics(run: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


# ------------------------------------------------------------------------------------------------
# The keys


def test_is_correction_defaults_to_token_one_step_off_and_is_allowed_with_hf_there():
    from teacli.train.importance import resolve_is_correction

    assert resolve_is_correction("auto", "hf", 0) == "off"
    assert resolve_is_correction("auto", "hf", 1) == "token"
    assert resolve_is_correction("sequence", "hf", 1) == "sequence"
    with pytest.raises(ValueError, match="rollout.max_staleness 1"):
        resolve_is_correction("token", "hf", 0)


@pytest.mark.parametrize("overrides, names", [
    ({"rollout": {"max_staleness": 1, "engine": "vllm"}}, "rollout.engine"),
    ({"rollout": {"max_staleness": 1, "dynamic_sampling": True}}, "rollout.dynamic_sampling"),
    ({"rollout": {"max_staleness": 2}}, "out of range"),
])
def test_what_one_step_off_cannot_run_with_is_refused_naming_the_keys(tmp_path, overrides, names):
    import yaml

    from teacli.config import RecipeError, load_recipe

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"policy": {"name_or_path": "x"}, "data": {"dir": "d"}, **overrides}))
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    message = str(err.value)
    assert "rollout.max_staleness" in message and names in message and "\n" not in message


def test_token_correction_with_hf_is_accepted_one_step_off(tmp_path):
    import yaml

    from teacli.config import load_recipe

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"policy": {"name_or_path": "x"}, "data": {"dir": "d"},
                                    "rollout": {"engine": "hf", "max_staleness": 1, "is_correction": "token"}}))
    assert load_recipe(path).rollout.max_staleness == 1


# ------------------------------------------------------------------------------------------------
# The weight transfer


def test_the_rollout_thread_has_cuda_graph_state_of_its_own():
    """torch < 2.13 keeps CUDA-graph tree managers in state that only the importing thread has (the compiled decode
    step failed `assert torch._C._is_key_in_tls` in the rollout thread on an H200 with torch 2.11): the rollout
    thread sets up its own before it generates."""
    import threading

    from torch._inductor import cudagraph_trees

    from teacli.train.offpolicy import OneStepAhead

    def own_state():
        return hasattr(cudagraph_trees.local, "tree_manager_containers"), cudagraph_trees.local.__dict__.get("tree_manager_containers")

    plain: list = []
    thread = threading.Thread(target=lambda: plain.append(own_state()))
    thread.start()
    thread.join()
    assert plain == [(False, None)]  # what a thread of its own starts with
    ahead = OneStepAhead(None, None, None, pad_id=0, batch_size=1, behaviour=False)
    try:
        has, containers = ahead.pool.submit(own_state).result()
    finally:
        ahead.close()
    assert has and containers == {}
    main = cudagraph_trees.local.__dict__.get("tree_manager_containers")
    assert containers is not main


def test_copy_weights_gives_the_sampler_the_trainers_weights_and_names_a_mismatch():
    import torch

    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.train.offpolicy import copy_weights

    tok = make_tokenizer()
    trainer, sampler = make_causal_lm(tok, seed=0), make_causal_lm(tok, seed=1)
    assert copy_weights(sampler, trainer.named_parameters()) == len(dict(sampler.named_parameters()))
    for (name, a), (_, b) in zip(trainer.named_parameters(), sampler.named_parameters()):
        assert torch.equal(a, b), name
    wrong = [(n, p[:1]) if n.endswith("layers.0.mlp.up_proj.weight") else (n, p) for n, p in trainer.named_parameters()]
    with pytest.raises(ValueError, match=r"up_proj.weight has shape"):
        copy_weights(sampler, wrong)
    with pytest.raises(ValueError, match="got no weights from the trainer"):
        copy_weights(sampler, list(trainer.named_parameters())[:-1])


def test_copy_weights_merges_lora_adapters_into_the_base_names():
    """A LoRA policy's transfer is its merged weights: the sampler's logits equal the adapted policy's."""
    import torch

    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.config import LoraConfig
    from teacli.lora import apply_lora
    from teacli.train.offpolicy import copy_weights

    tok = make_tokenizer()
    policy = apply_lora(make_causal_lm(tok, seed=0), LoraConfig(enabled=True, r=4, alpha=8))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # adapters that change the outputs
    sampler = make_causal_lm(tok, seed=3)
    copy_weights(sampler, policy.named_parameters(), lora_module=policy)
    ids = torch.tensor([[1, 5, 9, 12, 7]])
    with torch.no_grad():
        want, got = policy(input_ids=ids).logits, sampler(input_ids=ids).logits
        plain = make_causal_lm(tok, seed=0)(input_ids=ids).logits
    assert (want - plain).abs().max() > 1e-3  # the adapters matter
    assert torch.allclose(got, want, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# tea train


@pytest.mark.slow
def test_without_updates_one_step_off_samples_what_on_policy_does_with_ratios_of_one(assets, tmp_path):
    """At an lr too small to change a weight, the stale sampler holds the trainer's weights: the same samples and
    rewards as on-policy (the same seeds), importance ratios of 1, and every batch one version behind from step 2."""
    on, off = tmp_path / "on", tmp_path / "off"
    tea_train(recipe(assets, tmp_path, "on", optim__lr=1e-20), on, tmp_path)
    tea_train(recipe(assets, tmp_path, "off", optim__lr=1e-20, rollout__max_staleness=1), off, tmp_path)
    a, b = metrics(on), metrics(off)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert x["reward_mean"] == y["reward_mean"] and x["gen_len_mean"] == y["gen_len_mean"], y["step"]
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5, abs=1e-6)
        assert y["is_ratio_min"] == pytest.approx(1, abs=1e-5) and y["is_ratio_max"] == pytest.approx(1, abs=1e-5)
        assert y["is_truncated_frac"] == 0
    assert [r["weights_version"] for r in a] == [0, 1, 2, 3] and not any("staleness" in r for r in a)
    assert [r["weights_version"] for r in b] == [0, 0, 1, 2] and [r["staleness"] for r in b] == [0, 1, 1, 1]
    assert all(r["time_wait_rollouts"] >= 0 and r["time_behaviour"] > 0 for r in b)


@pytest.mark.slow
def test_one_step_off_trains_and_a_kill_resumes_with_the_batch_in_flight(assets, tmp_path):
    """lr > 0: every batch after the first is one update behind the trainer and the ratios leave 1. A run killed
    after checkpoint 2 resumes from it with the batch that was in flight (kept in the checkpoint), and its
    metrics and final weights equal the uninterrupted run's."""
    from tiny_lm import assert_resumed_like, kill_after

    rec = recipe(assets, tmp_path, rollout__max_staleness=1, optim__steps=6, reward__function="rewards_for_tests:slow_length_reward")
    reference = tmp_path / "reference"
    tea_train(rec, reference, tmp_path)
    ref = metrics(reference)
    assert [r["staleness"] for r in ref] == [0, 1, 1, 1, 1, 1]
    assert [r["weights_version"] for r in ref] == [0, 0, 1, 2, 3, 4]
    assert max(abs(r["is_ratio_max"] - 1) for r in ref[1:]) > 1e-4  # the weights moved between sampling and training
    ckpt = reference / "checkpoints" / "step_000002"
    assert (ckpt / "pending_rank0.pt").is_file() and not (reference / "checkpoints" / "step_000006" / "pending_rank0.pt").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["data_position"] == 2 * 2  # the trained batches only

    run = tmp_path / "killed"
    kill_after(rec, run, tmp_path, rows=3)  # mid-step 4: after checkpoint 2, before checkpoint 4
    assert (run / "checkpoints" / "step_000002").is_dir() and not (run / "checkpoints" / "step_000004").exists()
    tea_train(rec, run, tmp_path)
    assert_resumed_like(run, reference, 6, ("reward_mean", "loss", "is_ratio_mean", "weights_version"))


@pytest.mark.slow
def test_a_run_cannot_resume_with_another_staleness(assets, tmp_path):
    run = tmp_path / "run"
    tea_train(recipe(assets, tmp_path, "on", optim__steps=2), run, tmp_path)
    proc = tea_train(recipe(assets, tmp_path, "off", optim__steps=4, rollout__max_staleness=1), run, tmp_path, check=False)
    assert proc.returncode == 2 and "rollout.max_staleness" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("stage, lora", [(3, False), (2, True)])
def test_one_step_off_on_two_processes(assets, tmp_path, stage, lora):
    """Two ranks under the deepspeed launcher, each with its own sampler: ZeRO-3 (the transfer gathers each
    parameter, collectively) and LoRA (adapters merged into the transfer). Both ranks train one version behind,
    and at step 2 the ratios are 1 where the weights had not changed yet (lr tiny: the transfer is exact)."""
    rec = recipe(assets, tmp_path, rollout__max_staleness=1, backend__zero_stage=stage, optim__steps=3, optim__lr=1e-20,
                 checkpoint__save_every=2, rollout__prompts_per_step=4,
                 policy__lora={"enabled": lora, "r": 4, "alpha": 8},
                 logging={"report_to": [], "per_rank": True})
    run = tmp_path / "run"
    from tiny_lm import free_port

    tea_train(rec, run, tmp_path, launcher=[sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
                                           "--master_port", str(free_port()), "--module"])
    ranks = metrics(run, "ranks.jsonl")
    assert [(r["step"], r["rank"]) for r in ranks] == [(s, k) for s in (1, 2, 3) for k in (0, 1)]
    assert [r["staleness"] for r in ranks] == [0, 0, 1, 1, 1, 1]
    for r in ranks:
        assert r["is_ratio_min"] == pytest.approx(1, abs=1e-5) and r["is_ratio_max"] == pytest.approx(1, abs=1e-5), r
    assert {p.name for p in (run / "checkpoints" / "step_000002").glob("pending_rank*.pt")} == {"pending_rank0.pt", "pending_rank1.pt"}
