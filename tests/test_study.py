"""`tea study`: a two-recipe study on a tiny model trains, evaluates and reports, then skips it all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from teacli.study import StudyError, load_study, plan

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def test_shipped_studies_load_and_name_existing_recipes():
    studies = sorted((REPO / "recipes" / "studies").glob("*.yaml"))
    assert len(studies) >= 5
    for path in studies:
        s = load_study(path)
        assert s.baseline in [r.stem for r in s.recipes]
        stages = plan(s)
        assert stages[-1][0] == "report" and len(stages) == 2 * len(s.recipes) + 1


def test_bad_study_names_the_problem(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("recipes: [no_such_recipe]\n")
    with pytest.raises(StudyError, match="no recipe file or name 'no_such_recipe'"):
        load_study(bad)
    bad.write_text("recipes: [quickstart]\nbaseline: other\n")
    with pytest.raises(StudyError, match="baseline 'other' is not one of"):
        load_study(bad)
    bad.write_text("recipes: [quickstart]\nrecipe: x\n")
    with pytest.raises(StudyError, match="unknown study key"):
        load_study(bad)


def test_tiny_study_end_to_end_and_skip(tmp_path):
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_causal_lm, make_tokenizer, save

    from teacli.data.prepare import prepare

    tok = make_tokenizer()
    save(make_causal_lm(tok), tok, tmp_path / "policy")
    prepare("builtin", tmp_path / "data")
    for rule in ("grpo", "tea"):
        recipe = {
            "name": f"tiny_{rule}",
            "policy": {"name_or_path": str(tmp_path / "policy"), "dtype": "float32", "gradient_checkpointing": False},
            "reward": {"kind": "python", "function": "rewards_for_tests:length_reward"},
            "data": {"dir": str(tmp_path / "data")},
            "rollout": {"engine": "hf", "prompts_per_step": 2, "group_size": 8, "max_new_tokens": 6, "batch_size": 32},
            "advantage": {"name": rule, "params": {}},
            "optim": {"steps": 1, "lr": 1.0e-3, "micro_batch_size": 16},
            "backend": {"zero_stage": 0, "precision": "fp32"},
            "checkpoint": {"save_every": 1},
            "validation": {"prompts": 2, "samples": 2, "top": 1, "at_start": False},
            "eval": {"split": "core250", "M": 4},
            "logging": {"tensorboard": False},
        }
        (tmp_path / f"tiny_{rule}.yaml").write_text(yaml.safe_dump(recipe))
    study = {
        "name": "tiny", "recipes": ["tiny_grpo.yaml", "tiny_tea.yaml"], "baseline": "tiny_grpo",
        "eval": {"split": "core250", "n": 4}, "report": {"out": str(tmp_path / "report"), "bootstrap": 50},
        "runs_dir": str(tmp_path / "runs"),
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS / "train"), os.environ.get("PYTHONPATH", "")]),
               TEA_CACHE=str(tmp_path / "cache"))
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
