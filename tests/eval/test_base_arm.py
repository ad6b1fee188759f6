"""`tea eval-bon RUN --recipe R --checkpoint base`: a run-like directory for a recipe's untrained policy."""

from __future__ import annotations


import pytest
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


@pytest.mark.parametrize("args", [["--recipe", "quickstart"], ["--recipe", "quickstart", "--checkpoint", "step_2"]])
def test_recipe_needs_one_run_dir_and_checkpoint_base(tmp_path, args):
    res = CliRunner().invoke(app, ["eval-bon", str(tmp_path / "arm"), *args])
    assert res.exit_code == 2 and "--recipe: give exactly one RUN_DIR and --checkpoint base" in res.stderr
    assert not (tmp_path / "arm").exists()
