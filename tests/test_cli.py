"""The real `tea` command line, run as a subprocess."""

import json
import subprocess
import sys


def tea(*args, check=True, cwd=None, env=None):
    proc = subprocess.run([sys.executable, "-m", "teacli.cli", *args], capture_output=True, text=True, cwd=cwd, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"tea {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_help_lists_commands_without_heavy_imports():
    out = tea("--help").stdout
    for command in ("recipes", "diagnose"):
        assert command in out
    probe = "import sys, teacli.cli; print(sorted(m for m in ('torch','transformers','deepspeed','vllm','datasets','scipy') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_recipes_list_json_and_show():
    rows = json.loads(tea("recipes", "list", "--json").stdout)
    by_name = {r["name"]: r for r in rows}
    assert by_name["uf_llama1b_prefix_tea"]["advantage"] == "prefix_tea"
    assert by_name["uf_llama1b_bon_mean_2x"]["m"] == 128
    assert by_name["uf_llama8b_lora_tea"]["lora"] is True
    assert by_name["uf_llama1b_tea_n512"]["n_target"] == 512
    shown = tea("recipes", "show", "uf_llama1b_tea", "--set", "optim.lr=2e-5").stdout
    assert "lr: 2.0e-05" in shown and "name_or_path: meta-llama/Llama-3.2-1B-Instruct" in shown


def test_recipes_validate_reports_bad_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {group_size: 3}\n")
    proc = tea("recipes", "validate", str(bad), check=False)
    assert proc.returncode == 1
    assert "smallest valid m is 5" in proc.stderr and "bad.yaml" in proc.stderr
    assert "recipe(s) valid" in tea("recipes", "validate").stdout


def test_unknown_recipe_name_is_a_clean_error():
    proc = tea("recipes", "show", "no_such_recipe", check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: no recipe file or name 'no_such_recipe'")
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------------
# Conventions (docs/cli.md): one-line errors, exit codes, -h, --version, completion, colour, widths

def one_line_error(proc, code=2):
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_version_short_help_and_shell_completion():
    import teacli

    assert tea("--version").stdout.strip() == f"tea {teacli.__version__}"
    assert "Usage: tea [OPTIONS] COMMAND" in tea("-h").stdout
    assert "Usage: tea recipes show [OPTIONS] {NAME}" in tea("recipes", "show", "-h").stdout
    assert "--install-completion" in tea("--help").stdout
    # Where shellingham can detect a shell, typer makes --show-completion a flag that detects it and ignores "bash":
    # a test run with no shell among its ancestors (started detached) got "Shell  not supported". Typer's own tests'
    # switch makes the option take the shell named.
    import os

    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    script = tea("--show-completion", "bash", env=env).stdout
    assert "_TEA_COMPLETE" in script and "complete " in script


def _commands():
    import typer.main

    from teacli.cli import app

    def walk(group, prefix):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from walk(cmd, [*prefix, name])
            else:
                yield [*prefix, name]

    return list(walk(typer.main.get_command(app), []))


def test_every_help_shows_flags_plainly_and_arguments_in_capitals():
    import re

    from typer.testing import CliRunner

    from teacli.cli import app

    commands = _commands()
    assert ["recipes", "list"] in commands and ["train"] in commands and len(commands) >= 10
    for path in [[], *commands]:
        out = CliRunner().invoke(app, [*path, "--help"], prog_name="tea", env={"COLUMNS": "120"}).output
        assert "<bool>" not in out, (path, out)
        usage = next(line for line in out.splitlines() if "Usage:" in line).split("Usage:")[1]
        arguments = [w for w in re.findall(r"[\[{]?([A-Za-z_]+)[\]}]?(?:\.\.\.)?", usage.split("[OPTIONS]", 1)[-1])]
        assert all(a == a.upper() for a in arguments), (path, usage)


def _broken_sentences(out: str, width: int) -> list[tuple[str, str]]:
    """Pairs of consecutive help lines where the second continues a sentence (starts lowercase, same
    paragraph or table cell) although its first word would have fitted on the first: a line broken by the
    source's wrapping, not by the terminal's width."""
    found = []
    lines = out.splitlines()
    for a, b in zip(lines, lines[1:]):
        panel = a.startswith("│") and b.startswith("│")
        if a.startswith("│") != b.startswith("│"):
            continue
        a_text, b_text = a.strip("│").rstrip(), b.strip("│")
        if not a_text.strip() or not b_text.strip() or "Usage:" in a:
            continue
        a_col = len(a_text) - len(a_text.lstrip())
        b_col = len(b_text) - len(b_text.lstrip())
        word = b_text.split()[0]
        continues = b_col > a_col if panel else b_col == a_col
        fits = len(a_text) + 1 + len(word) + (2 if panel else 0) < width - 1
        if continues and word.lstrip("`'\"(<")[:1].islower() and fits:
            found.append((a.rstrip(), b.rstrip()))
    return found


def test_help_does_not_break_sentences_mid_line_on_a_wide_terminal():
    """Docstrings are wrapped for the source; help re-flows each paragraph to the terminal's width."""
    from typer.testing import CliRunner

    from teacli.cli import app

    for path in [[], *_commands(), ["recipes"], ["diagnose"]]:
        out = CliRunner().invoke(app, [*path, "--help"], prog_name="tea", env={"COLUMNS": "200", "NO_COLOR": "1"}).output
        assert "Usage:" in out, (path, out)
        assert _broken_sentences(out, 200) == [], (path, out)
    # the check itself finds a line the source broke, and not one the terminal's width broke
    assert _broken_sentences(" An unfinished training run\n resumes from its checkpoint.", 200)
    assert not _broken_sentences(" " + "x" * 190 + "\n resumes from its checkpoint.", 200)


def test_no_color_turns_colour_off():
    from typer.testing import CliRunner

    from teacli.cli import app

    args = ["recipes", "show", "no_such_recipe"]
    coloured = CliRunner().invoke(app, args, color=True)
    assert coloured.exit_code == 2 and "\x1b[" in coloured.output  # colour is on for a terminal...
    plain = CliRunner().invoke(app, args, color=True, env={"NO_COLOR": "1"})
    assert plain.exit_code == 2 and "\x1b[" not in plain.output and "error: no recipe" in plain.output  # ...and NO_COLOR wins


def test_recipes_list_is_readable_at_80_columns():
    import os

    env = {**os.environ, "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-m", "teacli.cli", "recipes", "list"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    names = [r["name"] for r in json.loads(tea("recipes", "list", "--json").stdout)]
    for name in names:  # every name whole on one line, not folded
        assert any(f" {name} " in line for line in lines), name
    assert "hidden at this width" in proc.stdout and "--json" in proc.stdout
    wide = subprocess.run([sys.executable, "-m", "teacli.cli", "recipes", "list"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "250"}).stdout
    assert "Llama-3.2-1B-Instruct" in wide and "hidden" not in wide


def test_local_rank_without_a_value_is_a_clean_error():
    line = one_line_error(tea("recipes", "list", "--local_rank", check=False))
    assert "--local_rank expects a GPU index" in line
    assert json.loads(tea("--local_rank=0", "recipes", "list", "--json").stdout)  # the launcher's form still works


def test_directories_and_unreadable_recipes_are_one_line_errors(tmp_path):
    for args in (["recipes", "show", str(tmp_path)], ["train", str(tmp_path)]):
        assert "is a directory, not a recipe file" in one_line_error(tea(*args, check=False))
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    assert "latin.yaml:1: not UTF-8 text" in one_line_error(tea("recipes", "show", str(latin), check=False))
    assert "(set by --set)" in one_line_error(tea("recipes", "show", "quickstart", "--set", "optim.lr=abc", check=False))


def test_recipes_validate_checks_every_file_after_a_bad_one(tmp_path):
    bad_bytes = tmp_path / "a.yaml"
    bad_bytes.write_bytes(b"seed: 1\nname: caf\xe9\n")
    dup = tmp_path / "b.yaml"
    dup.write_text("base: quickstart.yaml\noptim: {lr: 1e-5}\noptim: {steps: 2}\n")
    good = tmp_path / "c.yaml"
    good.write_text("base: quickstart.yaml\noptim: {lr: 2e-5}\n")
    proc = tea("recipes", "validate", str(bad_bytes), str(dup), str(good), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == 2 and "a.yaml:2: not UTF-8" in errors[0] and "b.yaml:3: duplicate key 'optim'" in errors[1]
    assert f"ok       {good}" in proc.stdout


def test_progress_and_warnings_go_to_stderr(tmp_path):
    syn = tea("diagnose", "synthetic", "--m", "128", "256", "--reps", "2", "--bias-reps", "2", "--out", str(tmp_path / "syn"))
    assert syn.stdout.startswith("| Estimator |") and "synthetic" in syn.stderr and "%" not in syn.stdout

    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b"".join(b'{"prompt": "Prompt number %d"}\n' % i for i in range(8)) + b'{"prompt": broken\n')
    prep = tea("prepare-data", "files", "--out", str(tmp_path / "data"), "--input", str(rows),
               "--train-size", "4", "--val-size", "2", "--heldout-size", "2")
    assert "skipped undecodable row rows.jsonl:9" in prep.stderr and "skipped" not in prep.stdout
    assert "written" in prep.stdout


def test_no_progress_bar_is_drawn_before_an_input_error(tmp_path):
    (tmp_path / "a" / "eval").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    one_line_error(tea("eval-bon", str(tmp_path / "b"), check=False))
    one_line_error(tea("judge", str(tmp_path / "a"), str(tmp_path / "b"), "--select", "bo4", "--base-url", "http://127.0.0.1:9/v1", check=False))


def test_recipes_list_imports_neither_torch_nor_scipy():
    """Listing reads the recipes; it does not run the advantage rules (issue 22, item 16: it took 2 s)."""
    probe = (
        "import sys, json\nfrom typer.testing import CliRunner\nfrom teacli.cli import app\n"
        "r = CliRunner().invoke(app, ['recipes', 'list', '--json'])\nassert r.exit_code == 0, r.output\n"
        "assert len(json.loads(r.stdout)) > 10\n"
        "print(sorted(m for m in ('torch', 'scipy', 'transformers') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"



def test_an_unwritable_run_directory_is_one_line_naming_the_file(tmp_path, monkeypatch):
    """A permission error (an unwritable or immutable folder: EACCES, EPERM) is one `error:` line naming the
    file tea meant to write, not its temporary name, exit 2, and no temporary file (issue 22, item 9)."""
    import errno
    from pathlib import Path

    from typer.testing import CliRunner

    from teacli.cli import app

    def immutable(self, *args, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(self))

    run = tmp_path / "base_arm"
    run.mkdir()
    monkeypatch.setattr(Path, "write_text", immutable)
    res = CliRunner().invoke(app, ["eval-bon", str(run), "--recipe", "quickstart", "--checkpoint", "base"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.stderr.strip() == (f"error: {run / 'recipe.yaml'}: operation not permitted; check its permissions and "
                                  "attributes (e.g. lsattr: immutable), or write elsewhere")
    assert list(run.iterdir()) == []


def test_a_vllm_kwarg_tea_sets_itself_stops_train_and_eval_bon_with_one_line(tmp_path):
    line = one_line_error(tea("train", "quickstart", "--set", "rollout.vllm_kwargs={gpu_memory_utilization: 0.5}", check=False))
    assert line == ("error: rollout.vllm_kwargs.gpu_memory_utilization: tea sets vLLM's gpu_memory_utilization itself "
                    "(set by --set): set rollout.gpu_memory_utilization")
    line = one_line_error(tea("eval-bon", str(tmp_path / "run"), "--recipe", "quickstart", "--checkpoint", "base",
                              "--set", "rollout.vllm_kwargs={enforce_eager: true}", check=False))
    assert "rollout.vllm_kwargs.enforce_eager: tea sets vLLM's enforce_eager itself (set by --set): set rollout.compile" in line


def test_a_cache_tea_cannot_create_names_tea_cache(tmp_path, monkeypatch):
    """TEA_CACHE=/proc/x: the error named /proc/x only, never the variable that put the cache there."""
    from typer.testing import CliRunner

    from teacli.cli import app

    monkeypatch.setenv("TEA_CACHE", "/proc/x")
    res = CliRunner().invoke(app, ["eval-bon", str(tmp_path / "arm"), "--recipe", "quickstart", "--checkpoint", "base"])
    assert res.exit_code == 2 and "Traceback" not in res.output and len(res.stderr.strip().splitlines()) == 1, res.output
    assert res.stderr.startswith("error: /proc/x")
    assert ("it is in tea's cache, TEA_CACHE=/proc/x: set TEA_CACHE to a directory tea can create and write (or unset "
            "it for ~/.cache/tea)") in " ".join(res.stderr.split())


def test_a_rehearsal_too_big_for_cpu_is_refused_at_once(tmp_path, monkeypatch):
    """Without CUDA, `tea train uf_llama1b_tea --rehearse` built the 8B reward model's stand-in in host memory and was
    killed minutes later (exit 137, no word): now one line before anything is built, naming what it needs."""
    import torch
    from typer.testing import CliRunner

    from teacli.cli import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    res = CliRunner().invoke(app, ["train", "uf_llama1b_tea", "--rehearse"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    line = " ".join(res.stderr.split())
    assert line.startswith("error: --rehearse runs the recipe's real shapes on GPUs: uf_llama1b_tea needs CUDA "
                           "(policy ~1.2B, reward model ~7.5B parameters;"), line
    assert "use --estimate on a CPU machine (tea train uf_llama1b_tea --estimate)" in line
    assert list(tmp_path.iterdir()) == []  # no run directory, no lock, no stand-in in the cache


def test_estimate_only_options_without_estimate_are_refused():
    line = one_line_error(tea("train", "quickstart", "--gpus", "8", "--card", "h200", check=False))
    assert line == "error: --card and --gpus apply only with --estimate, which was not given; add --estimate or drop --card and --gpus"
    line = one_line_error(tea("study", "uf_core250", "--gpus-per-run", "4", check=False))
    assert "--gpus-per-run applies only with --estimate" in line
    line = one_line_error(tea("train", "quickstart", "--estimate", "--gpus", "0,1", check=False))
    assert "tea train's --gpus is a count of GPUs" in line and "tea study's --gpus takes GPU indices" in line


def test_gpus_help_says_count_or_indices():
    from typer.testing import CliRunner

    from teacli.cli import app

    def help_of(*command):
        return " ".join(CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"}).output.replace("│", " ").split())

    assert "the number of GPUs the run trains on, e.g. 8 (default 1). A count, not GPU indices" in help_of("train")
    assert "GPU indices, comma-separated, e.g. 0,1,2,3 (not a count" in help_of("study")
    assert "needs CUDA" in help_of("train")  # --rehearse


def test_an_option_value_out_of_range_is_one_line():
    """typer's min=/max= and type errors were a boxed multi-line message; they are bad input: one `error:` line."""
    assert one_line_error(tea("train", "quickstart", "--steps", "0", check=False)).startswith("error: --steps: ")
    assert one_line_error(tea("serve-rm", "quickstart", "--port", "70000", check=False)).startswith("error: --port: ")
    assert one_line_error(tea("eval-bon", "x", "--n", "abc", check=False)).startswith("error: --n: ")
    syntax = tea("train", "quickstart", "--no-such-option", check=False)  # a syntax error keeps the usage line
    assert syntax.returncode == 2 and "Usage: tea train" in syntax.stderr
