"""The shipped prompt set: 240 unique prompts whose constraints the rule reward accepts."""

import importlib.util
import json
from importlib.resources import files
from pathlib import Path

from teacli.data.normalize import normalize_messages, prompt_id
from teacli.rewards.rule import CONSTRAINTS, RuleReward, count_keyword
from teacli.types import Prompt

ROOT = Path(__file__).resolve().parents[2]


def load() -> list[dict]:
    text = files("teacli.data").joinpath("builtin", "prompts.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_builtin_prompts_are_valid_unique_and_cover_every_constraint_type():
    rows = load()
    assert len(rows) == 240
    assert len({r["id"] for r in rows}) == 240
    types = set()
    reward = RuleReward()
    for r in rows:
        assert r["id"] == prompt_id(normalize_messages(r["messages"]))
        assert [m["role"] for m in r["messages"]] == ["user"]
        assert 2 <= len(r["constraints"]) <= 4
        types |= {c["type"] for c in r["constraints"]}
        reward.constraint_scores(Prompt.from_json(r), "some answer")  # validates
    assert types == set(CONSTRAINTS)


def test_builtin_file_matches_its_generator():
    spec = importlib.util.spec_from_file_location("make_builtin_prompts", ROOT / "scripts" / "make_builtin_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build() == files("teacli.data").joinpath("builtin", "prompts.jsonl").read_bytes()


def load_ext() -> list[dict]:
    text = files("teacli.data").joinpath("builtin", "heldout_ext.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def test_heldout_extension_prompts_are_valid_new_and_match_their_generator():
    spec = importlib.util.spec_from_file_location("make_builtin_prompts", ROOT / "scripts" / "make_builtin_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build_heldout_ext() == files("teacli.data").joinpath("builtin", "heldout_ext.jsonl").read_bytes()
    rows, pool = load_ext(), load()
    assert len(rows) == len({r["id"] for r in rows}) == 8 * len(module.KINDS)
    assert not {r["id"] for r in rows} & {r["id"] for r in pool}
    assert not {r["messages"][0]["content"] for r in rows} & {r["messages"][0]["content"] for r in pool}
    reward = RuleReward()
    for r in rows:
        assert r["id"] == prompt_id(normalize_messages(r["messages"])) and r["source"] == "builtin"
        reward.constraint_scores(Prompt.from_json(r), "some answer")


# sha256 of the builtin splits as `tea prepare-data builtin` wrote them before heldout_ext existed: the
# quickstart's and the embedded study's prompts (and so their README / results numbers) must not move.
PINNED = {
    "train.jsonl": "0cbf0cbbdbaa1264cf6b62f03f6157eb8b9fe74bcd1aa05eebba684d42203146",
    "val.jsonl": "51eb4b75d5c6f699a2d36451b1bc9ab28a50ab53750780b7ac92910a2d8381c5",
    "heldout.jsonl": "86b99a5af3ae2052f5f49dcf436b39259dd9ca1d2479db60e02b2924c47453fe",
    "core250.jsonl": "86b99a5af3ae2052f5f49dcf436b39259dd9ca1d2479db60e02b2924c47453fe",
    "core500.jsonl": "86b99a5af3ae2052f5f49dcf436b39259dd9ca1d2479db60e02b2924c47453fe",
}


def test_builtin_heldout_ext_split_extends_heldout_and_leaves_the_other_splits_unchanged(tmp_path):
    import hashlib

    from teacli.data.prepare import prepare

    summary = prepare("builtin", tmp_path / "data")
    out = tmp_path / "data"
    for name, digest in PINNED.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name

    def ids(split: str) -> list[str]:
        return [json.loads(line)["id"] for line in (out / f"{split}.jsonl").read_text().splitlines()]

    heldout, ext = ids("heldout"), ids("heldout_ext")
    assert ext[: len(heldout)] == heldout and ext[len(heldout):] == [r["id"] for r in load_ext()]
    assert len(ext) >= 128 and not set(ext) & (set(ids("train")) | set(ids("val")))
    m = summary.manifest
    assert m["splits"]["heldout_ext"]["size"] == len(ext) and m["splits"]["heldout_ext"]["extension"] == len(load_ext())
    assert m["checks"]["heldout_ext_overlaps_train_val"] == 0 and m["checks"]["heldout_in_heldout_ext"]


def test_an_older_builtin_cache_gets_the_new_split(tmp_path, monkeypatch):
    from teacli.data.load import load_split, resolve_data_dir

    monkeypatch.setenv("TEA_CACHE", str(tmp_path))
    cache = resolve_data_dir("builtin")
    before = {p.name: p.read_bytes() for p in cache.glob("*.jsonl")}
    (cache / "heldout_ext.jsonl").unlink()  # as prepared by a tea without the extension
    assert len(load_split("builtin", "heldout_ext")) == len(before["heldout_ext.jsonl"].splitlines())
    assert {p.name: p.read_bytes() for p in cache.glob("*.jsonl")} == before


def test_the_hard_set_matches_its_generator_and_is_new_valid_and_harder():
    """builtin-hard: the 12 kinds x 28 subjects, each prompt its kind's constraints plus three more (5-7), none
    repeated, none contradicting a required text; no prompt of the other two files."""
    spec = importlib.util.spec_from_file_location("make_builtin_prompts", ROOT / "scripts" / "make_builtin_prompts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build_hard() == files("teacli.data").joinpath("builtin", "hard.jsonl").read_bytes()
    rows = [json.loads(line) for line in files("teacli.data").joinpath("builtin", "hard.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len({r["id"] for r in rows}) == 28 * len(module.KINDS)
    assert not {r["id"] for r in rows} & {r["id"] for r in load() + load_ext()}
    reward = RuleReward()
    for r in rows:
        types = [c["type"] for c in r["constraints"]]
        assert 5 <= len(types) <= 7 and len(set(types)) == len(types), r["id"]
        required = [c["text"] for c in r["constraints"] if c["type"] in ("start_with", "ends_with")]
        if "no_commas" in types:
            assert not any("," in t for t in required), r["id"]
        forbidden = [w for c in r["constraints"] if c["type"] == "forbidden_words" for w in c["words"]]
        keywords = [k for c in r["constraints"] for k in c.get("keywords", [c["keyword"]] if "keyword" in c else [])]
        assert not any(count_keyword(t, w) for w in forbidden for t in required + keywords), r["id"]
        assert r["id"] == prompt_id(normalize_messages(r["messages"]))
        reward.constraint_scores(Prompt.from_json(r), "some answer")


def test_builtin_hard_prepares_into_the_cache_with_its_sizes(tmp_path, monkeypatch):
    from teacli.data.load import load_split, resolve_data_dir

    monkeypatch.setenv("TEA_CACHE", str(tmp_path))
    cache = resolve_data_dir("builtin-hard")
    assert cache == tmp_path / "data" / "builtin-hard"
    sizes = {s: len(load_split("builtin-hard", s)) for s in ("train", "val", "heldout")}
    assert sizes == {"train": 176, "val": 32, "heldout": 128}
    assert all(p.meta["constraints"] for p in load_split("builtin-hard", "heldout"))
    assert not (cache / "heldout_ext.jsonl").exists()  # only the builtin source has the extension
