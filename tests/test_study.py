"""`tea study`: a two-recipe study on a tiny model trains, evaluates and reports, then skips it all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from typer.testing import CliRunner

from teacli.cli import app
from teacli.config import RecipeError, find_study
from teacli.study import StudyError, load_study, plan

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def test_shipped_studies_load_and_name_existing_recipes():
    studies = sorted((REPO / "recipes" / "studies").glob("*.yaml"))
    assert len(studies) >= 5
    for path in studies:
        s = load_study(path)
        assert s.baseline in s.runs
        stages = plan(s)
        runs = len(s.recipes) * len(s.seeds or [None])
        assert stages[-1][0] == "report" and len(stages) == 2 * runs + (s.base is not None) + 1


def test_shipped_studies_hard_code_no_launcher():
    for path in sorted((REPO / "recipes" / "studies").glob("*.yaml")):
        assert "launcher" not in yaml.safe_load(path.read_text()), path
        s = load_study(path)
        train = [cmd for label, cmd, _ in plan(s) if label.startswith("train")]
        assert all(cmd[:3] == [sys.executable, "-m", "teacli.cli"] for cmd in train), path
    s = load_study(REPO / "recipes" / "studies" / "uf_core250.yaml", launcher="deepspeed --num_gpus 8 --module")
    cmd = next(cmd for label, cmd, _ in plan(s) if label == "train uf_llama1b_tea")
    assert cmd[:6] == ["deepspeed", "--num_gpus", "8", "--module", "teacli.cli", "train"]


def test_study_names_resolve_like_recipe_names(tmp_path):
    assert find_study("uf_core250") == REPO / "recipes" / "studies" / "uf_core250.yaml"
    with pytest.raises(RecipeError, match="study file not found: uf_core250.yaml; the study name 'uf_core250' finds"):
        find_study("uf_core250.yaml")  # a path that is not there: pointed at the name, as for recipes
    own = tmp_path / "mine.yaml"
    own.write_text("recipes: [quickstart]\n")
    assert find_study(str(own)) == own
    with pytest.raises(RecipeError, match="no study file or name 'nope' \\(studies live in recipes/studies/\\)"):
        find_study("nope")
    res = CliRunner().invoke(app, ["study", "nope"])
    assert res.exit_code == 2 and "no study file or name 'nope'" in res.stderr
    res = CliRunner().invoke(app, ["study", "uf_m_to_n", "--dry-run", "--launcher", "torchrun --nproc_per_node 4 -m"])
    assert res.exit_code == 0, res.output
    assert "torchrun --nproc_per_node 4 -m teacli.cli train" in res.output and "--pair runs/uf_llama1b_tea_m16=runs/uf_llama1b_grpo_m16" in res.output


@pytest.mark.parametrize("text, message", [
    ("recipes: [no_such_recipe]\n", "no recipe file or name 'no_such_recipe'"),
    ("recipes: [quickstart]\nbaseline: other\n", "baseline 'other' is not one of the study's runs (quickstart)"),
    ("recipes: [quickstart]\nrecipe: x\n", "unknown study key(s) recipe"),
    ("recipes: [quickstart\n", "not valid YAML"),
    ("- quickstart\n", "a study must be a YAML mapping"),
    ("recipes: [quickstart]\neval: {n: abc}\n", "eval.n must be an integer >= 1, got 'abc'"),
    ("recipes: [quickstart]\neval: {m: 4}\n", "unknown key(s) eval.m"),
    ("recipes: [quickstart]\neval: {checkpoint: last}\n", "eval.checkpoint must be selected, base or step_N"),
    ("recipes: [quickstart]\neval: 256\n", "'eval' must be a mapping"),
    ("recipes: [quickstart]\nreport: {bootstrap: 0}\n", "report.bootstrap must be an integer >= 1, got 0"),
    ("recipes: [quickstart]\nreport: {endpoints: 128}\n", "report.endpoints must be a list of N"),
    ("recipes: [quickstart]\npairs: {quickstart: quickstart}\n", "pairs.quickstart: a run cannot be its own baseline"),
    ("recipes: [quickstart]\npairs: {other: quickstart}\n", "pairs: run 'other' is not one of the study's runs"),
    ("recipes: [quickstart]\npairs: [quickstart]\n", "'pairs' must be a mapping RUN: BASELINE"),
    ("recipes: [quickstart]\nlauncher: {gpus: 8}\n", "launcher must be a command line"),
    ("recipes: [quickstart, quickstart]\n", "two recipes are named 'quickstart'"),
    ("recipes: [quickstart]\nrecipes: [quickstart]\n", "duplicate key 'recipes'"),
    ("recipes: [quickstart]\nseeds: 3\n", "seeds must be a non-empty list of training seeds"),
    ("recipes: [quickstart]\nseeds: [0, -1]\n", "seeds must be an integer >= 0, got -1"),
    ("recipes: [quickstart]\nseeds: [1, 1]\n", "seeds: [1, 1] repeats a seed"),
    ("recipes: [quickstart]\nbase: other\n", "base 'other' is not one of the study's runs (quickstart)"),
    ("recipes: [quickstart]\nbase: 3\n", "base must be true (the baseline's recipe), false or a recipe of the study"),
    ("recipes: [quickstart]\nbase: true\neval: {checkpoint: base}\n", "would evaluate the untrained policy twice"),
])
def test_bad_study_is_one_line_naming_the_key(tmp_path, text, message):
    bad = tmp_path / "s.yaml"
    bad.write_text(text)
    with pytest.raises(StudyError) as info:
        load_study(bad)
    assert message in str(info.value) and str(bad) in str(info.value)
    res = CliRunner().invoke(app, ["study", str(bad), "--dry-run"])
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1, res.output
    assert message in " ".join(res.stderr.split())


def test_fixed_checkpoint_study_evaluates_and_reports_that_checkpoint(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text(f"recipes: [quickstart]\neval: {{split: core500, n: 16, checkpoint: step_16}}\nruns_dir: {tmp_path / 'runs'}\n")
    s = load_study(study)
    stages = {label: (cmd, done) for label, cmd, done in plan(s)}
    eval_cmd, done = stages["eval-bon quickstart"]
    assert eval_cmd[-2:] == ["--checkpoint", "step_16"] and not done
    assert stages["report"][0][-2:] == ["--checkpoint", "step_16"]
    bon = tmp_path / "runs" / "quickstart" / "eval" / "step_000016" / "core500-M16.bon.json"
    bon.parent.mkdir(parents=True)
    bon.write_text("{}")
    assert dict((label, done) for label, _, done in plan(s))["eval-bon quickstart"]


def test_tiny_study_end_to_end_and_skip(tmp_path):
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_causal_lm, make_tokenizer, save

    from teacli.data.prepare import prepare

    tok = make_tokenizer()
    save(make_causal_lm(tok), tok, tmp_path / "policy")
    prepare("builtin", tmp_path / "data")
    from tiny_lm import tea_env, tiny_recipe, write_recipe

    for rule in ("grpo", "tea"):
        recipe = tiny_recipe(
            tmp_path / "policy", tmp_path / "data", name=f"tiny_{rule}", advantage={"name": rule, "params": {}},
            rollout__max_new_tokens=6, rollout__batch_size=32, optim__steps=1, optim__lr=1.0e-3, optim__micro_batch_size=16,
            kl={"beta": 0.1}, backend__zero_stage=0, checkpoint__save_every=1,
            validation={"prompts": 2, "samples": 2, "top": 1, "at_start": False}, eval={"split": "core250", "M": 4},
        )
        write_recipe(tmp_path / f"tiny_{rule}.yaml", recipe)
    study = {
        "name": "tiny", "recipes": ["tiny_grpo.yaml", "tiny_tea.yaml"], "baseline": "tiny_grpo",
        "eval": {"split": "core250", "n": 4}, "report": {"out": str(tmp_path / "report"), "bootstrap": 50},
        "runs_dir": str(tmp_path / "runs"),
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    env = tea_env(tmp_path)
    cmd = [sys.executable, "-m", "teacli.cli", "study", str(tmp_path / "study.yaml")]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "study done (5 stage(s) run)" in first.stdout
    for rule in ("grpo", "tea"):
        assert (tmp_path / "runs" / f"tiny_{rule}" / "eval" / "core250-M4.bon.json").exists()
    assert any((tmp_path / "report").glob("*.md"))
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert second.returncode == 0
    assert second.stdout.count("skip") == 4 and "study done (1 stage(s) run)" in second.stdout
    # recipe.yaml as `tea train` wrote it (flow-style sections) fills the Budget column.
    assert "| tiny_tea | m=8 |" in (tmp_path / "report" / "frontier.md").read_text()

    # A fixed-checkpoint study over the same runs (as uf_step450 reuses uf_core250's): no training, the
    # step-1 checkpoint evaluated into eval/step_000001/ and reported from there, TEA paired with GRPO.
    study.update(name="tiny_step1", eval={"split": "core250", "n": 4, "checkpoint": "step_1"}, pairs={"tiny_tea": "tiny_grpo"},
                 report={"out": str(tmp_path / "report_step1"), "bootstrap": 50, "endpoints": [2, 4]})
    (tmp_path / "step1.yaml").write_text(yaml.safe_dump(study))
    third = subprocess.run(cmd[:-1] + [str(tmp_path / "step1.yaml")], capture_output=True, text=True, env=env, timeout=900)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert third.stdout.count("skip  train") == 2 and "study done (3 stage(s) run)" in third.stdout
    for rule in ("grpo", "tea"):
        assert (tmp_path / "runs" / f"tiny_{rule}" / "eval" / "step_000001" / "core250-M4.bon.json").exists()
    frontier = (tmp_path / "report_step1" / "frontier.md").read_text()
    assert "| tiny_grpo | m=8 | 1 |" in frontier and "| tiny_tea | m=8 | 1 |" in frontier
    assert "| tiny_tea vs tiny_grpo |" in (tmp_path / "report_step1" / "win_tie_loss.md").read_text()
