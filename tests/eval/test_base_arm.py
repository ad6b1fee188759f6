"""`tea eval-bon RUN --recipe R --checkpoint base`: a run-like directory for a recipe's untrained policy."""

from __future__ import annotations


import pytest
import yaml
from typer.testing import CliRunner

from teacli.cli import app
from teacli.config import find_recipe, load_recipe, to_yaml
from teacli.eval.bon import EvalError, init_base_arm


def test_init_base_arm_writes_the_resolved_recipe_once(tmp_path):
    run = tmp_path / "runs" / "quickstart-base"
    path = init_base_arm(run, "quickstart")
    assert path == run / "recipe.yaml" and path.read_text() == to_yaml(load_recipe(find_recipe("quickstart")))
    assert sorted(p.name for p in run.iterdir()) == ["recipe.yaml"]
    assert init_base_arm(run, "quickstart") == path  # the same recipe again: kept
    older = path.read_text().replace("  stop_tokens: []\n", "")  # written before rollout.stop_tokens existed
    assert older != path.read_text()
    path.write_text(older)
    assert init_base_arm(run, "quickstart") == path and path.read_text() == older  # still the same recipe, file untouched
    with pytest.raises(EvalError, match="holds another recipe than --recipe embedded_tea"):
        init_base_arm(run, "embedded_tea")
    with pytest.raises(EvalError, match="--recipe: no recipe file or name 'nope'"):
        init_base_arm(tmp_path / "x", "nope")
    assert not (tmp_path / "x").exists()


def test_a_recipe_yaml_without_tea_schema_reads_at_the_defaults_it_ran_under(tmp_path):
    """A run's or base arm's recipe.yaml written before tea_schema existed (version 1) lacks policy.kernels: eval-bon
    reads it at version 1's default (what it ran under), not today's (--set still wins), and such a base arm is not the
    recipe as it resolves now, until the recipe pins the key to what the arm had."""
    from teacli.config import SCHEMA_KEY, schema_default
    from teacli.eval.bon import load_run_recipe

    run = tmp_path / "runs" / "quickstart-base"
    path = init_base_arm(run, "quickstart")
    tree = yaml.safe_load(path.read_text())
    del tree[SCHEMA_KEY], tree["policy"]["kernels"]
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    then, now = schema_default("policy.kernels", 1), load_recipe(find_recipe("quickstart")).policy.kernels
    assert then != now
    assert load_run_recipe(run).policy.kernels == then
    assert load_run_recipe(run, ["policy.kernels=liger"]).policy.kernels == "liger"
    with pytest.raises(EvalError, match="holds another recipe than --recipe quickstart"):
        init_base_arm(run, "quickstart")
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text(f"base: quickstart\nname: quickstart\npolicy: {{kernels: {then}}}\n")
    assert init_base_arm(run, str(pinned)) == path


def test_a_base_arm_recorded_under_reward_kernels_eager_is_the_rule_recipe_still(tmp_path):
    """quickstart's rule reward does not read reward.kernels (config.APPLIES_WHEN): a base arm recorded under tea_schema
    2, when it defaulted to eager, is the recipe that resolves to auto now; with an hf reward model it is not."""
    from teacli.config import SCHEMA_KEY

    run = tmp_path / "runs" / "quickstart-base"
    path = init_base_arm(run, "quickstart")
    tree = yaml.safe_load(path.read_text())
    assert tree["reward"]["kind"] == "rule" and tree["reward"]["kernels"] == "auto"
    tree[SCHEMA_KEY], tree["reward"]["kernels"] = 2, "eager"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    assert init_base_arm(run, "quickstart") == path
    hf = tmp_path / "hf.yaml"
    hf.write_text("base: quickstart\nname: quickstart\nreward: {kind: hf, name_or_path: some/rm}\n")
    tree["reward"].update(kind="hf", name_or_path="some/rm")
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    with pytest.raises(EvalError, match="holds another recipe than --recipe"):
        init_base_arm(run, str(hf))


@pytest.mark.parametrize("args", [["--recipe", "quickstart"], ["--recipe", "quickstart", "--checkpoint", "step_2"]])
def test_recipe_needs_one_run_dir_and_checkpoint_base(tmp_path, args):
    res = CliRunner().invoke(app, ["eval-bon", str(tmp_path / "arm"), *args])
    assert res.exit_code == 2 and "--recipe: give exactly one RUN_DIR and --checkpoint base" in res.stderr
    assert not (tmp_path / "arm").exists()
