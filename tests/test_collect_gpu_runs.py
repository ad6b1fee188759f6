"""results/gpu/collect.py: records kept without their text, each prompt's best sample kept with it, and
--restore giving run directories back."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

COLLECT = Path(__file__).resolve().parent.parent / "results" / "gpu" / "collect.py"


def test_collect_keeps_each_prompts_best_text_and_restores(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("collect", COLLECT)
    collect = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(collect)
    monkeypatch.setattr(collect, "DEST", tmp_path / "committed")
    run = tmp_path / "runs" / "r-s0"
    (run / "eval").mkdir(parents=True)
    (run / "recipe.yaml").write_text("name: r\n")
    rewards = {"p0": [0.1, 0.7, 0.7, 0.2], "p1": [0.5, 0.4, 0.9, 0.9]}
    rows = [{"prompt_id": p, "sample": j, "reward": r, "tokens": 3 + j, "response": f"{p} answer {j}", "finished": True}
            for p, rs in rewards.items() for j, r in enumerate(rs)]
    (run / "eval" / "val-M4.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval" / "val-M4.run.json").write_text("{}")
    collect.collect(tmp_path / "runs", "r-s0")
    kept = tmp_path / "committed" / "r-s0" / "eval"
    stripped = [json.loads(line) for line in gzip.open(kept / "val-M4.jsonl.gz", "rt")]
    assert stripped == [{k: r[k] for k in ("prompt_id", "sample", "reward", "tokens")} for r in rows]
    best = json.loads(gzip.open(kept / "val-M4.best.json.gz", "rt").read())
    # the highest reward per prompt, the first sample among equals, with its text
    assert [(b["prompt_id"], b["sample"], b["response"]) for b in best] == [("p0", 1, "p0 answer 1"), ("p1", 2, "p1 answer 2")]
    collect.restore(tmp_path / "restored")
    back = tmp_path / "restored" / "r-s0" / "eval"
    assert [json.loads(line) for line in (back / "val-M4.jsonl").read_text().splitlines()] == [
        {**{k: r[k] for k in ("prompt_id", "sample", "reward", "tokens")}, "response": None} for r in rows]
    assert json.loads(gzip.open(back / "val-M4.best.json.gz", "rt").read()) == best
    assert (tmp_path / "restored" / "r-s0" / "recipe.yaml").read_text() == "name: r\n"
