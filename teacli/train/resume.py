"""Where `tea train` starts: the run directory's lock, the resume rules, and the run's files, written
once every check has passed (docs/training.md, "One writer" and "Resume"); and where it stops: SIGTERM
taken as Ctrl-C, and the line that says where the run stopped and the command that resumes it (docs/cli.md).

Rank 0 decides and writes; `on_rank0` hands its answer, or its error, to every rank of the launch.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.rundir import RecordError, RunDir, exclusive, finished_evals, step_dir_name, write_text_atomic
from teacli.train.errors import Interrupted, TrainError

if TYPE_CHECKING:
    from teacli.config import Recipe


@dataclass(frozen=True)
class Start:
    """Where a run (re)starts: decided by rank 0 from the run directory before any model is loaded."""

    step: int  # the last complete checkpoint's step; 0 without one
    checkpoint: Path | None  # that checkpoint's directory
    restart: bool  # the run directory holds this run already (recipe.yaml)
    changed: dict[str, tuple[Any, Any]]  # execution keys changed since the last start: key → (before, now)
    data: dict[str, str]  # "train" / "validation" → sha256 of the split's file now
    replaces: tuple[str, ...] = ()  # a start over: the keys of the recipe that an earlier start, which kept nothing, had otherwise

    def note(self, run: RunDir, recipe: "Recipe") -> str:
        """The line a restart prints: from which step, and what changed."""
        where = (f"resuming {run.path} from step {self.step} of {recipe.optim.steps} ({step_dir_name(self.step)})"
                 if self.checkpoint else f"restarting {run.path} from step 0 (it has no checkpoint yet)")
        if self.changed:
            where += "; changed since the last start (resume.jsonl): " + ", ".join(
                f"{k} {a!r} → {b!r}" for k, (a, b) in self.changed.items())
        return where


@contextlib.contextmanager
def run_lock(run: RunDir, world) -> Iterator[None]:
    """Rank 0 holds the run directory's lock while the block runs; a second `tea train` on it stops at once.

    The other ranks of this launch do not take the lock (they would contend with their own rank 0): they
    wait for rank 0's answer and stop with it. A run directory this start created is removed again if it
    is left empty (a check failed before anything was written).
    """
    with contextlib.ExitStack() as stack:

        def lock() -> None:
            if not run.path.exists():
                run.path.mkdir(parents=True)
                stack.callback(_remove_if_empty, run.path)
            busy = f"another `tea train` is writing {run.path} (lock {run.lock.name}); wait for it to finish or stop it"
            stack.enter_context(exclusive(run.lock, busy, TrainError))

        on_rank0(world, lock)
        yield


def _remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def on_rank0(world, fn, *args):
    """fn(*args) on rank 0 only; its result, or its error, reaches every rank, so that all go on or all stop."""
    from teacli.config import RecipeError
    from teacli.data.errors import DataError
    from teacli.train import backend

    result = error = None
    if world.is_main:
        try:
            result = fn(*args)
        except (TrainError, DataError, RecipeError, RecordError) as exc:
            error = str(exc)
    result, error = backend.broadcast_object((result, error))
    if error is not None:
        raise TrainError(error)
    return result


def say(world, text: str) -> None:
    """A line on stderr from rank 0."""
    if world.is_main:
        print(text, file=sys.stderr, flush=True)


def check_run_dir(run: RunDir, recipe: "Recipe") -> Start:
    """Where to start, and whether this recipe may continue the run directory (the resume rules,
    docs/training.md): a change of a key outside config.EXECUTION_KEYS, an optim.steps the run cannot
    take, or a train / val split whose file changed since the run started is a TrainError; a damaged line of
    metrics.jsonl or validation.jsonl (other than a torn last line) a RecordError naming it. Reads only."""
    from teacli.config import canonical_tree, is_execution_key, parse_yaml, recipe_changes, to_yaml
    from teacli.data.load import split_sha256

    d = recipe.data
    data = {}
    if not recipe.rehearsal.enabled:  # a rehearsal's prompts are stand-ins, written the same way every time
        data["train"] = split_sha256(d.dir, d.train_split)
        if recipe.validation.enabled:
            data["validation"] = split_sha256(d.dir, d.val_split)
    if not run.recipe.exists():
        return Start(0, None, False, {}, data)
    before = parse_yaml(run.recipe.read_text(), str(run.recipe)) or {}
    # as this version writes it: a key added since the run started counts at its default, not as a change
    before = canonical_tree(before) or before
    changed = recipe_changes(before, parse_yaml(to_yaml(recipe), "this recipe"))
    defining = [f"{k}: {a!r} in the run, {b!r} now" for k, (a, b) in changed.items() if not is_execution_key(k)]
    if defining and _kept_nothing(run):  # a start that failed before its first checkpoint: the corrected recipe starts over
        return Start(0, None, False, {}, data, tuple(k for k in changed if not is_execution_key(k)))
    if defining:
        raise TrainError(
            f"{run.recipe} holds a different recipe ({'; '.join(defining[:8])}{'; …' if len(defining) > 8 else ''}); "
            f"resume with the same recipe (only execution keys may change, docs/training.md) or choose another --run-dir"
        )
    latest = run.latest_checkpoint()
    step, checkpoint = latest if latest else (0, None)
    for log in (run.metrics, run.ranks):  # every line whole before anything is trained or rewritten (RecordError)
        run.read_jsonl(log)
    _check_records_kept(run, before, step)
    if "optim.steps" in changed:
        _check_steps(recipe, changed["optim.steps"][0], step)
    _check_data(run, recipe, data)
    return Start(step, checkpoint, True, {k: v for k, v in changed.items() if is_execution_key(k)}, data)


def _kept_nothing(run: RunDir) -> bool:
    """Whether the run directory holds nothing a rerun would keep: no complete checkpoint, no validation row of a
    trained step (one is written only with its checkpoint) and nothing under eval/ or judge/. Such a directory is
    what a start that failed after setup leaves (a rehearsal out of memory, a reward that raised): its recipe.yaml
    does not bind the corrected command, which starts over (`commit_run_dir` drops the records of that start)."""
    if run.latest_checkpoint() is not None or any(r["step"] > 0 for r in run.read_jsonl(run.validation)):
        return False
    return not any((run.path / d).is_dir() and any((run.path / d).iterdir()) for d in ("eval", "judge"))


def _check_records_kept(run: RunDir, before: dict[str, Any], step: int) -> None:
    """A run is not trained again from `step` over records that say a later checkpoint existed: a validation
    row after `step` (written once its checkpoint was committed; tea's own pruning keeps the newest) or a
    finished evaluation of a later step. Those checkpoints were removed outside tea (to free disk once the
    run was evaluated, say), and training again would overwrite the run's metrics, validation and selection
    and leave its evaluations describing another training. A run stopped part-way resumes as always (its
    evaluations of steps up to `step` and of the untrained policy stay true)."""
    saved = max((r["step"] for r in run.read_jsonl(run.validation)), default=0)
    evals = [p.relative_to(run.path).as_posix() for p in _finished_evals(run) if _evaluated_step(p) > step]
    if saved <= step and not evals:
        return
    optim = before.get("optim")
    steps = optim.get("steps") if isinstance(optim, dict) else None
    if isinstance(steps, int) and saved >= steps:
        what = f"finished at step {saved} (optim.steps={steps})"
    elif saved > step:
        what = f"checkpointed and validated at step {saved}"
    else:
        what = f"trained past step {step}"
    if evals:
        what += f" and evaluated ({evals[0]}{f' and {len(evals) - 1} more' if len(evals) > 1 else ''})"
    gone = "checkpoints are all gone" if step == 0 else f"checkpoints after step {step} are gone"
    raise TrainError(
        f"{run.path} holds a run {what} whose {gone}: training it again from step {step} would overwrite its "
        f"records; `tea eval-bon` and `tea report` use it as it is; to train again, choose another --run-dir or move "
        f"{run.path} away"
    )


def _finished_evals(run: RunDir) -> list[Path]:
    """The bon.json of every finished evaluation of the run (rundir.finished_evals of eval/ and of each folder in
    it: base/, step_XXXXXX/), eval/'s own first."""
    root = run.path / "eval"
    folders = [root, *sorted(d for d in root.iterdir() if d.is_dir())] if root.is_dir() else []
    return [bon for folder in folders for _, bon in sorted(finished_evals(folder).items())]


def _evaluated_step(bon: Path) -> int:
    """The training step a finished evaluation scored (its bon.json's `checkpoint`); 0 for the untrained
    policy or a file that does not say."""
    try:
        which = json.loads(bon.read_text()).get("checkpoint")
    except (OSError, ValueError, AttributeError):
        return 0
    return which if _is_int(which) else 0


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_steps(recipe: "Recipe", before: int, reached: int) -> None:
    """optim.steps may change on resume when the learning rate does not depend on it, and not below the step reached."""
    o = recipe.optim
    if o.scheduler != "constant":
        raise TrainError(
            f"optim.steps: {before} → {o.steps} would change the learning rate of the steps still to run "
            f"(optim.scheduler: {o.scheduler} decays over optim.steps); keep optim.steps={before}, or train into another --run-dir"
        )
    if o.steps < reached:
        raise TrainError(f"optim.steps={o.steps} is below step {reached}, which the run has reached ({step_dir_name(reached)}); "
                         f"set optim.steps to {reached} or more")


def _check_data(run: RunDir, recipe: "Recipe", data: dict[str, str]) -> None:
    """Each split's file must be the one the run started with (data.json's sha256, written at its first start)."""
    if not run.data.exists():
        return
    try:
        recorded = json.loads(run.data.read_text())
    except json.JSONDecodeError as exc:
        raise TrainError(f"{run.data}: not valid JSON ({exc}); it records the data the run started with") from None
    for name, digest in data.items():
        before = recorded.get(name, {}).get("sha256")  # absent in runs started before it was recorded
        if before is not None and before != digest:
            split = recorded[name].get("split", name)
            raise TrainError(
                f"data.dir {recipe.data.dir}: split {split!r} changed since {run.path} started (sha256 {before[:12]}… in "
                f"{run.data.name}, {digest[:12]}… now; prepared again?); resume with the data the run started with, "
                f"or train into another --run-dir"
            )


def commit_run_dir(run: RunDir, recipe: "Recipe", start: Start, data_report: dict[str, Any]) -> list[str]:
    """Write the run's files, now that every check passed: recipe.yaml (execution keys as they are now),
    data.json (with each split's sha256), a resume.jsonl line on a restart; drop the log lines after the
    checkpoint resumed from, so a step run again is never logged twice. Returns the notes to print (a torn
    last log line dropped)."""
    from teacli.config import to_yaml

    notes: list[str] = []
    run.clean_partial()
    if start.replaces:  # an earlier start of another recipe that kept nothing (_kept_nothing): its records go
        for path in (run.metrics, run.validation, run.ranks, run.resumes, run.selected, run.trackers,
                     run.path / "tail_check_warning.txt", run.path / "reward_error.log"):
            path.unlink(missing_ok=True)
        keys = ", ".join(start.replaces[:6]) + (", …" if len(start.replaces) > 6 else "")
        notes.append(f"{run.path} held an earlier start of another recipe ({keys}) that failed before its first "
                     f"checkpoint: starting over with this recipe")
    run.truncate_after(run.metrics, start.step, notes.append)
    run.truncate_after(run.validation, start.step, notes.append)
    report = {**data_report}
    for name, digest in start.data.items():
        report[name] = {**report[name], "sha256": digest}
    write_text_atomic(run.data, json.dumps(report, indent=2) + "\n")
    write_text_atomic(run.recipe, to_yaml(recipe))
    if start.restart:
        run.append(run.resumes, {"step": start.step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                 "changed": {k: {"before": a, "now": b} for k, (a, b) in start.changed.items()}})
    return notes


def check_selection(run: RunDir, recipe: "Recipe") -> str | None:
    """A restarted run's selected.json must name the checkpoint its validation rows select: a run that stopped
    while choosing (after a checkpoint and its validation row were written) would otherwise keep a stale or
    damaged selection, for good once it is complete. Chosen again and rewritten when it differs; returns the
    line that says so. A damaged validation row is a RecordError naming it."""
    if not recipe.validation.enabled:
        return None
    best = run.selection()
    if best is None:
        return None
    try:
        recorded = run.read_selected()
    except RecordError as exc:
        recorded, why = None, f"{run.selected.name} was damaged ({str(exc).partition(': ')[2].partition(';')[0]})"
    else:
        why = (f"{run.selected.name} named step {recorded['step']}" if recorded else f"{run.selected.name} was missing")
    if recorded and recorded["step"] == best["step"] and recorded["path"] == best["path"]:
        return None
    write_text_atomic(run.selected, json.dumps(best, indent=2) + "\n")
    return (f"{why}, but the validation rows ({run.validation.name}) select step {best['step']} (score "
            f"{best['score']:.4f}): rewrote {run.selected} (the run stopped while choosing its checkpoint?)")


# ------------------------------------------------------------------------------------------------
# Stopping: SIGTERM as Ctrl-C, and the command that resumes


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[list[int]]:
    """While the block runs, SIGTERM (kill, a cluster's scheduler) stops training as Ctrl-C does: a KeyboardInterrupt.
    Yields a one-item list holding the signal that stopped it (SIGINT until a SIGTERM came), for the exit code
    128 + N. A second SIGTERM is not caught; off the main thread, signals stay as they are."""
    stopped_by = [int(signal.SIGINT)]

    def on_sigterm(signum: int, frame: Any) -> None:
        stopped_by[0] = signum
        signal.signal(signal.SIGTERM, previous)  # a second one is not caught
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGTERM)
    previous = signal.SIG_DFL if previous is None else previous  # None: a handler not set from Python
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: signals stay as they are
        previous = None
    try:
        yield stopped_by
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def resume_line(exc: KeyboardInterrupt, recipe: str, overrides: Sequence[str], run_dir: Path) -> str:
    """What a stopped `tea train RECIPE --set ...` prints: where it stopped (an Interrupted says, once training)
    and the command that resumes it, e.g. `interrupted in step 7 (generation) of runs/x; to resume from its last
    checkpoint, step 6, run: tea train recipe.yaml --run-dir runs/x`."""
    import shlex

    where = str(exc) if isinstance(exc, Interrupted) else f"interrupted while setting up {run_dir} (nothing trained in this attempt); to go on"
    again = ["tea", "train", recipe, *(a for item in overrides for a in ("--set", item)), "--run-dir", str(run_dir)]
    return f"{where}, run: {shlex.join(again)}"
