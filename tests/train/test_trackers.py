"""Experiment trackers (`logging.report_to`): what TensorBoard, W&B (offline) and MLflow (a local file
store) hold after a real `tea train`, read back with each tool's own reader, equals metrics.jsonl,
validation.jsonl and recipe.yaml, also across an interruption and a resume; and the sink's rules
(resume marks, a failing tracker, per-rank lines) on stub trackers."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from tiny_lm import tea_env, tiny_recipe, write_recipe  # noqa: E402

from teacli.config import Recipe, RecipeError, recipe_from_dict  # noqa: E402
from teacli.rundir import RunDir  # noqa: E402
from teacli.train import progress  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from tiny_lm import make_assets

    return make_assets(tmp_path_factory.mktemp("tracker_assets"))


def tracker_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = tea_env(tmp, WANDB_MODE="offline", WANDB_SILENT="true", MLFLOW_TRACKING_URI=f"file:{tmp / 'mlruns'}",
                  MLFLOW_ALLOW_FILE_STORE="true", **extra)  # MLflow 3 keeps file stores behind this switch
    for key in ("WANDB_DIR", "WANDB_PROJECT", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(key, None)
    return env


def train(recipe: Path, run: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "teacli.cli", "train", str(recipe), "--run-dir", str(run)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def same(a: float, b: float, rel: float = 1e-6) -> bool:
    a, b = float(a), float(b)  # a flag (grad_clipped) reaches the trackers as 0/1
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel, abs=1e-7)


# -- readers: each tracker's own files, through its own library ----------------------------------


def _wandb_records(data: bytes):
    """Records of a .wandb transaction log (W&B's LevelDB-style log: 7-byte file header ':W&B'+magic+version,
    32 KiB blocks of records with a 7-byte header crc32c/u16 length/u8 type: 1 full, 2 first, 3 middle, 4 last)."""
    assert data[:4] == b":W&B", data[:7]
    pos, parts, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too small for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            yield parts + chunk


def wandb_offline(run: Path) -> tuple[dict[int, dict], dict, list[str]]:
    """Every offline W&B run of the run directory, in order: {step: history row}, the config, the run ids."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows: dict[int, dict] = {}
    config: dict = {}
    ids = []
    for path in sorted(run.glob("wandb/offline-run-*/run-*.wandb")):
        for raw in _wandb_records(path.read_bytes()):
            rec = pb.Record()
            rec.ParseFromString(raw)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                ids.append(rec.run.run_id)
                config.update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
            elif kind == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
                step = int(row["_step"])
                assert step not in rows, f"step {step} logged twice"
                rows[step] = row
    return rows, config, ids


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()  # applies purge_step: events after a resumed checkpoint are replaced by the re-run's
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


# -- end to end ----------------------------------------------------------------------------------


def test_trackers_hold_what_the_run_directory_holds_across_a_resume(assets, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for reading the store back in this process

    rec = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(
        assets / "policy", assets / "data", name="tracked", reward__function="rewards_for_tests:interrupted_length_reward",
        logging={"report_to": ["tensorboard", "wandb", "mlflow"], "project": "tea-tests"},
    ))
    run = tmp_path / "run"
    # Reward calls: 1 validation at step 0, 2-3 steps 1-2, 4 validation at 2, 5 step 3, 6 step 4: stops in step 4.
    first = train(rec, run, tracker_env(tmp_path, TEA_TEST_FAIL_AT="6"))
    assert first.returncode == 2 and "interrupted on purpose" in first.stderr, first.stderr[-3000:]
    assert [r["step"] for r in jsonl(run / "metrics.jsonl")] == [1, 2, 3]
    state = json.loads((run / "trackers.json").read_text())
    assert state["wandb"]["metrics_step"] == state["mlflow"]["metrics_step"] == 3

    second = train(rec, run, tracker_env(tmp_path))  # resumes from step 2 and re-runs step 3
    assert second.returncode == 0, second.stderr[-3000:]
    assert "step 4:" in second.stderr and "step 4:" not in second.stdout  # progress on stderr, results on stdout
    metrics, validation = jsonl(run / "metrics.jsonl"), jsonl(run / "validation.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3, 4] and [v["step"] for v in validation] == [0, 2, 4]
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    keys = [k for k in metrics[0] if k != "step"]
    # Step 3 ran twice; W&B and MLflow keep the first attempt's values, which equal the re-run's except timings.
    timing = {k for k in keys if k.startswith("time_") or k == "tokens_per_s"}

    def expected(m: dict, k: str) -> bool:
        return not (m["step"] == 3 and k in timing)
    val_keys = [k for k, v in validation[0].items() if k != "step" and isinstance(v, (int, float))]
    assert len(keys) >= 20 and "score" in val_keys

    # W&B: two offline pieces of one run (the id kept in trackers.json), every step once.
    rows, config, ids = wandb_offline(run)
    assert len(ids) == 2 and set(ids) == {json.loads((run / "trackers.json").read_text())["wandb"]["id"]}
    for m in metrics:
        for k in keys:
            assert not expected(m, k) or same(rows[m["step"]][k], m[k], rel=1e-5), (m["step"], k)
    for v in validation:
        for k in val_keys:
            assert same(rows[v["step"]][f"validation/{k}"], v[k]), (v["step"], k)
    assert config["run_dir"] == str(run.resolve())
    assert {k: config[k] for k in recipe} == recipe

    # MLflow: one run, one value per step, the recipe as params and artifact, FINISHED.
    client = MlflowClient(f"file:{tmp_path / 'mlruns'}")
    run_id = json.loads((run / "trackers.json").read_text())["mlflow"]["run_id"]
    info = client.get_run(run_id)
    assert info.info.status == "FINISHED" and info.info.run_name == "tracked"
    assert client.get_experiment(info.info.experiment_id).name == "tea-tests"
    assert info.data.tags["tea.run_dir"] == str(run.resolve())
    for k in keys:
        history = sorted((h.step, h.value) for h in client.get_metric_history(run_id, k))
        assert [s for s, _ in history] == [1, 2, 3, 4], k
        assert all(same(value, m[k], rel=1e-5) for (_, value), m in zip(history, metrics) if expected(m, k)), k
    history = sorted((h.step, h.value) for h in client.get_metric_history(run_id, "validation/score"))
    assert history == [(v["step"], pytest.approx(v["score"])) for v in validation]

    def leaves(tree, prefix=""):
        for key, value in tree.items():
            if isinstance(value, dict) and value:
                yield from leaves(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value if isinstance(value, str) else json.dumps(value)

    assert info.data.params == dict(leaves(recipe))
    artifact = Path(client.download_artifacts(run_id, "recipe.yaml", str(tmp_path)))
    assert yaml.safe_load(artifact.read_text()) == recipe

    # TensorBoard: the re-run step 3 replaced the first attempt's (purge_step), values as float32.
    scalars = tensorboard_scalars(run)
    for k in keys:
        assert [s for s, _ in scalars[k]] == [1, 2, 3, 4], k
        assert all(same(value, m[k], rel=1e-5) for (_, value), m in zip(scalars[k], metrics)), k
    assert [s for s, _ in scalars["validation/score"]] == [0, 2, 4]


def test_an_uninstalled_tracker_is_a_clear_error_before_anything_runs(assets, tmp_path):
    rec = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(assets / "policy", assets / "data", logging={"report_to": ["wandb"]}))
    run = tmp_path / "run"
    code = ("import sys; sys.modules['wandb'] = None; from teacli.cli import main; "  # find_spec('wandb') is None now
            f"sys.argv = ['tea', 'train', {str(rec)!r}, '--run-dir', {str(run)!r}]; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=tea_env(tmp_path), timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "logging.report_to: wandb is not installed; pip install 'teacli[wandb]'" in proc.stderr
    assert "Traceback" not in proc.stderr and not run.exists()


# -- the recipe keys -----------------------------------------------------------------------------


def test_logging_tensorboard_is_gone_with_a_hint(tmp_path):
    with pytest.raises(RecipeError, match=r"logging\.tensorboard .*report_to: \[tensorboard\]"):
        recipe_from_dict({"logging": {"tensorboard": False}}, runnable=False)
    with pytest.raises(RecipeError, match="names a tracker twice"):
        recipe_from_dict({"logging": {"report_to": ["wandb", "wandb"]}}, runnable=False)
    with pytest.raises(RecipeError, match=r"logging\.report_to\[0\]: 'neptune' is not one of"):
        recipe_from_dict({"logging": {"report_to": ["neptune"]}}, runnable=False)
    assert recipe_from_dict({"logging": {"report_to": []}}, runnable=False).logging.report_to == []
    assert Recipe().logging.report_to is None


def test_default_report_to_is_tensorboard_when_installed(monkeypatch):
    assert progress.resolve_report_to(None) == ["tensorboard"]  # installed by the test extra
    assert progress.resolve_report_to([]) == []
    real = progress.importlib.util.find_spec
    monkeypatch.setattr(progress.importlib.util, "find_spec", lambda name: None if name == "tensorboard" else real(name))
    assert progress.resolve_report_to(None) == []  # earlier behaviour: JSONL only, no error
    with pytest.raises(progress.TrackerError, match=r"pip install 'teacli\[tensorboard\]'"):
        progress.resolve_report_to(["tensorboard"])


# -- the sink's rules on stub trackers -----------------------------------------------------------


class World:
    def __init__(self, rank=0, world_size=1):
        self.rank, self.world_size, self.is_main = rank, world_size, rank == 0


class Stub:
    """A tracker that records what it gets; `fail_at` raises at that metrics step."""

    name, rewinds, fail_at, opened = "wandb", False, None, []

    def __init__(self, run, recipe, state, start):
        self.got, self.status = [], None
        Stub.opened.append(self)

    def metrics(self, step, values):
        if step == self.fail_at:
            raise ConnectionError("tracker server gone")
        self.got.append(("metrics", step, dict(values)))

    def validation(self, step, values):
        self.got.append(("validation", step, dict(values)))

    def close(self, status):
        self.status = status


def sink_for(tmp_path, monkeypatch, start=0, **logging):
    monkeypatch.setitem(progress._OPEN, "wandb", Stub)  # wandb itself is installed: the name check passes
    recipe = recipe_from_dict({"logging": {"report_to": ["wandb"], **logging}}, runnable=False)
    return progress.MetricsSink(RunDir(tmp_path), recipe, World(), start)


def test_sink_logs_numbers_and_skips_steps_logged_before_a_resume(tmp_path, monkeypatch):
    Stub.opened = []
    sink = sink_for(tmp_path, monkeypatch)
    sink.validation({"step": 0, "score": 0.5, "rule": "mean of top-2", "prompts": 4})
    for step in (1, 2, 3):
        sink.write({"step": step, "reward_mean": step / 10, "skipped_prompts": 0})
    sink.close()
    first = Stub.opened[0]
    assert first.got[0] == ("validation", 0, {"score": 0.5, "prompts": 4.0})  # strings are not plotted
    assert [g[1] for g in first.got[1:]] == [1, 2, 3] and first.status == "FINISHED"

    # Resumed from a checkpoint at step 1: steps 2 and 3 are re-run; this tracker already has them.
    RunDir(tmp_path).truncate_after(RunDir(tmp_path).metrics, 1)
    sink = sink_for(tmp_path, monkeypatch, start=1)
    for step in (2, 3, 4):
        sink.write({"step": step, "reward_mean": step / 10})
    sink.close()
    assert [g[1] for g in Stub.opened[1].got] == [4]
    assert [r["step"] for r in jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]  # the file is always whole


def test_a_failing_tracker_is_dropped_with_one_warning_and_metrics_stay_complete(tmp_path, monkeypatch, capsys):
    Stub.opened, Stub.fail_at = [], 2
    try:
        sink = sink_for(tmp_path, monkeypatch)
        for step in (1, 2, 3):
            sink.write({"step": step, "reward_mean": 0.1})
        sink.close()
    finally:
        Stub.fail_at = None
    err = capsys.readouterr().err
    assert err.count("the wandb tracker failed at step 2") == 1 and "ConnectionError" in err
    assert [g[1] for g in Stub.opened[0].got] == [1]
    assert [r["step"] for r in jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert json.loads((tmp_path / "trackers.json").read_text())["wandb"]["metrics_step"] == 1


def test_close_records_a_failed_run(tmp_path, monkeypatch):
    Stub.opened = []
    sink = sink_for(tmp_path, monkeypatch)
    with pytest.raises(RuntimeError):
        try:
            raise RuntimeError("the run failed")
        finally:
            sink.close()
    assert Stub.opened[0].status == "FAILED"


def test_per_rank_lines_are_written_by_rank_zero_and_cut_on_resume(tmp_path):
    recipe = recipe_from_dict({"logging": {"report_to": [], "per_rank": True}}, runnable=False)
    sink = progress.MetricsSink(RunDir(tmp_path), recipe, World(), 0)
    for step in (1, 2):
        sink.write({"step": step, "reward_mean": 0.5}, local={"step": step, "reward_mean": 0.25})
    lines = jsonl(tmp_path / "ranks.jsonl")
    assert [(r["step"], r["rank"], r["reward_mean"]) for r in lines] == [(1, 0, 0.25), (2, 0, 0.25)]
    assert all(r["host"] for r in lines)
    progress.MetricsSink(RunDir(tmp_path), recipe, World(), 1)  # resumed at step 1
    assert [r["step"] for r in jsonl(tmp_path / "ranks.jsonl")] == [1]
    # Another rank writes nothing (its row reaches rank 0 through the gather).
    other = progress.MetricsSink(RunDir(tmp_path / "r1"), recipe, World(rank=1, world_size=1), 0)
    other.write({"step": 1, "reward_mean": 0.5})
    assert not (tmp_path / "r1").exists()


def test_trackers_that_cannot_start_are_clear_errors(tmp_path, monkeypatch):
    import wandb

    recipe = recipe_from_dict({"logging": {"report_to": ["wandb"]}}, runnable=False)

    def no_login(**kwargs):
        raise wandb.errors.UsageError("api_key not configured (no-tty)")

    monkeypatch.setattr(wandb, "init", no_login)
    with pytest.raises(progress.TrackerError, match=r"wandb could not start a run \(UsageError: api_key not configured.*wandb login"):
        progress.MetricsSink(RunDir(tmp_path), recipe, World(), 0)

    import socket

    with socket.socket() as s:  # a tracking server that is not there
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    recipe = recipe_from_dict({"logging": {"report_to": ["mlflow"]}}, runnable=False)
    (tmp_path / "a").mkdir()
    with pytest.raises(progress.TrackerError, match=rf"mlflow could not start a run at {uri} \(MlflowException: .*MLFLOW_TRACKING_URI"):
        progress.MetricsSink(RunDir(tmp_path / "a"), recipe, World(), 0)

    # A resume whose tracking URI changed would start a second run silently: refused, saying what to do.
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "trackers.json").write_text(json.dumps({"mlflow": {"run_id": "abc", "tracking_uri": "file:/elsewhere"}}))
    with pytest.raises(progress.TrackerError, match=r"MLflow run abc is in file:/elsewhere, but the tracking URI is now .*delete the mlflow entry"):
        progress.MetricsSink(RunDir(tmp_path / "b"), recipe, World(), 1)
