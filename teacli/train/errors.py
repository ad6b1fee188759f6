"""The errors `tea train` reports: TrainError (one line, exit 2) and Interrupted (Ctrl-C, exit 130)."""

from __future__ import annotations

from teacli.rundir import RunDir


class TrainError(RuntimeError):
    """A training problem the user can act on (named cause and recipe key)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while training; its text says where the run stopped and from which step a rerun resumes."""

    def __init__(self, run: RunDir, step: int, phase: str):
        latest = run.latest_checkpoint()
        then = (f"; to resume from its last checkpoint, step {latest[0]}" if latest
                else ", before its first checkpoint; to start again from step 0")
        super().__init__(f"interrupted in step {step} ({phase}) of {run.path}{then}")
