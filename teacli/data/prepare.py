"""`tea prepare-data`: a prompt source → deduplicated, hashed, disjoint splits + manifest.

Pipeline (each step's count goes to the manifest, in this order):

  rows_read → undecodable → excluded_source → unrated → empty → too_long → duplicate
  → test_overlap → eligible pool → seeded split → train / val / heldout (+ core250 ⊂ core500 ⊂ heldout)

The builtin source also writes heldout_ext: its held-out prompts followed by the packaged
evaluation-only prompts (teacli/data/builtin/heldout_ext.jsonl), which are not in the pool, so
adding them left every other split byte for byte as it was.

Paper (Appendix "Training and Evaluation Details", "UltraFeedback splits"; §"HH-helpful dataset
robustness"): disjoint train / validation pool / held-out pool after deduplication and removal of
prompts overlapping the source test split; core250 ⊂ core500 ⊂ held-out, deterministic. Where this
departs from or adds to the paper (source exclusions, the length limit, capped core sets, the
hh-helpful default train size that the train split cannot reach) is documented in docs/data.md.

The split is a pure function of (seed, prompt ids): prompts are ranked by sha256(seed, id), the
first `heldout` go to held-out, the next `val` to validation, the next `train` to training, the
rest are unused. Input order therefore does not matter, and changing the train size never
changes the held-out set. Outputs hold no timestamps or machine paths: reruns are byte-identical.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from teacli.data.errors import DataError
from teacli.data.normalize import normalize_messages, prompt_id
from teacli.data.readers import FORMATS, BadRow, sniff
from teacli.data.sources import (
    SOURCES,
    Candidate,
    RowError,
    Source,
    Stream,
    builtin_stream,
    file_stream,
    hub_stream,
    make_extractor,
    resolve_column,
    resolve_revision,
)
from teacli.types import Prompt

MAX_PROMPT_CHARS = 4096  # all turns together, after normalization (~1k tokens of English)
CORE_SIZES = (250, 500)
SPLITS = ("train", "val", "heldout")
EXT_SPLIT = "heldout_ext"  # sources with an `extension` (builtin): heldout + the extension's prompts
FILTERS = (
    "rows_read",
    "undecodable",
    "excluded_source",
    "unrated",
    "empty",
    "too_long",
    "duplicate",
    "test_overlap",
    "eligible",
)
MANIFEST_FORMAT = "tea-prepare-data/1"
_BAD_SAMPLES = 3


def split_names(source: str | None = None) -> tuple[str, ...]:
    """The splits prepare-data writes for `source` (None: those it writes for every source)."""
    names = (*SPLITS, *(f"core{k}" for k in CORE_SIZES))
    return (*names, EXT_SPLIT) if source is not None and SOURCES[source].extension else names


@dataclass(frozen=True)
class PrepareSummary:
    out: Path
    status: str  # "written" | "unchanged" (identical files were already there)
    manifest: dict[str, Any]
    bad_samples: tuple[str, ...]  # a few "where: reason" lines for undecodable rows


def print_summary(summary: PrepareSummary) -> None:
    """What `tea prepare-data` prints: the filters' counts and the splits as tables and the checks on stdout,
    the skipped undecodable rows on stderr."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    m = summary.manifest
    console = Console()
    filters = Table(title=f"prepare-data {m['source']}: filters")
    filters.add_column("step")
    filters.add_column("prompts", justify="right")
    for step, n in m["filters"].items():
        filters.add_row(step, f"{n:,}")
    console.print(filters)
    splits = Table(title=f"splits (seed {m['options']['seed']}, {m['unused']:,} unused)")
    for col in ("file", "prompts", "sha256"):
        splits.add_column(col, justify="right" if col == "prompts" else "left")
    for entry in m["splits"].values():
        note = " (capped)" if entry.get("capped") else ""
        splits.add_row(entry["file"], f"{entry['size']:,}{note}", entry["sha256"][:16])
    console.print(splits)
    warn = Console(stderr=True)
    for line in summary.bad_samples:
        warn.print(f"[yellow]skipped undecodable row[/yellow] {escape(line)}")
    checks = m["checks"]
    ok = checks["disjoint"] and checks["cores_nested_in_heldout"] and not checks["test_overlap_in_outputs"]
    console.print(f"checks: {'ok' if ok else 'FAILED'} (disjoint splits, cores nested, no test overlap)")
    verb = "unchanged (identical files already there)" if summary.status == "unchanged" else "written"
    console.print(f"{escape(str(summary.out))}: {verb}")


def prepare(
    source: str,
    out: Path,
    *,
    inputs: Sequence[Path] = (),
    test_inputs: Sequence[Path] = (),
    prompt_column: str | None = None,
    train_size: int | None = None,
    val_size: int | None = None,
    heldout_size: int | None = None,
    seed: int = 0,
    max_prompt_chars: int = MAX_PROMPT_CHARS,
    exclude_sources: Sequence[str] | None = None,
    force: bool = False,
) -> PrepareSummary:
    """Build the splits of `source` into `out`; raises DataError for anything the user can fix.

    `exclude_sources`: fnmatch patterns over a row's origin (UltraFeedback `source`, hh-rlhf
    data dir, a files `source` column); None = the source's default, ["none"] = exclude nothing.
    Sizes left None take the source's defaults (the paper's sizes for the hub sources).
    """
    if source not in SOURCES:
        raise DataError(f"unknown source {source!r}; choose one of: {', '.join(SOURCES)}")
    spec = SOURCES[source]
    if max_prompt_chars < 1:
        raise DataError(f"--max-prompt-chars must be positive, got {max_prompt_chars}")
    _check_sizes(train_size, val_size, heldout_size)
    excludes = tuple(spec.default_exclude if exclude_sources is None else exclude_sources)
    if excludes == ("none",):
        excludes = ()
    train_streams, test_streams = _streams(spec, inputs, test_inputs)

    bad: list[str] = []
    test_ids, test_stats = _collect_test_ids(spec, test_streams, prompt_column, bad)
    pool, counts = _collect_pool(spec, train_streams, prompt_column, excludes, max_prompt_chars, test_ids, bad)

    sizes = _resolve_sizes(spec, len(pool), counts, train_size, val_size, heldout_size)
    ranked = sorted(pool, key=lambda p: hashlib.sha256(f"{seed}\x1f{p.id}".encode()).hexdigest())
    h, v, t = sizes["heldout"], sizes["val"], sizes["train"]
    splits: dict[str, list[Prompt]] = {"heldout": ranked[:h], "val": ranked[h : h + v], "train": ranked[h + v : h + v + t]}
    for k in CORE_SIZES:
        splits[f"core{k}"] = splits["heldout"][:k]
    if spec.extension:
        splits[EXT_SPLIT] = splits["heldout"] + _extension(spec, pool, excludes, max_prompt_chars, bad)

    files = {f"{name}.jsonl": _jsonl(splits[name]) for name in split_names(spec.name)}
    manifest = _manifest(
        spec, inputs, test_inputs, splits, files, counts, test_stats,
        unused=len(ranked) - h - v - t,
        options={
            "seed": seed,
            "max_prompt_chars": max_prompt_chars,
            "exclude_sources": list(excludes),
            "prompt_column": prompt_column,
            "sizes_requested": {"train": train_size, "val": val_size, "heldout": heldout_size},
        },
        test_ids=test_ids,
    )
    files["manifest.json"] = (json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    status = _write(out, files, force)
    return PrepareSummary(out=out, status=status, manifest=manifest, bad_samples=tuple(bad))


# ---------------------------------------------------------------------------- inputs


def _streams(spec: Source, inputs: Sequence[Path], test_inputs: Sequence[Path]) -> tuple[list[Stream], list[Stream]]:
    if spec.packaged:
        if inputs or test_inputs:
            raise DataError(f"the {spec.name} source takes no --input / --test-input")
        return [builtin_stream(spec.packaged)], []
    if spec.name == "files" and not inputs:
        raise DataError("the files source needs at least one --input PATH (jsonl, parquet or csv)")
    # Hub splits load eagerly (an offline failure surfaces before any work), train first.
    if inputs:
        train = [file_stream(spec, Path(p)) for p in inputs]
    else:
        hint = "--input PATH" + (" (and the test split with --test-input PATH)" if not test_inputs else "")
        train = [hub_stream(s, hint) for s in spec.train_splits]
    if test_inputs:
        test = [file_stream(spec, Path(p)) for p in test_inputs]
    else:
        test = [hub_stream(s, "--test-input PATH") for s in spec.test_splits]
    return train, test


def _candidates(spec: Source, stream: Stream, prompt_column: str | None, test: bool, bad: list[str], counts: dict[str, int]):
    """Yield Candidates of one stream; undecodable rows are counted and sampled into `bad`.

    An input with no rows, or none that can be read, is a DataError naming it (and its first bad row
    and the cause): it is the wrong file, format or encoding, not a few bad rows among good ones.
    """
    extract = None
    rows = failed = 0
    first_bad = ""
    for where, row in stream.rows():
        counts["rows_read"] += 1
        rows += 1
        if isinstance(row, BadRow):
            counts["undecodable"] += 1
            failed += 1
            first_bad = first_bad or f"{row.where}: {row.reason}"
            _sample(bad, f"{row.where}: {row.reason}")
            continue
        if extract is None:  # the first decodable row fixes the column (missing → clear error)
            requested = prompt_column if (not test or spec.name == "files") else None
            column = resolve_column(spec, requested, list(row), f"{stream.label} ({where})", test)
            extract = make_extractor(spec, column, stream.origin)
        try:
            yield extract(row)
        except RowError as e:
            counts["undecodable"] += 1
            failed += 1
            first_bad = first_bad or f"{where}: {e}"
            _sample(bad, f"{where}: {e}")
    if rows == 0:
        raise DataError(f"{stream.label} is empty: it holds no rows")
    if failed == rows:
        looks = sniff(stream.path) if stream.path is not None else ""
        hint = f" The file looks {looks}." if looks else ""
        raise DataError(
            f"{stream.label}: none of its {rows} row(s) could be read; the first: {first_bad}.{hint} "
            f"prepare-data reads {FORMATS}"
        )


def _sample(bad: list[str], line: str) -> None:
    if len(bad) < _BAD_SAMPLES:
        bad.append(line)


def _collect_test_ids(spec: Source, streams: list[Stream], prompt_column: str | None, bad: list[str]):
    stats = {"rows_read": 0, "undecodable": 0}
    ids: set[str] = set()
    for stream in streams:
        for cand in _candidates(spec, stream, prompt_column, True, bad, stats):
            ids.add(prompt_id(normalize_messages(cand.messages)))
    stats["prompts"] = len(ids)
    return ids, stats


def _collect_pool(
    spec: Source,
    streams: list[Stream],
    prompt_column: str | None,
    excludes: tuple[str, ...],
    max_chars: int,
    test_ids: set[str],
    bad: list[str],
) -> tuple[list[Prompt], dict[str, int]]:
    counts = dict.fromkeys(FILTERS, 0)
    seen: set[str] = set()
    pool: list[Prompt] = []
    for stream in streams:
        for cand in _candidates(spec, stream, prompt_column, False, bad, counts):
            messages = normalize_messages(cand.messages)
            reason = _drop_reason(cand, messages, excludes, max_chars)
            if reason:
                counts[reason] += 1
                continue
            pid = prompt_id(messages)
            if pid in seen:
                counts["duplicate"] += 1
                continue
            seen.add(pid)
            if pid in test_ids:
                counts["test_overlap"] += 1
                continue
            tag = spec.name if cand.origin in ("", spec.name) else f"{spec.name}/{cand.origin}"
            pool.append(Prompt(id=pid, messages=tuple(messages), source=tag, meta=cand.meta))
    counts["eligible"] = len(pool)
    return pool, counts


def _extension(spec: Source, pool: list[Prompt], excludes: tuple[str, ...], max_chars: int, bad: list[str]) -> list[Prompt]:
    """The source's evaluation-only prompts, read and filtered like the pool; none may be a pool prompt."""
    extra, _ = _collect_pool(spec, [builtin_stream(spec.extension)], None, excludes, max_chars, set(), bad)
    ids = {p.id for p in pool}
    clash = [p.id for p in extra if p.id in ids]
    if clash:
        raise DataError(f"builtin/{spec.extension}: {len(clash)} prompt(s) are also in the pool (e.g. {clash[0]}); "
                        "regenerate it with scripts/make_builtin_prompts.py")
    return extra


def _drop_reason(cand: Candidate, messages: list[dict[str, str]], excludes: tuple[str, ...], max_chars: int) -> str | None:
    if any(fnmatch.fnmatchcase(cand.origin, pat) for pat in excludes):
        return "excluded_source"
    if cand.rated is False:
        return "unrated"
    if any(not m["content"] for m in messages):
        return "empty"
    if sum(len(m["content"]) for m in messages) > max_chars:
        return "too_long"
    return None


# ---------------------------------------------------------------------------- sizes


def _check_sizes(train: int | None, val: int | None, heldout: int | None) -> dict[str, int]:
    """The sizes given explicitly, checked before any input is read."""
    explicit = {k: n for k, n in (("train", train), ("val", val), ("heldout", heldout)) if n is not None}
    for name, n in explicit.items():
        if n < 0 or (name in ("train", "val") and n == 0):
            why = " (training selects checkpoints on the val split)" if name == "val" else ""
            raise DataError(f"--{name}-size must be {'non-negative' if name == 'heldout' else 'positive'}{why}, got {n}")
    return explicit


def _resolve_sizes(
    spec: Source, pool: int, counts: dict[str, int], train: int | None, val: int | None, heldout: int | None
) -> dict[str, int]:
    explicit = _check_sizes(train, val, heldout)
    d_train, d_val, d_heldout = spec.default_sizes
    val = d_val if val is None else val
    heldout = d_heldout if heldout is None else heldout
    if train is None:
        train = d_train if d_train is not None else pool - val - heldout
    if train < 1:
        train = 0  # "all the rest" left nothing: report it like any other misfit
    elif train + val + heldout <= pool:
        return {"train": train, "val": val, "heldout": heldout}
    removed = ", ".join(f"{k} {counts[k]}" for k in FILTERS[1:-1] if counts[k])
    detail = f"(rows read {counts['rows_read']}; removed: {removed or 'none'})"
    asked = f"train {train} + val {val} + heldout {heldout} = {train + val + heldout}"
    if explicit:
        raise DataError(f"the requested sizes ({asked}) do not fit the eligible pool of {pool} prompts {detail}")
    fit = pool - val - heldout
    hint = f"e.g. --train-size {fit}" if fit >= 1 else "with --train-size/--val-size/--heldout-size"
    raise DataError(
        f"the eligible pool has {pool} prompts, fewer than the default {spec.name} sizes need ({asked}) "
        f"{detail}. Choose sizes that fit, {hint}."
    )


# ---------------------------------------------------------------------------- outputs


def _jsonl(records: list[Prompt]) -> bytes:
    lines = (json.dumps(r.to_json(), sort_keys=True, ensure_ascii=False, separators=(",", ":")) for r in records)
    return "".join(line + "\n" for line in lines).encode("utf-8")


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks: the manifest's digests, and a run's data.json (data.load.split_sha256)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest(
    spec: Source,
    inputs: Sequence[Path],
    test_inputs: Sequence[Path],
    splits: dict[str, list[Prompt]],
    files: dict[str, bytes],
    counts: dict[str, int],
    test_stats: dict[str, int],
    unused: int,
    options: dict[str, Any],
    test_ids: set[str],
) -> dict[str, Any]:
    def hub_entries(hub_splits, local: bool) -> list[dict[str, Any]]:
        return [
            {**s.to_json(), "loaded_from": "local" if local else "hub",
             "resolved_revision": None if local else resolve_revision(s)}
            for s in hub_splits
        ]

    ids = {name: {p.id for p in splits[name]} for name in SPLITS}
    overlaps = {f"{a}&{b}": len(ids[a] & ids[b]) for a, b in (("train", "val"), ("train", "heldout"), ("val", "heldout"))}
    core_ids = [{p.id for p in splits[f"core{k}"]} for k in CORE_SIZES]
    nested = core_ids[0] <= core_ids[1] <= ids["heldout"]
    all_ids = set().union(*ids.values())
    split_entries: dict[str, Any] = {}
    for name in split_names(spec.name):
        entry: dict[str, Any] = {"file": f"{name}.jsonl", "size": len(splits[name]),
                                 "sha256": hashlib.sha256(files[f"{name}.jsonl"]).hexdigest()}
        if name.startswith("core"):
            requested = int(name[4:])
            entry.update(requested=requested, capped=len(splits[name]) < requested)
        if name == EXT_SPLIT:
            entry["extension"] = len(splits[name]) - len(splits["heldout"])
        split_entries[name] = entry
    checks = {}
    if EXT_SPLIT in splits:  # the extension is held out: in neither train nor val, and heldout ⊂ heldout_ext
        ext_ids = {p.id for p in splits[EXT_SPLIT]}
        checks["heldout_ext_overlaps_train_val"] = len(ext_ids & (ids["train"] | ids["val"]))
        checks["heldout_in_heldout_ext"] = ids["heldout"] <= ext_ids
    return {
        "format": MANIFEST_FORMAT,
        "source": spec.name,
        "datasets": {
            "train": hub_entries(spec.train_splits, bool(inputs)),
            "test": hub_entries(spec.test_splits, bool(test_inputs)),
        },
        "inputs": {
            "train": [{"file": Path(p).name, "sha256": sha256_file(Path(p))} for p in inputs],
            "test": [{"file": Path(p).name, "sha256": sha256_file(Path(p))} for p in test_inputs],
        },
        "options": options,
        "filters": counts,
        "test_split": test_stats,
        "splits": split_entries,
        "unused": unused,
        "checks": {
            "overlaps": overlaps,
            "disjoint": not any(overlaps.values()),
            "cores_nested_in_heldout": nested,
            "test_overlap_in_outputs": len(all_ids & test_ids),
            **checks,
        },
    }


def _write(out: Path, files: dict[str, bytes], force: bool) -> str:
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} exists and is not a directory")
    own_temp = {f".{n}.tmp" for n in files}  # what an interrupted run (kill -9) can leave: overwritten below
    existing = sorted(p.name for p in out.iterdir() if p.name not in own_temp) if out.exists() else []
    changed = [n for n in files if n in existing and (out / n).read_bytes() != files[n]]
    foreign = [n for n in existing if n not in files]
    if not changed and not foreign and all(n in existing for n in files):
        return "unchanged"
    if (changed or foreign) and not force:
        what = [f"{n} differs" for n in changed] + [f"{n} is not a prepare-data file" for n in foreign]
        more = f", and {len(what) - 4} more" if len(what) > 4 else ""
        raise DataError(
            f"{out} already holds different content ({', '.join(what[:4])}{more}); "
            "pass --force to overwrite, or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    # Every file is written aside first, then all are renamed into place: a full disk leaves the old files
    # whole and no temporary file behind (a rerun would take one for foreign content).
    staged = {name: out / f".{name}.tmp" for name in files}
    try:
        for name, data in files.items():
            try:
                staged[name].write_bytes(data)
            except OSError as exc:
                if exc.filename in (None, str(staged[name])):
                    exc.filename = str(out / name)  # a failed write() names no file; name the one the user knows
                raise
        for name, tmp in staged.items():
            os.replace(tmp, out / name)
    finally:
        for tmp in staged.values():
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    return "written"
