"""End-to-end `tea eval-bon` through the real CLI on a tiny run trained by `tea train` (CPU)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))  # tiny_lm, rewards_for_tests (in-process runs)

from rewards_for_tests import length_reward  # noqa: E402
from tiny_lm import tea_env, tiny_recipe, write_recipe  # noqa: E402

from teacli.cli import app  # noqa: E402

M = 8
SPLIT = "tiny"
KEYS = {"prompt_id", "sample", "response", "reward", "tokens"}


def env(tmp: Path) -> dict[str, str]:
    return tea_env(tmp)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny run directory: 2 steps of `tea train`, checkpoints at steps 1 and 2, one selected."""
    from tiny_lm import make_assets

    root = make_assets(tmp_path_factory.mktemp("eval_assets"))
    heldout = (root / "data" / "heldout.jsonl").read_text().splitlines()
    (root / "data" / f"{SPLIT}.jsonl").write_text("\n".join(heldout[:5]) + "\n")
    recipe = tiny_recipe(
        root / "policy", root / "data", name="tiny_eval",
        rollout__group_size=4, rollout__batch_size=16, optim__steps=2, kl__beta=0.0, backend__zero_stage=0,
        checkpoint__save_every=1, validation={"prompts": 2, "samples": 2, "top": 1},
        eval={"split": SPLIT, "M": M, "score_batch_size": 4},
    )
    write_recipe(root / "recipe.yaml", recipe)
    run = root / "run"
    cmd = [sys.executable, "-m", "teacli.cli", "train", str(root / "recipe.yaml"), "--run-dir", str(run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(root), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (run / "selected.json").exists() and (run / "checkpoints" / "step_000001").is_dir()
    return run


def tea(*args: str, cwd: Path | None = None):
    old = Path.cwd()
    if cwd:
        os.chdir(cwd)
    try:
        return CliRunner().invoke(app, list(args))
    finally:
        os.chdir(old)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def recomputed_bon(records: list[dict], prompt_ids: list[str]) -> dict[str, list[float]]:
    """Grouped best-of-N by hand from the records: consecutive groups of N in sample order."""
    out = {}
    for pid in prompt_ids:
        r = [rec["reward"] for rec in sorted((x for x in records if x["prompt_id"] == pid), key=lambda x: x["sample"])]
        values = []
        for n in (1, 2, 4, 8):
            maxima = [max(r[g * n : (g + 1) * n]) for g in range(M // n)]
            values.append(sum(maxima) / len(maxima))
        out[pid] = values
    return out


@pytest.fixture(scope="module")
def evaluated(trained) -> Path:
    res = tea("eval-bon", str(trained))
    assert res.exit_code == 0, res.output
    return trained


def test_eval_bon_writes_records_prompts_and_grouped_bon(evaluated):
    run = evaluated
    ev = run / "eval"
    records = read_jsonl(ev / f"{SPLIT}-M{M}.jsonl")
    prompts = read_jsonl(ev / f"{SPLIT}.prompts.jsonl")
    bon = json.loads((ev / f"{SPLIT}-M{M}.bon.json").read_text())
    selected = json.loads((run / "selected.json").read_text())

    assert len(prompts) == 5 and all(set(p) == {"prompt_id", "messages"} for p in prompts)
    ids = [p["prompt_id"] for p in prompts]
    assert len(records) == 5 * M
    for rec in records:
        assert set(rec) == KEYS
        assert isinstance(rec["prompt_id"], str) and isinstance(rec["sample"], int) and isinstance(rec["response"], str)
        assert isinstance(rec["reward"], float) and isinstance(rec["tokens"], int) and 1 <= rec["tokens"] <= 8
        assert rec["reward"] == pytest.approx(length_reward(None, [rec["response"]])[0], rel=1e-6)  # scored this response
    assert sorted((r["prompt_id"], r["sample"]) for r in records) == sorted((p, s) for p in ids for s in range(M))

    assert set(bon) == {"split", "M", "checkpoint", "N", "mean", "per_prompt"}
    assert (bon["split"], bon["M"], bon["checkpoint"]) == (SPLIT, M, selected["step"])
    assert bon["N"] == [1, 2, 4, 8]
    assert list(bon["per_prompt"]) == ids
    expected = recomputed_bon(records, ids)
    for pid in ids:
        assert bon["per_prompt"][pid] == pytest.approx(expected[pid], abs=1e-12)
    assert bon["mean"] == pytest.approx(np.mean([expected[p] for p in ids], axis=0).tolist(), abs=1e-12)
    assert bon["mean"] == sorted(bon["mean"])  # best-of-N grows with N
    assert len({r["response"] for r in records}) > 1  # sampled, not greedy

    # Re-running a finished evaluation samples nothing and leaves the records as they were.
    before = (ev / f"{SPLIT}-M{M}.jsonl").read_text()
    res = tea("eval-bon", str(run))
    assert res.exit_code == 0, res.output
    assert "0 completions sampled now, 40 found on disk" in res.output
    # Not a terminal: the progress is plain lines, not a bar drawn only at the end.
    assert f"{run.name}: 40/40 (100%), 0s elapsed\n" in res.output and "━" not in res.output
    assert (ev / f"{SPLIT}-M{M}.jsonl").read_text() == before


def test_resume_after_sigkill_matches_an_uninterrupted_run(evaluated, tmp_path):
    run = tmp_path / "killed_run"
    shutil.copytree(evaluated, run, ignore=shutil.ignore_patterns("eval"))
    slow = ["--set", "reward.function=rewards_for_tests:slow_length_reward"]
    records = run / "eval" / f"{SPLIT}-M{M}.jsonl"
    cmd = [sys.executable, "-m", "teacli.cli", "eval-bon", str(run), *slow]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(tmp_path), start_new_session=True)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if records.exists() and len(records.read_text().splitlines()) >= 2 * M:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    lines = records.read_text().splitlines()
    assert 2 * M <= len(lines) < 5 * M, len(lines)
    # Make the interruption as bad as a kill can be: a prompt half-written and a torn last line.
    keep = lines[: len(lines) - 3]
    records.write_text("\n".join(keep) + "\n" + lines[len(keep)][:25])

    res = tea("eval-bon", str(run), *slow)
    assert res.exit_code == 0, res.output
    assert f"{len(keep)} found on disk" in res.output
    got = read_jsonl(records)
    keys = [(r["prompt_id"], r["sample"]) for r in got]
    assert len(keys) == len(set(keys)) == 5 * M  # nothing duplicated, nothing lost
    assert [json.loads(line) for line in keep] == got[: len(keep)]  # append-only: kept lines untouched
    ref_records = read_jsonl(evaluated / "eval" / f"{SPLIT}-M{M}.jsonl")
    assert sorted(got, key=lambda r: (r["prompt_id"], r["sample"])) == sorted(ref_records, key=lambda r: (r["prompt_id"], r["sample"]))
    name = f"{SPLIT}-M{M}.bon.json"
    assert (run / "eval" / name).read_text() == (evaluated / "eval" / name).read_text()


def test_call_groups_fill_the_batch_and_one_prompt_calls_keep_their_seeds():
    from teacli.eval.bon import call_groups, derive_seed, group_seed

    ids = ["a", "b", "c", "d", "e"]
    assert call_groups(ids, M=8, batch_size=16) == [[0, 1], [2, 3], [4]]  # this module's evaluation: 2 prompts a call
    assert call_groups(ids, M=8, batch_size=64) == [[0, 1, 2, 3, 4]]
    assert call_groups(ids, M=64, batch_size=64) == [[0], [1], [2], [3], [4]]  # M >= batch: one prompt a call, as before
    assert call_groups(ids, M=128, batch_size=64) == [[0], [1], [2], [3], [4]]
    # A one-prompt call has the per-prompt seed of the one-call-per-prompt evaluation: the same records.
    assert group_seed(7, ["c"]) == derive_seed(7, "c")
    assert group_seed(7, ["a", "b"]) not in (derive_seed(7, "a"), derive_seed(7, "b"))


def test_checkpoint_base_and_step(evaluated):
    run = evaluated
    res = tea("eval-bon", str(run), "--checkpoint", "base")
    assert res.exit_code == 0, res.output
    res = tea("eval-bon", str(run), "--checkpoint", "step_1")
    assert res.exit_code == 0, res.output
    base = json.loads((run / "eval" / "base" / f"{SPLIT}-M{M}.bon.json").read_text())
    step1 = json.loads((run / "eval" / "step_000001" / f"{SPLIT}-M{M}.bon.json").read_text())
    assert base["checkpoint"] == "base" and step1["checkpoint"] == 1
    assert (run / "eval" / "base" / f"{SPLIT}.prompts.jsonl").exists()
    # Same per-prompt seeds, different weights: the trained checkpoint samples other responses.
    responses = lambda d: [r["response"] for r in read_jsonl(run / "eval" / d / f"{SPLIT}-M{M}.jsonl")]  # noqa: E731
    assert responses("base") != responses("step_000001")

    res = tea("eval-bon", str(run), "--checkpoint", "step_99")
    assert res.exit_code == 2 and "step_1, step_2" in res.output


def test_resume_refuses_other_settings_and_a_missing_run(evaluated, tmp_path):
    res = tea("eval-bon", str(evaluated), "--set", "rollout.temperature=0.5")
    assert res.exit_code == 2
    assert "other settings" in res.output and "sampling" in res.output
    res = tea("eval-bon", str(tmp_path))
    assert res.exit_code == 2 and "not a run directory" in res.output


def test_default_run_is_the_current_or_most_recent(tmp_path):
    from teacli.eval.bon import EvalError, default_run_dir

    with pytest.raises(EvalError, match="no RUN_DIR"):
        default_run_dir(tmp_path)
    for i, name in enumerate(["old", "new"]):
        d = tmp_path / "runs" / name
        d.mkdir(parents=True)
        (d / "recipe.yaml").write_text("name: x\n")
        os.utime(d / "recipe.yaml", (1_000_000 + i, 1_000_000 + i))
    assert default_run_dir(tmp_path) == tmp_path / "runs" / "new"
    os.utime(tmp_path / "runs" / "old" / "recipe.yaml", (2_000_000, 2_000_000))
    assert default_run_dir(tmp_path) == tmp_path / "runs" / "old"
    assert default_run_dir(tmp_path / "runs" / "new") == tmp_path / "runs" / "new"
    help_text = " ".join(tea("eval-bon", "--help").output.replace("│", " ").split())
    assert "most recently active run under runs/" in help_text


# -- issue 22: items 9, 12 and 16 --------------------------------------------------------------------


def _unevaluated_copy(evaluated: Path, run: Path) -> tuple[Path, Path]:
    """A copy of the evaluated run without its evaluation, and where its records will go."""
    shutil.copytree(evaluated, run, ignore=shutil.ignore_patterns("eval"))
    return run, run / "eval" / f"{SPLIT}-M{M}.jsonl"


def _second_fsync_raises(monkeypatch, exc: BaseException, synced: bool):
    """The evaluator's second fsync (the second batch of records appended) raises `exc`, before the sync or, with
    `synced`, after it (the records safely on disk); returns the real os.fsync, to put back."""
    from teacli.eval import bon

    real, appends = bon.os.fsync, []

    def fsync(fd):
        appends.append(fd)
        if synced:
            real(fd)
        if len(appends) == 2:
            raise exc
        if not synced:
            real(fd)

    monkeypatch.setattr(bon.os, "fsync", fsync)
    return real


def test_a_full_disk_is_one_line_naming_the_records_and_the_rerun_resumes(evaluated, tmp_path, monkeypatch):
    """ENOSPC on the second append: exit 2, one `error:` line naming the records file (a failed write names
    no file itself), only whole records on disk, no temporary file; the rerun completes the evaluation."""
    import errno

    from teacli.eval import bon

    run, records = _unevaluated_copy(evaluated, tmp_path / "full_run")
    real = _second_fsync_raises(monkeypatch, OSError(errno.ENOSPC, "No space left on device"), synced=False)
    res = tea("eval-bon", str(run))
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.stderr.strip().splitlines()[-1] == (f"error: {records}: no space left on device; free space there (or write "
                                                   "elsewhere) and run the command again")
    assert res.stdout == ""
    assert len(read_jsonl(records)) % M == 0 and not list(run.rglob("*.tmp"))
    monkeypatch.setattr(bon.os, "fsync", real)
    res = tea("eval-bon", str(run))
    assert res.exit_code == 0, res.output
    assert len(read_jsonl(records)) == 5 * M


def test_an_unknown_split_creates_nothing_and_the_default_run_note_goes_to_stderr(evaluated):
    before = sorted(p.relative_to(evaluated) for p in evaluated.rglob("*"))
    res = tea("eval-bon", str(evaluated), "--split", "nosuch")
    assert res.exit_code == 2 and "nosuch" in res.stderr
    assert sorted(p.relative_to(evaluated) for p in evaluated.rglob("*")) == before  # no lock file, no eval dir

    res = tea("eval-bon", cwd=evaluated)  # no RUN_DIR: the current directory, already evaluated
    assert res.exit_code == 0, res.output
    assert "no RUN_DIR given" in res.stderr and "no RUN_DIR given" not in res.stdout


def test_stop_tokens_are_part_of_the_eval_settings_and_a_bad_one_writes_nothing(evaluated):
    """rollout.stop_tokens changes what is sampled: an evaluation with it records it in its settings (and one
    without it records nothing, so files from before the key compare equal), a resume cannot change it, and a
    string that is not one token stops with one line naming the key before any file is written."""
    before = sorted(p.relative_to(evaluated) for p in evaluated.rglob("*"))
    res = tea("eval-bon", str(evaluated), "--n", "4", "--set", "rollout.stop_tokens=['the sea']")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "rollout.stop_tokens: 'the sea' is 2 tokens" in res.stderr
    assert sorted(p.relative_to(evaluated) for p in evaluated.rglob("*")) == before

    old = json.loads((evaluated / "eval" / f"{SPLIT}-M{M}.run.json").read_text())  # the selected checkpoint's
    assert "stop_tokens" not in old["sampling"]
    res = tea("eval-bon", str(evaluated), "--n", "4", "--set", "rollout.stop_tokens=['<|user|>']")
    assert res.exit_code == 0, res.output
    new = json.loads((evaluated / "eval" / f"{SPLIT}-M4.run.json").read_text())
    assert new["sampling"]["stop_tokens"] == ["<|user|>"]
    res = tea("eval-bon", str(evaluated), "--n", "4")  # the same files without the stop token: refused
    assert res.exit_code == 2 and "other settings" in res.output and "sampling" in res.output


def test_a_chat_template_set_in_the_recipe_is_part_of_the_eval_settings(evaluated, tmp_path):
    """policy.chat_template changes the prompts the policy sees: an evaluation with it records it in its run.json
    (which `tea report` compares with a base arm's; one without it records nothing, so files from before the key
    compare equal) and a resume cannot change it."""
    run = tmp_path / "run"
    shutil.copytree(evaluated, run)
    assert "chat_template" not in json.loads((run / "eval" / f"{SPLIT}-M{M}.run.json").read_text())
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}"
    res = tea("eval-bon", str(run), "--n", "2", "--set", f"policy.chat_template='{template}'")
    assert res.exit_code == 0, res.output
    assert json.loads((run / "eval" / f"{SPLIT}-M2.run.json").read_text())["chat_template"] == template
    line = error_line(tea("eval-bon", str(run), "--n", "2"))  # the same files with the tokenizer's own template
    assert "other settings (chat_template: on disk" in line and "now None" in line


def error_line(res) -> str:
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    (line,) = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    return line


@pytest.mark.parametrize("content, message", [
    (b'{"step": 2}', "needs an integer 'step' and a string 'path' (the selected checkpoint's directory), got path=None"),
    (b"[]", "expected a JSON object"),  # was "selected.json not found"
    (b'{"step": 2, "path": "checkpoints/step_00000\xb2"}', "not UTF-8 text"),
])
def test_a_damaged_selected_json_is_one_line_naming_it(evaluated, tmp_path, content, message):
    run = tmp_path / "run"
    shutil.copytree(evaluated, run, ignore=shutil.ignore_patterns("eval"))
    (run / "selected.json").write_bytes(content)
    line = error_line(tea("eval-bon", str(run)))
    assert line.startswith(f"error: {run / 'selected.json'}: ") and message in line, line
    assert not (run / "eval").exists()


@pytest.mark.parametrize("edit, message", [
    (lambda rec: json.dumps({**rec, "reward": float("nan")}).encode(), "reward must be a finite number, got nan"),  # was "1 of 40 completions are missing"
    (lambda rec: json.dumps({**rec, "reward": "high"}).encode(), "reward must be a finite number, got 'high'"),  # was "could not convert string to float"
    (lambda rec: json.dumps(rec).encode().replace(b'"response": "', b'"response": "\xff'), "not UTF-8 text (byte 0xff"),
])
def test_a_damaged_record_is_one_line_naming_the_file_and_line(evaluated, tmp_path, edit, message):
    run = tmp_path / "run"
    shutil.copytree(evaluated, run)
    records = run / "eval" / f"{SPLIT}-M{M}.jsonl"
    lines = records.read_bytes().split(b"\n")
    lines[2] = edit(json.loads(lines[2]))
    records.write_bytes(b"\n".join(lines))
    before = records.read_bytes()
    line = error_line(tea("eval-bon", str(run)))
    assert line.startswith(f"error: {records}:3: {message}"), line
    assert records.read_bytes() == before


def test_ctrl_c_says_what_is_written_and_the_command_that_goes_on(evaluated, tmp_path, monkeypatch):
    """Ctrl-C (here: inside the second prompt's fsync, its records written) exits 130 with one line saying how many
    completions and prompts are safely on disk and the command that goes on; it used to exit 130 silently."""
    from teacli.eval import bon

    run, records = _unevaluated_copy(evaluated, tmp_path / "stopped")
    real = _second_fsync_raises(monkeypatch, KeyboardInterrupt(), synced=True)
    res = tea("eval-bon", str(run), "--split", SPLIT, "--set", "rollout.batch_size=16")
    assert res.exit_code == 130 and "Traceback" not in res.output, res.output
    assert res.stderr.strip().splitlines()[-1] == (
        f"interrupted while evaluating {run}: {2 * M} of {5 * M} completions are written to {records} (2 of 5 prompts "
        f"complete); to go on from there, run: tea eval-bon {run} --split {SPLIT} --set rollout.batch_size=16")
    assert len(read_jsonl(records)) == 2 * M
    monkeypatch.setattr(bon.os, "fsync", real)
    res = tea("eval-bon", str(run), "--split", SPLIT, "--set", "rollout.batch_size=16")
    assert res.exit_code == 0 and len(read_jsonl(records)) == 5 * M, res.output


def test_an_error_inside_a_python_reward_names_it_and_keeps_its_traceback_beside_the_records(evaluated, tmp_path):
    run = tmp_path / "bad_reward"
    shutil.copytree(evaluated, run, ignore=shutil.ignore_patterns("eval"))
    res = tea("eval-bon", str(run), "--set", "reward.kind=python", "--set", "reward.function=rewards_for_tests:json_error_reward")
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    log = run / "eval" / f"{SPLIT}-M{M}.reward_error.log"
    assert res.stderr.strip().splitlines()[-1] == (  # after transformers' "Loading weights" bar
        "error: the reward function rewards_for_tests:json_error_reward raised JSONDecodeError: Expecting property name "
        f"enclosed in double quotes: line 1 column 2 (char 1) (its traceback: {log})")
    assert 'return [json.loads("{bad: 1}") for _ in responses]' in log.read_text()
