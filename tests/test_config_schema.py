"""Schema versions of recorded recipes (teacli/config/schema.py): `tea_schema` written first in every recipe tree tea
writes, an older recipe.yaml read back at the defaults of its version (not today's), and the pinned defaults that
make a changed default need a new version.

`python tests/test_config_schema.py` rewrites tests/recipe_defaults.json from the tree, once SCHEMA_DEFAULTS says
what the runs recorded before a change ran under (the failing test says what to do)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from teacli.config import (
    SCHEMA_DEFAULTS,
    SCHEMA_KEY,
    SCHEMA_VERSION,
    Recipe,
    RecipeError,
    canonical_tree,
    default_changes,
    field_docs,
    load_recipe,
    parse_yaml,
    recipe_changes,
    recipe_from_dict,
    schema_default,
    to_yaml,
)
from teacli.config import schema

PINNED = Path(__file__).with_name("recipe_defaults.json")
RUNNABLE = {"policy": {"name_or_path": "p"}, "data": {"dir": "d"}}


def defaults_now() -> dict[str, object]:
    return {key: default for key, _, default, _ in field_docs(Recipe)}


def write_pinned() -> None:
    lines = [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in defaults_now().items()]
    PINNED.write_text(f'{{"tea_schema": {SCHEMA_VERSION}, "defaults": {{\n' + ",\n".join(lines) + "\n}}\n")


def test_every_default_is_pinned_at_the_schema_version_that_has_it():
    """A default that changed since tests/recipe_defaults.json was written needs a new tea_schema version whose table
    keeps the old default at the pinned version; a key added or removed needs the file written again."""
    pinned = json.loads(PINNED.read_text())
    version, was, now = pinned["tea_schema"], pinned["defaults"], defaults_now()
    for key in (k for k in now if k in was and now[k] != was[k]):
        assert SCHEMA_VERSION > version, (
            f"{key}: default {was[key]!r} changed to {now[key]!r} within tea_schema {version}, so a record does not say "
            f"which one its run had. Raise SCHEMA_VERSION, give {key} its new default under it and its old one "
            f"under {version} (or earlier) in SCHEMA_DEFAULTS (teacli/config/schema.py), then run python tests/{Path(__file__).name}"
        )
        assert schema_default(key, version) == was[key], f"{key}: SCHEMA_DEFAULTS must keep {was[key]!r} at version {version}"
    added, removed = sorted(set(now) - set(was)), sorted(set(was) - set(now))
    assert (version, was) == (SCHEMA_VERSION, now), (
        f"recipe defaults differ from {PINNED.name} (added {added}, removed {removed}, tea_schema {version} pinned, "
        f"{SCHEMA_VERSION} now): if runs before an added key did otherwise than its default, give what they did under "
        f"tea_schema {version} in SCHEMA_DEFAULTS (and its default under a new version); then run python tests/{Path(__file__).name}"
    )


def test_the_table_ends_at_todays_defaults_and_names_real_keys():
    keys = {k for entries in SCHEMA_DEFAULTS.values() for k in entries}
    now = defaults_now()
    assert keys <= set(now) and set(SCHEMA_DEFAULTS) <= set(range(1, SCHEMA_VERSION + 1))
    assert all(schema_default(k, SCHEMA_VERSION) == now[k] for k in keys)
    # the history recorded (CHANGELOG, git log): policy.kernels did not exist before fused kernels, auto since version 2
    assert (schema_default("policy.kernels", 1), schema_default("policy.kernels", 2)) == ("eager", "auto")
    assert default_changes(1, 2) == {"policy.kernels": ("eager", "auto")} and default_changes(2, 2) == {}
    # reward.kernels: eager from its start, auto since version 3 (liger where it runs; a rule reward does not read it)
    assert [schema_default("reward.kernels", v) for v in (1, 2, 3)] == ["eager", "eager", "auto"]
    assert default_changes(2, 3)["reward.kernels"] == ("eager", "auto") == default_changes(1, 3)["reward.kernels"]
    # reward.share_prompts: added at true (version 3's); every hf reward scored whole conversations before it existed
    assert [schema_default("reward.share_prompts", v) for v in (1, 2, 3)] == [False, False, True]


def test_a_key_reads_at_its_entry_up_to_the_version_else_its_first(monkeypatch):
    """A made-up history: optim.scheduler added at version 2 as linear, cosine from version 4, constant (today's)
    from 5. Version 1 predates the key: its first entry. optim.lr was never named: the tree's default."""
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 5)
    monkeypatch.setattr(schema, "SCHEMA_DEFAULTS", {2: {"optim.scheduler": "linear"}, 4: {"optim.scheduler": "cosine"},
                                                    5: {"optim.scheduler": "constant"}})
    assert [schema_default("optim.scheduler", v) for v in range(1, 6)] == ["linear", "linear", "linear", "cosine", "constant"]
    assert schema_default("optim.lr", 1) == Recipe().optim.lr
    assert default_changes(1, 3) == {} and default_changes(3, 5) == {"optim.scheduler": ("linear", "constant")}
    old = {"tea_schema": 3, "optim": {"lr": 2e-5}}
    assert schema.fill_defaults(old, 3) == {"optim": {"lr": 2e-5, "scheduler": "linear"}}
    assert schema.fill_defaults({"optim": {"scheduler": "cosine"}}, 3) == {"optim": {"scheduler": "cosine"}}  # set: kept
    assert schema.fill_defaults({}, 5) == {}  # today's default: left to the tree


def test_every_tree_tea_writes_starts_with_its_schema_and_loads_back(tmp_path):
    text = to_yaml(Recipe())
    assert text.splitlines()[0] == f"{SCHEMA_KEY}: {SCHEMA_VERSION}"
    recorded = tmp_path / "recipe.yaml"
    recorded.write_text(to_yaml(recipe_from_dict({**RUNNABLE, "name": "r"})))
    assert to_yaml(load_recipe(recorded)) == recorded.read_text()  # `tea train runs/x/recipe.yaml` reads it as written
    assert canonical_tree(parse_yaml(text, "x")) == parse_yaml(text, "x")


def test_an_old_record_reads_at_its_versions_defaults_a_recipe_at_todays(tmp_path):
    """A recipe.yaml without tea_schema (written before versions were recorded) that lacks policy.kernels ran without
    fused kernels; a recipe file a user writes without it gets today's default; one that names a version, that
    version's; --set wins over both."""
    then, now = schema_default("policy.kernels", 1), Recipe().policy.kernels
    assert then != now
    assert recipe_from_dict({**RUNNABLE}, record=True).policy.kernels == then
    assert recipe_from_dict({**RUNNABLE}).policy.kernels == now
    assert recipe_from_dict({**RUNNABLE, SCHEMA_KEY: 1}).policy.kernels == then
    assert recipe_from_dict({**RUNNABLE, SCHEMA_KEY: 1}, overrides=["policy.kernels=liger"]).policy.kernels == "liger"
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**RUNNABLE, SCHEMA_KEY: 1}))
    assert load_recipe(path).policy.kernels == then
    path.write_text(yaml.safe_dump(RUNNABLE))
    assert load_recipe(path).policy.kernels == now


def test_an_old_recipe_yaml_compares_by_the_values_it_ran_under():
    """canonical_tree of a version-1 recipe.yaml against one written now: keys added since at the value version 1 ran
    (stop_tokens, scale_rewards: equal to today's) compare equal; a key whose default changed since differs, naming
    both values; pinned to what version 1 ran, equal again."""
    now = parse_yaml(to_yaml(Recipe()), "now")
    older = json.loads(json.dumps(now))
    del older[SCHEMA_KEY], older["rollout"]["stop_tokens"], older["advantage"]["scale_rewards"]
    assert canonical_tree(older) == now
    del older["policy"]["kernels"]
    assert recipe_changes(canonical_tree(older), now) == {"policy.kernels": (schema_default("policy.kernels", 1), Recipe().policy.kernels)}
    now["policy"]["kernels"] = schema_default("policy.kernels", 1)
    assert canonical_tree(older) == now


@pytest.mark.parametrize("value, message", [
    ("two", "tea_schema: 'two' (set in {path}) is not a schema version"),
    (0, "tea_schema: 0 (set in {path}) is not a schema version"),
    (SCHEMA_VERSION + 1, f"tea_schema: {SCHEMA_VERSION + 1} (set in {{path}}) was written by a newer tea (this one reads "
                         f"versions 1 to {SCHEMA_VERSION}); upgrade teacli"),
])
def test_a_bad_or_newer_schema_is_one_line_naming_the_key(tmp_path, value, message):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**RUNNABLE, SCHEMA_KEY: value}))
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    assert message.format(path=path) in str(err.value)
    assert canonical_tree({**RUNNABLE, SCHEMA_KEY: value}) is None


if __name__ == "__main__":
    write_pinned()
    print(f"wrote {PINNED} (tea_schema {SCHEMA_VERSION}, {len(defaults_now())} defaults)", file=sys.stderr)
