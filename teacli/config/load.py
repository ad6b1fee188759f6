"""Loading a recipe: the one YAML loader (recipes, their bases, `--set` values, run directories' recipe.yaml),
`base:` inheritance (relative to the file that names it, then ./recipes and the packaged recipes; `name:` is not
inherited), `--set` overrides, and the tree that results, built and validated (teacli/config/validate.py).
`canonical_tree` and `to_yaml`: a recipe tree as this version writes it, `tea_schema:` first (teacli/config/schema.py:
a recorded recipe's missing keys take the defaults of the version that wrote it).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from teacli.config.lookup import _display, discover_recipes, recipe_dirs
from teacli.config.schema import SCHEMA_KEY, SCHEMA_VERSION, fill_defaults, schema_version
from teacli.config.tree import Recipe, RecipeError
from teacli.config.validate import OVERRIDE, RECIPE_FILE, _where, build, validate_recipe

# ------------------------------------------------------------------------------------------------
# The YAML loader


def _yaml_loader() -> type:
    """The one YAML loader for recipes, their bases, `--set` values and run directories' recipe.yaml.

    A `yaml.SafeLoader` that (1) refuses a key given twice in one mapping (PyYAML keeps the last and
    drops the first silently: two `optim:` blocks would lose a setting), (2) reads numbers with an
    exponent as YAML 1.2 does (`1e-5`, `3E+4`); YAML 1.1 wants a dot and a signed exponent
    (`1.0e-5`) and otherwise reads the string '1e-5', and (3) reads only decimal numbers as numbers:
    YAML 1.1's hexadecimal, octal, binary and base-60 forms (`0x10` = 16, `010` = 8, `1:30` = 90)
    stay strings, so a typo is a type error naming the key instead of another number.
    """
    global _LOADER
    if _LOADER is None:
        import re

        import yaml

        class RecipeLoader(yaml.SafeLoader):
            def construct_mapping(self, node, deep=False):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # `<<: *anchor` merges are meant to be overridden
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.get(key)
                    except TypeError:
                        continue  # an unhashable key: SafeLoader reports it
                    seen[key] = key_node.start_mark.line
                    if first is not None:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first at line {first + 1}); YAML would silently keep only "
                            f"the last one: merge the two into one", key_node.start_mark,
                        )
                return super().construct_mapping(node, deep)

        numbers = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
        RecipeLoader.yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in resolvers if tag not in numbers]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
        }
        RecipeLoader.add_implicit_resolver(numbers[0], re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789"))
        RecipeLoader.add_implicit_resolver(
            numbers[1],
            re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*|[0-9][0-9_]*(?=[eE]))(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
            list("-+0123456789."),
        )
        _LOADER = RecipeLoader
    return _LOADER


_LOADER: type | None = None


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text with the recipe loader; RecipeError naming `source` and the line on bad YAML."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = " ".join(str(exc.problem or exc.context or exc).split())
        raise RecipeError(f"{where}: {problem}" if "duplicate key" in problem else f"{where}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None


def read_yaml(path: str | Path) -> Any:
    """Read and parse one YAML file (a recipe, a base, a study, a run's recipe.yaml) with the recipe loader.

    Every problem is a one-line RecipeError naming the file: missing, a directory, unreadable, not
    UTF-8 (with the line of the first bad byte), not valid YAML or a duplicate key (with the line).
    """
    path = Path(path)
    shown = _display(path)
    if path.is_dir():
        raise RecipeError(f"{shown} is a directory, not a YAML file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {shown}") from None
    except OSError as exc:
        raise RecipeError(f"{shown}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RecipeError(
            f"{shown}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None
    return parse_yaml(text, shown)


def _read_yaml(path: Path) -> dict[str, Any]:
    data = read_yaml(path)
    if data is None:
        raise RecipeError(
            f"{_display(path)} is empty (no settings); a recipe names at least policy.name_or_path and data.dir, "
            f"or inherits them with base: (see `tea recipes show quickstart`)"
        )
    if not isinstance(data, dict):
        raise RecipeError(f"{_display(path)}: a recipe must be a YAML mapping at the top level, got {type(data).__name__}")
    return data


# ------------------------------------------------------------------------------------------------
# `base:` inheritance


def _merge(dst: dict, src: dict, origin: dict[str, str], source: str, prefix: str = "") -> None:
    """Deep-merge src into dst (later wins); record which file set each leaf key."""
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(dst.get(key), dict) and not _is_free_dict(dotted):
            _merge(dst[key], value, origin, source, dotted + ".")
        else:
            dst[key] = value
            origin[dotted] = source
            if isinstance(value, dict):
                _mark(value, origin, source, dotted + ".")


def _mark(value: dict, origin: dict[str, str], source: str, prefix: str) -> None:
    for key, sub in value.items():
        origin[f"{prefix}{key}"] = source
        if isinstance(sub, dict):
            _mark(sub, origin, source, f"{prefix}{key}.")


def _is_free_dict(dotted: str) -> bool:
    """Free-form dict fields (advantage.params, reward.params, rollout.vllm_kwargs) are replaced, not merged key by key."""
    return dotted in {"advantage.params", "reward.params", "rollout.vllm_kwargs"}


def _resolve_file(path: Path, origin: dict[str, str], stack: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in stack:
        raise RecipeError(f"{_display(path)}: circular 'base:' inheritance via {' -> '.join(_display(p) for p in stack)}")
    data = _read_yaml(path)
    bases = data.pop("base", None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise RecipeError(f"{_display(path)}: 'base' must be a file name or a list of file names, got {bases!r}")
    merged: dict[str, Any] = {}
    for base in bases:
        base_path = _find_base(base, path)
        _merge(merged, _resolve_file(base_path, origin, stack + (path,)), origin, _display(base_path))
    _merge(merged, data, origin, _display(path))
    return merged


def _find_base(base: str, path: Path) -> Path:
    """The file a `base:` entry of `path` names: relative to `path`'s directory, then ./recipes, then the packaged
    recipes; without a .yaml/.yml suffix also `<base>.yaml` there, and a bare name also as a recipe name (as
    `tea train NAME` finds it: `base: quickstart` is recipes/quickstart.yaml)."""
    candidates = [Path(base)] if Path(base).is_absolute() else [path.parent / base, *(d / base for d in recipe_dirs())]
    if Path(base).suffix not in (".yaml", ".yml"):
        candidates += [c.with_name(c.name + ".yaml") for c in candidates]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None and Path(base).suffix not in (".yaml", ".yml") and len(Path(base).parts) == 1:
        found = next((c for c in discover_recipes() if c.stem == base), None)
    if found is None:
        looked = ", ".join(dict.fromkeys(_display(c.parent) for c in candidates))
        raise RecipeError(f"{_display(path)}: base recipe {base!r} not found (looked in {looked})")
    return found


# ------------------------------------------------------------------------------------------------
# `--set` overrides


def parse_override(item: str) -> tuple[str, Any]:
    """'a.b=c' → ('a.b', c parsed by the recipe loader): numbers (1e-5 too), booleans, null, lists and
    mappings read exactly as they would in a recipe file; anything else stays a string. An empty value
    (`a.b=`) is the empty string (`a.b=null` is none), checked like any other value."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {item!r}: expected KEY=VALUE, e.g. optim.lr=3e-5")
    try:
        value = parse_yaml(raw, f"--set {item!r}") if raw.strip() else ""
    except RecipeError as exc:
        if "duplicate key" in str(exc):
            raise
        value = raw  # not YAML (e.g. an unbalanced bracket): the literal text
    return key.strip(), value


def apply_overrides(data: dict[str, Any], overrides: list[str], origin: dict[str, str]) -> None:
    """Apply `--set` items in order. A mapping value merges into the section key by key, as a recipe
    merges over its bases (`rollout={temperature: 0.7}` keeps the other rollout keys); the free-form
    advantage.params, reward.params and rollout.vllm_kwargs are replaced whole, as there."""
    for item in overrides:
        key, value = parse_override(item)
        parts = key.split(".")
        node = data
        for part in parts[:-1]:
            if not isinstance(node.setdefault(part, {}), dict):
                raise RecipeError(f"--set {item!r}: {part!r} is not a section")
            node = node[part]
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict) and not _is_free_dict(key):
            _merge(node[parts[-1]], value, origin, OVERRIDE, key + ".")
            continue
        node[parts[-1]] = value
        origin[key] = OVERRIDE
        if isinstance(value, dict):
            _mark(value, origin, OVERRIDE, key + ".")


# ------------------------------------------------------------------------------------------------
# A recipe file → the validated tree


def load_recipe(path: str | Path, overrides: list[str] | None = None, *, runnable: bool = True, advantage: bool = True) -> Recipe:
    """Load, inherit, override and validate a recipe file. `runnable=False` skips the check that it names a
    policy and prompts (for commands that use one section only, e.g. `tea serve-rm` the reward);
    `advantage=False` skips running the advantage rule once (it imports torch; `tea recipes list` only lists)."""
    recipe, _ = load_recipe_with_origin(path, overrides, runnable=runnable, advantage=advantage)
    return recipe


def load_recipe_with_origin(
    path: str | Path, overrides: list[str] | None = None, *, runnable: bool = True, advantage: bool = True
) -> tuple[Recipe, dict[str, str]]:
    origin: dict[str, str] = {RECIPE_FILE: _display(path)}
    data = _resolve_file(Path(path), origin)
    if "name" in data and origin.get("name") != origin[RECIPE_FILE]:
        # set by a base: a recipe is its own run, named by its own name: or its file's (docs/recipes.md)
        del data["name"]
        origin.pop("name", None)
    data = _at_schema(data, origin, missing=SCHEMA_VERSION)
    apply_overrides(data, list(overrides or []), origin)
    recipe = build(Recipe, data, origin, "")
    if not recipe.name:
        if "name" in data:  # written empty (e.g. `--set name=`), not left out: there is no run name to default to
            raise RecipeError(f"name: empty{_where(origin, 'name')}; give the run a name, or leave name out to use "
                              f"the file's ({Path(path).stem!r})")
        recipe.name = Path(path).stem
        if not RUN_NAME.fullmatch(recipe.name):
            raise RecipeError(f"name: not set in {_display(path)}, and its file name {recipe.name!r} is not a run name "
                              f"({NAME_RULE}); set name: in the recipe")
    _check_name(recipe, origin)  # here, not in validate_recipe: a recorded run's recipe.yaml keeps the name it ran under
    validate_recipe(recipe, origin, runnable=runnable, advantage=advantage)
    return recipe, origin


# A run name becomes one directory (runs/<name>): never a path that leaves runs/ or nests in it.
RUN_NAME = re.compile(r"\w[\w.-]*")
NAME_RULE = "letters, digits, '_', '.' and '-', starting with a letter, digit or '_'; a name, not a path"


def _check_name(recipe: "Recipe", origin: dict[str, str]) -> None:
    if recipe.name and not RUN_NAME.fullmatch(recipe.name):
        raise RecipeError(f"name: {recipe.name!r} is not a run name ({NAME_RULE}){_where(origin, 'name')}")


def recipe_from_dict(
    data: dict[str, Any], source: str = "<dict>", overrides: Sequence[str] = (), *, runnable: bool = True,
    record: bool = False,
) -> Recipe:
    """Build and validate a Recipe from a plain dict, `--set` applied. Keys it lacks take today's defaults, or those of
    the `tea_schema` it names; `record=True` reads it as a run's recipe.yaml, of version 1 when it names none."""
    origin: dict[str, str] = {RECIPE_FILE: source}
    if isinstance(data, dict):
        _mark(data, origin, source, "")
        data = _at_schema(data, origin, missing=1 if record else SCHEMA_VERSION)
        apply_overrides(data, list(overrides), origin)
    recipe = build(Recipe, data, origin, "")
    validate_recipe(recipe, origin, runnable=runnable)
    return recipe


def _at_schema(data: dict[str, Any], origin: dict[str, str], *, missing: int) -> dict[str, Any]:
    """`data` without its `tea_schema`, each key it lacks at that version's default (`missing`: the version of a tree
    that names none); a bad or newer version is a RecipeError naming where it was set."""
    version = schema_version(data, _where(origin, SCHEMA_KEY), missing=missing)
    return fill_defaults(data, version)


# ------------------------------------------------------------------------------------------------
# A recipe tree as this version writes it


def canonical_tree(data: Any) -> dict[str, Any] | None:
    """The recorded recipe tree `data` (a run directory's recipe.yaml) as this version writes it: built against the
    schema without validation, with every key this version has, those `data` lacks at their defaults *at the
    `tea_schema` that wrote it* (version 1 without one: teacli/config/schema.py), then written and read back as
    `tea train` writes recipe.yaml. A recipe.yaml written before a key existed thus equals one written since with
    the key at the value runs had before it (`rollout.stop_tokens: []`), and differs from one with the key at a
    default that changed since (`policy.kernels: auto`): what compares two recorded recipes (resume, a base arm,
    the seeds of one method in `tea report`, a study's trained runs) compares these. None when `data` does not
    build (a key this version does not know, a value of the wrong type, a newer `tea_schema`)."""
    if not isinstance(data, dict):
        return None
    try:
        recipe = build(Recipe, _at_schema(data, {}, missing=1), {RECIPE_FILE: "<recipe.yaml>"}, "")
    except (ValueError, TypeError):
        return None
    return parse_yaml(to_yaml(recipe), "<recipe.yaml>")


def to_yaml(recipe: Recipe) -> str:
    """The recipe as tea writes it (recipe.yaml, a checkpoint's copy, `tea recipes show`): `tea_schema:` first."""
    import yaml

    tree = {SCHEMA_KEY: SCHEMA_VERSION, **recipe.to_dict()}
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=None, width=100)
