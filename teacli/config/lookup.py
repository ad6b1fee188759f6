"""Where recipes and studies are found: `./recipes` first (a clone, or the user's own), then the recipes shipped with
tea; a bare name (`uf_llama1b_tea`, `uf_core250`) or a path. Also `tea recipes list`'s summary of a recipe.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.config.tree import RecipeError

if TYPE_CHECKING:
    from teacli.config.tree import Recipe

_PACKAGE = Path(__file__).resolve().parent.parent  # teacli/


def packaged_recipes_dir() -> Path:
    """The recipes (and recipes/studies) shipped with tea: `teacli/recipes/` in an installed wheel
    (setup.py maps the repository's `recipes/` there), `recipes/` beside `teacli/` in a checkout."""
    installed = _PACKAGE / "recipes"
    return installed if installed.is_dir() else _PACKAGE.parent / "recipes"


RECIPES_DIR = packaged_recipes_dir()


def _display(path: str | Path) -> str:
    """A path for messages: relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def recipe_dirs() -> list[Path]:
    """Where recipe names, `base:` files and study names are looked up, in order: the user's
    `./recipes` (a clone, or the user's own), then the recipes shipped with tea."""
    dirs = [Path.cwd() / "recipes", packaged_recipes_dir()]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def discover_recipes(root: Path | None = None) -> list[Path]:
    """Every runnable recipe (base/ and studies/ hold fragments and studies, not recipes), sorted by name.

    Under `root` alone when given; otherwise `./recipes` first, then the packaged recipes whose names
    `./recipes` does not already have (a local recipe shadows the packaged one of the same name).
    """
    roots = [root] if root is not None else recipe_dirs()
    found: dict[str, Path] = {}
    for r in roots:
        for p in sorted(r.rglob("*.yaml")):
            if p.relative_to(r).parts[0] not in {"base", "studies"}:
                found.setdefault(p.stem, p)
    return sorted(found.values(), key=lambda p: p.stem)


def _find(name_or_path: str, kind: str, candidates: list[Path], hint: str) -> Path:
    """An existing file `name_or_path`, else the first of `candidates` (name lookups) that exists."""
    path = Path(name_or_path)
    if path.is_dir():
        raise RecipeError(f"{_display(path)} is a directory, not a {kind} file; name a .yaml file or a {kind} name ({hint})")
    if path.is_file():
        return path
    if path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        # A path that is not there (e.g. recipes/x.yaml typed outside a clone): point at the name, do not guess.
        same = next((c for c in candidates if c.name == path.name or c.stem == path.stem), None)
        extra = f"; the {kind} name {same.stem!r} finds {_display(same)}" if same else ""
        raise RecipeError(f"{kind} file not found: {name_or_path}{extra}")
    found = next((c for c in candidates if c.stem == name_or_path), None)
    if found is None:
        raise RecipeError(f"no {kind} file or name {name_or_path!r} ({hint})")
    return found


def find_recipe(name_or_path: str) -> Path:
    """A recipe path from a path or a bare name (`uf_llama1b_tea` → ./recipes/uf_llama1b_tea.yaml, else the
    packaged one); RecipeError for a directory, a missing file or an unknown name."""
    return _find(name_or_path, "recipe", discover_recipes(), "see `tea recipes list`")


def find_study(name_or_path: str) -> Path:
    """A study file from a path or a bare name (`uf_core250` → ./recipes/studies/uf_core250.yaml, else the
    packaged one); RecipeError as for find_recipe."""
    studies = [p for d in recipe_dirs() for p in sorted((d / "studies").glob("*.yaml"))]
    return _find(name_or_path, "study", studies, "studies live in recipes/studies/")


def shipped_studies() -> list[Path]:
    """The studies packaged with tea (names resolve with find_study: ./recipes first)."""
    return sorted((RECIPES_DIR / "studies").glob("*.yaml"))


def recipe_summary(path: str | Path, recipe: "Recipe") -> dict[str, Any]:
    """`tea recipes list`'s row of a recipe: its name and file (relative to the working directory where it is
    below it), method, group size, N_target (rules that have one), policy, reward, dataset and LoRA."""
    params = recipe.advantage.params
    reward = recipe.reward.name_or_path if recipe.reward.kind == "hf" else recipe.reward.function or recipe.reward.kind
    try:
        rel = str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        rel = str(path)
    return {
        "name": recipe.name,
        "path": rel,
        "advantage": recipe.advantage.name,
        "m": recipe.rollout.group_size,
        "n_target": params.get("n_target") if recipe.advantage.name in ("tea", "tea_raw", "prefix_tea", "cat_bon") else None,
        "policy": recipe.policy.name_or_path,
        "reward": reward,
        "dataset": recipe.data.dir,
        "lora": recipe.policy.lora.enabled,
    }
