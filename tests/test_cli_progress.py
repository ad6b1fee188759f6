"""Progress where stderr is not a terminal (logs, CI, cluster jobs): plain lines per stage, at the first report,
at most every TEA_PROGRESS_EVERY seconds, and when the stage completes (rich draws nothing there until the end)."""

from __future__ import annotations

import io

import pytest
import typer
from rich.console import Console

from teacli import cli


def bar_with_clock(monkeypatch, every: str | None, label: str = "run-s0"):
    import time

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    if every is None:
        monkeypatch.delenv("TEA_PROGRESS_EVERY", raising=False)
    else:
        monkeypatch.setenv("TEA_PROGRESS_EVERY", every)
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    return cli._LazyBar(console=console, label=label), clock, out


def test_lines_at_the_first_progress_every_30_s_and_at_the_end(monkeypatch):
    bar, clock, out = bar_with_clock(monkeypatch, None)
    bar.update(100, 1000)  # 100 found on disk: no line yet, and not counted as speed
    for t, done in ((10, 200), (29, 300), (31, 400), (45, 500), (61, 700), (70, 1000), (80, 1000)):
        clock[0] = 100.0 + t
        bar.update(done, 1000)
    assert out.getvalue().splitlines() == [
        "run-s0: 200/1,000 (20%), 10s elapsed, ~1m20s left, 10.0/s",  # the first progress: 100 new in 10 s
        "run-s0: 500/1,000 (50%), 45s elapsed, ~56s left, 8.9/s",  # 30 s or more after the last line
        "run-s0: 1,000/1,000 (100%), 1m10s elapsed, 12.9/s",  # complete: printed once, at once
    ]


def test_a_stage_that_does_not_move_still_says_so_every_interval(monkeypatch):
    bar, clock, out = bar_with_clock(monkeypatch, "30")
    bar.update(0, 8)
    clock[0] += 29
    bar.update(0, 8)
    assert out.getvalue() == ""  # an error now would be the only line on stderr
    clock[0] += 1
    bar.update(0, 8)
    assert out.getvalue().splitlines() == ["run-s0: 0/8 (0%), 30s elapsed"]


def test_stages_are_separate_lines_and_zero_means_every_report(monkeypatch):
    bar, clock, out = bar_with_clock(monkeypatch, "0", label="alignment")
    bar.update(0, 4, "pool")
    clock[0] += 2
    bar.update(1, 4, "pool")
    bar.update(0, 10, "gradients")
    assert out.getvalue().splitlines() == [
        "alignment pool: 0/4 (0%), 0s elapsed",
        "alignment pool: 1/4 (25%), 2s elapsed, ~6s left, 0.5/s",
        "alignment gradients: 0/10 (0%), 0s elapsed",
    ]


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_interval_is_one_line(monkeypatch, capsys, value):
    with pytest.raises(typer.Exit) as exc:
        bar_with_clock(monkeypatch, value)
    assert exc.value.exit_code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TEA_PROGRESS_EVERY" in err[0] and repr(value) in err[0]
