"""End-to-end: the real `tea prepare-data` command (CliRunner in-process, and one subprocess)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from datafixtures import write_jsonl
from typer.testing import CliRunner

from teacli.cli import app

OUTPUTS = ["core250.jsonl", "core500.jsonl", "heldout.jsonl", "manifest.json", "train.jsonl", "val.jsonl"]


def test_cli_files_end_to_end(tmp_path):
    src = write_jsonl(tmp_path / "prompts.jsonl", [{"instruction": f"Describe city number {i}."} for i in range(40)])
    out = tmp_path / "data" / "mine"
    args = ["prepare-data", "files", "--out", str(out), "--input", str(src), "--prompt-column", "instruction",
            "--train-size", "30", "--val-size", "4", "--heldout-size", "6", "--seed", "3"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "eligible" in result.output and "checks: ok" in result.output and "written" in result.output
    assert sorted(p.name for p in out.iterdir()) == OUTPUTS
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["seed"] == 3 and manifest["splits"]["heldout"]["size"] == 6
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "unchanged" in again.output
    clash = CliRunner().invoke(app, args[:-1] + ["4"])
    assert clash.exit_code == 2 and "error:" in clash.output and "--force" in clash.output


def test_cli_bad_input_exits_2_with_message(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", [{"text": "hello"}])
    result = CliRunner().invoke(app, ["prepare-data", "files", "--out", str(tmp_path / "o"), "--input", str(src)])
    assert result.exit_code == 2
    assert "error:" in result.output and "columns present: text" in result.output


def test_cli_builtin_subprocess_and_offline_hub(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    tea = [sys.executable, "-m", "teacli.cli"]
    out = tmp_path / "builtin"
    done = subprocess.run([*tea, "prepare-data", "builtin", "--out", str(out)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    sizes = {k: v["size"] for k, v in json.loads((out / "manifest.json").read_text())["splits"].items()}
    assert sizes == {"train": 160, "val": 32, "heldout": 48, "core250": 48, "core500": 48, "heldout_ext": 144}
    hub = subprocess.run([*tea, "prepare-data", "ultrafeedback", "--out", str(tmp_path / "uf")],
                         capture_output=True, text=True, env=env)
    assert hub.returncode == 2
    assert "error: could not load openbmb/UltraFeedback" in hub.stderr and "--input PATH" in hub.stderr
    assert not (tmp_path / "uf").exists()


def test_cli_import_stays_light():
    code = ("import sys, teacli.cli; heavy = {'datasets', 'torch', 'pyarrow', 'pandas', 'teacli.data.prepare'} "
            "& set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent)


def test_cli_unreadable_input_is_one_line_on_stderr(tmp_path):
    src = tmp_path / "latin1.jsonl"
    src.write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    tea = [sys.executable, "-m", "teacli.cli", "prepare-data", "files", "--out", str(tmp_path / "o")]
    for args, message in (
        (["--input", str(src)], "error: latin1.jsonl: none of its 1 row(s) could be read; the first: latin1.jsonl:1: not UTF-8"),
        (["--input", str(tmp_path)], f"error: input {tmp_path} is a directory"),
        (["--input", str(src), "--val-size", "0"], "error: --val-size must be positive"),
    ):
        proc = subprocess.run([*tea, *args], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith(message), proc.stderr
    assert not (tmp_path / "o").exists()


def test_a_full_disk_or_a_read_only_out_is_one_line_and_leaves_nothing_half_written(tmp_path, monkeypatch):
    """ENOSPC on the third file: exit 2, one `error:` line naming the file, the earlier splits whole (no
    mix of old and new files) and no temporary file, so the rerun is not refused for foreign content
    ('.val.jsonl.tmp is not a prepare-data file'). A read-only --out is one line too (issue 22, item 9)."""
    import errno

    out = tmp_path / "data"
    assert CliRunner().invoke(app, ["prepare-data", "builtin", "--out", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real, calls = Path.write_bytes, []

    def fills_up(self, data):
        calls.append(self.name)
        if len(calls) == 3:
            real(self, data[: len(data) // 2])  # what a full disk leaves: part of the file
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", fills_up)
    res = CliRunner().invoke(app, ["prepare-data", "builtin", "--out", str(out), "--seed", "5", "--force"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out / calls[2].strip('.').removesuffix('.tmp')}: no space left on device")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing replaced, no temporary file
    monkeypatch.setattr(Path, "write_bytes", real)
    again = CliRunner().invoke(app, ["prepare-data", "builtin", "--out", str(out), "--seed", "5", "--force"])
    assert again.exit_code == 0, again.output

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    res = CliRunner().invoke(app, ["prepare-data", "builtin", "--out", str(tmp_path / "new")])
    assert res.exit_code == 2 and res.stderr.strip() == f"error: {tmp_path / 'new'}: read-only file system; write elsewhere"
