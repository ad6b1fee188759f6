"""DeepSpeed's CPU backend loads its shared-memory all-reduce op in every process it starts, under the file lock of
the op's torch build directory. A process killed while holding that lock (a SIGKILLed `tea train`, a CI job cut
short) left it behind, and every later CPU `tea train` waited on it forever: a whole CI run hung that way. A
one-process run now does not load the op at all; a multi-process one removes a lock older than STALE_LOCK_S."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tiny_lm import tea_env


def test_a_one_process_cpu_group_starts_past_a_lock_left_by_a_killed_process(tmp_path):
    lock = tmp_path / "ext" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()  # fresh: nobody may remove it, and torch's loader would wait until it goes
    code = "from teacli.train.backend import init_world; w = init_world(); print(w.world_size, w.device.type)"
    env = tea_env(tmp_path, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["1", "cpu"]
    assert lock.exists()  # left alone: it is not this process's to remove
    assert sorted(p.name for p in lock.parent.iterdir()) == ["lock"]  # and nothing was built


def test_only_a_lock_older_than_any_build_is_removed(tmp_path, monkeypatch, capsys):
    from teacli.train import backend

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    lock.touch()
    backend._clear_stale_build_lock("op")
    assert lock.exists() and capsys.readouterr().err == ""  # a build may be running right now

    old = time.time() - backend.STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    backend._clear_stale_build_lock("op")
    assert not lock.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stale build lock" in err and str(lock) in err

    backend._clear_stale_build_lock("op")  # no lock: nothing to say
    assert capsys.readouterr().err == ""
