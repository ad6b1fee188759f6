"""prepare('files'): column handling, bad rows, nesting at scale, the output-directory rules."""

import json

import pytest
from datafixtures import write_jsonl, write_parquet

from teacli.data import DataError, prepare


def read_ids(path):
    return [json.loads(l)["id"] for l in path.read_text().splitlines()]


def read_records(out, *splits):
    return [json.loads(line) for split in splits for line in (out / f"{split}.jsonl").read_text().splitlines()]


def test_core_sets_nest_inside_heldout(tmp_path):
    rows = [{"prompt": f"Write a limerick about the number {i}."} for i in range(600)]
    src = write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "out"
    m = prepare("files", out, inputs=[src], train_size=50, val_size=10, heldout_size=520).manifest
    held, c250, c500 = (read_ids(out / f"{n}.jsonl") for n in ("heldout", "core250", "core500"))
    assert (len(held), len(c250), len(c500)) == (520, 250, 500)
    assert c250 == c500[:250] and c500 == held[:500]  # prefixes of one seeded order
    assert m["splits"]["core500"]["capped"] is False and m["unused"] == 20


def test_files_default_train_is_the_rest(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Prompt {i}"} for i in range(30)])
    m = prepare("files", tmp_path / "out", inputs=[src], val_size=5, heldout_size=5).manifest
    assert m["splits"]["train"]["size"] == 20 and m["unused"] == 0
    with pytest.raises(DataError, match="eligible pool has 30 prompts"):
        prepare("files", tmp_path / "out2", inputs=[src])  # defaults: val 512 + heldout 500


def test_messages_column_and_constraints_are_kept(tmp_path):
    rows = [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."},
                      {"role": "assistant", "content": "Blue."}], "constraints": [{"type": "lowercase"}]},
        {"messages": [{"role": "user", "content": "Name a fruit."}], "extra": 1},
    ]
    src = write_parquet(tmp_path / "m.parquet", rows)
    out = tmp_path / "out"
    prepare("files", out, inputs=[src], train_size=1, val_size=1, heldout_size=0)
    recs = {r["messages"][-1]["content"]: r for r in read_records(out, "train", "val")}
    assert recs["Name a color."]["messages"] == [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Name a color."}]  # answer dropped
    assert recs["Name a color."]["constraints"] == [{"type": "lowercase"}]
    assert "extra" not in recs["Name a fruit."] and recs["Name a fruit."]["source"] == "files"


def test_csv_with_named_prompt_column_and_test_overlap(tmp_path):
    (tmp_path / "q.csv").write_text('question,answer\n"What is 2+2?",4\n"Define ""entropy"", briefly.",x\nName a river.,Nile\n')
    (tmp_path / "t.csv").write_text("question\nName a river.\n")
    with pytest.raises(DataError) as e:
        prepare("files", tmp_path / "out", inputs=[tmp_path / "q.csv"], train_size=1)
    assert "no 'messages' or 'prompt' column; columns present: answer, question" in str(e.value)
    assert "--prompt-column" in str(e.value)
    m = prepare("files", tmp_path / "out", inputs=[tmp_path / "q.csv"], test_inputs=[tmp_path / "t.csv"],
                prompt_column="question", train_size=1, val_size=1, heldout_size=0).manifest
    assert m["filters"]["test_overlap"] == 1 and m["filters"]["eligible"] == 2
    texts = [r["messages"][0]["content"] for r in read_records(tmp_path / "out", "train", "val")]
    assert sorted(texts) == ['Define "entropy", briefly.', "What is 2+2?"]


def test_named_column_missing_lists_columns(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", [{"text": "a", "label": 1}])
    with pytest.raises(DataError, match=r"column 'instruction' not found; columns present: label, text"):
        prepare("files", tmp_path / "out", inputs=[src], prompt_column="instruction", train_size=1)


def test_undecodable_rows_are_counted_and_sampled(tmp_path):
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(
        b'{"prompt": "fine one"}\n'
        b'{"prompt": "broken json"\n'
        b'["not", "an", "object"]\n'
        b'{"prompt": "bad bytes \xff\xfe"}\n'
        b'{"prompt": 42}\n'
        b'{"prompt": [{"role": "robot", "content": "x"}]}\n'
        b'\n'
        b'{"prompt": "fine two"}\n'
    )
    s = prepare("files", tmp_path / "out", inputs=[src], train_size=1, val_size=1, heldout_size=0)
    assert s.manifest["filters"]["rows_read"] == 7 and s.manifest["filters"]["undecodable"] == 5
    assert s.manifest["filters"]["eligible"] == 2
    assert s.bad_samples == (
        "mixed.jsonl:2: not valid JSON (Expecting ',' delimiter at column 25)",
        "mixed.jsonl:3: expected a JSON object, got list",
        "mixed.jsonl:4: not UTF-8 (byte 0xff at column 23)",
    )


def test_a_lone_surrogate_is_an_undecodable_row(tmp_path):
    """A JSON "\\ud800" (half of a UTF-16 pair) decoded into a str that cannot be UTF-8: prompt_id raised
    UnicodeEncodeError (a traceback). It is an undecodable row now, in the prompt or in carried columns; a
    valid pair ("\\ud83d\\ude00", one emoji) is fine."""
    src = tmp_path / "s.jsonl"
    src.write_text(
        '{"prompt": "fine one"}\n'
        '{"prompt": "bad \\ud800 text"}\n'
        '{"messages": [{"role": "user", "content": "lone low \\udc00"}]}\n'
        '{"prompt": "carried", "constraints": [{"type": "keyword", "keyword": "\\udfff"}]}\n'
        '{"prompt": "an emoji \\ud83d\\ude00"}\n'
    )
    s = prepare("files", tmp_path / "out", inputs=[src], train_size=1, val_size=1, heldout_size=0)
    assert s.manifest["filters"]["rows_read"] == 5 and s.manifest["filters"]["undecodable"] == 3
    assert s.bad_samples[0] == ("s.jsonl:2: text holds a lone surrogate '\\ud800' (half of a UTF-16 pair, e.g. a JSON "
                                "\\ud800 escape without its other half): not valid Unicode text")
    assert sorted(r["messages"][0]["content"] for r in read_records(tmp_path / "out", "train", "val")) == ["an emoji 😀", "fine one"]


def test_too_long_limit_is_configurable(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x" * 50}, {"prompt": "y" * 10}, {"prompt": "z" * 10}])
    m = prepare("files", tmp_path / "out", inputs=[src], max_prompt_chars=20, train_size=1, val_size=1, heldout_size=0).manifest
    assert m["filters"]["too_long"] == 1 and m["options"]["max_prompt_chars"] == 20


def test_output_directory_rules(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Prompt {i}"} for i in range(10)])
    out = tmp_path / "out"
    kw = dict(inputs=[src], train_size=6, val_size=2, heldout_size=2)
    assert prepare("files", out, **kw).status == "written"
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert prepare("files", out, **kw).status == "unchanged"  # identical content: no-op
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    with pytest.raises(DataError, match=r"already holds different content \(train.jsonl differs, val.jsonl differs.*--force"):
        prepare("files", out, seed=7, **kw)
    assert prepare("files", out, seed=7, force=True, **kw).status == "written"
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"notes.txt is not a prepare-data file"):
        prepare("files", other, **kw)


def test_option_errors(tmp_path):
    with pytest.raises(DataError, match="unknown source 'uf'; choose one of: ultrafeedback, hh-helpful, files, builtin"):
        prepare("uf", tmp_path / "o")
    with pytest.raises(DataError, match="needs at least one --input"):
        prepare("files", tmp_path / "o")
    with pytest.raises(DataError, match="builtin source takes no --input"):
        prepare("builtin", tmp_path / "o", inputs=[tmp_path / "x.jsonl"])
    with pytest.raises(DataError, match="input file not found"):
        prepare("files", tmp_path / "o", inputs=[tmp_path / "missing.jsonl"])
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match="unsupported input format: x.txt"):
        prepare("files", tmp_path / "o", inputs=[tmp_path / "x.txt"])
    with pytest.raises(DataError, match="--val-size must be positive"):
        prepare("builtin", tmp_path / "o", val_size=-1)


# ---------------------------------------------------------------------------- files that cannot be read (issue 14)


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("latin1.jsonl", '{"prompt": "café"}\n{"prompt": "naïve"}\n'.encode("latin-1"),
         r"latin1.jsonl: none of its 2 row\(s\) could be read; the first: latin1.jsonl:1: not UTF-8 \(byte 0xe9 at column 16\)"),
        ("binary.jsonl", bytes(range(256)) * 4, r"binary.jsonl: none of its \d+ row\(s\) could be read; the first: binary.jsonl:1: not valid JSON"),
        ("packed.jsonl", None, r"packed.jsonl: none of its \d+ row\(s\) could be read.*The file looks gzip-compressed"),
        ("objects.jsonl", b'[{"prompt": "a"}, {"prompt": "b"}]\n', r"objects.jsonl:1: expected a JSON object, got list"),
        ("latin1.csv", "prompt\ncafé\nnaïve\n".encode("latin-1"), r"latin1.csv: none of its 2 row\(s\) could be read; the first: latin1.csv:2: not UTF-8"),
        ("numbers.jsonl", b'{"prompt": 1}\n{"prompt": 2}\n', r"numbers.jsonl:1: expected a string or a non-empty list of messages"),
    ],
)
def test_a_file_where_every_row_fails_names_the_first_row_the_cause_and_the_formats(tmp_path, name, data, message):
    import gzip

    src = tmp_path / name
    # gzip's header holds the time of compression: its bytes (and the newlines among them, so the row count) change
    # with the second the test runs in; mtime=0 makes the file the same every run
    src.write_bytes(gzip.compress(b'{"prompt": "hi"}\n', mtime=0) if data is None else data)
    with pytest.raises(DataError, match=message) as e:
        prepare("files", tmp_path / "out", inputs=[src], train_size=1, val_size=1, heldout_size=0)
    assert "prepare-data reads JSON Lines (.jsonl, .jsonl.gz), JSON (.json: an array of objects" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_a_json_array_file_is_read_as_rows(tmp_path):
    src = tmp_path / "rows.json"
    src.write_text(json.dumps([{"prompt": f"Question {i}?"} for i in range(6)] + [["not", "an", "object"]], indent=2))
    s = prepare("files", tmp_path / "out", inputs=[src], train_size=4, val_size=1, heldout_size=1)
    assert s.manifest["filters"]["rows_read"] == 7 and s.manifest["filters"]["eligible"] == 6
    assert s.bad_samples == ("rows.json[6]: expected a JSON object, got list",)
    lines = tmp_path / "lines.json"  # Dataset.to_json's default: JSON Lines under a .json name
    lines.write_text("".join(json.dumps({"prompt": f"Question {i}?"}) + "\n" for i in range(6)))
    assert prepare("files", tmp_path / "out2", inputs=[lines], train_size=4, val_size=1, heldout_size=1).manifest["filters"]["eligible"] == 6


def test_empty_files_directories_and_zero_val_size_are_refused_before_reading(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": f"Prompt {i}"} for i in range(10)])
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "header.csv").write_text("prompt\n")
    (tmp_path / "blank.jsonl").write_text("\n\n  \n")
    for name in ("empty.jsonl", "header.csv", "blank.jsonl"):
        with pytest.raises(DataError, match=rf"^{name} is empty: it holds no rows$"):
            prepare("files", tmp_path / "out", inputs=[good, tmp_path / name], train_size=6, val_size=2, heldout_size=2)
    (tmp_path / "folder").mkdir()
    with pytest.raises(DataError, match=r"input .*folder is a directory; pass the files in it one by one"):
        prepare("files", tmp_path / "out", inputs=[good, tmp_path / "folder"], train_size=6, val_size=2, heldout_size=2)
    with pytest.raises(DataError, match=r"input .*folder is a directory"):
        prepare("files", tmp_path / "out", inputs=[good], test_inputs=[tmp_path / "folder"], train_size=6, val_size=2, heldout_size=2)
    with pytest.raises(DataError, match=r"--val-size must be positive \(training selects checkpoints on the val split\), got 0"):
        prepare("files", tmp_path / "out", inputs=[good], train_size=6, val_size=0, heldout_size=2)
    with pytest.raises(DataError, match=r"--train-size must be positive, got 0"):
        prepare("files", tmp_path / "out", inputs=[good], train_size=0, val_size=2, heldout_size=2)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".json", ".csv"])
def test_a_utf8_byte_order_mark_is_read_past(tmp_path, suffix):
    """Excel and Notepad write a BOM: the first JSONL row must not be lost ("Unexpected UTF-8 BOM") nor the
    CSV's first column renamed '\\ufeffprompt' (issue 22, item 14)."""
    import gzip

    prompts = [f"Question {i}?" for i in range(6)]
    if suffix == ".csv":
        text = "prompt\n" + "".join(f"{p}\n" for p in prompts)
    elif suffix == ".json":
        text = json.dumps([{"prompt": p} for p in prompts])
    else:
        text = "".join(json.dumps({"prompt": p}) + "\n" for p in prompts)
    data = "\ufeff".encode() + text.encode()
    src = tmp_path / f"bom{suffix}"
    src.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    s = prepare("files", tmp_path / "out", inputs=[src], train_size=4, val_size=1, heldout_size=1)
    assert s.manifest["filters"]["eligible"] == 6 and s.bad_samples == ()
    assert sorted(r["messages"][0]["content"] for r in read_records(tmp_path / "out", "train", "val", "heldout")) == prompts


@pytest.mark.parametrize("encoding, shown", [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")])
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_utf16_and_utf32_files_are_refused_by_name_and_encoding(tmp_path, encoding, shown, suffix):
    src = tmp_path / f"wide{suffix}"
    src.write_bytes(("prompt\nHello?\n" if suffix == ".csv" else '{"prompt": "Hello?"}\n').encode(encoding))
    with pytest.raises(DataError, match=rf"^wide{suffix}: {shown} text; prepare-data reads UTF-8: save the file as UTF-8"):
        prepare("files", tmp_path / "out", inputs=[src], train_size=1, val_size=1, heldout_size=0)
