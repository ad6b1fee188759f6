"""The run directory's rules through the real `tea train` CLI (CPU, the tiny model of tests/tiny_lm.py):
one writer at a time (the lock), what a resume refuses (a changed experiment, changed data) and takes
(execution keys, recorded in resume.jsonl), nothing written by a start that fails its checks, and the
lines that say what happens (resuming, already complete, interrupted)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from tiny_lm import free_port, make_assets, tea_env, tiny_recipe, write_recipe  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    return make_assets(tmp_path_factory.mktemp("run_dir_assets"))


def recipe(assets: Path, tmp: Path, data: Path | None = None, **overrides) -> Path:
    return write_recipe(tmp / f"recipe{len(list(tmp.glob('recipe*.yaml')))}.yaml",
                        tiny_recipe(assets / "policy", data or assets / "data", **overrides))


def command(rec: Path, run: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "teacli.cli", "train", str(rec), "--run-dir", str(run), *extra]


def tea_train(rec: Path, run: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(command(rec, run, *extra), capture_output=True, text=True, env=tea_env(tmp), timeout=600)


def start(rec: Path, run: Path, tmp: Path) -> subprocess.Popen:
    """`tea train` in the background, in its own process group."""
    return subprocess.Popen(command(rec, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=tea_env(tmp), start_new_session=True)


def wait_for_rows(run: Path, rows: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= rows:
            return
        time.sleep(0.1)
    raise AssertionError(f"metrics.jsonl never reached {rows} rows (exit {proc.poll()})")


def steps(run: Path, name: str = "metrics.jsonl") -> list[int]:
    return [json.loads(line)["step"] for line in (run / name).read_text().splitlines()]


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error:` line of a refused start (DeepSpeed's accelerator notes aside)."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_a_second_train_on_a_running_directory_stops_and_the_first_is_untouched(assets, tmp_path):
    rec = recipe(assets, tmp_path, reward__function="rewards_for_tests:held_length_reward")
    run, hold = tmp_path / "run", tmp_path / "hold"
    hold.touch()  # the first run waits in its first reward call until the second has tried
    first = subprocess.Popen(command(rec, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=tea_env(tmp_path, TEA_TEST_HOLD=str(hold)), start_new_session=True)
    try:
        deadline = time.time() + 300
        while not (tmp_path / "hold.waiting").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "hold.waiting").exists(), first.communicate()[1][-3000:]
        second = tea_train(rec, run, tmp_path)  # not held: without the lock it would train beside the first
        hold.unlink()
        line = error_line(second)
        assert "another `tea train` is writing" in line and str(run) in line
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, err[-3000:]
    assert steps(run) == [1, 2, 3, 4] and steps(run, "validation.jsonl") == [0, 2, 4]
    assert not (run / ".train.lock").exists()  # removed when the run ends


def test_other_ranks_stop_with_rank_zero_when_the_directory_is_locked(assets, tmp_path):
    """Two ranks launched onto a run directory another writer holds: rank 0 finds the lock taken, and rank 1
    (which never takes it) stops with rank 0's answer instead of waiting for it."""
    import fcntl

    run = tmp_path / "run"
    run.mkdir()
    rec = recipe(assets, tmp_path)
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           "--module", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    with open(run / ".train.lock", "a") as held:  # another writer holds the run directory
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tmp_path), timeout=300)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("error: another `tea train` is writing") == 1  # rank 0 says it; rank 1 stops too
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in run.iterdir()) == [".train.lock"]  # the test's own: nothing written


@pytest.mark.slow  # a whole training run or two: the slow stage (README's command stays within its budget)
def test_resume_refuses_data_prepared_again(assets, tmp_path):
    from teacli.data.prepare import prepare

    data = tmp_path / "data"
    prepare("builtin", data)
    rec = recipe(assets, tmp_path, data=data, optim__steps=4, reward__function="rewards_for_tests:slow_length_reward")
    run = tmp_path / "run"
    proc = start(rec, run, tmp_path)
    wait_for_rows(run, 3, proc)  # mid-step 4: after checkpoint 2
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept, recorded = (run / "metrics.jsonl").read_text(), json.loads((run / "data.json").read_text())
    manifest = json.loads((data / "manifest.json").read_text())

    prepare("builtin", data, seed=5, force=True)  # other prompts in every split
    line = error_line(tea_train(rec, run, tmp_path))
    assert f"data.dir {data}" in line and "'train' changed" in line
    assert (run / "metrics.jsonl").read_text() == kept and not (run / "checkpoints" / "step_000004").exists()
    # what it compared: the split files' sha256 recorded at the start, as prepare-data's manifest has them
    assert [recorded[k]["sha256"] for k in ("train", "validation")] == [manifest["splits"][k]["sha256"] for k in ("train", "val")]

    prepare("builtin", data, force=True)  # the data the run started with: it resumes
    resumed = tea_train(rec, run, tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert steps(run) == [1, 2, 3, 4]


def test_a_start_that_fails_its_checks_writes_nothing(assets, tmp_path):
    run = tmp_path / "run"
    too_many = recipe(assets, tmp_path, rollout__prompts_per_step=1000)
    line = error_line(tea_train(too_many, run, tmp_path))
    assert "rollout.prompts_per_step=1000" in line
    assert not run.exists()  # neither recipe.yaml nor the directory itself

    run.mkdir()  # a directory the user made is kept, and stays empty
    missing = recipe(assets, tmp_path, policy={"name_or_path": str(tmp_path / "no_model"), "dtype": "float32"})
    assert "policy.name_or_path" in error_line(tea_train(missing, run, tmp_path))
    assert run.is_dir() and list(run.iterdir()) == []

    fixed = recipe(assets, tmp_path, optim__steps=2, validation__enabled=False)  # the corrected recipe is accepted
    proc = tea_train(fixed, run, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert steps(run) == [1, 2] and not (run / "resume.jsonl").exists()

    # eval-bon on a run without validation: no checkpoint is ever selected, and it says what to pass.
    proc = subprocess.run([sys.executable, "-m", "teacli.cli", "eval-bon", str(run)], capture_output=True, text=True,
                          env=tea_env(tmp_path), timeout=300)
    line = error_line(proc)
    assert "validation.enabled: false" in line and "never" in line and "yet" not in line
    assert "--checkpoint step_N (checkpoints: step_2)" in line and "--checkpoint base" in line


def test_a_rehearsal_that_fails_after_setup_does_not_bind_the_corrected_command(assets, tmp_path):
    """A start that fails after setup (here the reward raises in the untrained policy's validation; on a GPU, an
    out-of-memory) has written recipe.yaml; with no checkpoint and no records kept, the corrected recipe starts over
    instead of being refused as "a different recipe"."""
    run = tmp_path / "run"
    failing = recipe(assets, tmp_path, reward__function="rewards_for_tests:json_error_reward", rehearsal={"prompt_tokens": 24})
    line = error_line(tea_train(failing, run, tmp_path, "--rehearse"))
    assert "json_error_reward" in line and (run / "recipe.yaml").is_file()

    fixed = recipe(assets, tmp_path, optim__steps=2, rehearsal={"prompt_tokens": 24})
    proc = tea_train(fixed, run, tmp_path, "--rehearse")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{run} held an earlier start of another recipe (reward.function) that failed before its first checkpoint" in proc.stderr
    assert steps(run) == [1, 2] and steps(run, "validation.jsonl") == [0, 2]
    recorded = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recorded["reward"]["function"] == "rewards_for_tests:length_reward" and recorded["rehearsal"]["enabled"] is True
    assert not (run / "reward_error.log").exists() and not (run / "resume.jsonl").exists()

    # once a checkpoint exists, another recipe is refused as before
    line = error_line(tea_train(failing, run, tmp_path, "--rehearse"))
    assert "holds a different recipe" in line and "reward.function" in line


def test_execution_keys_may_change_on_resume_and_are_recorded(assets, tmp_path):
    rec = recipe(assets, tmp_path, optim__steps=2)
    run = tmp_path / "run"
    assert tea_train(rec, run, tmp_path).returncode == 0
    # as an older version wrote it, before rollout.stop_tokens existed: the key counts at its default ([]), not as a change
    older = yaml.safe_load((run / "recipe.yaml").read_text())
    assert older["rollout"].pop("stop_tokens") == []
    (run / "recipe.yaml").write_text(yaml.safe_dump(older, sort_keys=False))

    # what the out-of-memory message says to lower, and more steps to extend the finished run
    changes = ["optim.steps=4", "rollout.batch_size=8", "optim.micro_batch_size=4", "logging.log_every=2"]
    proc = tea_train(rec, run, tmp_path, *(a for c in changes for a in ("--set", c)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming {run} from step 2 of 4" in proc.stderr
    assert "loading the trainer state of step_000002 (weights, optimizer, RNG)" in proc.stderr  # what the start-up does
    assert steps(run) == [1, 2, 3, 4] and [r["optimizer_step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())] == [1, 2, 3, 4]
    (line,) = [json.loads(x) for x in (run / "resume.jsonl").read_text().splitlines()]
    assert line["step"] == 2 and line["changed"] == {
        "optim.steps": {"before": 2, "now": 4}, "rollout.batch_size": {"before": 16, "now": 8},
        "optim.micro_batch_size": {"before": 8, "now": 4}, "logging.log_every": {"before": 1, "now": 2},
    }
    resolved = yaml.safe_load((run / "recipe.yaml").read_text())  # what runs now
    assert resolved["optim"]["steps"] == 4 and resolved["rollout"]["batch_size"] == 8

    # as a run that stopped while choosing its checkpoint leaves it: step 4 scored best, selected.json still at step 2
    rows = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 2, 4]
    rows[1]["score"], rows[2]["score"] = 0.25, 0.75
    (run / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "selected.json").write_text(json.dumps({"step": 2, "path": "checkpoints/step_000002", "score": 0.25, "rule": ""}))
    again = tea_train(rec, run, tmp_path, *(a for c in changes for a in ("--set", c)))
    assert again.returncode == 0 and f"{run} is already complete at step 4 (optim.steps=4)" in again.stderr
    assert "selected.json named step 2, but the validation rows (validation.jsonl) select step 4 (score 0.7500)" in again.stderr
    assert json.loads((run / "selected.json").read_text())["step"] == 4
    assert steps(run) == [1, 2, 3, 4] and len((run / "resume.jsonl").read_text().splitlines()) == 1  # nothing ran

    # what defines the experiment is still refused, and nothing is written
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    line = error_line(tea_train(rec, run, tmp_path, "--set", "optim.steps=4", "--set", "optim.lr=1e-4"))
    assert "holds a different recipe" in line and "optim.lr" in line
    line = error_line(tea_train(rec, run, tmp_path, "--set", "optim.steps=3"))
    assert "optim.steps=3 is below step 4" in line
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before

    # optim.steps stays where the learning rate decays over it (a run stopped before its first checkpoint)
    from teacli.config import load_recipe, to_yaml

    cosine = tmp_path / "cosine"
    cosine.mkdir()
    (cosine / "recipe.yaml").write_text(to_yaml(load_recipe(rec, ["optim.scheduler=cosine"])))
    line = error_line(tea_train(rec, cosine, tmp_path, "--set", "optim.scheduler=cosine", "--set", "optim.steps=8"))
    assert "optim.steps: 2 → 8" in line and "optim.scheduler: cosine" in line


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])  # Ctrl-C; kill or a cluster scheduler's stop
def test_ctrl_c_says_where_it_stopped_and_the_command_resumes(assets, tmp_path, signum):
    rec = recipe(assets, tmp_path, reward__function="rewards_for_tests:held_at_row_length_reward")
    run, hold = tmp_path / "run", tmp_path / "hold"
    # Held in step 4's reward call (metrics.jsonl has 3 rows; checkpoint 2 is the last), so the signal lands in
    # step 4 however slow the machine is.
    env = tea_env(tmp_path, TEA_TEST_HOLD=str(hold), TEA_TEST_METRICS=str(run / "metrics.jsonl"), TEA_TEST_HOLD_ROWS="3")
    # SIGINT at its default in the child, as under a terminal: a shell that starts pytest in the background (`cmd &`
    # in a script, nohup) hands it down ignored, and the run would then never see the Ctrl-C below.
    proc = subprocess.Popen(command(rec, run), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not (tmp_path / "hold.waiting").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "hold.waiting").exists(), proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted in step 4 (") and f"of {run}; to resume from its last checkpoint, step 2, run: " in last
    again = shlex.split(last.split(", run: ", 1)[1])
    assert again[:2] == ["tea", "train"]
    resumed = subprocess.run([sys.executable, "-m", "teacli.cli", *again[1:]], capture_output=True, text=True,
                             env=tea_env(tmp_path), timeout=600)
    assert resumed.returncode == 0 and f"resuming {run} from step 2 of 4" in resumed.stderr
    assert steps(run) == [1, 2, 3, 4]
