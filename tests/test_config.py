"""The recipe tree: inheritance, overrides, errors naming key and file, every shipped recipe."""

import textwrap
from pathlib import Path

import pytest

from teacli.config import RECIPES_DIR, Recipe, RecipeError, discover_recipes, field_docs, load_recipe, to_yaml


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("path", discover_recipes(), ids=lambda p: p.stem)
def test_every_shipped_recipe_loads(path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    assert recipe.policy.name_or_path and recipe.data.dir


def test_every_yaml_under_recipes_parses():
    import yaml

    files = sorted(RECIPES_DIR.rglob("*.yaml"))
    assert len(files) >= 30
    for f in files:
        assert isinstance(yaml.safe_load(f.read_text()), dict), f


def test_base_inheritance_later_wins_and_overrides(tmp_path):
    write(tmp_path / "a.yaml", "optim: {lr: 1.0e-5, steps: 10}\nrollout: {group_size: 32}\n")
    write(tmp_path / "b.yaml", "optim: {lr: 2.0e-5}\n")
    child = write(
        tmp_path / "child.yaml",
        """\
        base: [a.yaml, b.yaml]
        policy: {name_or_path: x}
        data: {dir: d}
        rollout: {prompts_per_step: 3}
        """,
    )
    r = load_recipe(child, ["optim.steps=7", "advantage.params={alpha: 0.2}", "optim.lr=3e-5"])
    assert r.optim.lr == 3e-5 and r.optim.steps == 7
    assert r.rollout.group_size == 32 and r.rollout.prompts_per_step == 3
    assert r.advantage.params == {"alpha": 0.2}
    assert r.name == "child"


def test_unknown_key_names_key_and_file(tmp_path):
    write(tmp_path / "base.yaml", "optim: {lrr: 1.0}\n")
    child = write(tmp_path / "c.yaml", "base: base.yaml\n")
    with pytest.raises(RecipeError, match=r"unknown recipe key 'optim.lrr' \(set in .*base.yaml\); did you mean 'optim.lr'"):
        load_recipe(child)


def test_wrong_type_and_range_name_key_and_file(tmp_path):
    bad_type = write(tmp_path / "t.yaml", "rollout: {group_size: many}\n")
    with pytest.raises(RecipeError, match=r"rollout.group_size: expected an integer, got 'many' \(set in .*t.yaml\)"):
        load_recipe(bad_type)
    bad_range = write(tmp_path / "r.yaml", "rollout: {top_p: 1.5}\n")
    with pytest.raises(RecipeError, match=r"rollout.top_p: 1.5 is out of range: must be <= 1.0"):
        load_recipe(bad_range)
    bad_choice = write(tmp_path / "l.yaml", "kl: {estimator: k9}\n")
    with pytest.raises(RecipeError, match=r"kl.estimator: 'k9' is not one of 'k1', 'k2', 'k3'"):
        load_recipe(bad_choice)


def test_advantage_rule_checked_against_group_size(tmp_path):
    p = write(tmp_path / "p.yaml", "advantage: {name: prefix_tea, params: {}}\nrollout: {group_size: 16}\n")
    with pytest.raises(RecipeError, match=r"no valid prefix plan for group size m=16.*smallest valid m is 24.*p.yaml"):
        load_recipe(p)
    q = write(tmp_path / "q.yaml", "advantage: {name: grpo, params: {alpha: 0.3}}\n")
    with pytest.raises(RecipeError, match=r"'grpo' does not take parameter\(s\) alpha"):
        load_recipe(q)


def test_missing_file_and_bad_override(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="expected KEY=VALUE"):
        load_recipe(write(tmp_path / "ok.yaml", "seed: 1\n"), ["optim.lr"])
    child = write(tmp_path / "loop.yaml", "base: loop.yaml\n")
    with pytest.raises(RecipeError, match="circular"):
        load_recipe(child)


def test_resolved_yaml_round_trips(tmp_path):
    r = load_recipe(RECIPES_DIR / "uf_llama1b_prefix_tea.yaml")
    dumped = write(tmp_path / "resolved.yaml", to_yaml(r))
    assert load_recipe(dumped) == r


def test_every_field_is_documented():
    rows = field_docs(Recipe)
    assert len(rows) > 50
    undocumented = [key for key, _, _, doc in rows if not doc]
    assert undocumented == []


def test_docs_list_every_recipe_field():
    text = (RECIPES_DIR.parent / "docs" / "recipes.md").read_text()
    missing = [key for key, _, _, _ in field_docs(Recipe) if f"`{key}`" not in text]
    assert missing == []
