"""Row readers for local copies: jsonl (optionally .gz), parquet and csv.

Each reader streams `(where, row)` pairs; `where` is `file:line` (or `file#row`) for error
messages. A row that cannot be decoded is yielded as a `BadRow` so the caller can count it
and show a sample, instead of failing the whole file. pyarrow is imported only for parquet.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teacli.data.errors import DataError

SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet", ".csv")


@dataclass(frozen=True)
class BadRow:
    where: str
    reason: str


Row = dict[str, Any]


def read_rows(path: Path) -> Iterator[tuple[str, Row | BadRow]]:
    """Stream the rows of one local file; the format follows the file name."""
    if not path.is_file():
        raise DataError(f"input file not found: {path}")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json")):
        return _read_jsonl(path)
    if name.endswith(".parquet"):
        return _read_parquet(path)
    if name.endswith(".csv"):
        return _read_csv(path)
    raise DataError(f"unsupported input format: {path.name} (expected one of {', '.join(SUFFIXES)})")


def _read_jsonl(path: Path) -> Iterator[tuple[str, Row | BadRow]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path.name}:{lineno}"
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                yield where, BadRow(where, f"not valid UTF-8 JSON ({e.__class__.__name__})")
                continue
            if not isinstance(row, dict):
                yield where, BadRow(where, f"expected a JSON object, got {type(row).__name__}")
                continue
            yield where, row


def _read_parquet(path: Path) -> Iterator[tuple[str, Row | BadRow]]:
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise DataError(f"cannot read parquet file {path.name}: {e}") from e
    index = 0
    for batch in table.iter_batches(batch_size=2048):
        for row in batch.to_pylist():
            yield f"{path.name}#{index}", row
            index += 1


def _read_csv(path: Path) -> Iterator[tuple[str, Row | BadRow]]:
    data = path.read_bytes()
    try:
        text, lossy = data.decode("utf-8"), False
    except UnicodeDecodeError:
        # csv needs text: replace the bad bytes and report the rows that contain them.
        text, lossy = data.decode("utf-8", errors="replace"), True
    reader = csv.DictReader(io.StringIO(text, newline=""))
    for row in reader:
        where = f"{path.name}:{reader.line_num}"
        if None in row or any(v is None for v in row.values()):
            yield where, BadRow(where, "wrong number of fields")
        elif lossy and any("\ufffd" in v for v in row.values()):
            yield where, BadRow(where, "not valid UTF-8")
        else:
            yield where, row
