"""Schema versions of a recorded recipe: the defaults a run's recipe.yaml ran under.

`tea train` writes the whole resolved recipe, so a key that a run's recipe.yaml lacks did not exist when it was
written (or, in a file written by hand, was left at its default then). Today's default is not always what that run
ran under: `policy.kernels` did not exist before fused kernels, so a run recorded then ran eager, while the key's
default is auto now. Filled in at today's default, such a record would read as a run under the new default, pool
with seeds that ran otherwise, or refuse seeds that ran alike.

So every recipe tree tea writes (`to_yaml`: recipe.yaml, a checkpoint's copy, a base arm's, `tea recipes show`)
starts with `tea_schema: SCHEMA_VERSION`, and reading one fills each key it lacks with that key's default *at its
version* (`schema_default`), not today's. A recipe.yaml without `tea_schema` was written before versions were
recorded: version 1. A recipe file a user writes has no version and takes today's defaults; one that names a
version (a recorded recipe.yaml given to `tea train`) takes that version's.

Changing a default, or adding a key whose default does not keep runs as they were, needs a new version: raise
SCHEMA_VERSION, give the key's new default under it in SCHEMA_DEFAULTS and its old one under an earlier version.
tests/test_config_schema.py pins every default of the current version (tests/recipe_defaults.json) and fails until
that is done. `tea report` and `tea study` name a key of `default_changes` when seeds of one recipe ran under two of
its values, where the recipe reads it: a key that it does not (tree.APPLIES_WHEN: `reward.kernels` of a rule reward,
auto since version 3) is not compared, so a default changed there splits no seeds.
"""

from __future__ import annotations

import copy
from typing import Any

from teacli.config.tree import Recipe, RecipeError, field_docs, recipe_changes

SCHEMA_KEY = "tea_schema"
SCHEMA_VERSION = 5
"""The version this tea writes. 2: the first recorded (policy.kernels auto). 3: reward.kernels auto. 4: no default
changed (optim.completion_splits added at 1, as runs were); written by the working tree in which that key defaulted to
auto, whose one record (results/performance/2026-11-29-h200-splits/, a rehearsal) names its value. 5:
backend.cudnn_attention false (torch's own SDPA choice, cuDNN first on Hopper, before)."""

SCHEMA_DEFAULTS: dict[int, dict[str, Any]] = {
    # Written before versions were recorded, each with every key tea had then: a key one lacks did not exist yet,
    # and these are the values runs had before it did.
    1: {
        "policy.kernels": "eager",  # added for fused kernels (default auto, eager, then auto again): none ran before
        "reward.kernels": "eager",  # added at eager (CHANGELOG; auto for a day in git log, reverted)
        "rollout.stop_tokens": [],  # added at []: only EOS ended a completion before
        "advantage.scale_rewards": "none",  # added at none: "runs unchanged" (CHANGELOG)
        "reward.share_prompts": False,  # added at true (issue 45): every reward model scored whole conversations before
        "backend.cudnn_attention": True,  # added at false: torch chose its SDPA backend (cuDNN allowed) before
    },
    2: {
        "policy.kernels": "auto",
    },
    3: {
        "reward.kernels": "auto",  # eager (version 1's entry) until: liger scored the 8B reward model 1.22x faster
        "reward.share_prompts": True,  # named here so that records of version 1 and 2, which lack it, read false
    },
    5: {
        "backend.cudnn_attention": False,  # cuDNN's per-shape plans: a realistic micro-batch 2x as long a token (H100)
    },
}
"""version → {dotted key: its default from this version on}: what a recipe.yaml of that version which lacks the key
ran under, until a later version names the key again. Keys never named have had one default."""


def _tree_defaults() -> dict[str, Any]:
    return {key: default for key, _, default, _ in field_docs(Recipe)}


def schema_default(key: str, version: int) -> Any:
    """The value a recipe.yaml of schema `version` that lacks the dotted `key` ran under: the key's entry at the latest
    version up to `version`; for a key first named after `version`, its first entry (the key did not exist yet, and
    was added at the value that kept runs as they were); for a key never named, the tree's default."""
    entries = [(v, keys[key]) for v, keys in sorted(SCHEMA_DEFAULTS.items()) if key in keys]
    if not entries:
        return _tree_defaults()[key]
    upto = [value for v, value in entries if v <= version]
    return copy.deepcopy(upto[-1] if upto else entries[0][1])


def default_changes(a: int, b: int) -> dict[str, tuple[Any, Any]]:
    """dotted key → (its default at schema version a, at b), for every key whose default differs between them."""
    keys = dict.fromkeys(k for entries in SCHEMA_DEFAULTS.values() for k in entries)
    pairs = {k: (schema_default(k, a), schema_default(k, b)) for k in keys}
    return {k: (x, y) for k, (x, y) in pairs.items() if x != y}


def default_differences(old: dict[str, Any], old_version: int, new: dict[str, Any], new_version: int
                        ) -> tuple[dict[str, tuple[Any, Any]], dict[str, tuple[Any, Any]]]:
    """Two canonical recipe trees written under schema versions `old_version` and `new_version` → (the keys whose
    default changed between the versions that differ between them, every other key that differs), each dotted key →
    (old value, new value) as `recipe_changes` gives them. `tea study` refuses a recorded run with any of the first;
    `tea report` reads two seeds as one recipe run under two defaults when all their differences are of the first."""
    changed = recipe_changes(old, new)
    moved = default_changes(old_version, new_version)
    return ({k: v for k, v in changed.items() if k in moved}, {k: v for k, v in changed.items() if k not in moved})


def schema_version(data: dict[str, Any], where: str = "", *, missing: int) -> int:
    """The `tea_schema` of a recipe tree, `missing` when it has none (1 for a run's record, SCHEMA_VERSION for a recipe
    file); a RecipeError naming the key when it is not a version this tea reads. `where`: what follows the key's value
    in the message, e.g. ' (set in runs/x/recipe.yaml)'."""
    version = data.get(SCHEMA_KEY, missing)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RecipeError(f"{SCHEMA_KEY}: {version!r}{where} is not a schema version (a positive integer, as tea writes it)")
    if version > SCHEMA_VERSION:
        raise RecipeError(f"{SCHEMA_KEY}: {version}{where} was written by a newer tea (this one reads versions 1 to "
                          f"{SCHEMA_VERSION}); upgrade teacli to read it")
    return version


def fill_defaults(data: dict[str, Any], version: int) -> dict[str, Any]:
    """A copy of the recipe tree `data` without its `tea_schema`, each key it lacks whose default at schema `version`
    is not today's set to that version's (`schema_default`): the tree as the run it records ran."""
    out = copy.deepcopy({k: v for k, v in data.items() if k != SCHEMA_KEY})
    today = _tree_defaults()
    for key in dict.fromkeys(k for entries in SCHEMA_DEFAULTS.values() for k in entries):
        then = schema_default(key, version)
        if then == today[key]:
            continue
        *sections, leaf = key.split(".")
        node: Any = out
        for name in sections:
            node = node.setdefault(name, {}) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf not in node:  # a section that is not a mapping: build names it
            node[leaf] = then
    return out
