"""`tea study` running its stages: concurrently on GPU slots (`--gpus`), in dependency order, a failure
kept to the stages that need it, resume, and signals passed on to the stages (issue 20 §3, issue 22 item 2).

The scheduler is tested on stages that are small Python commands recording when they ran and with which
environment; the CLI on the tiny model with two "GPUs" (on CPU the ids only set CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from teacli.cli import app
from teacli.study import Stage, StagesFailed, assign, execute, make_slots, plan_lines

TESTS = Path(__file__).resolve().parent

# A stage that records (label, start, end, its GPU and port) into OUT/<label>.json, sleeps, prints, exits with CODE.
RECORD = (
    "import json, os, sys, time; out, label, sleep, code = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]); "
    "t = time.time(); time.sleep(sleep); print('output of', label); "
    "json.dump({'start': t, 'end': time.time(), 'gpu': os.environ.get('CUDA_VISIBLE_DEVICES'), "
    "'port': os.environ.get('MASTER_PORT')}, open(os.path.join(out, label + '.json'), 'w')); sys.exit(code)"
)


def fake(out: Path, label: str, needs: tuple[str, ...] = (), sleep: float = 1.0, code: int = 0, done: bool = False) -> Stage:
    return Stage(label, [sys.executable, "-c", RECORD, str(out), label, str(sleep), str(code)], done, needs)


def two_chains(out: Path, fail: str | None = None) -> list[Stage]:
    """train/eval for runs a and b, then a report that needs everything: the shape of a study's plan."""
    stages = []
    for run in ("a", "b"):
        stages.append(fake(out, f"train-{run}", code=3 if fail == f"train-{run}" else 0))
        stages.append(fake(out, f"eval-{run}", needs=(f"train-{run}",), sleep=0.3))
    stages.append(fake(out, "report", needs=tuple(s.label for s in stages), sleep=0.1))
    return stages


def record(out: Path, label: str) -> dict:
    return json.loads((out / f"{label}.json").read_text())


def test_independent_stages_overlap_on_their_gpus_and_dependents_wait(tmp_path):
    stages = two_chains(tmp_path)
    slots = make_slots(["0", "1"])
    slot_of = assign(stages, len(slots))
    # Each evaluation follows its training on the same slot; the report goes where the last evaluation ran.
    assert slot_of == {"train-a": 0, "eval-a": 0, "train-b": 1, "eval-b": 1, "report": 1}
    lines = plan_lines(stages, slots, slot_of)
    assert lines[0].startswith("run   train-a [gpu 0]: ") and lines[2].startswith("run   train-b [gpu 1]: ")
    notes: list[str] = []
    ran = execute(stages, slots, slot_of, logs=tmp_path / "logs", note=notes.append, status_every=0.5, poll_s=0.05)
    assert sorted(ran) == sorted(s.label for s in stages)
    a, b = record(tmp_path, "train-a"), record(tmp_path, "train-b")
    assert a["start"] < b["end"] and b["start"] < a["end"], "the two trainings did not run at the same time"
    for run in ("a", "b"):
        assert record(tmp_path, f"eval-{run}")["start"] >= record(tmp_path, f"train-{run}")["end"]
    assert record(tmp_path, "report")["start"] >= max(record(tmp_path, s.label)["end"] for s in stages[:-1])
    gpus = {s.label: record(tmp_path, s.label)["gpu"] for s in stages}
    assert gpus == {"train-a": "0", "eval-a": "0", "train-b": "1", "eval-b": "1", "report": "1"}
    ports = [record(tmp_path, s.label)["port"] for s in stages]
    assert all(p and p.isdigit() for p in ports) and ports[0] != ports[2]  # the concurrent trainings: ports of their own
    log = (tmp_path / "logs" / "train-a.log").read_text()
    assert "train-a on gpu 0" in log.splitlines()[0] and "output of train-a" in log
    assert any(re.fullmatch(r"\[study \d+s\] start train-b on gpu 1 \(log: .*train-b\.log\)", n) for n in notes), notes
    assert any(re.fullmatch(r"\[study \d+s\] done  eval-a in \d+s", n) for n in notes), notes
    assert any(re.search(r"\d+ done, 2 running \(train-a \d+s gpu 0, train-b \d+s gpu 1\), 3 waiting, 0 failed", n) for n in notes), notes


def test_a_failed_stage_stops_only_what_needs_it_and_is_named_with_its_log(tmp_path):
    stages = two_chains(tmp_path, fail="train-a")
    slots = make_slots(["0", "1"])
    notes: list[str] = []
    with pytest.raises(StagesFailed) as info:
        execute(stages, slots, assign(stages, len(slots)), logs=tmp_path / "logs", note=notes.append, poll_s=0.05)
    log = tmp_path / "logs" / "train-a.log"
    assert str(info.value).startswith(f"1 stage(s) failed: train-a (exit 3; log: {log}); not run because of them: eval-a, report")
    assert "output of train-a" in log.read_text()
    assert (tmp_path / "eval-b.json").exists() and not (tmp_path / "eval-a.json").exists() and not (tmp_path / "report.json").exists()
    assert any("not run eval-a: it needs train-a, which failed" in n for n in notes)
    assert any("not run report: it needs train-a, which failed" in n for n in notes)


def test_resume_runs_only_what_is_not_done_and_one_slot_runs_one_at_a_time(tmp_path):
    stages = two_chains(tmp_path)
    stages = [Stage(s.label, s.cmd, s.label in ("train-a", "eval-a", "train-b"), s.needs) for s in stages]
    slot_of = assign(stages, 1)
    assert slot_of == {"eval-b": 0, "report": 0}
    assert plan_lines(stages, [None], slot_of)[0].startswith("skip  train-a (done): ")
    ran = execute(stages, [None], slot_of, note=lambda _: None, poll_s=0.05)  # no logs: the output goes to ours
    assert ran == ["eval-b", "report"]
    assert record(tmp_path, "eval-b")["gpu"] == os.environ.get("CUDA_VISIBLE_DEVICES")  # no GPU slot: left as it was
    assert record(tmp_path, "report")["start"] >= record(tmp_path, "eval-b")["end"]


@pytest.mark.parametrize("args, message", [
    (["--per-gpu", "2"], "--per-gpu needs --gpus"),
    (["--gpus", "0,x"], "--gpus '0,x': expected GPU indices separated by commas"),
    (["--gpus", "1,1"], "--gpus '1,1' names a GPU twice"),
    (["--gpus", "0", "--per-gpu", "0"], "--per-gpu must be an integer >= 1, got 0"),
    (["--gpus", "0,1", "--launcher", "deepspeed --num_gpus 2 --module"], "--gpus runs every stage in one process on one GPU"),
])
def test_bad_gpu_options_are_one_line(args, message):
    res = CliRunner().invoke(app, ["study", "embedded_bon", "--dry-run", *args])
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1, res.output
    assert message in res.stderr


def _tiny_study(tmp_path: Path, steps: int = 1) -> Path:
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_assets, tiny_study

    make_assets(tmp_path)
    tiny_study(tmp_path, steps)
    return tmp_path / "study.yaml"


def _intervals(stderr: str) -> dict[str, tuple[int, int]]:
    """label → (start, end) in whole seconds since the study started, from its progress lines."""
    def secs(text: str) -> int:
        h, m, s = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(\d+)s", text).groups()
        return int(h or 0) * 3600 + int(m or 0) * 60 + int(s)

    starts = {m[2]: secs(m[1]) for m in re.finditer(r"^\[study (\S+)\] start (.+?) on gpu", stderr, re.M)}
    ends = {m[2]: secs(m[1]) for m in re.finditer(r"^\[study (\S+)\] done  (.+?) in ", stderr, re.M)}
    return {label: (starts[label], ends[label]) for label in starts}


def test_tiny_study_on_two_gpus_runs_trainings_together_logs_and_resumes(tmp_path):
    study = _tiny_study(tmp_path)
    from tiny_lm import tea_env

    env = tea_env(tmp_path)
    cmd = [sys.executable, "-m", "teacli.cli", "study", str(study), "--gpus", "0,1"]
    dry = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert dry.returncode == 0, dry.stderr
    planned = dry.stdout.splitlines()[:-1]
    assert [line.split(":")[0] for line in planned] == [
        "run   train tiny_grpo [gpu 0]", "run   eval-bon tiny_grpo [gpu 0]", "run   train tiny_tea [gpu 1]",
        "run   eval-bon tiny_tea [gpu 1]", "run   report [gpu 1]"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert first.stdout.splitlines()[: len(planned)] == planned  # the run prints the plan --dry-run printed
    assert "study done (5 stage(s) run)" in first.stdout
    spans = _intervals(first.stderr)
    (s0, e0), (s1, e1) = spans["train tiny_grpo"], spans["train tiny_tea"]
    assert s0 < e1 and s1 < e0, f"the trainings did not overlap: {spans}"
    assert spans["eval-bon tiny_grpo"][0] >= e0 and spans["eval-bon tiny_tea"][0] >= e1
    assert spans["report"][0] >= max(end for label, (_, end) in spans.items() if label != "report")
    logs = tmp_path / "runs" / "logs" / "tiny"
    assert "train tiny_tea on gpu 1" in (logs / "train_tiny_tea.log").read_text().splitlines()[0]
    assert "run directory:" in (logs / "train_tiny_tea.log").read_text()  # the stage's own stdout went to its log
    assert (tmp_path / "report" / "frontier.md").exists()

    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.count("skip  ") == 4 and "run   report [gpu 0]: " in second.stdout
    assert "study done (1 stage(s) run)" in second.stdout


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (Linux /proc)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("signum, gpus", [(signal.SIGTERM, []), pytest.param(signal.SIGINT, [], marks=pytest.mark.slow),  # SIGTERM's path
                                          (signal.SIGKILL, ["--gpus", "0,1"])])
def test_a_signal_to_the_study_stops_its_stages(tmp_path, signum, gpus):
    """Issue 22 item 2: `tea study` killed with SIGTERM left its `tea train` running (re-parented to PID 1)."""
    study = _tiny_study(tmp_path, steps=500)
    from tiny_lm import tea_env

    cmd = [sys.executable, "-m", "teacli.cli", "study", str(study), *gpus]
    # Output to files, not pipes: a stage that outlives the study must not keep the test waiting on a pipe.
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err_file:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err_file, env=tea_env(tmp_path))
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (tmp_path / "runs" / "tiny_grpo" / "recipe.yaml").exists():
            assert proc.poll() is None, (tmp_path / "err.txt").read_text()[-3000:]
            time.sleep(0.2)
        children = _descendants(proc.pid)
        assert children, "no stage started"
        os.kill(proc.pid, signum)
        proc.wait(timeout=120)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(_alive, children)):
            time.sleep(0.2)
        assert not [p for p in children if _alive(p)], "stages outlived the study"
        err = (tmp_path / "err.txt").read_text()
        if signum == signal.SIGKILL:
            assert proc.returncode == -signal.SIGKILL
        else:
            assert proc.returncode == 128 + signum, err[-3000:]
            assert f"error: stopped by {signal.Signals(signum).name}: the running stages were stopped too" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
