"""Row readers for local copies: JSON Lines (optionally .gz), JSON, parquet and csv.

Each reader streams `(where, row)` pairs; `where` is `file:line` (or `file#row`) for error
messages. A row that cannot be decoded is yielded as a `BadRow` so the caller can count it
and show a sample, instead of failing the whole file (a file where every row fails is an
error: see prepare.py). pyarrow is imported only for parquet.

Text is UTF-8, with or without a byte-order mark (Excel and Notepad write one); UTF-16 and UTF-32
files are refused by name. A `.json` file is read as one JSON array of objects (what `json.dump(rows)` and
`Dataset.to_json(lines=False)` write) when it is one, else as JSON Lines (`Dataset.to_json`'s
default); HF `datasets` reads both the same way.
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
FORMATS = (
    "JSON Lines (.jsonl, .jsonl.gz), JSON (.json: an array of objects, or JSON Lines), Parquet (.parquet) "
    "and CSV with a header row (.csv), as UTF-8 text"
)
_MAGIC = {b"\x1f\x8b": "gzip-compressed", b"PAR1": "a Parquet file", b"PK\x03\x04": "a zip archive", b"\x89PNG": "a PNG image"}


def sniff(path: Path) -> str:
    """What a file that failed to parse looks like ('gzip-compressed', ...), or '' when nothing is recognised."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return ""
    if path.name.lower().endswith(".gz") and head.startswith(b"\x1f\x8b"):
        return ""
    return next((what for magic, what in _MAGIC.items() if head.startswith(magic)), "")


@dataclass(frozen=True)
class BadRow:
    where: str
    reason: str


Row = dict[str, Any]


_BOMS = (  # longest first: UTF-32's little-endian mark begins with UTF-16's
    (b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"),
)
UTF8_BOM = b"\xef\xbb\xbf"


def check_encoding(path: Path, head: bytes) -> None:
    """DataError naming the file for UTF-16 or UTF-32 text (its byte-order mark, or two printable ASCII
    characters each beside a NUL byte: UTF-16 without one); a UTF-8 byte-order mark is fine (readers skip it)."""
    found = next((enc for mark, enc in _BOMS if head.startswith(mark)), None)
    if found is None and len(head) >= 4:
        for text, nul in ((head[0::2], head[1::2]), (head[1::2], head[0::2])):  # little-endian, big-endian
            if nul == b"\0\0" and all(32 <= b < 127 for b in text):
                found = "UTF-16"
    if found:
        raise DataError(f"{path.name}: {found} text; prepare-data reads UTF-8: save the file as UTF-8 "
                        f"(e.g. iconv -f {found} -t UTF-8 {path.name})")


def read_rows(path: Path) -> Iterator[tuple[str, Row | BadRow]]:
    """Stream the rows of one local file; the format follows the file name."""
    check_input(path)
    name = path.name.lower()
    if not name.endswith(".parquet"):
        opener = gzip.open if name.endswith(".gz") else open
        try:
            with opener(path, "rb") as f:
                check_encoding(path, f.read(4))
        except (OSError, EOFError) as e:  # a truncated or non-gzip .gz
            raise DataError(f"cannot read {path.name}: {e}") from None
    if name.endswith(".json"):
        return _read_json(path)
    if name.endswith((".jsonl", ".jsonl.gz")):
        return _read_jsonl(path)
    if name.endswith(".parquet"):
        return _read_parquet(path)
    return _read_csv(path)


def check_input(path: Path) -> None:
    """DataError unless `path` is a file of a format read here (checked for every input before any is read)."""
    if path.is_dir():
        raise DataError(f"input {path} is a directory; pass the files in it one by one (--input A --input B ...)")
    if not path.is_file():
        raise DataError(f"input file not found: {path}")
    if not path.name.lower().endswith(SUFFIXES):
        raise DataError(f"unsupported input format: {path.name}; prepare-data reads {FORMATS}")


def _decode_json(raw: bytes) -> tuple[Any, str | None]:
    """(value, None) or (None, why the bytes are not one JSON value)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at column {e.colno})"


def _read_jsonl(path: Path) -> Iterator[tuple[str, Row | BadRow]]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                where = f"{path.name}:{lineno}"
                if lineno == 1:
                    raw = raw.removeprefix(UTF8_BOM)
                if not raw.strip():
                    continue
                row, why = _decode_json(raw.rstrip(b"\r\n"))
                if why is not None:
                    yield where, BadRow(where, why)
                elif not isinstance(row, dict):
                    yield where, BadRow(where, f"expected a JSON object, got {type(row).__name__}")
                else:
                    yield where, row
    except (OSError, EOFError) as e:  # a truncated or non-gzip .gz
        raise DataError(f"cannot read {path.name}: {e}") from None


def _read_json(path: Path) -> Iterator[tuple[str, Row | BadRow]]:
    data = path.read_bytes().removeprefix(UTF8_BOM)
    if not data.lstrip().startswith(b"["):
        yield from _read_jsonl(path)
        return
    rows, why = _decode_json(data)
    if why is not None or not isinstance(rows, list):
        # Not one array: lines that each hold an array, or a broken file. Line by line names the first bad line.
        yield from _read_jsonl(path)
        return
    for i, row in enumerate(rows):
        where = f"{path.name}[{i}]"
        if isinstance(row, dict):
            yield where, row
        else:
            yield where, BadRow(where, f"expected a JSON object, got {type(row).__name__}")


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
    data = path.read_bytes().removeprefix(UTF8_BOM)  # else the first column is named '\ufeffprompt'
    try:
        text, lossy = data.decode("utf-8"), False
    except UnicodeDecodeError:
        # csv needs text: replace the bad bytes and report the rows that contain them.
        text, lossy = data.decode("utf-8", errors="replace"), True
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            where = f"{path.name}:{reader.line_num}"
            if None in row or any(v is None for v in row.values()):
                yield where, BadRow(where, "wrong number of fields")
            elif lossy and any("\ufffd" in v for v in row.values()):
                yield where, BadRow(where, "not UTF-8")
            else:
                yield where, row
    except csv.Error as e:  # e.g. a field over the csv module's size limit: the rest cannot be parsed
        raise DataError(f"{path.name}:{reader.line_num}: not readable as CSV ({e})") from None
