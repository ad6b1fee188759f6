"""benchmarks/grad_ckpt.py (issue 21: which gradient checkpointing is fastest where it fits): the verdict on
synthetic rows, bad arguments, and a real CPU run of train_step.py beside a setting that runs out of memory and
one that fails otherwise."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("grad_ckpt_benchmark", ROOT / "benchmarks" / "grad_ckpt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_verdict_is_the_fastest_setting_that_ran(bench):
    rows = [
        {"micro_batch": 64, "setting": "0", "result": "out of memory"},
        {"micro_batch": 64, "setting": "2", "layers": 2, "step_s": 4.1, "result": "ok"},
        {"micro_batch": 64, "setting": "6", "layers": 6, "step_s": 4.4, "result": "ok"},
        {"micro_batch": 64, "setting": "auto", "layers": 6, "step_s": 4.5, "result": "ok"},
        {"micro_batch": 32, "setting": "0", "result": "failed: ValueError: x (log: l)"},
    ]
    assert bench.verdicts(rows) == ["micro-batch 64: fastest 2 layers checkpointed (4.100 s a step); auto chose 6 (4.500 s)",
                                    "micro-batch 32: no setting ran"]
    lines = bench.table(rows).splitlines()
    assert lines[2].startswith("| 64 | 0 |") and lines[2].endswith("| out of memory |") and len(lines) == 7
    assert bench.cell(float("nan"), "{:.1f}") == "" and bench.cell(None, "{}") == "" and bench.cell(2.25, "{:.1f}") == "2.2"


def test_bad_arguments_are_one_line_errors(bench, capsys):
    for args, message in ((["--settings", "0,x"], "each setting is a number of layers, true, false or auto (bad: x)"),
                          (["--micro-batches", "64,0"], "every count must be at least 1")):
        with pytest.raises(SystemExit) as exc:
            bench.main(args)
        assert exc.value.code == 2 and message in capsys.readouterr().err
    assert bench.main(["--", "--micro-batch", "8"]) == 2
    assert "--micro-batch after --: grad_ckpt.py sets" in capsys.readouterr().err


def test_real_run_beside_an_out_of_memory_and_a_failed_setting(bench, tmp_path, monkeypatch, capsys):
    """--small --settings 0,1,2: setting 0 runs train_step.py for real; settings 1 and 2 run stand-ins that raise
    what a CUDA out-of-memory and another error print. Out of memory is a row of the table (exit 0 on its own);
    the other failure is a row naming its error and kept log, and the exit status is 1."""
    oom, bad = tmp_path / "oom.py", tmp_path / "bad.py"
    oom.write_text("raise SystemExit('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB')\n")
    bad.write_text("raise ValueError('policy.gradient_checkpointing: broken on purpose')\n")
    real = bench.run_one

    def run_one(cmd, log, timeout):
        setting = cmd[cmd.index("--grad-ckpt") + 1]
        stand_in = {"1": oom, "2": bad}.get(setting)
        return real([sys.executable, str(stand_in)] if stand_in else cmd, log, timeout)

    monkeypatch.setattr(bench, "run_one", run_one)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    logs, out = tmp_path / "logs", tmp_path / "grad_ckpt.json"
    assert bench.main(["--small", "--settings", "0,1,2", "--micro-batches", "8", "--logs", str(logs), "--json", str(out)]) == 1
    stdout = capsys.readouterr().out
    result = json.loads(out.read_text())
    ok, oom_row, bad_row = result["rows"]
    assert (ok["result"], ok["layers"], oom_row["result"]) == ("ok", 0, "out of memory")
    assert bad_row["result"] == f"failed: ValueError: policy.gradient_checkpointing: broken on purpose (log: {logs / 'mb8_ckpt_2.log'})"
    assert sorted(p.name for p in logs.iterdir()) == ["mb8_ckpt_1.log", "mb8_ckpt_2.log"]  # a run that worked leaves no log
    run = result["results"][0]["train_step"]
    assert run["args"]["micro_batch"] == 8 and run["args"]["grad_ckpt"] == 0
    expected = {"micro_batch": 8, "setting": "0"} | bench.summarise(run) | {"result": "ok"}
    assert json.dumps(ok, sort_keys=True) == json.dumps(expected, sort_keys=True)  # (no CUDA: the memory columns are NaN)
    assert stdout.splitlines()[-1] == f"micro-batch 8: fastest 0 layers checkpointed ({ok['step_s']:.3f} s a step)"


def test_a_run_stopped_part_way_keeps_the_settings_that_finished(bench, tmp_path, monkeypatch):
    """--json is written after every setting: `timeout 400 python benchmarks/grad_ckpt.py ...` on an H100 ended it
    in the sixth of ten settings and the five that had run (6 minutes of GPU time) were lost with it."""
    fake = {"grad_ckpt_layers": 2, "mem_estimate_gib": 5.0,
            "rows": [{"step_s": s, "generate_s": 1.0, "ref_logprobs_s": 0.5, "backward_step_s": 2.0, "mfu_backward_step": 0.4,
                      "peak_train_gib": 4.0, "peak_mem_gib": 4.5} for s in (9.0, 3.0, 3.2, 3.4)]}

    def run_one(cmd, log, timeout):
        if cmd[cmd.index("--grad-ckpt") + 1] == "auto":
            raise KeyboardInterrupt  # what SIGTERM from `timeout` becomes in run_one
        Path(cmd[cmd.index("--json") + 1]).write_text(json.dumps(fake))
        log.write_text("")
        return 0, 1.0

    monkeypatch.setattr(bench, "run_one", run_one)
    out, logs = tmp_path / "grad_ckpt.json", tmp_path / "logs"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--settings", "2,auto", "--micro-batches", "8", "--logs", str(logs), "--json", str(out)])
    kept = json.loads(out.read_text())
    assert [(r["setting"], r["result"], r["step_s"]) for r in kept["rows"]] == [("2", "ok", 3.2)]
    assert kept["results"][0]["train_step"] == fake and list(logs.iterdir()) == []
