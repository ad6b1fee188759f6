"""prepare('ultrafeedback') on local copies: every filter, disjointness, nesting, determinism."""

import json
from pathlib import Path

import pytest
from datafixtures import UF_GOOD, binarized_test_rows, uf_rows, write_jsonl, write_parquet

from teacli.data import DataError, prepare
from teacli.data.normalize import normalize_messages, prompt_id

SIZES = dict(train_size=8, val_size=2, heldout_size=2)


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run(uf_files, out, **kw):
    train, test = uf_files
    return prepare("ultrafeedback", out, inputs=[train], test_inputs=[test], **{**SIZES, **kw})


def test_filters_are_counted_one_by_one(uf_files, tmp_path):
    m = run(uf_files, tmp_path / "out").manifest
    assert m["filters"] == {
        "rows_read": 20, "undecodable": 0, "excluded_source": 2, "unrated": 1, "empty": 1,
        "too_long": 1, "duplicate": 1, "test_overlap": 2, "eligible": 12,
    }
    assert m["test_split"] == {"rows_read": 3, "undecodable": 0, "prompts": 3}
    assert m["options"]["exclude_sources"] == ["truthful_qa", "flan_v2_*"]


def test_records_and_disjoint_nested_splits(uf_files, tmp_path):
    out = tmp_path / "out"
    m = run(uf_files, out).manifest
    splits = {name: read(out / f"{name}.jsonl") for name in ("train", "val", "heldout", "core250", "core500")}
    assert [len(splits[n]) for n in ("train", "val", "heldout")] == [8, 2, 2]
    ids = {n: [r["id"] for r in rows] for n, rows in splits.items()}
    assert not set(ids["train"]) & set(ids["val"]) and not set(ids["train"]) & set(ids["heldout"])
    assert not set(ids["val"]) & set(ids["heldout"])
    assert ids["core250"] == ids["core500"] == ids["heldout"]  # capped: held-out has only 2
    assert {k: m["splits"]["core500"][k] for k in ("size", "requested", "capped")} == {"size": 2, "requested": 500, "capped": True}
    assert m["checks"] == {
        "overlaps": {"train&val": 0, "train&heldout": 0, "val&heldout": 0},
        "disjoint": True, "cores_nested_in_heldout": True, "test_overlap_in_outputs": 0,
    }
    # every eligible prompt appears once; records carry id, messages, source
    everything = splits["train"] + splits["val"] + splits["heldout"]
    assert sorted(r["messages"][0]["content"] for r in everything) == sorted(t for _, t in UF_GOOD)
    rec = next(r for r in everything if r["messages"][0]["content"] == UF_GOOD[0][1])
    assert rec == {"id": prompt_id(rec["messages"]), "messages": [{"role": "user", "content": UF_GOOD[0][1]}],
                   "source": "ultrafeedback/evol_instruct"}
    code = next(r for r in everything if "def reverse" in r["messages"][0]["content"])
    assert "\n        ..." in code["messages"][0]["content"]  # indentation survives normalization
    # test-split prompts (up to whitespace) are gone
    test_ids = {prompt_id(normalize_messages([{"role": "user", "content": r["prompt"]}])) for r in binarized_test_rows()}
    assert not test_ids & {r["id"] for r in everything}


def test_manifest_hashes_match_files(uf_files, tmp_path):
    import hashlib

    out = tmp_path / "out"
    m = run(uf_files, out).manifest
    for entry in m["splits"].values():
        assert hashlib.sha256((out / entry["file"]).read_bytes()).hexdigest() == entry["sha256"]
    assert json.loads((out / "manifest.json").read_text()) == m
    train_in = m["inputs"]["train"][0]
    assert train_in["file"] == "ultrafeedback-train.parquet" and len(train_in["sha256"]) == 64
    assert m["datasets"]["train"] == [{
        "name": "openbmb/UltraFeedback", "data_dir": None, "split": "train",
        "revision": "40b436560ca83a8dba36114c22ab3c66e43f6d5e", "loaded_from": "local", "resolved_revision": None,
    }]
    assert m["datasets"]["test"][0]["name"] == "HuggingFaceH4/ultrafeedback_binarized"
    assert m["datasets"]["test"][0]["split"] == "test_prefs"


def test_reruns_are_byte_identical_and_independent_of_input_order(uf_files, tmp_path):
    run(uf_files, tmp_path / "a")
    run(uf_files, tmp_path / "b")
    for name in ("train.jsonl", "val.jsonl", "heldout.jsonl", "core250.jsonl", "core500.jsonl", "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # reversed rows (jsonl this time): same prompts in the same splits
    rev = write_jsonl(tmp_path / "in" / "reversed.jsonl", uf_rows()[::-1])
    prepare("ultrafeedback", tmp_path / "c", inputs=[rev], test_inputs=[uf_files[1]], **SIZES)
    for name in ("train", "val", "heldout"):
        assert {r["id"] for r in read(tmp_path / "a" / f"{name}.jsonl")} == {r["id"] for r in read(tmp_path / "c" / f"{name}.jsonl")}


def test_seed_changes_the_split_but_not_train_size(uf_files, tmp_path):
    run(uf_files, tmp_path / "s0")
    run(uf_files, tmp_path / "s0small", train_size=5)
    run(uf_files, tmp_path / "s1", seed=1)
    held = lambda d: (tmp_path / d / "heldout.jsonl").read_bytes()  # noqa: E731
    assert held("s0") == held("s0small")  # the held-out set does not depend on the train size
    assert held("s0") != held("s1")
    m = json.loads((tmp_path / "s0small" / "manifest.json").read_text())
    assert m["unused"] == 3 and m["splits"]["train"]["size"] == 5


def test_exclude_source_option(uf_files, tmp_path):
    m = run(uf_files, tmp_path / "none", exclude_sources=["none"], train_size=10).manifest
    assert m["filters"]["excluded_source"] == 0 and m["filters"]["eligible"] == 14
    m = run(uf_files, tmp_path / "sg", exclude_sources=["sharegpt"], train_size=5).manifest
    # 7 sharegpt rows (4 eligible ones + the duplicate, unrated and empty rows): the source filter
    # runs first; truthful_qa and flan come back because the list replaces the default
    assert m["filters"]["excluded_source"] == 7
    assert m["filters"]["duplicate"] == 0 and m["filters"]["unrated"] == 0 and m["filters"]["empty"] == 0
    assert m["filters"]["eligible"] == 12 - 4 + 2


def test_unscored_completions_count_as_unrated(tmp_path):
    rows = [{"instruction": "Keep me.", "source": "sharegpt",
             "completions": [{"overall_score": 6.0}, {"overall_score": "7"}]},
            {"instruction": "Drop me.", "source": "sharegpt",
             "completions": [{"overall_score": 6.0}, {"overall_score": "N/A"}]},
            {"instruction": "No completions column: kept (filter needs it).", "source": "sharegpt"}]
    train = write_jsonl(tmp_path / "uf.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "other"}])
    m = prepare("ultrafeedback", tmp_path / "out", inputs=[train], test_inputs=[test],
                train_size=1, val_size=1, heldout_size=0).manifest
    assert m["filters"]["unrated"] == 1 and m["filters"]["eligible"] == 2


def test_default_sizes_fail_with_pool_size(uf_files, tmp_path):
    train, test = uf_files
    with pytest.raises(DataError) as e:
        prepare("ultrafeedback", tmp_path / "out", inputs=[train], test_inputs=[test])
    msg = str(e.value)
    assert "eligible pool has 12 prompts" in msg
    assert "train 34994 + val 512 + heldout 2000 = 37506" in msg
    assert "--train-size" in msg and "duplicate 1" in msg
    assert not (tmp_path / "out").exists()


def test_explicit_sizes_fail_only_when_they_do_not_fit(uf_files, tmp_path):
    with pytest.raises(DataError, match=r"train 10 \+ val 2 \+ heldout 2 = 14\) do not fit the eligible pool of 12"):
        run(uf_files, tmp_path / "out", train_size=10)
    assert run(uf_files, tmp_path / "ok", train_size=10, val_size=1, heldout_size=1).manifest["unused"] == 0


def test_parquet_and_jsonl_give_the_same_output(uf_files, tmp_path):
    run(uf_files, tmp_path / "pq")
    as_jsonl = write_jsonl(tmp_path / "in" / "uf.jsonl", uf_rows())
    prepare("ultrafeedback", tmp_path / "js", inputs=[as_jsonl], test_inputs=[uf_files[1]], **SIZES)
    for name in ("train.jsonl", "val.jsonl", "heldout.jsonl"):
        assert (tmp_path / "pq" / name).read_bytes() == (tmp_path / "js" / name).read_bytes()


def test_missing_test_column_lists_columns(uf_files, tmp_path):
    bad_test = write_parquet(tmp_path / "in" / "bad_test.parquet", [{"question": "q", "answer": "a"}])
    with pytest.raises(DataError, match=r"column 'prompt' not found; columns present: answer, question"):
        prepare("ultrafeedback", tmp_path / "out", inputs=[uf_files[0]], test_inputs=[bad_test], **SIZES)
