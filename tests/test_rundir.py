"""teacli/rundir.py: the one-writer lock that train, eval-bon and judge share, and what counts as a finished evaluation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from teacli.rundir import exclusive, finished_evals


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
