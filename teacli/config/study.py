"""A study file's schema (recipes/studies/*.yaml, or any YAML file; docs/recipes.md, "Study files"): the recipes of one
comparison, how to evaluate them and how to report them. Every key is declared once below (StudyFile, with its
sections StudyEval and StudyReport) with its default, its documentation and, for numbers, its range; `read_study`
checks a file against these declarations, resolves its recipes and runs, and returns the Study that `tea study` runs.
Each problem is one StudyError naming the file and the key.

What needs the stages' own modules is checked by teacli/study.py when it loads a study: that every recipe's data has
the evaluated split, that the report's endpoints are among the N the evaluation reports, that every recipe writes and
keeps the evaluated checkpoint.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli import rundir
from teacli.config.load import load_recipe, read_yaml
from teacli.config.lookup import find_recipe
from teacli.config.tree import RecipeError, field

if TYPE_CHECKING:
    from teacli.config.tree import Recipe


class StudyError(ValueError):
    """A study file problem, naming the key and the file."""


# ------------------------------------------------------------------------------------------------
# The file


@dataclass
class StudyEval:
    split: str = field("core250", "The split every run is evaluated on (`tea eval-bon --split`); every recipe's data must have it.")
    n: int = field(256, "M: completions sampled per prompt (`tea eval-bon --n`); the report's N are the powers of two dividing it.", ge=1)
    checkpoint: str = field(
        "selected", "The checkpoint evaluated: selected (the validation's choice), base (the untrained policy) or step_N, "
        "which every recipe must write and keep.",
    )


@dataclass
class StudyReport:
    out: str | None = field(None, "The report's directory; default report/<name>.")
    # The bounds of `tea report --bootstrap` (teacli.eval.stats.MIN_RESAMPLES, MAX_RESAMPLES; tests/test_study.py checks).
    bootstrap: int = field(1000, "Bootstrap resamples of the report's intervals: 41 (a 95% interval's fewest) to 100000.", ge=41, le=100_000)
    seed: int = field(0, "Seed of the bootstrap.", ge=0)
    endpoints: list[int] | None = field(
        None, "The report's high-N columns, e.g. [128, 256, 512] (default: the three largest N); each one of the N that "
        "eval.n evaluates.", ge=1,
    )


@dataclass
class StudyFile:
    name: str | None = field(None, "The study's name (its logs, its default report directory); default: the file's name.")
    recipes: list[str] = field(
        [], "The recipes compared (required): names (recipes/*.yaml) or paths, relative to the study file first. A run is "
        "named by its recipe's name:.",
    )
    baseline: str | None = field(None, "The run every delta is taken against, a recipe of the study; default: the first.")
    pairs: dict[str, str] = field({}, "RUN: BASELINE, runs compared with their own baseline instead (recipes of the study).")
    eval: StudyEval = field(StudyEval(), "How every run is evaluated (`tea eval-bon`).")
    report: StudyReport = field(StudyReport(), "How the runs are compared (`tea report`).")
    runs_dir: str = field("runs", "Where the run directories go: <runs_dir>/<recipe name> (<recipe name>-s<seed> with seeds).")
    launcher: str | list[str] | None = field(
        None, "Launch training through this command, e.g. \"deepspeed --num_gpus 8 --module\"; `tea study --launcher` "
        "replaces it; default: one process.",
    )
    seeds: list[int] | None = field(
        None, "Train every recipe once per seed (runs <name>-s<seed>, `tea train --set seed=<seed>`), each evaluated alike; "
        "the report pools a method's seeds.", ge=0,
    )
    base: bool | str | None = field(
        False, "Evaluate an untrained policy once (`tea eval-bon --recipe R --checkpoint base`, into <runs_dir>/R-base) as "
        "an arm every method is compared with: true = the baseline's recipe, or a recipe of the study.",
    )


# ------------------------------------------------------------------------------------------------
# What `tea study` runs


@dataclass
class Study:
    """A study file resolved: its recipes' files and run names, every setting given or defaulted."""

    name: str
    recipes: list[Path]
    runs: list[str]  # run names (the recipes' `name`), in recipe order
    baseline: str
    split: str
    n: int
    report_out: Path
    pairs: dict[str, str] = dataclasses.field(default_factory=dict)  # run → its own baseline
    checkpoint: str = "selected"
    bootstrap: int = 1000
    seed: int = 0
    endpoints: list[int] | None = None
    runs_dir: Path = Path("runs")
    launcher: list[str] = dataclasses.field(default_factory=list)
    seeds: list[int] | None = None  # None: one run per recipe, named by the recipe
    base: str | None = None  # the recipe (run name) whose untrained policy is the base arm
    partial: bool = False  # only some of the seeds (`--seeds`): no report stage

    def run_dirs(self, name: str) -> list[tuple[Path, int | None]]:
        """(run directory, seed) of every training run of recipe `name`."""
        if self.seeds is None:
            return [(self.runs_dir / name, None)]
        return [(self.runs_dir / f"{name}-s{seed}", seed) for seed in self.seeds]

    def base_dir(self) -> Path | None:
        """The base arm's run-like directory (recipe.yaml + eval/base/), or None without `base`."""
        return None if self.base is None else self.runs_dir / f"{self.base}-base"


def _keys(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


KEYS = _keys(StudyFile)
EVAL_KEYS = _keys(StudyEval)
REPORT_KEYS = _keys(StudyReport)


def _bounds(cls: type, key: str) -> dict[str, Any]:
    """The declared range of `cls.key`: minimum (ge) and maximum (le)."""
    meta = next(f.metadata for f in dataclasses.fields(cls) if f.name == key)
    return {"minimum": meta.get("ge", 1), "maximum": meta.get("le")}


def _positive_int(value: Any, where: str, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StudyError(f"{where} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise StudyError(f"{where} must be an integer <= {maximum}, got {value!r}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise StudyError(f"{where} must be a non-empty string, got {value!r}")
    return value


def _section(data: dict, key: str, allowed: set[str], path: Path) -> dict:
    section = data.get(key) or {}
    if not isinstance(section, dict):
        raise StudyError(f"{path}: '{key}' must be a mapping, got {section!r}")
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise StudyError(f"{path}: unknown key(s) {', '.join(f'{key}.{k}' for k in unknown)}; valid: {', '.join(sorted(allowed))}")
    return section


def read_study(path: str | Path, launcher: str | None = None) -> tuple[Study, list["Recipe"]]:
    """Read and check a study file against the schema; `launcher` (the command line's) replaces the file's `launcher:`.
    Returns the Study and its recipes, loaded and validated (a bad recipe fails before hours of training)."""
    path = Path(path)
    try:
        data = read_yaml(path)  # the recipe loader: duplicate keys are errors, 1e-5 is a number
    except RecipeError as exc:
        raise StudyError(str(exc).replace("recipe file not found", "study file not found")) from None
    if not isinstance(data, dict):
        raise StudyError(f"{path}: a study must be a YAML mapping with at least 'recipes'")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise StudyError(f"{path}: unknown study key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(KEYS))}")
    names = data.get("recipes")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise StudyError(f"{path}: 'recipes' must be a non-empty list of recipe names or paths")
    recipes, runs, alias, loaded = [], [], {}, []
    for name in names:
        try:
            candidate = (path.parent / name) if (path.parent / name).is_file() else find_recipe(name)
            recipe = load_recipe(candidate)  # validate now: a bad recipe fails before hours of training
        except RecipeError as exc:
            raise StudyError(f"{path}: recipes: {exc}") from None
        if recipe.name in runs:
            raise StudyError(f"{path}: recipes: two recipes are named {recipe.name!r}; they would share runs/{recipe.name}")
        recipes.append(Path(candidate))
        loaded.append(recipe)
        runs.append(recipe.name)
        alias[recipe.name] = alias[Path(candidate).stem] = recipe.name

    def run_of(value: Any, where: str) -> str:
        if not isinstance(value, str) or value not in alias:
            raise StudyError(f"{path}: {where} {value!r} is not one of the study's runs ({', '.join(runs)})")
        return alias[value]

    baseline = run_of(data["baseline"], "baseline") if "baseline" in data else runs[0]
    raw_pairs = data.get("pairs") or {}
    if not isinstance(raw_pairs, dict):
        raise StudyError(f"{path}: 'pairs' must be a mapping RUN: BASELINE, got {raw_pairs!r}")
    pairs = {}
    for run, base in raw_pairs.items():
        r, b = run_of(run, "pairs: run"), run_of(base, f"pairs.{run}:")
        if r == b:
            raise StudyError(f"{path}: pairs.{run}: a run cannot be its own baseline")
        pairs[r] = b

    ev = _section(data, "eval", EVAL_KEYS, path)
    rep = _section(data, "report", REPORT_KEYS, path)
    checkpoint = str(ev.get("checkpoint", StudyEval.checkpoint))
    try:
        rundir.parse_checkpoint_spec(checkpoint)
    except ValueError:
        raise StudyError(f"{path}: eval.checkpoint must be selected, base or step_N (e.g. step_450), got {checkpoint!r}") from None
    endpoints = rep.get("endpoints")
    if endpoints is not None:
        if not isinstance(endpoints, list) or not endpoints:
            raise StudyError(f"{path}: report.endpoints must be a list of N, e.g. [128, 256, 512], got {endpoints!r}")
        endpoints = [_positive_int(n, f"{path}: report.endpoints", **_bounds(StudyReport, "endpoints")) for n in endpoints]
    raw_launcher = data.get("launcher") if launcher is None else launcher
    if raw_launcher is None or raw_launcher == "":
        launch: list[str] = []
    elif isinstance(raw_launcher, str):
        launch = shlex.split(raw_launcher)
    elif isinstance(raw_launcher, list) and all(isinstance(x, str) for x in raw_launcher):
        launch = list(raw_launcher)
    else:
        raise StudyError(f"{path}: launcher must be a command line such as \"deepspeed --num_gpus 8 --module\", got {raw_launcher!r}")
    seeds = None
    if "seeds" in data:
        raw = data["seeds"]
        if not isinstance(raw, list) or not raw:
            raise StudyError(f"{path}: seeds must be a non-empty list of training seeds, e.g. [0, 1, 2], got {raw!r}")
        seeds = [_positive_int(x, f"{path}: seeds", **_bounds(StudyFile, "seeds")) for x in raw]
        if len(set(seeds)) != len(seeds):
            raise StudyError(f"{path}: seeds: {seeds} repeats a seed; each seed is one training run")
    base = None
    raw_base = data.get("base", StudyFile.base)
    if raw_base is True:
        base = baseline
    elif isinstance(raw_base, str):
        base = run_of(raw_base, "base")
    elif raw_base not in (False, None):
        raise StudyError(f"{path}: base must be true (the baseline's recipe), false or a recipe of the study, got {raw_base!r}")
    if base is not None and checkpoint == "base":
        raise StudyError(f"{path}: base: with eval.checkpoint base would evaluate the untrained policy twice; drop one")
    name = _text(data.get("name", path.stem), f"{path}: name")
    split = _text(ev.get("split", StudyEval.split), f"{path}: eval.split")
    n = _positive_int(ev.get("n", StudyEval.n), f"{path}: eval.n", **_bounds(StudyEval, "n"))
    runs_dir = Path(_text(str(data.get("runs_dir", StudyFile.runs_dir)), f"{path}: runs_dir"))
    for parent in (runs_dir, *runs_dir.parents):  # the nearest part that exists must be a directory (a dry run checks it too)
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                what = f"runs_dir {str(runs_dir)!r}" + ("" if parent == runs_dir else f": {str(parent)!r}")
                raise StudyError(f"{path}: {what} is {'a file' if parent.is_file() else 'not a directory'}; the study's run "
                                 f"directories go under runs_dir: name a directory (or a path that does not exist yet)")
            break
    study = Study(
        name=name,
        recipes=recipes,
        runs=runs,
        baseline=baseline,
        pairs=pairs,
        split=split,
        n=n,
        checkpoint=checkpoint,
        report_out=Path(_text(rep.get("out", f"report/{name}"), f"{path}: report.out")),
        bootstrap=_positive_int(rep.get("bootstrap", StudyReport.bootstrap), f"{path}: report.bootstrap", **_bounds(StudyReport, "bootstrap")),
        seed=_positive_int(rep.get("seed", StudyReport.seed), f"{path}: report.seed", **_bounds(StudyReport, "seed")),
        endpoints=endpoints,
        runs_dir=runs_dir,
        launcher=launch,
        seeds=seeds,
        base=base,
    )
    return study, loaded
