"""Completions may contain Unicode line boundaries (U+2028, U+2029, U+0085, \\x1c–\\x1e) that JSON
writes unescaped with ensure_ascii=False. JSONL readers must split on "\\n" only: str.splitlines()
also splits on those, and a model that emitted one made `tea eval-bon` call its own records file
damaged (found on the embedded study's GPU run)."""

from __future__ import annotations

import json

from teacli.eval.bon import append_records, read_records
from teacli.report.read import read_records as report_read_records
from teacli.rundir import RunDir

TEXTS = ["line\u2028separator", "para\u2029graph", "next\x85line", "file\x1csep", "plain"]


def test_records_with_unicode_line_boundaries_round_trip(tmp_path):
    path = tmp_path / "heldout-M5.jsonl"
    records = [{"prompt_id": "p0", "sample": i, "response": t, "reward": float(i), "tokens": 3, "finished": True}
               for i, t in enumerate(TEXTS)]
    append_records(path, records)
    assert len(path.read_text(encoding="utf-8").splitlines()) > len(records)  # the trap: splitlines sees more lines
    back = read_records(path)
    assert [r["response"] for r in back] == TEXTS
    tokens, rewards = report_read_records(path, 5, ["p0"])
    assert rewards["p0"] == [0.0, 1.0, 2.0, 3.0, 4.0] and tokens["p0"] == [3] * 5


def test_run_dir_jsonl_with_unicode_line_boundaries(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir(parents=True)
    path = run.path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i, "note": t}, ensure_ascii=False) + "\n" for i, t in enumerate(TEXTS, 1)),
                    encoding="utf-8")
    assert [r["note"] for r in run.read_jsonl(path)] == TEXTS
    assert run.truncate_after(path, 3) == 3 and [r["step"] for r in run.read_jsonl(path)] == [1, 2, 3]
