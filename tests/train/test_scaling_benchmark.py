"""benchmarks/scaling.py (issue 21's scaling table) and the per-rank maxima of benchmarks/train_step.py: the
table's arithmetic on synthetic train_step results, `backend.all_reduce_max_stats` in a one- and a
two-process gloo group, and a real CPU run on 1 and 2 processes with a launch whose rank crashes between them."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))

from tiny_lm import tea_env  # noqa: E402


@pytest.fixture(scope="module")
def scaling():
    spec = importlib.util.spec_from_file_location("scaling_benchmark", ROOT / "benchmarks" / "scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def synthetic(n: int, steps: list[dict], allreduce_s: float | None = None) -> dict:
    """train_step.py's JSON for world size n: one warm-up row then `steps` (only the fields the table reads)."""
    warmup = {"step_s_max": 100.0, "generate_s": 90.0, "generate_s_max": 99.0, "ref_logprobs_s": 5.0, "backward_step_s": 5.0,
              "backward_step_s_max": 9.0, "new_tokens": 1.0}
    return {"device": "test", "zero": 2, "world_size": n, "n_params": 1000, "allreduce_dtype": "bfloat16", "micro_batches_per_rank": 4,
            "allreduce_s": allreduce_s, "rows": [warmup] + steps}


def row(step, gen, gen_max, bwd, bwd_max, tokens, ref=0.5):
    return {"step_s_max": step, "generate_s": gen, "generate_s_max": gen_max, "ref_logprobs_s": ref, "backward_step_s": bwd,
            "backward_step_s_max": bwd_max, "new_tokens": tokens}


def test_table_arithmetic_on_synthetic_results(scaling):
    one = synthetic(1, [row(2.0, 1.0, 1.0, 0.8, 0.8, 1000), row(4.0, 2.0, 2.0, 1.2, 1.2, 1000), row(3.0, 1.5, 1.5, 1.0, 1.0, 1000)])
    two = synthetic(2, [row(3.2, 1.4, 1.6, 1.0, 1.3, 2000), row(3.5, 1.5, 1.6, 1.1, 1.2, 2000), row(4.0, 1.7, 2.2, 1.2, 1.6, 2000)],
                    allreduce_s=1e-6)
    four = synthetic(4, [row(5.0, 2.0, 2.5, 1.5, 1.9, 4000), row(5.0, 2.0, 2.5, 1.5, 1.9, 4000), row(5.0, 2.0, 2.5, 1.5, 1.9, 4000)],
                     allreduce_s=2e-6)
    rows = scaling.add_efficiency([scaling.summarise(r) for r in (one, two, four)])

    # Medians of the measured steps (the warm-up row's 100 s never counts); tokens/s is the median of each step's.
    per_gpu_1 = 1000 / 3.0                          # steps of 500, 250, 333.3 tok/s
    per_gpu_2 = 2000 / 3.5 / 2                      # steps of 625, 571.4, 500 tok/s on 2 GPUs
    per_gpu_4 = 4000 / 5.0 / 4
    assert rows[0] == pytest.approx({
        "n": 1, "step_s": 3.0, "generate_s": 1.5, "ref_logprobs_s": 0.5, "backward_step_s": 1.0, "tokens_per_s": per_gpu_1,
        "tokens_per_s_per_gpu": per_gpu_1, "efficiency_pct": 100.0, "generate_straggle_s": 0.0, "backward_straggle_s": 0.0,
        "allreduce_s": None, "allreduce_busbw_gbps": None, "grad_comm_per_step_s": None})
    assert rows[1]["tokens_per_s"] == pytest.approx(2 * per_gpu_2)
    assert rows[1]["efficiency_pct"] == pytest.approx(100 * per_gpu_2 / per_gpu_1)  # 85.7%
    assert rows[1]["generate_straggle_s"] == pytest.approx(0.2)                      # median of 0.2, 0.1, 0.5
    assert rows[1]["backward_straggle_s"] == pytest.approx(0.3)                      # median of 0.3, 0.1, 0.4
    # 1000 bf16 parameters = 2000 bytes in 1 us = 2 GB/s algorithm bandwidth; the bus moves 2 (N - 1) / N of it.
    assert rows[1]["allreduce_busbw_gbps"] == pytest.approx(2.0 * 2 * 1 / 2)
    assert rows[2]["allreduce_busbw_gbps"] == pytest.approx(1.0 * 2 * 3 / 4)
    assert rows[1]["grad_comm_per_step_s"] == pytest.approx(4 * 1e-6)  # one all-reduce a micro-batch, 4 a rank
    assert rows[2]["efficiency_pct"] == pytest.approx(100 * per_gpu_4 / per_gpu_1)  # 60%

    lines = scaling.table(rows).splitlines()
    assert len(lines) == 5 and all(line.count("|") == len(scaling.COLUMNS) + 1 for line in lines)
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells[0] == "2" and cells[7] == f"{100 * per_gpu_2 / per_gpu_1:.1f}%" == "85.7%" and cells[10] == "0.0000"
    assert [c.strip() for c in lines[2].strip("|").split("|")][10:] == ["", "", ""]  # N = 1 has no all-reduce

    # Without N = 1 (it failed, or was not asked for) there is no efficiency to give.
    assert [r["efficiency_pct"] for r in scaling.add_efficiency([scaling.summarise(two)])] == [None]


def test_bad_arguments_are_one_line_errors(scaling, capsys, tmp_path):
    assert scaling.main(["--small", "--gpus", "1", "--logs", str(tmp_path), "--", "--prompts", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --prompts after --")
    assert scaling.main(["--small", "--gpus", "1", "--prompts-per-gpu", "0", "--logs", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: --prompts-per-gpu 0")
    with pytest.raises(SystemExit) as exc:
        scaling.main(["--gpus", "1,0"])
    assert exc.value.code == 2
    assert not list(tmp_path.iterdir())  # nothing launched


def test_all_reduce_max_stats_alone_is_the_identity(world):
    from teacli.train import backend

    values = {"generate_s": 1.25, "backward_step_s": -3.0}
    assert backend.all_reduce_max_stats(values) == values and backend.all_reduce_max_stats({}) == {}
    assert backend.all_reduce_mean(values) == values


def test_all_reduce_max_and_mean_over_two_processes(tmp_path):
    script = tmp_path / "reduce.py"
    script.write_text(
        "import json, os, torch.distributed as dist\n"
        "from teacli.train import backend\n"
        "dist.init_process_group('gloo')\n"
        "r = dist.get_rank()\n"
        "values = {'a': r + 1.0, 'b': -3.0 * r}\n"
        "out = {'max': backend.all_reduce_max_stats(values), 'mean': backend.all_reduce_mean(values)}\n"
        "open(os.path.join(os.path.dirname(__file__), f'rank{r}.json'), 'w').write(json.dumps(out))\n"
        "dist.destroy_process_group()\n")
    env = tea_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env["PYTHONPATH"]])
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]  # a file each: ranks' prints interleave
    # rank 0: a = 1, b = 0; rank 1: a = 2, b = -3. Every rank gets the same answer.
    assert results == [{"max": {"a": 2.0, "b": 0.0}, "mean": {"a": 1.5, "b": -1.5}}] * 2


@pytest.mark.slow
def test_real_run_on_one_and_two_processes_past_a_crashed_launch(scaling, tmp_path, monkeypatch, capsys):
    """--gpus 1,3,2 on CPU: N = 1 and N = 2 run train_step.py for real (gloo); N = 3's launch runs a script whose
    rank 1 exits 1 through the same torchrun. The failure is one line naming N = 3 and its kept log; N = 2 still
    runs after it; the exit status is 1."""
    crash = tmp_path / "crash.py"
    crash.write_text("import os, sys\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\n"
                     "if os.environ['RANK'] == '1':\n    raise RuntimeError('rank 1 crashed on purpose')\n")
    real = scaling.launch_command

    def launch(launcher, n, script_args):
        cmd = real(launcher, n, script_args)
        return [str(crash) if n == 3 and part == str(scaling.TRAIN_STEP) else part for part in cmd]

    monkeypatch.setattr(scaling, "launch_command", launch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    logs, out = tmp_path / "logs", tmp_path / "scaling.json"
    assert scaling.main(["--small", "--gpus", "1,3,2", "--logs", str(logs), "--json", str(out)]) == 1
    stdout, stderr = capsys.readouterr()

    log3 = logs / "train_step_n3.log"
    assert sorted(p.name for p in logs.iterdir()) == [log3.name]  # successful launches leave nothing behind
    assert "rank 1 crashed on purpose" in log3.read_text()
    failed = [line for line in stdout.splitlines() if line.startswith("N=")]
    assert failed == [f"N=3: failed (exit 1); log: {log3}; RuntimeError: rank 1 crashed on purpose"]
    assert "[scaling] N=3: FAILED (exit 1)" in stderr and stderr.index("N=3: FAILED") < stderr.index("[scaling] N=2: done")

    result = json.loads(out.read_text())
    assert list(result["runs"]) == ["1", "2"] and result["failed"]["3"]["log"] == str(log3)
    one, two = result["runs"]["1"], result["runs"]["2"]
    assert (one["world_size"], one["args"]["prompts"], two["world_size"], two["args"]["prompts"]) == (1, 1, 2, 2)
    assert one["allreduce_s"] is None and two["allreduce_s"] > 0 and two["n_params"] > 0
    for run in (one, two):
        for r in run["rows"]:
            for key in ("generate_s", "backward_step_s", "step_s"):
                assert r[f"{key}_max"] >= r[key] - 1e-12
    for r in one["rows"]:  # one process: its maximum is its mean
        assert r["generate_s_max"] == r["generate_s"] and r["step_s_max"] == r["step_s"]
    # The table's rows are summarise() of the runs, efficiency against N = 1 included.
    rows = result["table"]
    assert [r["n"] for r in rows] == [1, 2]
    assert rows == scaling.add_efficiency([scaling.summarise(one), scaling.summarise(two)])  # floats survive JSON exactly
    assert rows[1]["efficiency_pct"] == pytest.approx(100 * rows[1]["tokens_per_s"] / 2 / rows[0]["tokens_per_s"])
    table = [line for line in stdout.splitlines() if line.startswith("| 2 |")]
    assert len(table) == 1 and f"| {rows[1]['efficiency_pct']:.1f}% |" in table[0]


def test_a_stopped_benchmark_ends_the_launch_it_waits_for(tmp_path):
    """run_one starts the launch in a session of its own (so a --timeout can end it and its ranks), which is also
    out of reach of the signal that stops the benchmark: `timeout 400 python benchmarks/grad_ckpt.py ...` left
    its train_step.py running on the GPU beside the next job. SIGTERM to the benchmark now ends the launch too."""
    import signal
    import time

    pid_file, log = tmp_path / "child.pid", tmp_path / "child.log"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent = (f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import scaling; "
              f"scaling.run_one([sys.executable, '-c', {child!r}], __import__('pathlib').Path({str(log)!r}), 300)")
    proc = subprocess.Popen([sys.executable, "-c", parent], env=tea_env())
    child_pid = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child_pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(child_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the launch (pid {child_pid}) outlived the stopped benchmark")
    finally:
        proc.kill()
        if child_pid is not None:
            try:
                os.killpg(child_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
