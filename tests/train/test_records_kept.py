"""`tea train` on a run directory whose records say a later checkpoint existed than the last one left (a
validation row, written once its checkpoint was committed, or an evaluation of a later step): the checkpoints
were removed outside tea (e.g. to free disk after evaluating), and training again would overwrite its metrics
and selection and leave its evaluations describing another training, so it is refused. A run stopped
part-way (a kill before a checkpoint was committed) resumes from its last checkpoint as always. The rule is
read-only (`resume.check_run_dir`); the CLI's one line and the untouched directory are checked end to end. Also: a
run recorded before tea_schema existed resumes at the defaults it ran under, and what the start writes carries it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from tiny_lm import make_assets, tea_env, tiny_recipe, write_recipe  # noqa: E402

from teacli.config import load_recipe, to_yaml  # noqa: E402
from teacli.rundir import RunDir, step_dir_name  # noqa: E402
from teacli.train.errors import TrainError  # noqa: E402
from teacli.train.resume import check_run_dir  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> Path:
    return make_assets(tmp_path_factory.mktemp("records_kept_assets"))


def run_dir(tmp: Path, recipe, reached: int, validated: list[int], checkpoints: list[int], evals: dict[str, object] = {}) -> RunDir:
    """A run directory as `tea train` leaves it after `reached` steps (metrics rows 1..reached), validation rows
    at step 0 and at `validated`, these complete checkpoints, and finished evaluations (path under eval/ → the
    `checkpoint` their bon.json records)."""
    run = RunDir(tmp / "run")
    run.path.mkdir()
    run.recipe.write_text(to_yaml(recipe))
    run.metrics.write_text("".join(json.dumps({"step": s, "reward_mean": 0.5}) + "\n" for s in range(1, reached + 1)))
    run.validation.write_text("".join(json.dumps({"step": s, "score": 0.5}) + "\n" for s in [0, *validated]))
    for s in checkpoints:
        (run.checkpoints / step_dir_name(s)).mkdir(parents=True)
        (run.checkpoints / step_dir_name(s) / "trainer_state.json").write_text("{}")
    for rel, which in evals.items():
        (run.path / "eval" / rel).parent.mkdir(parents=True, exist_ok=True)
        (run.path / "eval" / rel).write_text(json.dumps({"checkpoint": which, "N": [1], "mean": [0.5]}))
    return run


@pytest.fixture()
def recipe(assets, tmp_path):
    return load_recipe(write_recipe(tmp_path / "r.yaml", tiny_recipe(assets / "policy", assets / "data", optim__steps=4)))


def test_a_run_stopped_part_way_resumes_from_its_last_checkpoint(recipe, tmp_path):
    # stopped at step 3 with a checkpoint at 2; its evaluations of step 2 and of the untrained policy stay true
    run = run_dir(tmp_path, recipe, 3, [2], [2], {"step_000002/heldout-M4.bon.json": 2, "base/heldout-M4.bon.json": "base"})
    start = check_run_dir(run, recipe)
    assert start.step == 2 and start.restart


def test_a_kill_before_the_final_checkpoint_resumes_from_the_one_before(recipe, tmp_path):
    # step 4's metrics row is written before its checkpoint; no validation row for step 4 means it never committed
    run = run_dir(tmp_path, recipe, 4, [2], [2])
    assert check_run_dir(run, recipe).step == 2
    shutil.rmtree(run.checkpoints)
    run.validation.write_text(json.dumps({"step": 0, "score": 0.5}) + "\n")  # stopped before its first checkpoint
    start = check_run_dir(run, recipe)
    assert start.step == 0 and start.checkpoint is None


@pytest.mark.parametrize("reached, validated, checkpoints, evals, message", [
    (4, [2, 4], [], {}, "holds a run finished at step 4 (optim.steps=4) whose checkpoints are all gone: training it again from step 0"),
    (4, [2, 4], [2], {}, "finished at step 4 (optim.steps=4) whose checkpoints after step 2 are gone: training it again from step 2"),
    (4, [2, 4], [], {"heldout-M4.bon.json": 4, "base/heldout-M4.bon.json": "base"},
     "finished at step 4 (optim.steps=4) and evaluated (eval/heldout-M4.bon.json) whose checkpoints are all gone"),
    (3, [2], [], {}, "holds a run checkpointed and validated at step 2 whose checkpoints are all gone"),
    (3, [2], [2], {"step_000003/heldout-M4.bon.json": 3, "heldout-M8.bon.json": 3, "base/heldout-M4.bon.json": "base"},
     "holds a run trained past step 2 and evaluated (eval/heldout-M8.bon.json and 1 more) whose checkpoints after step 2 are gone"),
])
def test_a_run_whose_later_checkpoints_were_removed_is_not_trained_again_over_its_records(
        recipe, tmp_path, reached, validated, checkpoints, evals, message):
    run = run_dir(tmp_path, recipe, reached, validated, checkpoints, evals)
    with pytest.raises(TrainError) as err:
        check_run_dir(run, recipe)
    assert message in str(err.value) and "choose another --run-dir or move" in str(err.value)


def test_a_finished_run_with_its_final_checkpoint_is_complete_not_refused(recipe, tmp_path):
    run = run_dir(tmp_path, recipe, 4, [2, 4], [2, 4], {"heldout-M4.bon.json": 4})
    assert check_run_dir(run, recipe).step == 4


def test_tea_train_refuses_with_one_line_and_leaves_the_run_as_it_was(assets, tmp_path):
    """End to end: a finished two-step run whose checkpoints were removed; before the fix `tea train`
    restarted it from step 0 and rewrote its metrics.jsonl, validation.jsonl and selected.json."""
    rec = write_recipe(tmp_path / "r2.yaml", tiny_recipe(assets / "policy", assets / "data", optim__steps=2))
    run = tmp_path / "run2"
    cmd = [sys.executable, "-m", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    first = subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tmp_path), timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(run / "checkpoints")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    again = subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tmp_path), timeout=600)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr[-3000:]
    (line,) = [x for x in again.stderr.splitlines() if x.startswith("error:")]
    assert f"{run} holds a run finished at step 2 (optim.steps=2) whose checkpoints are all gone" in line
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


# -- damaged records and a stale selection ----------------------------------------------------------


def test_a_damaged_validation_row_is_refused_before_training_naming_file_and_line(recipe, tmp_path):
    """A finished 2-step run whose step-2 validation row lost its score, extended to 4 steps: before, steps 3-4
    trained and the run died choosing its checkpoint (KeyError: 'score'), leaving selected.json at step 2 and a
    run that said it was complete. Now the start is refused with one line, before anything is trained or written."""
    from teacli.train.resume import on_rank0

    run = run_dir(tmp_path, recipe, 2, [2], [2])
    run.validation.write_text(json.dumps({"step": 0, "score": 0.5}) + "\n" + json.dumps({"step": 2}) + "\n")
    before = run.validation.read_bytes()

    class World:
        is_main = True

    with pytest.raises(TrainError) as err:  # what every rank of `tea train` gets: one line, exit 2
        on_rank0(World(), check_run_dir, run, recipe)
    assert str(err.value).startswith(f"{run.validation}:2: a validation row needs a finite number 'score', this one (step 2) "
                                     "has no 'score'")
    assert run.validation.read_bytes() == before


@pytest.mark.parametrize("line", [b'{"step": 2, "rew', b"42", b'{"step": 2, "x": "\xff"}'])
def test_a_damaged_metrics_line_is_refused_before_training(recipe, tmp_path, line):
    run = run_dir(tmp_path, recipe, 3, [2], [2])
    rows = run.metrics.read_bytes().split(b"\n")
    run.metrics.write_bytes(b"\n".join([rows[0], line, *rows[2:]]))
    with pytest.raises(ValueError, match=f"^{run.metrics}:2: "):
        check_run_dir(run, recipe)


def test_a_complete_run_chooses_its_checkpoint_again_when_selected_json_is_stale(recipe, tmp_path):
    """A run that stopped while choosing its checkpoint (its last checkpoint and validation row written, selected.json
    not): before, every rerun said "already complete" and eval-bon evaluated the stale step."""
    from teacli.train.resume import check_selection

    run = run_dir(tmp_path, recipe, 4, [2, 4], [2, 4])
    run.validation.write_text("".join(json.dumps({"step": s, "score": v}) + "\n" for s, v in [(0, 0.5), (2, 0.6), (4, 0.7)]))
    run.selected.write_text(json.dumps({"step": 2, "path": "checkpoints/step_000002", "score": 0.6, "rule": ""}))
    note = check_selection(run, recipe)
    assert note.startswith("selected.json named step 2, but the validation rows (validation.jsonl) select step 4 (score 0.7000)")
    assert json.loads(run.selected.read_text()) == {"step": 4, "path": "checkpoints/step_000004", "score": 0.7, "rule": ""}
    mtime = run.selected.stat().st_mtime_ns
    assert check_selection(run, recipe) is None and run.selected.stat().st_mtime_ns == mtime  # right: left alone
    run.selected.write_text("[]")  # damaged: chosen again, not refused
    assert check_selection(run, recipe).startswith("selected.json was damaged (expected a JSON object")
    assert json.loads(run.selected.read_text())["step"] == 4


def test_a_torn_last_metrics_line_is_dropped_on_resume_and_said(recipe, tmp_path):
    from teacli.train.resume import commit_run_dir

    run = run_dir(tmp_path, recipe, 3, [2], [2])
    with open(run.metrics, "a") as f:
        f.write('{"step": 4, "reward_me')  # killed in the middle of step 4's append
    start = check_run_dir(run, recipe)
    notes = commit_run_dir(run, recipe, start, {"train": {}, "validation": {}})
    assert notes == [f"{run.metrics}: dropped its last line, cut short (22 characters with no newline: a write stopped by a kill)"]
    assert [json.loads(x)["step"] for x in run.metrics.read_text().splitlines()] == [1, 2]


def test_a_run_recorded_before_tea_schema_resumes_at_what_it_ran_and_is_written_with_its_version(recipe, tmp_path):
    """A recipe.yaml without tea_schema (version 1) that lacks policy.kernels ran without fused kernels: resumed under
    today's default, the key is a change (an execution key: taken and recorded), not equal as when missing keys took
    today's defaults; a key added since at what runs had before (rollout.stop_tokens) is no change. The recipe.yaml
    the start writes carries this version."""
    import yaml

    from teacli.config import SCHEMA_KEY, SCHEMA_VERSION, schema_default
    from teacli.train.resume import commit_run_dir

    run = run_dir(tmp_path, recipe, 2, [2], [2])
    tree = yaml.safe_load(run.recipe.read_text())
    assert tree.pop(SCHEMA_KEY) == SCHEMA_VERSION
    del tree["policy"]["kernels"], tree["rollout"]["stop_tokens"]
    run.recipe.write_text(yaml.safe_dump(tree, sort_keys=False))
    then, now = schema_default("policy.kernels", 1), recipe.policy.kernels
    assert then != now
    start = check_run_dir(run, recipe)
    assert start.restart and start.step == 2 and start.changed == {"policy.kernels": (then, now)}
    commit_run_dir(run, recipe, start, {"train": {}, "validation": {}})
    written = yaml.safe_load(run.recipe.read_text())
    assert written[SCHEMA_KEY] == SCHEMA_VERSION and written["policy"]["kernels"] == now
    assert json.loads(run.resumes.read_text())["changed"] == {"policy.kernels": {"before": then, "now": now}}


@pytest.mark.parametrize("kind", ["python", "hf"])
def test_a_run_recorded_under_reward_kernels_eager_resumes_under_auto(recipe, tmp_path, kind):
    """reward.kernels was eager up to tea_schema 2, auto since 3. A python reward never reads it (config.APPLIES_WHEN):
    resumed under auto, nothing changed. An hf reward model scores the same within bf16 rounding with either kernels,
    so the key is an execution key, as policy.kernels: taken and recorded in resume.jsonl, not refused."""
    import copy

    import yaml

    from teacli.config import SCHEMA_KEY, schema_default

    recipe = copy.deepcopy(recipe)
    if kind == "hf":
        recipe.reward.kind, recipe.reward.name_or_path = "hf", "some/rm"
    run = run_dir(tmp_path, recipe, 2, [2], [2])
    tree = yaml.safe_load(run.recipe.read_text())
    then, now = schema_default("reward.kernels", 2), recipe.reward.kernels
    assert (then, now) == ("eager", "auto")
    tree[SCHEMA_KEY], tree["reward"]["kernels"] = 2, then
    run.recipe.write_text(yaml.safe_dump(tree, sort_keys=False))
    start = check_run_dir(run, recipe)
    assert start.restart and start.step == 2
    assert start.changed == ({} if kind == "python" else {"reward.kernels": (then, now)})
