"""End-to-end `tea train` through the real CLI on a tiny Llama built in-process (CPU, gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from teacli.config import SCHEMA_KEY, SCHEMA_VERSION

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))
from tiny_lm import free_port  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_causal_lm, make_reward_model, make_tokenizer, save

    from teacli.data.prepare import prepare

    root = tmp_path_factory.mktemp("train_assets")
    tok = make_tokenizer()
    save(make_causal_lm(tok), tok, root / "policy")
    save(make_reward_model(tok), tok, root / "rm")
    prepare("builtin", root / "data")
    return root


@pytest.fixture(scope="module")
def two_steps(assets, tmp_path_factory) -> Path:
    """A finished 2-step run of the tiny recipe (checkpoint at step 2), trained once for the tests that start from one
    (each works on its own copy: `copy_run`)."""
    tmp = tmp_path_factory.mktemp("two_steps")
    run = tmp / "run"
    tea_train(recipe(assets, tmp, optim__steps=2), run, tmp)
    return run


def copy_run(run: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run, to)
    return to


def recipe(assets: Path, tmp: Path, **overrides) -> Path:
    from tiny_lm import tiny_recipe, write_recipe

    return write_recipe(tmp / "recipe.yaml", tiny_recipe(assets / "policy", assets / "data", **overrides))


def env(tmp: Path) -> dict[str, str]:
    from tiny_lm import tea_env

    return tea_env(tmp)


def tea_train(recipe_path: Path, run_dir: Path, tmp: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "teacli.cli", "train", str(recipe_path), "--run-dir", str(run_dir), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(tmp), timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"tea train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def load_weights(path: Path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_train_writes_a_complete_run_directory(assets, tmp_path):
    run = tmp_path / "run"
    log = tmp_path / "stderr.log"  # a log file, not a terminal: plain lines only (docs/cli.md)
    with log.open("w") as err:
        proc = subprocess.run([sys.executable, "-m", "teacli.cli", "train", str(recipe(assets, tmp_path)), "--run-dir", str(run)],
                              stdout=subprocess.PIPE, stderr=err, text=True, env=env(tmp_path), timeout=600)
    text = log.read_text()
    assert proc.returncode == 0, text[-5000:]
    assert "\r" not in text and "ETA" not in text and "Loading weights" not in text, text  # no tqdm redraws, no rich bar
    lines = text.splitlines()
    for phase in ("loading the policy", "loading the reference policy", "loading the reward", "building the trainer",
                  "building the hf rollout engine", "step 0 validation (untrained policy): 4 prompts × 4 samples, 16 sequences",
                  "step 0 validation (untrained policy): 16/16 sequences (100%)", "step 0 (untrained policy): validation",
                  "step 1: reward", "step 4: reward", "step 4 validation: 16/16 sequences (100%)", "step 4: validation"):
        assert any(line.startswith(phase) for line in lines), (phase, text)
    setup = [next(i for i, line in enumerate(lines) if line.startswith(p)) for p in ("loading the policy", "building the trainer", "step 0 validation")]
    assert setup == sorted(setup)
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in ("reward_mean", "reward_max", "reward_std", "adv_std", "kl", "kl_loss", "loss", "grad_norm", "grad_clipped",
                "prompts", "optimizer_step", "gen_len_mean",
                "time_generate", "time_reward", "time_ref_logprobs", "time_train", "tokens_per_s", "pad_frac_train",
                "pad_frac_reference"):
        assert key in rows[0], key
    assert all(0 <= r["pad_frac_train"] == r["pad_frac_reference"] < 1 for r in rows)  # the reference runs the same batches
    assert "pad_frac_reward" not in rows[0]  # a python reward computes no tokens
    assert all(r["grad_norm"] > 0 for r in rows)
    assert rows[-1]["kl_loss"] > 0  # the policy moved away from the reference (k2: ½ d², not a signed sample mean)
    assert all(r["prompts"] == 2 and r["optimizer_step"] == r["step"] for r in rows)
    assert not any(k.startswith(("dynamic_", "is_")) for k in rows[0])  # both off: hf engine, no dynamic sampling
    assert json.loads((run / "checkpoints" / "step_000004" / "trainer_state.json").read_text())["data_position"] == 4 * 2
    val = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [0, 2, 4]  # step 0: the untrained policy's baseline
    selected = json.loads((run / "selected.json").read_text())
    best = max(val[1:], key=lambda v: (v["score"], -v["step"]))  # only saved checkpoints are selectable
    assert selected["step"] == best["step"] and (run / selected["path"]).is_dir()
    recorded = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recorded["advantage"]["name"] == "grpo"
    assert next(iter(recorded)) == SCHEMA_KEY and recorded[SCHEMA_KEY] == SCHEMA_VERSION  # what a later tea reads it by
    assert yaml.safe_load((run / "checkpoints" / "step_000004" / "recipe.yaml").read_text()) == recorded

    # HF-format checkpoint: from_pretrained loads it, and training changed the parameters.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = run / "checkpoints" / "step_000004"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    AutoTokenizer.from_pretrained(ckpt)
    before, after = load_weights(assets / "policy"), load_weights(ckpt)
    changed = [k for k in before if not (before[k] == after[k]).all()]
    assert len(changed) >= len(before) // 2
    assert model.config.vocab_size == AutoModelForCausalLM.from_pretrained(assets / "policy").config.vocab_size


def kill_after(rec: Path, run: Path, tmp: Path, rows: int) -> None:
    from tiny_lm import kill_after as kill

    kill(rec, run, tmp, rows)


@pytest.mark.slow
def test_dynamic_sampling_drops_flat_groups_and_resumes_exactly(assets, tmp_path):
    """Half the prompts get equal rewards for every response: those groups are dropped and the next prompts of
    the data order drawn, so steps consume more than P prompts; a run killed mid-way and resumed from its
    checkpoint (data_position in trainer_state.json) equals the uninterrupted one."""
    rec = recipe(assets, tmp_path, optim__steps=6, rollout__dynamic_sampling=True,
                 reward__function="rewards_for_tests:slow_half_flat_length_reward")
    reference = tmp_path / "reference"
    tea_train(rec, reference, tmp_path)
    ref_rows = metrics(reference)
    assert sum(r["dynamic_dropped_groups"] for r in ref_rows) > 0 and sum(r["dynamic_extra_rounds"] for r in ref_rows) > 0
    assert all(r["dynamic_filled_groups"] == 0 for r in ref_rows)
    assert all(r["adv_nonzero_frac"] > 0.9 for r in ref_rows)  # every trained group carries signal
    # Prompts drawn in steps 1-2: the P = 2 trained groups of each, plus every dropped (or surplus, or skipped) one.
    drawn = sum(2 + r["dynamic_dropped_groups"] + r["dynamic_surplus_groups"] for r in ref_rows[:2])
    state = json.loads((reference / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert state["data_position"] == drawn > 4

    run = tmp_path / "killed"
    kill_after(rec, run, tmp_path, rows=3)  # mid-step 4: after checkpoint 2, before checkpoint 4
    assert (run / "checkpoints" / "step_000002").is_dir() and not (run / "checkpoints" / "step_000004").exists()
    tea_train(rec, run, tmp_path)
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(rows, ref_rows):
        for key in ("reward_mean", "dynamic_dropped_groups", "dynamic_extra_rounds", "loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
    final, ref_final = load_weights(run / "checkpoints" / "step_000006"), load_weights(reference / "checkpoints" / "step_000006")
    for k in ref_final:
        assert (final[k] - ref_final[k]).abs().max() < 1e-5, k


def test_dynamic_sampling_bound_trains_on_what_there_is_and_says_so(assets, tmp_path):
    run = tmp_path / "flat"
    rec = recipe(assets, tmp_path, optim__steps=1, checkpoint__save_every=1, validation__enabled=False,
                 rollout__dynamic_sampling=True, rollout__max_resample_rounds=2, reward__function="rewards_for_tests:constant_reward")
    proc = tea_train(rec, run, tmp_path)
    (row,) = metrics(run)
    assert row["dynamic_extra_rounds"] == 2 and row["dynamic_filled_groups"] == 2 and row["adv_nonzero_frac"] == 0
    assert "too few informative groups" in proc.stderr and "rollout.max_resample_rounds" in proc.stderr
    # round 0: 2 prompts, then 2 extra rounds of the 2 missing groups
    assert json.loads((run / "checkpoints" / "step_000001" / "trainer_state.json").read_text())["data_position"] == 6


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(assets, tmp_path):
    rec = recipe(assets, tmp_path, optim__steps=6, reward__function="rewards_for_tests:slow_length_reward")
    reference = tmp_path / "reference"
    tea_train(rec, reference, tmp_path)

    run = tmp_path / "killed"
    kill_after(rec, run, tmp_path, rows=3)  # mid-step 4: after checkpoint 2, before checkpoint 4
    assert (run / "checkpoints" / "step_000002").is_dir()
    assert not (run / "checkpoints" / "step_000004").exists()

    tea_train(rec, run, tmp_path)
    rows, ref_rows = metrics(run), metrics(reference)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # nothing duplicated, nothing lost
    assert [r["optimizer_step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # the update counter comes back with the state
    for a, b in zip(rows, ref_rows):
        assert a["reward_mean"] == pytest.approx(b["reward_mean"], rel=1e-5), a["step"]
    final, ref_final = load_weights(run / "checkpoints" / "step_000006"), load_weights(reference / "checkpoints" / "step_000006")
    for k in ref_final:
        assert (final[k] - ref_final[k]).abs().max() < 1e-5, k


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_two_processes(assets, tmp_path, stage):
    """Two processes under the deepspeed launcher; DeepSpeed's CPU shared-memory all-reduce segments (one per rank in
    /dev/shm) are gone afterwards (teacli.train.backend._unlink_shm_segment: DeepSpeed never unlinks them).
    Validation is split over the ranks: 5 prompts as 3 + 2 (ZeRO-2); 1 prompt as 1 + 0 (ZeRO-3: the rank without
    prompts still takes part in the parameter gathering and generates nothing)."""
    run = tmp_path / f"zero{stage}"
    val_prompts = {2: 5, 3: 1}[stage]
    rec = recipe(assets, tmp_path, backend__zero_stage=stage, optim__steps=2, validation__prompts=val_prompts)
    port = free_port()
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(port),
           "--module", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))  # no memory left behind
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2] and all(r["grad_norm"] > 0 for r in rows)
    val = [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]
    used = json.loads((run / "data.json").read_text())["validation"]["used"]
    assert [v["step"] for v in val] == [0, 2] and used == val_prompts
    shares = [4 * len(range(k, val_prompts, 2)) for k in (0, 1)]  # rank k: prompts k, k + 2, … × 4 samples
    for v in val:
        assert v["prompts"] == used and v["sequences_by_rank"] == shares, v
        assert v["watch_picks"] == used  # every prompt's best-of-n pick, from both ranks
    assert f"{shares[0] // 4} prompts (this GPU's share of {used}) × 4 samples, {shares[0]} sequences" in proc.stderr + proc.stdout
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000002")


@pytest.mark.slow
def test_dynamic_sampling_two_processes_agree_on_rounds(assets, tmp_path):
    """Two ranks (ZeRO-3: every generation gathers parameters on both) with different flat groups: they run
    the same rounds (the all-reduced shortfall), each trains on exactly its share, and they agree on the data
    position saved in the checkpoint."""
    run = tmp_path / "dyn2"
    rec = recipe(assets, tmp_path, backend__zero_stage=3, optim__steps=3, checkpoint__save_every=3, rollout__prompts_per_step=4,
                 rollout__dynamic_sampling=True, reward__function="rewards_for_tests:half_flat_length_reward",
                 logging={"report_to": [], "per_rank": True})
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           "--module", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads(line) for line in (run / "ranks.jsonl").read_text().splitlines()]
    assert [(r["step"], r["rank"]) for r in ranks] == [(s, k) for s in (1, 2, 3) for k in (0, 1)]
    drawn = 0
    for step in (1, 2, 3):
        r0, r1 = (r for r in ranks if r["step"] == step)
        assert r0["dynamic_extra_rounds"] == r1["dynamic_extra_rounds"]
        assert r0["dynamic_filled_groups"] == r1["dynamic_filled_groups"] == 0
        # both ranks drew the same number of prompts this step: kept (2 each) + dropped + surplus
        n0, n1 = ((2 + r["dynamic_dropped_groups"] + r["dynamic_surplus_groups"]) for r in (r0, r1))
        assert n0 == n1
        drawn += n0 + n1
    assert sum(r["dynamic_dropped_groups"] for r in ranks) > 0
    assert json.loads((run / "checkpoints" / "step_000003" / "trainer_state.json").read_text())["data_position"] == drawn


def test_zero3_one_process(assets, tmp_path):
    run = tmp_path / "z3"
    tea_train(recipe(assets, tmp_path, backend__zero_stage=3, optim__steps=2), run, tmp_path)
    assert [r["step"] for r in metrics(run)] == [1, 2]


def test_dotted_path_advantage_and_hf_reward_model(assets, tmp_path):
    run = tmp_path / "custom"
    rec = recipe(
        assets, tmp_path, optim__steps=1, checkpoint__save_every=1,
        advantage={"name": "rewards_for_tests:rank_rule", "params": {"scale": 0.5}},
        reward={"kind": "hf", "name_or_path": str(assets / "rm"), "dtype": "float32", "batch_size": 4},
    )
    tea_train(rec, run, tmp_path)
    row = metrics(run)[0]
    assert row["adv_nonzero_frac"] > 0.5 and row["adv_max"] == pytest.approx(0.5 * 3.5)  # ranks 0..7 centred, scaled
    padded = row["tokens_reward_padded"]  # what the reward model's batches ran beyond the tokens they scored
    assert 0 < row["pad_frac_reward"] < 1 and row["pad_frac_reward"] == pytest.approx(padded / (padded + row["tokens_reward_run"]))


def test_bad_input_is_a_clear_error_and_keeps_the_run(assets, two_steps, tmp_path):
    run = copy_run(two_steps, tmp_path / "run")  # trained by recipe(assets, ..., optim__steps=2)
    before = (run / "metrics.jsonl").read_text()

    other = tmp_path / "other"
    other.mkdir()
    changed = recipe(assets, other, optim__lr=1.0e-4, optim__steps=2)
    proc = tea_train(changed, run, tmp_path, check=False)
    assert proc.returncode == 2 and "holds a different recipe" in proc.stderr
    assert (run / "metrics.jsonl").read_text() == before

    missing = recipe(assets, other, policy={"name_or_path": str(tmp_path / "no_model"), "dtype": "float32"})
    proc = tea_train(missing, tmp_path / "run_missing", tmp_path, check=False)
    assert proc.returncode == 2 and "policy.name_or_path" in proc.stderr and "Traceback" not in proc.stderr

    nan = recipe(assets, other, reward={"kind": "python", "function": "math:nan_reward_does_not_exist"})
    proc = tea_train(nan, tmp_path / "run_nan", tmp_path, check=False)
    assert proc.returncode == 2 and "reward.function" in proc.stderr

    fused = recipe(assets, other, reward={"kind": "hf", "name_or_path": str(assets / "rm"), "dtype": "float32", "kernels": "liger"})
    proc = tea_train(fused, tmp_path / "run_fused", tmp_path, check=False)  # liger's kernels are CUDA only
    assert proc.returncode == 2 and "reward.kernels: liger needs a CUDA device" in proc.stderr and "Traceback" not in proc.stderr


def test_lora_trains_adapters_and_saves_merged_weights(assets, tmp_path):
    run = tmp_path / "lora"
    rec = recipe(
        assets, tmp_path, optim__steps=2, optim__lr=1.0e-2,
        policy={"name_or_path": str(assets / "policy"), "dtype": "float32", "gradient_checkpointing": False,
                "lora": {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
    )
    tea_train(rec, run, tmp_path)
    rows = metrics(run)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # reference = the same model with adapters disabled
    assert rows[1]["kl_loss"] > 0
    ckpt = run / "checkpoints" / "step_000002"
    after, before = load_weights(ckpt), load_weights(assets / "policy")
    assert set(after) == set(before)  # plain model names: no PEFT prefixes, no lora_ tensors
    for key in before:
        moved = not (after[key] == before[key]).all()
        assert moved == (".q_proj." in key or ".v_proj." in key), key
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ckpt)


def test_nan_reward_stops_with_the_prompt_id_and_keeps_the_run(assets, two_steps, tmp_path):
    run = copy_run(two_steps, tmp_path / "nan")  # a finished 2-step run
    kept = (run / "metrics.jsonl").read_text()
    rec = recipe(assets, tmp_path, optim__steps=4, reward__function="rewards_for_tests:nan_reward")
    # a new recipe needs a new run directory; copy the finished run so nothing is lost on failure
    run2 = copy_run(run, tmp_path / "nan2")
    (run2 / "recipe.yaml").unlink()
    proc = tea_train(rec, run2, tmp_path, check=False)
    assert proc.returncode == 2
    assert "returned NaN for prompt" in proc.stderr and "reward" in proc.stderr and "Traceback" not in proc.stderr
    assert (run / "metrics.jsonl").read_text() == kept
    assert (run2 / "checkpoints" / "step_000002" / "model.safetensors").exists()


@pytest.mark.slow
def test_scale_rewards_group_and_batch_through_the_loop(assets, tmp_path):
    """advantage.scale_rewards in a real run: group makes GRPO's advantages GRPO-Z's (each non-flat group's std 1, so
    the step's adv_std² is the share of non-flat groups); batch divides every rank's advantages by one std, that of
    every rank's rewards together (two ranks: the same factor adv_std_unscaled / adv_std on both)."""
    run = tmp_path / "group"
    tea_train(recipe(assets, tmp_path, optim__steps=2, advantage={"name": "grpo", "params": {}, "scale_rewards": "group"}), run, tmp_path)
    for r in metrics(run):
        assert r["adv_std_unscaled"] != pytest.approx(r["adv_std"])
        assert 0 < r["adv_std"] <= 1 + 1e-5
    run = tmp_path / "batch"
    rec = recipe(assets, tmp_path, optim__steps=2, rollout__prompts_per_step=4,
                 advantage={"name": "tea", "params": {"alpha": 0.25, "n_target": 8}, "scale_rewards": "batch"},
                 logging={"report_to": [], "per_rank": True})
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           "--module", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads(line) for line in (run / "ranks.jsonl").read_text().splitlines()]
    for step in (1, 2):
        r0, r1 = (r for r in ranks if r["step"] == step)
        assert r0["reward_mean"] != r1["reward_mean"]  # the ranks scored different prompts ...
        assert r0["adv_std_unscaled"] / r0["adv_std"] == pytest.approx(r1["adv_std_unscaled"] / r1["adv_std"], rel=1e-5)  # ... one factor
