"""teacli/rundir.py: the one-writer lock that train, eval-bon and judge share, what counts as a finished evaluation,
and how the step logs and selected.json are read (a resume drops only a torn last line, and says so)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from teacli.rundir import RecordError, RunDir, exclusive, finished_evals, step_dir_name


class Busy(Exception):
    pass


def test_a_second_holder_is_refused_at_once_and_the_file_goes_with_the_first(tmp_path):
    lock = tmp_path / ".x.lock"
    with exclusive(lock, "busy: x", Busy):
        assert lock.exists()
        with pytest.raises(Busy, match="busy: x"):
            with exclusive(lock, "busy: x", Busy):
                pass
        probe = ("import fcntl, sys; f = open(sys.argv[1], 'a')\n"  # another process, plain flock
                 "try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError: sys.exit(3)")
        assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 3
    assert not lock.exists()
    with exclusive(lock, "busy: x", Busy):  # free again
        pass


def test_a_lock_file_left_by_a_killed_holder_does_not_block(tmp_path):
    lock = tmp_path / ".x.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(Busy):
        with exclusive(lock, "busy", Busy):
            pass
    holder.kill()  # kill -9: the kernel drops its lock; the file stays
    holder.wait()
    assert lock.exists()
    with exclusive(lock, "busy", Busy):
        pass


def test_an_evaluation_is_finished_when_its_bon_json_exists(tmp_path):
    (tmp_path / "core-M8.jsonl").write_text("")
    (tmp_path / "core-M8.bon.json").write_text(json.dumps({}))
    (tmp_path / "core-M16.jsonl").write_text("")  # records only: unfinished
    assert finished_evals(tmp_path) == {("core", 8): tmp_path / "core-M8.bon.json"}
    assert finished_evals(tmp_path / "none") == {}


def rows(*steps, score=None) -> bytes:
    return b"".join(json.dumps({"step": s, **({} if score is None else {"score": score})}).encode() + b"\n" for s in steps)


def test_a_resume_drops_a_torn_last_line_and_says_so(tmp_path):
    run = RunDir(tmp_path)
    run.metrics.write_bytes(rows(1, 2, 3) + b'{"step": 4, "reward_me')  # a kill in the middle of step 4's append
    notes = []
    assert run.truncate_after(run.metrics, 2, notes.append) == 2
    assert run.metrics.read_bytes() == rows(1, 2)
    (note,) = notes
    assert str(run.metrics) in note and "dropped its last line, cut short" in note
    # a whole last line that only lacks its newline is a row, kept
    run.metrics.write_bytes(rows(1) + b'{"step": 2}')
    notes.clear()
    assert run.truncate_after(run.metrics, 2, notes.append) == 2 and notes == []
    assert run.metrics.read_bytes() == rows(1, 2)


@pytest.mark.parametrize("log, content, line, message", [
    ("metrics", rows(1) + b'{"step": 2, "rew\n' + rows(3), 2, "not a JSON line"),  # a damaged middle line
    ("metrics", rows(1) + b"42\n" + rows(2), 2, "expected a JSON object, got 42"),
    ("metrics", rows(1) + b'{"step": 2, "note": "caf\xe9"}\n' + rows(3), 2, "not UTF-8 text (byte 0xe9 at column 25)"),
    ("metrics", rows(1) + b'{"reward_mean": 0.5}\n', 2, "a row needs an integer 'step' >= 0, this one has no 'step'"),
    ("validation", b'{"step": 0, "sco\n' + rows(2, score=0.5), 1, "not a JSON line"),  # the untrained policy's row
    ("validation", rows(0, score=0.4) + b'{"step": 2}\n', 2, "a validation row needs a finite number 'score', this one (step 2) has no 'score'"),
    ("validation", rows(0, score=0.4) + b'{"step": 2, "score": NaN}\n', 2, "a validation row needs a finite number 'score', this one (step 2) has 'score' nan"),
])
def test_a_damaged_line_other_than_a_torn_last_one_names_file_and_line_and_nothing_is_rewritten(tmp_path, log, content, line, message):
    """Before, every line that was not JSON was dropped silently on resume (a damaged middle line, the untrained
    policy's validation row, never computed again), and a line `42` was a traceback."""
    run = RunDir(tmp_path)
    path = getattr(run, log)
    path.write_bytes(content)
    with pytest.raises(RecordError) as err:
        run.truncate_after(path, 5)
    assert str(err.value).startswith(f"{path}:{line}: {message}") and "fix or delete that line" in str(err.value)
    assert path.read_bytes() == content


@pytest.mark.parametrize("content, message", [
    (b'{"step": 2}', "needs an integer 'step' and a string 'path' (the selected checkpoint's directory), got path=None"),
    (b"[]", "expected a JSON object"),
    (b'{"step": 2, "path": "checkpoints/caf\xe9"}', "not UTF-8 text"),
    (b'{"step": 2, ', "not valid JSON"),
])
def test_a_damaged_selected_json_names_the_file(tmp_path, content, message):
    run = RunDir(tmp_path)
    run.selected.write_bytes(content)
    with pytest.raises(RecordError) as err:
        run.read_selected()
    assert str(err.value).startswith(f"{run.selected}: ") and message in str(err.value)


def test_selection_is_the_best_validated_checkpoint_still_on_disk(tmp_path):
    run = RunDir(tmp_path)
    run.validation.write_bytes(b"".join(json.dumps({"step": s, "score": v}).encode() + b"\n" for s, v in [(0, 0.9), (2, 0.5), (4, 0.7), (6, 0.8)]))
    for s in (2, 4):
        run.checkpoint(s).mkdir(parents=True)
    # step 0 has no checkpoint (the untrained policy), step 6's was removed: step 4 is the best one left
    assert run.update_selection() == {"step": 4, "path": f"checkpoints/{step_dir_name(4)}", "score": 0.7, "rule": ""}
    assert run.read_selected()["step"] == 4
