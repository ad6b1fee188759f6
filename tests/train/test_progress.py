"""The training progress bar reports on stderr: stdout carries results only (docs/cli.md)."""

from teacli.train.progress import Progress


def test_progress_bar_and_step_lines_go_to_stderr(capsys):
    bar = Progress(total=2, start=0, enabled=True, name="tiny")
    bar.update({"step": 1, "reward_mean": 0.5, "reward_max": 0.9, "kl": 0.01, "time_step": 1.5})
    bar.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert "step 1: reward 0.5000 (max 0.9000)  kl 0.0100  1.5s/step" in err


def test_off_a_terminal_no_rich_bar_and_a_validation_says_what_it_does(capsys, monkeypatch):
    import time

    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setenv("TEA_PROGRESS_EVERY", "30")
    bar = Progress(total=2, start=0, enabled=True, name="tiny")
    bar.stage("step 0 validation", 0, 128, "16 prompts × 8 samples")
    for t, done in ((10, 32), (20, 64), (41, 96), (50, 128)):
        clock[0] = 100.0 + t
        bar.stage("step 0 validation", done, 128)
    bar.update({"step": 1, "reward_mean": 0.5, "reward_max": 0.9, "kl": 0.01, "time_step": 1.5})
    bar.close()
    assert capsys.readouterr().err.splitlines() == [
        "step 0 validation: 16 prompts × 8 samples, 128 sequences",  # when it starts
        "step 0 validation: 32/128 sequences (25%), 10s elapsed",  # the first progress
        "step 0 validation: 96/128 sequences (75%), 41s elapsed",  # 30 s after the last line
        "step 0 validation: 128/128 sequences (100%), 50s elapsed",  # complete
        "step 1: reward 0.5000 (max 0.9000)  kl 0.0100  1.5s/step",  # and no bar drawn at the end
    ]


def test_on_a_terminal_a_validation_is_a_second_bar_removed_when_done(monkeypatch):
    import io

    from rich.console import Console

    out = io.StringIO()
    monkeypatch.setattr("rich.console.Console", lambda stderr=True: Console(file=out, force_terminal=True, width=120))
    bar = Progress(total=2, start=0, enabled=True, name="tiny")
    bar.stage("step 0 validation", 0, 8, "2 prompts × 4 samples")
    assert [t.description for t in bar.bar.tasks] == ["tiny", "step 0 validation"]
    bar.stage("step 0 validation", 8, 8)
    assert [t.description for t in bar.bar.tasks] == ["tiny"]
    bar.close()
    assert "step 0 validation:" not in out.getvalue()  # no plain lines on a terminal
