"""What `tea train` does when the disk fills up, the run directory is not one, or a checkpoint is damaged
(issue 22, items 9, 12 and 16): one `error:` line, exit 2, no partial checkpoint left, and stdout holding
results only.

The checkpoint writer and the state loader run on a real DeepSpeed engine in-process (one-process gloo
group, CPU) around a tiny Llama; the rest goes through the real command.
"""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))


@pytest.fixture(scope="module")
def engine(world):
    from tiny_lm import make_causal_lm, make_tokenizer

    from teacli.config import Recipe
    from teacli.train import backend

    tok = make_tokenizer()
    recipe = Recipe()
    recipe.backend.precision, recipe.optim.micro_batch_size = "fp32", 4
    return tok, recipe, backend.build_engine(make_causal_lm(tok), recipe, world, 1, "fp32")


def test_a_full_disk_while_checkpointing_removes_the_partial_checkpoint(engine, world, tmp_path, monkeypatch):
    """safetensors and torch.save report a full disk with their own errors, not OSError: either way the
    half-written checkpoint goes (it holds the space) and the error is one line naming the checkpoint."""
    from safetensors import SafetensorError

    from teacli.rundir import RunDir
    from teacli.train import checkpoint as loop

    tok, recipe, eng = engine
    run = RunDir(tmp_path / "run")

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(loop, "save_hf_model", full)
    with pytest.raises(loop.TrainError, match=r"writing checkpoint step_000003 into .*checkpoints failed \(SafetensorError: "
                       r"Error while serializing: .*No space left on device.*\); [\d,]+ MiB free on that disk\. The partial checkpoint "
                       r"was removed: free space and run the same command to resume from the last complete checkpoint"):
        loop.save_checkpoint(run, eng, tok, recipe, world, 3, {"data_position": 6})
    assert list(run.checkpoints.iterdir()) == []  # no .tmp_step_000003 (trainer state included)

    def enospc(*args, **kwargs):  # a plain write() that fails names no file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(loop, "save_hf_model", enospc)
    with pytest.raises(OSError) as exc:
        loop.save_checkpoint(run, eng, tok, recipe, world, 3, {"data_position": 6})
    assert exc.value.filename == str(run.tmp_checkpoint(3)) and list(run.checkpoints.iterdir()) == []


def test_a_checkpoint_respects_the_umask(engine, world, tmp_path):
    """safetensors writes model.safetensors 0600 whatever the umask; a checkpoint's files get 0666 & ~umask like
    any other file (here umask 027: readable by the group)."""
    import os

    from teacli.rundir import RunDir
    from teacli.train import checkpoint as loop

    tok, recipe, eng = engine
    old = os.umask(0o027)
    try:
        path = loop.save_checkpoint(RunDir(tmp_path / "run"), eng, tok, recipe, world, 2, {"data_position": 4})
    finally:
        os.umask(old)
    files = {p.relative_to(path).as_posix(): p.stat().st_mode & 0o777 for p in path.rglob("*")}
    assert files["model.safetensors"] == 0o640
    assert {m for p, m in files.items() if (path / p).is_file()} == {0o640}, files
    assert {m for p, m in files.items() if (path / p).is_dir()} <= {0o750} and path.stat().st_mode & 0o777 == 0o750


def test_a_missing_or_truncated_trainer_state_is_a_value_error_naming_it(engine, tmp_path):
    """DeepSpeed itself raised a bare AssertionError (missing folder) or an unpickling error (truncated file)."""
    from teacli.train import backend

    _, _, eng = engine
    trainer = tmp_path / "trainer"
    with pytest.raises(ValueError, match=rf"^the trainer state {trainer / 'state'} is missing$"):
        backend.load_engine_state(eng, str(trainer), tag="state")
    backend.save_engine_state(eng, str(trainer), tag="state")
    backend.load_engine_state(eng, str(trainer), tag="state")  # whole: loads
    for f in (trainer / "state").iterdir():
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])  # cut short, as by a full disk
    with pytest.raises(ValueError, match=rf"^the trainer state in {trainer / 'state'} cannot be read \(damaged or truncated\?\): "):
        backend.load_engine_state(eng, str(trainer), tag="state")


# -- the real command ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from tiny_lm import make_assets

    return make_assets(tmp_path_factory.mktemp("write_failures"))


def tea_train(assets: Path, tmp: Path, run: Path, **overrides) -> subprocess.CompletedProcess:
    from tiny_lm import tea_env, tiny_recipe, write_recipe

    rec = write_recipe(tmp / "recipe.yaml", tiny_recipe(assets / "policy", assets / "data", **overrides))
    cmd = [sys.executable, "-m", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
    return subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tmp), timeout=600)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and proc.stdout == "", (proc.stdout, proc.stderr[-3000:])
    return errors[0]


def test_run_dir_that_is_a_file_or_a_foreign_folder_is_refused(assets, tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    assert one_line_error(tea_train(assets, tmp_path, afile)) == f"error: run directory {afile} is a file; give a directory (--run-dir)"
    foreign = tmp_path / "project"
    foreign.mkdir()
    (foreign / "metrics.jsonl").write_text('{"step": 1, "mine": true}\n')
    (foreign / "notes.md").write_text("mine\n")
    line = one_line_error(tea_train(assets, tmp_path, foreign))
    assert line == (f"error: {foreign} holds files that tea did not write (notes.md) and no recipe.yaml: it is not a run "
                    "directory; choose a new or empty --run-dir")
    assert (foreign / "metrics.jsonl").read_text() == '{"step": 1, "mine": true}\n' and sorted(p.name for p in foreign.iterdir()) == [
        "metrics.jsonl", "notes.md"]


def test_stdout_holds_results_only_and_a_damaged_checkpoint_is_one_line(assets, tmp_path):
    """DeepSpeed's accelerator warning and "... built successfully" went to stdout. Resuming from a
    checkpoint whose trainer/ folder is gone was a bare AssertionError inside DeepSpeed."""
    run = tmp_path / "run"
    proc = tea_train(assets, tmp_path, run, optim__steps=2, checkpoint__save_every=1, validation__enabled=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == f"run directory: {run}\n"
    assert "Setting accelerator to CPU" in proc.stderr  # still shown, on stderr

    # As if killed before checkpoint 2, with checkpoint 1's trainer state lost.
    shutil.rmtree(run / "checkpoints" / "step_000002")
    shutil.rmtree(run / "checkpoints" / "step_000001" / "trainer")
    line = one_line_error(tea_train(assets, tmp_path, run, optim__steps=2, checkpoint__save_every=1, validation__enabled=False))
    step1 = run / "checkpoints" / "step_000001"
    assert line == (f"error: cannot resume from {step1}: the trainer state {step1 / 'trainer' / 'state'} is missing; move that "
                    f"checkpoint out of {run / 'checkpoints'} to resume from the one before it, or start over in a new --run-dir")
    assert json.loads((step1 / "trainer_state.json").read_text())["step"] == 1  # the run is kept as it was
