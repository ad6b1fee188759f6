"""The shipped prompt set: 240 unique prompts whose constraints the rule reward accepts."""

import importlib.util
import json
from importlib.resources import files
from pathlib import Path

from teacli.data.normalize import normalize_messages, prompt_id
from teacli.rewards.rule import CONSTRAINTS, RuleReward
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
