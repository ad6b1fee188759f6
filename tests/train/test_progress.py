"""The training progress bar reports on stderr: stdout carries results only (docs/cli.md)."""

from teacli.train.progress import Progress


def test_progress_bar_and_step_lines_go_to_stderr(capsys):
    bar = Progress(total=2, start=0, enabled=True, name="tiny")
    bar.update({"step": 1, "reward_mean": 0.5, "reward_max": 0.9, "kl": 0.01, "time_step": 1.5})
    bar.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert "step 1: reward 0.5000 (max 0.9000)  kl 0.0100  1.5s/step" in err
