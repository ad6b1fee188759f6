"""A served reward end to end: `tea serve-rm` started on 127.0.0.1 in the test, `tea train` and `tea eval-bon`
with `reward.kind: remote` against it; the same run as with the local reward, a server that fails and then
recovers, and a server that is gone (a one-line error naming the URL, nothing half-written)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from rewards_for_tests import length_reward  # noqa: E402
from tiny_lm import free_port, tea_env, tiny_recipe, write_recipe  # noqa: E402

SPLIT, M = "tiny", 4


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from tiny_lm import make_assets

    root = make_assets(tmp_path_factory.mktemp("remote_assets"))
    heldout = (root / "data" / "heldout.jsonl").read_text().splitlines()
    (root / "data" / f"{SPLIT}.jsonl").write_text("\n".join(heldout[:3]) + "\n")
    return root


class Server:
    """`tea serve-rm` on a free port of 127.0.0.1 serving `function` (a python reward of tests/)."""

    def __init__(self, tmp: Path, function: str, **env: str):
        recipe = tmp / f"serve-{function.split(':')[1]}.yaml"
        recipe.write_text(f"reward: {{kind: python, function: '{function}'}}\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/get_reward"
        self.proc = subprocess.Popen([sys.executable, "-m", "teacli.cli", "serve-rm", str(recipe), "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=tea_env(tmp, **env))
        deadline = time.time() + 120
        while True:
            assert self.proc.poll() is None and time.time() < deadline, "tea serve-rm did not come up"
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1.0)
                break
            except httpx.TransportError:
                time.sleep(0.2)

    def stop(self) -> str:
        """Ctrl-C; returns the server's stderr (one line per request)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=30)
        return err


def tea(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "teacli.cli", *args], capture_output=True, text=True, env=tea_env(tmp), timeout=600)


def recipe(assets: Path, path: Path, **overrides) -> Path:
    return write_recipe(path, tiny_recipe(
        assets / "policy", assets / "data", optim__steps=2, checkpoint__save_every=2,
        eval={"split": SPLIT, "M": M, "score_batch_size": 4}, **overrides,
    ))


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # a whole training run or two: the slow stage (README's command stays within its budget)
def test_train_and_eval_against_a_served_reward_equal_the_local_reward(assets, tmp_path):
    server = Server(tmp_path, "rewards_for_tests:length_reward")
    try:
        local = tea(tmp_path, "train", str(recipe(assets, tmp_path / "local.yaml")), "--run-dir", str(tmp_path / "local"))
        assert local.returncode == 0, local.stderr[-3000:]
        served = recipe(assets, tmp_path / "remote.yaml", reward={"kind": "remote", "url": server.url, "batch_size": 5, "concurrency": 2})
        proc = tea(tmp_path, "train", str(served), "--run-dir", str(tmp_path / "remote"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        evaluated = tea(tmp_path, "eval-bon", str(tmp_path / "remote"))
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    finally:
        log = server.stop()

    # Same seeds, same rewards: the served run is the local run (timings aside).
    a, b = jsonl(tmp_path / "local" / "metrics.jsonl"), jsonl(tmp_path / "remote" / "metrics.jsonl")
    assert [m["step"] for m in b] == [1, 2]
    for x, y in zip(a, b):
        for key in x:
            if not key.startswith("time_") and key != "tokens_per_s":
                assert x[key] == pytest.approx(y[key], rel=1e-6, abs=1e-9), key
    untimed = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time_")} for r in rows]  # noqa: E731
    assert untimed(jsonl(tmp_path / "local" / "validation.jsonl")) == untimed(jsonl(tmp_path / "remote" / "validation.jsonl"))
    # Requests of at most reward.batch_size rows: a step's 16 responses went as 5 + 5 + 5 + 1.
    sizes = [int(line.split(" rows ")[0].rsplit(" ", 1)[1]) for line in log.splitlines() if "POST /get_reward 200" in line]
    assert max(sizes) == 5 and sizes.count(1) >= 2

    # eval-bon scored every completion on the server: the records' rewards are length_reward's.
    records = jsonl(tmp_path / "remote" / "eval" / f"{SPLIT}-M{M}.jsonl")
    assert len(records) == 3 * M
    expected = length_reward(None, [r["response"] for r in records])
    assert [r["reward"] for r in records] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_a_failing_server_recovers_and_a_dead_one_is_a_clear_error(assets, tmp_path):
    server = Server(tmp_path, "rewards_for_tests:flaky_length_reward", TEA_TEST_FLAKY_CALLS="2")  # two 500s first
    served = recipe(assets, tmp_path / "remote.yaml", reward={"kind": "remote", "url": server.url, "batch_size": 64, "max_retries": 3})
    run = tmp_path / "run"
    try:
        proc = tea(tmp_path, "train", str(served), "--run-dir", str(run))
    finally:
        log = server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("retrying in") == 2 and "HTTP 500" in proc.stderr
    statuses = [line.split("POST /get_reward ")[1].split()[0] for line in log.splitlines() if "POST /get_reward" in line]
    assert statuses[:3] == ["500", "500", "200"] and set(statuses[3:]) == {"200"}
    assert [m["step"] for m in jsonl(run / "metrics.jsonl")] == [1, 2]

    # The server is gone now: evaluation and training stop with one line naming the URL.
    evaluated = tea(tmp_path, "eval-bon", str(run))
    assert evaluated.returncode == 2 and "Traceback" not in evaluated.stderr
    error = [line for line in evaluated.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and f"reward.url {server.url}: no reply after 4 attempts" in error[0]
    records = run / "eval" / f"{SPLIT}-M{M}.jsonl"
    assert not records.exists() or records.read_text() == ""  # nothing half-written
    fresh = tea(tmp_path, "train", str(served), "--run-dir", str(tmp_path / "fresh"))
    assert fresh.returncode == 2 and f"reward.url {server.url}: no reply" in fresh.stderr
    assert not (tmp_path / "fresh" / "metrics.jsonl").exists()
