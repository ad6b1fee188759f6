"""The run directory: the contract between `train`, `eval-bon`, `judge`, `report` and `study`.

Every stage reads and writes run directories through this module, which sits below all of them
and imports only the standard library (docs/architecture.md):

    runs/<name>/recipe.yaml            the fully resolved recipe (what actually ran)
    runs/<name>/metrics.jsonl          one line per training step
    runs/<name>/validation.jsonl       one line per validated checkpoint (step 0 = the untrained policy)
    runs/<name>/selected.json          {"step", "path", "score", "rule"}: the validation-selected checkpoint
    runs/<name>/data.json              per split: its file's sha256 (checked on resume) and the prompts kept and dropped
    runs/<name>/resume.jsonl           one line per restart: the step it resumed from and the execution keys it changed
    runs/<name>/.train.lock            held by the `tea train` that writes the run (rank 0), removed when it ends
    runs/<name>/trackers.json          the experiment trackers' run ids (W&B, MLflow), so a resume continues them
    runs/<name>/ranks.jsonl            with logging.per_rank: one line per rank and step, before averaging
    runs/<name>/checkpoints/step_000025/   HF model + tokenizer + recipe.yaml + trainer/ (resume state)
    runs/<name>/eval/[base/|step_XXXXXX/]<split>-M<M>.{jsonl,bon.json,run.json}, <split>.prompts.jsonl
    runs/<name>/judge/<other-run>-bo<N>.jsonl  (and .<other-run>-bo<N>.lock while a `tea judge` writes it)
    runs/<name>/tail_check_warning.txt  the training tail check's warning, written once (docs/diagnostics.md)

One writer per file: `tea train` holds `.train.lock`, `tea eval-bon` `eval/.<split>-M<M>.lock`,
`tea judge` `judge/.<other-run>-bo<N>.lock` (`exclusive`); a second writer stops at once.
An evaluation is finished when its `<split>-M<M>.bon.json` exists (`finished_evals`).

A checkpoint is written into `checkpoints/.tmp_step_XXXXXX/` and renamed into place once
complete, so a directory named `step_*` is always whole. On resume, metrics and validation lines
past the checkpoint's step are dropped, so a run killed mid-step never duplicates a line.

The step logs (metrics.jsonl, validation.jsonl, ranks.jsonl) are read strictly (`read_log`): every line
a JSON object with an integer `step` (and, in validation.jsonl, a finite `score`). The one exception is a
torn last line (no newline, not JSON: an append stopped by a kill), which a resume drops and says so; any
other damage is a `RecordError` naming the file and line, and nothing is rewritten.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CKPT_PREFIX = "step_"
_FIX = "fix or delete that line (tea writes one JSON object per line), then run the command again"


class RecordError(ValueError):
    """A record file of a run directory that is not as tea writes it; the message names the file (and line)."""


@dataclass(frozen=True)
class Log:
    """A step log as read: its rows, their lines' text, and the torn last line (None when there is none)."""

    rows: list[dict[str, Any]]
    lines: list[str]  # the text of each row's line, without its newline
    torn: str | None
    ends_whole: bool = True  # the file ends with a newline (or is empty): the next append starts a line


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _decode(path: Path, lineno: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RecordError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); {_FIX}") from None


def _row(path: Path, lineno: int, text: str, score: bool) -> dict[str, Any]:
    """One line of a step log, checked: a JSON object with an integer step >= 0 (and a finite score)."""
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path}:{lineno}: not a JSON line ({exc}); {_FIX}") from None
    if not isinstance(row, dict):
        raise RecordError(f"{path}:{lineno}: expected a JSON object, got {text.strip()[:40]}; {_FIX}")
    step = row.get("step")
    if not _is_int(step) or step < 0:
        got = "no 'step'" if "step" not in row else f"'step' {step!r}"
        raise RecordError(f"{path}:{lineno}: a row needs an integer 'step' >= 0, this one has {got}; {_FIX}")
    if score:
        value = row.get("score")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            got = "no 'score'" if "score" not in row else f"'score' {value!r}"
            raise RecordError(f"{path}:{lineno}: a validation row needs a finite number 'score', this one (step {step}) "
                              f"has {got}; {_FIX}")
    return row


def read_log(path: Path, score: bool = False) -> Log:
    """A step log's rows (`score`: validation.jsonl's rows need a finite score). Blank lines are skipped; a
    last line with no newline that is not JSON is torn (an append stopped by a kill) and returned apart;
    any other line that is not a row as tea writes it is a RecordError naming the file and line."""
    path = Path(path)
    if not path.exists():
        return Log([], [], None)
    pieces = path.read_bytes().split(b"\n")
    rows, lines, torn = [], [], None
    for lineno, raw in enumerate(pieces, 1):
        if not raw.strip():
            continue
        if lineno == len(pieces):  # the bytes after the last newline (none in a whole file)
            try:
                json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                torn = raw.decode("utf-8", errors="replace")
                continue
        text = _decode(path, lineno, raw)
        rows.append(_row(path, lineno, text, score))
        lines.append(text)
    return Log(rows, lines, torn, pieces[-1] == b"")


_BON_FILE = re.compile(r"^(?P<split>.+)-M(?P<M>\d+)\.bon\.json$")


def step_dir_name(step: int) -> str:
    return f"{CKPT_PREFIX}{step:06d}"


def parse_checkpoint_spec(spec: str) -> int | str:
    """'selected' | 'base' | 'step_N' | 'N' → 'selected', 'base' or the step number.

    Raises ValueError naming the spec for anything else.
    """
    if spec in ("selected", "base"):
        return spec
    text = spec[len(CKPT_PREFIX):] if spec.startswith(CKPT_PREFIX) else spec
    if not text.isdigit():
        raise ValueError(f"--checkpoint {spec!r}: expected selected, base or step_N (e.g. step_25)")
    return int(text)


def eval_dir(run: Path, checkpoint: int | str) -> Path:
    """Where a checkpoint's evaluation files live: eval/ (the validation-selected checkpoint),
    eval/base/ (the untrained policy) or eval/step_XXXXXX/ (an explicitly chosen step)."""
    which = parse_checkpoint_spec(checkpoint) if isinstance(checkpoint, str) else checkpoint
    if which == "selected":
        return Path(run) / "eval"
    if which == "base":
        return Path(run) / "eval" / "base"
    return Path(run) / "eval" / step_dir_name(int(which))


def finished_evals(directory: Path) -> dict[tuple[str, int], Path]:
    """(split, M) → bon.json of every finished evaluation in an eval directory: `tea eval-bon` writes
    `<split>-M<M>.bon.json` last, once every record is there, so records without it are unfinished."""
    if not Path(directory).is_dir():
        return {}
    found = {}
    for p in Path(directory).iterdir():
        m = _BON_FILE.match(p.name)
        if m and p.is_file():
            found[(m["split"], int(m["M"]))] = p
    return found


@contextlib.contextmanager
def exclusive(lock: Path, busy: str, error: type[Exception] = RuntimeError) -> Iterator[None]:
    """Hold an exclusive lock on the file `lock` (created) while the block runs; `error(busy)` at once
    when another process holds it. The lock file is removed on the way out.

    flock: the kernel drops the lock when its holder dies (kill -9 included), so a stale file never
    blocks. After locking, the file must still be the one at `lock`: a holder that was removing it
    meanwhile leaves an unlinked file behind, and locking that would let two writers in.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    while True:
        f = open(lock, "a")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise error(busy) from None
        try:
            same = os.path.samestat(os.fstat(f.fileno()), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()  # lost the race with a holder removing it: lock the new file
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        f.close()


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """An OSError raised inside names `path` when it names no file itself (a failed write() or fsync()
    does not), so the CLI's one-line error says where the disk was full or read-only."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to a temporary file beside `path`, then rename it into place. A failed write
    (a full disk) leaves `path` as it was and removes the temporary file."""
    tmp = path.with_name(f".{path.name}.tmp")
    with writing(path):
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.filename == str(tmp):
                exc.filename = str(path)  # the file the user knows
            raise


def with_traceback_file(message: str, details: str, path: Path) -> str:
    """`message`, naming `path` after writing `details` (e.g. the user's traceback) there; the message alone when
    there is nothing to write or it cannot be written (the error it reports matters more)."""
    if not details:
        return message
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, details)
    except OSError:
        return message
    return f"{message} (its traceback: {path})"


# What `tea train` and the other stages write into a run directory (besides hidden temporary and lock files).
RUN_FILES = frozenset({
    "recipe.yaml", "metrics.jsonl", "validation.jsonl", "selected.json", "data.json", "trackers.json", "ranks.jsonl",
    "checkpoints", "eval", "judge", "tensorboard", "wandb", "tail_check_warning.txt", "reward_error.log",
})


def check_run_dir_path(path: Path) -> None:
    """ValueError unless `path` can be a run directory: absent, empty, or one that holds a recipe.yaml or
    only what tea writes. A file, or a folder of other files (a foreign metrics.jsonl would be appended
    to), is refused before anything is written."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"run directory {path} is a file; give a directory (--run-dir)")
    if not path.is_dir() or (path / "recipe.yaml").is_file():
        return
    foreign = sorted(p.name for p in path.iterdir() if p.name not in RUN_FILES and not p.name.startswith("."))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ValueError(f"{path} holds files that tea did not write ({shown}) and no recipe.yaml: it is not a run "
                         "directory; choose a new or empty --run-dir")


class RunDir:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.metrics = self.path / "metrics.jsonl"
        self.validation = self.path / "validation.jsonl"
        self.selected = self.path / "selected.json"
        self.recipe = self.path / "recipe.yaml"
        self.trackers = self.path / "trackers.json"
        self.data = self.path / "data.json"
        self.ranks = self.path / "ranks.jsonl"
        self.resumes = self.path / "resume.jsonl"
        self.lock = self.path / ".train.lock"

    # -- checkpoints ------------------------------------------------------------------------
    def complete_checkpoints(self) -> list[tuple[int, Path]]:
        if not self.checkpoints.is_dir():
            return []
        found = []
        for d in self.checkpoints.iterdir():
            if d.is_dir() and d.name.startswith(CKPT_PREFIX) and (d / "trainer_state.json").exists():
                found.append((int(d.name[len(CKPT_PREFIX):]), d))
        return sorted(found)

    def latest_checkpoint(self) -> tuple[int, Path] | None:
        found = self.complete_checkpoints()
        return found[-1] if found else None

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / step_dir_name(step)

    def tmp_checkpoint(self, step: int) -> Path:
        return self.checkpoints / f".tmp_{step_dir_name(step)}"

    def commit_checkpoint(self, step: int) -> Path:
        tmp, final = self.tmp_checkpoint(step), self.checkpoint(step)
        if final.exists():  # a re-run of the same step after resume: replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def clean_partial(self) -> None:
        if self.checkpoints.is_dir():
            for d in self.checkpoints.glob(".tmp_*"):
                shutil.rmtree(d, ignore_errors=True)

    def prune(self, keep_last: int | None) -> None:
        if keep_last is None:
            return
        keep_step = self.read_selected().get("step") if self.selected.exists() else None
        found = self.complete_checkpoints()
        for step, path in found[:-keep_last]:
            if step != keep_step:
                shutil.rmtree(path, ignore_errors=True)

    # -- jsonl logs -------------------------------------------------------------------------
    def append(self, path: Path, record: dict[str, Any]) -> None:
        with writing(path), open(path, "a") as f:
            f.write(json.dumps(record, sort_keys=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def truncate_after(self, path: Path, step: int, note: Callable[[str], None] | None = None) -> int:
        """Drop lines whose step is > `step`, and a torn last line (said through `note`); returns lines kept.
        A damaged line elsewhere is a RecordError and the file is left as it was."""
        if not path.exists():
            return 0
        log = read_log(path, score=path == self.validation)
        kept = [line for row, line in zip(log.rows, log.lines) if row["step"] <= step]
        if log.torn is not None and note is not None:
            note(f"{path}: dropped its last line, cut short ({len(log.torn)} characters with no newline: a write "
                 "stopped by a kill)")
        if log.torn is not None or len(kept) < len(log.rows) or not log.ends_whole:
            write_text_atomic(path, "".join(k + "\n" for k in kept))
        return len(kept)

    def read_jsonl(self, path: Path) -> list[dict[str, Any]]:
        """A step log's rows (`read_log`: a torn last line is left out, other damage is a RecordError)."""
        return read_log(path, score=path == self.validation).rows

    # -- selection --------------------------------------------------------------------------
    def read_selected(self) -> dict[str, Any]:
        """selected.json ({} when absent), checked: a JSON object with an integer `step` and a string `path`."""
        if not self.selected.exists():
            return {}
        how = "rerun `tea train` on the run to choose again, or pass --checkpoint step_N"
        try:
            sel = json.loads(self.selected.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise RecordError(f"{self.selected}: not UTF-8 text ({exc.reason} at byte {exc.start}); {how}") from None
        except json.JSONDecodeError as exc:
            raise RecordError(f"{self.selected}: not valid JSON ({exc}); {how}") from None
        if not isinstance(sel, dict):
            raise RecordError(f"{self.selected}: expected a JSON object {{\"step\", \"path\", ...}}, got "
                              f"{type(sel).__name__} {json.dumps(sel)[:40]}; {how}")
        if not _is_int(sel.get("step")) or not isinstance(sel.get("path"), str):
            bad = [k for k, ok in (("step", _is_int(sel.get("step"))), ("path", isinstance(sel.get("path"), str))) if not ok]
            raise RecordError(f"{self.selected}: needs an integer 'step' and a string 'path' (the selected checkpoint's "
                              f"directory), got {', '.join(f'{k}={sel.get(k)!r}' for k in bad)}; {how}")
        return sel

    def selection(self) -> dict[str, Any] | None:
        """The validated checkpoint with the highest score (earliest on ties) among those still on disk, as
        selected.json records it; None when there is none. Reads validation.jsonl strictly (RecordError)."""
        rows = [r for r in self.read_jsonl(self.validation) if self.checkpoint(r["step"]).exists()]
        if not rows:
            return None
        best = max(rows, key=lambda r: (r["score"], -r["step"]))
        return {
            "step": best["step"],
            "path": f"checkpoints/{step_dir_name(best['step'])}",
            "score": best["score"],
            "rule": best.get("rule", ""),
        }

    def update_selection(self) -> dict[str, Any] | None:
        """selected.json ← `selection()`."""
        sel = self.selection()
        if sel is not None:
            write_text_atomic(self.selected, json.dumps(sel, indent=2) + "\n")
        return sel
