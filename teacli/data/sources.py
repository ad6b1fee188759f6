"""Where prompts come from: hub datasets, local copies of them, user files, the built-in set.

A source turns raw rows into `Candidate`s (chat messages + the row's origin tag) and knows
its test split, whose prompts are removed from every output split. Hub access goes through
`datasets.load_dataset` with pinned names, data dirs and revisions; `--input` /
`--test-input` point at local copies of the same rows instead (offline machines, tests).

Row schemas (those of the hub releases):
- `openbmb/UltraFeedback` train: `instruction` (str), `source` (str), `completions`
  (list of {"overall_score", ...}).
- `HuggingFaceH4/ultrafeedback_binarized` test_prefs: `prompt` (str).
- `Anthropic/hh-rlhf` (helpful-*): `chosen` (str transcript "\\n\\nHuman: ...\\n\\nAssistant: ...").
- files / builtin: a prompt column (str) or a messages column (list of {"role", "content"}).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teacli.data.errors import DataError
from teacli.data.readers import BadRow, Row, check_input, read_rows

ROLES = ("system", "user", "assistant")


class RowError(ValueError):
    """One row cannot be turned into a prompt (counted as undecodable, not fatal)."""


@dataclass
class Candidate:
    messages: list[dict[str, str]]  # raw, not yet normalized; ends with a user turn
    origin: str = ""  # the row's sub-source: UltraFeedback `source`, hh-rlhf data dir, ...
    rated: bool | None = None  # UltraFeedback: has >= 2 completions with a score (None: not checked)
    meta: dict[str, Any] = field(default_factory=dict)  # carried into the record (e.g. constraints)


@dataclass(frozen=True)
class HubSplit:
    """One `datasets.load_dataset(name, data_dir=..., split=..., revision=...)` call."""

    name: str
    split: str
    revision: str
    data_dir: str | None = None

    def describe(self) -> str:
        sub = f"/{self.data_dir}" if self.data_dir else ""
        return f"{self.name}{sub} [{self.split}] @ {self.revision}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "data_dir": self.data_dir, "split": self.split, "revision": self.revision}


# ---------------------------------------------------------------------------- row parsers


def _as_messages(value: Any) -> list[dict[str, str]]:
    """A prompt cell (str, or a list of {role, content}) → messages ending with a user turn.

    Trailing assistant turns are dropped: a conversation that already contains the answer
    is prompted up to its final assistant turn, like hh-rlhf.
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if hasattr(value, "tolist"):  # numpy arrays from parquet/pandas
        value = value.tolist()
    if not isinstance(value, list) or not value:
        raise RowError(f"expected a string or a non-empty list of messages, got {type(value).__name__}")
    messages = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in ROLES:
            raise RowError(f"malformed message {str(m)[:60]!r} (need role in {ROLES} and string content)")
        messages.append({"role": m["role"], "content": m["content"]})
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages or messages[-1]["role"] != "user":
        raise RowError("conversation has no final user turn")
    return messages


_HH_TURN = re.compile(r"(?:^|\n\n)(Human|Assistant):")


def parse_hh_transcript(text: Any) -> list[dict[str, str]]:
    """An hh-rlhf transcript → the messages before the final assistant turn.

    Consecutive turns of the same speaker (rare in the release) are merged so that roles
    alternate, as chat templates require.
    """
    if not isinstance(text, str):
        raise RowError(f"transcript is {type(text).__name__}, not a string")
    parts = _HH_TURN.split(text)
    if parts[0].strip():
        raise RowError("text before the first 'Human:' turn")
    turns: list[dict[str, str]] = []
    for speaker, content in zip(parts[1::2], parts[2::2]):
        role = "user" if speaker == "Human" else "assistant"
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] += "\n\n" + content
        else:
            turns.append({"role": role, "content": content})
    if len(turns) < 2 or turns[0]["role"] != "user" or turns[-1]["role"] != "assistant":
        raise RowError("transcript is not Human ... Assistant turns ending with an assistant turn")
    return turns[:-1]


def _scored(completions: Any) -> int:
    if hasattr(completions, "tolist"):
        completions = completions.tolist()
    if not isinstance(completions, list):
        return 0
    n = 0
    for c in completions:
        try:
            float(c["overall_score"])  # "N/A" and missing scores do not count
            n += 1
        except (TypeError, KeyError, ValueError):
            pass
    return n


# ---------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Source:
    name: str
    train_splits: tuple[HubSplit, ...]
    test_splits: tuple[HubSplit, ...]
    train_column: str | None  # None: resolved per run (files)
    test_column: str | None
    default_sizes: tuple[int | None, int, int]  # (train, val, heldout); train None = all the rest
    default_exclude: tuple[str, ...] = ()  # fnmatch patterns over Candidate.origin
    extension: str | None = None  # builtin: a packaged file of further prompts for evaluation only (the heldout_ext split)
    packaged: str | None = None  # the pool is this file of teacli/data/builtin/ (no --input; `data.dir: NAME` prepares it into the cache)

    @property
    def hub(self) -> bool:
        return bool(self.train_splits)


UF_REVISION = "40b436560ca83a8dba36114c22ab3c66e43f6d5e"  # the one the binarized release pins (overall_score fix)

SOURCES: dict[str, Source] = {
    "ultrafeedback": Source(
        name="ultrafeedback",
        train_splits=(HubSplit("openbmb/UltraFeedback", "train", UF_REVISION),),
        test_splits=(HubSplit("HuggingFaceH4/ultrafeedback_binarized", "test_prefs", "main"),),
        train_column="instruction",
        test_column="prompt",
        default_sizes=(34_994, 512, 2_000),
        default_exclude=("truthful_qa", "flan_v2_*"),
    ),
    "hh-helpful": Source(
        name="hh-helpful",
        train_splits=tuple(
            HubSplit("Anthropic/hh-rlhf", "train", "main", d)
            for d in ("helpful-base", "helpful-online", "helpful-rejection-sampled")
        ),
        test_splits=tuple(
            HubSplit("Anthropic/hh-rlhf", "test", "main", d)
            for d in ("helpful-base", "helpful-online", "helpful-rejection-sampled")
        ),
        train_column="chosen",
        test_column="chosen",
        default_sizes=(121_079, 512, 250),
    ),
    "files": Source("files", (), (), None, None, default_sizes=(None, 512, 500)),
    "builtin": Source("builtin", (), (), "messages", None, default_sizes=(160, 32, 48), extension="heldout_ext.jsonl",
                      packaged="prompts.jsonl"),
    # the hard set: the same kinds and subjects with 5-7 constraints a prompt (docs/data.md)
    "builtin-hard": Source("builtin-hard", (), (), "messages", None, default_sizes=(176, 32, 128), packaged="hard.jsonl"),
}
PACKAGED = tuple(name for name, s in SOURCES.items() if s.packaged)  # data.dir values prepared into the cache

FILE_COLUMN_GUESSES = ("messages", "prompt")
CARRIED_META = ("constraints",)  # files/builtin columns copied into the records


def resolve_column(source: Source, requested: str | None, columns: list[str], where: str, test: bool) -> str:
    """The column to read prompts from; an error lists the columns that exist."""
    present = ", ".join(sorted(columns)) or "(none)"
    column = requested or (source.test_column if test else source.train_column)
    if column is None:
        column = next((c for c in FILE_COLUMN_GUESSES if c in columns), None)
        if column is None:
            raise DataError(
                f"{where}: no 'messages' or 'prompt' column; columns present: {present}. "
                "Name the prompt column with --prompt-column COL."
            )
    if column not in columns:
        raise DataError(f"{where}: column {column!r} not found; columns present: {present}")
    return column


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: Any) -> str | None:
    """The first surrogate code point in any string inside `value` (str, dict, list), else None. JSON decodes a
    valid pair (\\ud83d\\ude00) into one character, so one left in a str is half a pair: not Unicode text, which
    cannot be encoded as UTF-8 (prompt_id and the written splits would raise UnicodeEncodeError)."""
    if isinstance(value, str):
        m = _SURROGATE.search(value)
        return m.group() if m else None
    items = list(value.items()) if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _lone_surrogate(item)
        if found:
            return found
    return None


def make_extractor(source: Source, column: str, origin: str) -> Callable[[Row], Candidate]:
    """A function turning one raw row into a Candidate (raises RowError, also for text that is not Unicode)."""
    parse = _make_parser(source, column, origin)

    def extract(row: Row) -> Candidate:
        cand = parse(row)
        bad = _lone_surrogate([cand.messages, cand.meta, cand.origin])
        if bad:
            raise RowError(f"text holds a lone surrogate {bad!r} (half of a UTF-16 pair, e.g. a JSON \\u{ord(bad):04x} "
                           "escape without its other half): not valid Unicode text")
        return cand

    return extract


def _make_parser(source: Source, column: str, origin: str) -> Callable[[Row], Candidate]:
    if source.name == "hh-helpful":
        return lambda row: Candidate(parse_hh_transcript(row.get(column)), origin=origin)

    def extract(row: Row) -> Candidate:
        value = row.get(column)
        if value is None:
            raise RowError(f"column {column!r} is missing or null")
        if isinstance(value, str) and source.name == "files" and value.lstrip().startswith("[{"):
            try:  # csv stores a messages list as JSON text
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        cand = Candidate(_as_messages(value), origin=str(row.get("source") or origin))
        if source.name == "ultrafeedback" and "completions" in row:
            cand.rated = _scored(row["completions"]) >= 2
        for key in CARRIED_META:
            if (source.name == "files" or source.packaged) and row.get(key) is not None:
                cand.meta[key] = row[key]
        return cand

    return extract


def hh_origin(path: Path) -> str:
    """hh-rlhf local copies keep the data dir as the parent folder (helpful-base/train.jsonl.gz)."""
    return path.parent.name if path.parent.name.startswith("helpful-") else ""


# ---------------------------------------------------------------------------- row streams


@dataclass(frozen=True)
class Stream:
    """One input: a local file or a hub split, streamed as (where, row | BadRow)."""

    label: str
    origin: str
    rows: Callable[[], Iterator[tuple[str, Row | BadRow]]]
    path: Path | None = None  # a local file (None: a hub split or the built-in set)


def file_stream(source: Source, path: Path) -> Stream:
    check_input(path)
    origin = hh_origin(path) if source.name == "hh-helpful" else ""
    return Stream(path.name, origin, lambda: read_rows(path), path)


def builtin_stream(name: str = "prompts.jsonl") -> Stream:
    """A packaged file of teacli/data/builtin/: prompts.jsonl (the pool) or the extension's file."""
    from importlib.resources import files

    resource = files("teacli.data").joinpath("builtin", name)

    def rows() -> Iterator[tuple[str, Row | BadRow]]:
        for lineno, line in enumerate(resource.read_text(encoding="utf-8").split("\n"), start=1):
            if line.strip():
                yield f"builtin/{name}:{lineno}", json.loads(line)

    return Stream(f"builtin/{name}", "", rows)


def hub_stream(split: HubSplit, hint: str) -> Stream:
    """Load a hub split now (so offline failures surface before any work) and stream it."""
    try:
        import datasets

        ds = datasets.load_dataset(split.name, data_dir=split.data_dir, split=split.split, revision=split.revision)
    except Exception as e:  # offline, missing revision, auth: all say the same thing to the user
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise DataError(
            f"could not load {split.describe()} from the Hugging Face hub ({type(e).__name__}: {reason}). "
            f"On an offline machine, download a copy elsewhere and pass it with {hint} "
            "(see docs/data.md, 'Offline use')."
        ) from e

    def rows() -> Iterator[tuple[str, Row | BadRow]]:
        for i, row in enumerate(ds):
            yield f"{split.describe()}#{i}", row

    return Stream(split.describe(), split.data_dir or "", rows)


def resolve_revision(split: HubSplit) -> str | None:
    """The commit a hub revision pointed to when loaded (best effort; None offline)."""
    try:
        from huggingface_hub import HfApi

        return HfApi().dataset_info(split.name, revision=split.revision).sha
    except Exception:
        return None
