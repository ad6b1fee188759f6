"""tea's cache directory, and the one reader of the `TEA_CACHE` setting.

`TEA_CACHE` names the directory; `~` and `~user` are expanded (a value quoted in a shell, `TEA_CACHE='~/tc'`,
reaches tea unexpanded), and an empty value counts as unset, so `TEA_CACHE=` means the default `~/.cache/tea`
rather than the current directory. Everything written to the cache (converted `pypi:` models, prepared
built-in prompt sets, rehearsal stand-ins) finds its directory through `cache_dir()`.
Imports nothing of teacli (docs/architecture.md import rule).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

VARIABLE = "TEA_CACHE"


def cache_setting() -> str | None:
    """`TEA_CACHE` as the user set it, or None when it is unset or empty."""
    return os.environ.get(VARIABLE) or None


def cache_dir() -> Path:
    """tea's cache: $TEA_CACHE with `~` expanded, else ~/.cache/tea."""
    value = cache_setting()
    return Path(value).expanduser() if value is not None else Path.home() / ".cache" / "tea"


@contextlib.contextmanager
def waiting_for(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `lock` (created, kept) while the block runs, waiting for another process
    that holds it: what fills one cache entry in place (a built-in prompt set) runs in one process at a time, so
    four runs a study starts at once do not write the same files together. flock: the kernel drops the lock when
    its holder dies (kill -9 included). Off POSIX, no lock."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
