"""The real `tea` command line, run as a subprocess."""

import json
import subprocess
import sys

import pytest


def tea(*args, check=True, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "teacli.cli", *args], capture_output=True, text=True, cwd=cwd)
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
