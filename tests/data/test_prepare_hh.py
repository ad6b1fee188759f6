"""prepare('hh-helpful') on local copies laid out like the hh-rlhf repo (helpful-*/train.jsonl.gz)."""

import json

import pytest
from datafixtures import hh, write_jsonl

from teacli.data import DataError, prepare
from teacli.data.sources import RowError, parse_hh_transcript

TRAIN_BASE = [
    hh("How do I learn piano?", "Practice a little every day."),
    hh("Hi there", "Hello! How can I help?", "Recommend a novel about the sea.", "Try Moby-Dick."),
    hh("What's a good stretch for my back?", "Try the cat-cow stretch."),
    hh("How do I learn piano?", "A different answer: take lessons."),  # same prompt → duplicate
    "Some text that is not a transcript",  # undecodable
    hh("Can you help me plan a picnic?", "Sure!", "It is for six people.", "Bring sandwiches."),
]
TRAIN_ONLINE = [
    hh("Give me a fun fact about owls.", "Owls cannot move their eyes."),
    hh("What should I cook tonight?", "How about a stir-fry?"),
    hh("Is tea healthier than coffee?", "Both have benefits."),
]
TEST_BASE = [hh("Hi there", "Hello! How can I help?", "Recommend a novel about the sea.", "Read The Old Man and the Sea.")]


def rows(transcripts):
    return [{"chosen": t, "rejected": t.rsplit("Assistant:", 1)[0] + "Assistant: worse answer"} for t in transcripts]


@pytest.fixture
def hh_files(tmp_path):
    base = write_jsonl(tmp_path / "hh" / "helpful-base" / "train.jsonl.gz", rows(TRAIN_BASE))
    online = write_jsonl(tmp_path / "hh" / "helpful-online" / "train.jsonl.gz", rows(TRAIN_ONLINE))
    test = write_jsonl(tmp_path / "hh" / "helpful-base" / "test.jsonl.gz", rows(TEST_BASE))
    return [base, online], [test]


def test_parse_transcript_keeps_turns_up_to_final_assistant():
    assert parse_hh_transcript(hh("q1", "a1", "q2", "a2")) == [
        {"role": "user", "content": " q1"}, {"role": "assistant", "content": " a1"}, {"role": "user", "content": " q2"},
    ]
    merged = parse_hh_transcript("\n\nHuman: part one\n\nHuman: part two\n\nAssistant: ok")
    assert merged == [{"role": "user", "content": " part one\n\n part two"}]
    for bad in ("no turns at all", hh("only a question"), "\n\nAssistant: starts with the assistant\n\nHuman: q", None):
        with pytest.raises(RowError):
            parse_hh_transcript(bad)


def test_hh_splits_counts_and_sources(hh_files, tmp_path):
    train, test = hh_files
    out = tmp_path / "out"
    s = prepare("hh-helpful", out, inputs=train, test_inputs=test, train_size=4, val_size=1, heldout_size=1)
    m = s.manifest
    assert m["filters"] == {"rows_read": 9, "undecodable": 1, "excluded_source": 0, "unrated": 0, "empty": 0,
                            "too_long": 0, "duplicate": 1, "test_overlap": 1, "eligible": 6}
    assert s.bad_samples == ("train.jsonl.gz:5: text before the first 'Human:' turn",)
    records = [json.loads(l) for f in ("train", "val", "heldout") for l in (out / f"{f}.jsonl").read_text().splitlines()]
    picnic = next(r for r in records if "picnic" in r["messages"][0]["content"])
    assert picnic["messages"] == [
        {"role": "user", "content": "Can you help me plan a picnic?"},
        {"role": "assistant", "content": "Sure!"},
        {"role": "user", "content": "It is for six people."},
    ]
    assert picnic["source"] == "hh-helpful/helpful-base"
    assert {r["source"] for r in records} == {"hh-helpful/helpful-base", "hh-helpful/helpful-online"}
    assert not any("novel" in r["messages"][-1]["content"] for r in records)  # in the test split
    assert [d["data_dir"] for d in m["datasets"]["train"]] == ["helpful-base", "helpful-online", "helpful-rejection-sampled"]
    assert all(d["name"] == "Anthropic/hh-rlhf" and d["loaded_from"] == "local" for d in m["datasets"]["train"])


def test_hh_exclude_a_subset(hh_files, tmp_path):
    train, test = hh_files
    m = prepare("hh-helpful", tmp_path / "out", inputs=train, test_inputs=test, exclude_sources=["helpful-online"],
                train_size=1, val_size=1, heldout_size=1).manifest
    assert m["filters"]["excluded_source"] == 3 and m["filters"]["eligible"] == 3


def test_hh_paper_sizes_need_a_pool_larger_than_the_fixture(hh_files, tmp_path):
    train, test = hh_files
    with pytest.raises(DataError, match=r"eligible pool has 6 prompts.*train 121079 \+ val 512 \+ heldout 250"):
        prepare("hh-helpful", tmp_path / "out", inputs=train, test_inputs=test)
