"""The multi-node path: two "nodes" on 127.0.0.1, each a torchrun agent with one process (`--nnodes 2`,
c10d rendezvous on localhost, gloo), train two ZeRO-2 steps of the tiny model through the real CLI; the
ranks' own metrics (logging.per_rank → ranks.jsonl) agree with each other and with metrics.jsonl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from tiny_lm import free_port, tea_env, tiny_recipe, write_recipe  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from tiny_lm import make_assets

    return make_assets(tmp_path_factory.mktemp("multinode_assets"))


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow  # a whole training run or two: the slow stage (README's command stays within its budget)
def test_two_nodes_train_two_zero2_steps_and_agree(assets, tmp_path):
    rec = write_recipe(tmp_path / "recipe.yaml", tiny_recipe(
        assets / "policy", assets / "data", optim__steps=2, checkpoint__save_every=2, backend__zero_stage=2,
        validation={"prompts": 2, "samples": 2, "top": 1}, logging={"report_to": [], "per_rank": True},
    ))
    run, port = tmp_path / "run", free_port()

    def node(rank: int) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "tea-multinode-test",
               "--rdzv-conf", f"is_host={int(rank == 0)}", "--local-addr", "127.0.0.1", "--max-restarts", "0",
               "-m", "teacli.cli", "train", str(rec), "--run-dir", str(run)]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tea_env(tmp_path))

    nodes = [node(0), node(1)]
    outs = []
    try:
        for proc in nodes:
            outs.append(proc.communicate(timeout=600))
    finally:
        for proc in nodes:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (out, err) in zip(nodes, outs):
        assert proc.returncode == 0, out[-2000:] + err[-4000:]
    assert sum("run directory:" in out for out, _ in outs) == 1  # rank 0 reports, once

    metrics = jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["grad_norm"] > 0 for m in metrics)
    ranks = jsonl(run / "ranks.jsonl")
    assert [(r["step"], r["rank"]) for r in ranks] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for m in metrics:
        pair = [r for r in ranks if r["step"] == m["step"]]
        # Global facts every rank computes alike: one optimizer, one schedule, ZeRO-2's global gradient norm.
        for key in ("lr", "grad_norm"):
            assert pair[0][key] == pytest.approx(pair[1][key], rel=1e-6), key
        # metrics.jsonl is the mean over the two nodes of each rank's own value (the all-reduce across nodes).
        for key in m:
            if key not in ("step", "prompts"):
                assert m[key] == pytest.approx((pair[0][key] + pair[1][key]) / 2, rel=1e-6, abs=1e-9), key
        # ... but for `prompts`, the step's total (P): each node trained on its P/W.
        assert m["prompts"] == pair[0]["prompts"] + pair[1]["prompts"] == 2 and m["optimizer_step"] == m["step"]
    # The nodes scored different prompts (P/W each), so the mean above is a real average of two values.
    assert any(ranks[i]["reward_mean"] != ranks[i + 1]["reward_mean"] for i in (0, 2))
    assert [v["step"] for v in jsonl(run / "validation.jsonl")] == [0, 2]

    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_000002")
