"""Reading the splits written by `tea prepare-data` (the only prompt format the trainer and
evaluator need). `dir: builtin` (or `builtin-hard`) names a packaged prompt set, prepared once into the cache.
"""

from __future__ import annotations

import json
from pathlib import Path

from teacli.cache import cache_dir, waiting_for
from teacli.data.errors import DataError
from teacli.types import Prompt


def resolve_data_dir(data_dir: str) -> Path:
    """A prepare-data output directory; 'builtin' prepares the packaged set into the cache once."""
    from teacli.data.sources import PACKAGED

    if data_dir in PACKAGED:
        from teacli.data.prepare import prepare, split_names

        out = cache_dir() / "data" / data_dir
        names = ("manifest.json", *(f"{s}.jsonl" for s in split_names(data_dir)))
        # A cache prepared by an older tea lacks the splits added since (heldout_ext); its other
        # files are rewritten with the same bytes. Runs started together (a study's) prepare it one at a time.
        if not all((out / name).exists() for name in names):
            with waiting_for(out.parent / f".{data_dir}.lock"):
                if not all((out / name).exists() for name in names):
                    prepare(data_dir, out, force=True)
        return out
    path = Path(data_dir)
    if not path.is_dir():
        raise DataError(f"data.dir: {data_dir!r} is not a directory; run `tea prepare-data SOURCE --out {data_dir}` first")
    return path


def split_path(data_dir: str, split: str) -> Path:
    """The file of split `split` in a prepare-data directory; DataError listing the splits there when it is missing."""
    path = resolve_data_dir(data_dir) / f"{split}.jsonl"
    if not path.exists():
        raise DataError(f"split {split!r} not found: {path} (files there: {', '.join(sorted(p.name for p in path.parent.glob('*.jsonl')))})")
    return path


def split_sha256(data_dir: str, split: str) -> str:
    """sha256 of a split's file, as prepare-data's manifest.json records it: it changes when the split is
    prepared again with other content (another --seed, other inputs), and only then."""
    from teacli.data.prepare import sha256_file

    return sha256_file(split_path(data_dir, split))


def load_split(data_dir: str, split: str) -> list[Prompt]:
    path = split_path(data_dir, split)
    prompts = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                prompts.append(Prompt.from_json(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise DataError(f"{path}:{lineno}: not a prompt record ({exc}); rebuild it with `tea prepare-data`") from None
    if not prompts:
        raise DataError(f"{path}: no prompts")
    return prompts
