"""`tea study`: train, evaluate and report a set of recipes as one comparison, skipping what is done.

A study file (recipes/studies/*.yaml; the reference is docs/recipes.md, "Study files"):

    name: uf_m_to_n
    recipes: [uf_llama1b_grpo_m16, uf_llama1b_tea_m16, uf_llama1b_grpo, uf_llama1b_tea]  # names or paths
    baseline: uf_llama1b_grpo            # the default baseline of the report's deltas
    pairs:                               # runs compared with their own baseline instead
      uf_llama1b_tea_m16: uf_llama1b_grpo_m16
    eval: {split: core250, n: 512, checkpoint: selected}
    report: {out: report/uf_m_to_n, bootstrap: 1000, seed: 0, endpoints: [128, 256, 512]}
    runs_dir: runs                       # run directories: <runs_dir>/<recipe name>
    launcher: null                       # e.g. "deepspeed --num_gpus 8 --module"; `tea study --launcher` wins
    seeds: [0, 1, 2]                     # optional: train every recipe once per seed (runs <name>-s<seed>)
    base: true                           # optional: evaluate the untrained policy as an arm (true = the baseline's recipe)

Runs are named by their recipe's `name` (for shipped recipes, the file name); `baseline` and `pairs`
name recipes (methods) of the study. With `seeds`, recipe NAME is trained once per seed into
`<runs_dir>/NAME-s<seed>` (`tea train ... --set seed=<seed>`), every seed evaluated with the same
settings, and the report pools a method's seeds (teacli/report/pool.py). With `base`, the recipe's
untrained policy is evaluated once into `<runs_dir>/NAME-base/eval/base/` (`tea eval-bon --recipe`)
and reported as the arm every method is also compared with.

Several studies share run directories: a run trained for one study is skipped by the next
(uf_core500 and uf_step450 evaluate the uf_core250 runs on core500).

Each stage runs the real `tea` command in its own process (so every training run gets a fresh
process group), through the launcher for training when there is one. A stage is skipped when its
output already exists: training when the run's last checkpoint is the recipe's final step,
evaluation when `<eval dir>/<split>-M<n>.bon.json` exists. A killed study is resumed by running it
again (an unfinished training run resumes from its last checkpoint; an unfinished evaluation from
its records). The report is always rebuilt: it is cheap and must see every run's latest evaluation.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from teacli import rundir
from teacli.config import RECIPES_DIR, RecipeError, find_recipe, load_recipe, read_yaml


class StudyError(ValueError):
    """A study file problem, naming the key and the file."""


@dataclass
class Study:
    name: str
    recipes: list[Path]
    runs: list[str]  # run names (the recipes' `name`), in recipe order
    baseline: str
    split: str
    n: int
    report_out: Path
    pairs: dict[str, str] = field(default_factory=dict)  # run → its own baseline
    checkpoint: str = "selected"
    bootstrap: int = 1000
    seed: int = 0
    endpoints: list[int] | None = None
    runs_dir: Path = Path("runs")
    launcher: list[str] = field(default_factory=list)
    seeds: list[int] | None = None  # None: one run per recipe, named by the recipe
    base: str | None = None  # the recipe (run name) whose untrained policy is the base arm

    def run_dirs(self, name: str) -> list[tuple[Path, int | None]]:
        """(run directory, seed) of every training run of recipe `name`."""
        if self.seeds is None:
            return [(self.runs_dir / name, None)]
        return [(self.runs_dir / f"{name}-s{seed}", seed) for seed in self.seeds]

    def base_dir(self) -> Path | None:
        """The base arm's run-like directory (recipe.yaml + eval/base/), or None without `base`."""
        return None if self.base is None else self.runs_dir / f"{self.base}-base"


KEYS = {"name", "recipes", "baseline", "pairs", "eval", "report", "runs_dir", "launcher", "seeds", "base"}
EVAL_KEYS = {"split", "n", "checkpoint"}
REPORT_KEYS = {"out", "bootstrap", "seed", "endpoints"}


def shipped_studies() -> list[Path]:
    """The studies packaged with tea (names resolve with teacli.config.find_study: ./recipes first)."""
    return sorted((RECIPES_DIR / "studies").glob("*.yaml"))


def _positive_int(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StudyError(f"{where} must be an integer >= {minimum}, got {value!r}")
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


def load_study(path: str | Path, launcher: str | None = None) -> Study:
    """Read and check a study file; `launcher` (the command line's) replaces the file's `launcher:`."""
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
    recipes, runs, alias = [], [], {}
    for name in names:
        try:
            candidate = (path.parent / name) if (path.parent / name).is_file() else find_recipe(name)
            recipe = load_recipe(candidate)  # validate now: a bad recipe fails before hours of training
        except RecipeError as exc:
            raise StudyError(f"{path}: recipes: {exc}") from None
        if recipe.name in runs:
            raise StudyError(f"{path}: recipes: two recipes are named {recipe.name!r}; they would share runs/{recipe.name}")
        recipes.append(Path(candidate))
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
    checkpoint = str(ev.get("checkpoint", "selected"))
    try:
        rundir.parse_checkpoint_spec(checkpoint)
    except ValueError:
        raise StudyError(f"{path}: eval.checkpoint must be selected, base or step_N (e.g. step_450), got {checkpoint!r}") from None
    endpoints = rep.get("endpoints")
    if endpoints is not None:
        if not isinstance(endpoints, list) or not endpoints:
            raise StudyError(f"{path}: report.endpoints must be a list of N, e.g. [128, 256, 512], got {endpoints!r}")
        endpoints = [_positive_int(n, f"{path}: report.endpoints") for n in endpoints]
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
        seeds = [_positive_int(x, f"{path}: seeds", minimum=0) for x in raw]
        if len(set(seeds)) != len(seeds):
            raise StudyError(f"{path}: seeds: {seeds} repeats a seed; each seed is one training run")
    base = None
    raw_base = data.get("base", False)
    if raw_base is True:
        base = baseline
    elif isinstance(raw_base, str):
        base = run_of(raw_base, "base")
    elif raw_base not in (False, None):
        raise StudyError(f"{path}: base must be true (the baseline's recipe), false or a recipe of the study, got {raw_base!r}")
    if base is not None and checkpoint == "base":
        raise StudyError(f"{path}: base: with eval.checkpoint base would evaluate the untrained policy twice; drop one")
    name = _text(data.get("name", path.stem), f"{path}: name")
    return Study(
        name=name,
        recipes=recipes,
        runs=runs,
        baseline=baseline,
        pairs=pairs,
        split=_text(ev.get("split", "core250"), f"{path}: eval.split"),
        n=_positive_int(ev.get("n", 256), f"{path}: eval.n"),
        checkpoint=checkpoint,
        report_out=Path(_text(rep.get("out", f"report/{name}"), f"{path}: report.out")),
        bootstrap=_positive_int(rep.get("bootstrap", 1000), f"{path}: report.bootstrap"),
        seed=_positive_int(rep.get("seed", 0), f"{path}: report.seed", minimum=0),
        endpoints=endpoints,
        runs_dir=Path(_text(str(data.get("runs_dir", "runs")), f"{path}: runs_dir")),
        launcher=launch,
        seeds=seeds,
        base=base,
    )


def training_done(run_dir: Path, steps: int) -> bool:
    final = run_dir / "checkpoints" / rundir.step_dir_name(steps)
    return (final / "trainer_state.json").exists() or ((run_dir / "selected.json").exists() and final.exists())


def plan(study: Study) -> list[tuple[str, list[str], bool]]:
    """(label, command, already done) for every stage, in order: per recipe (and seed) train then eval-bon,
    the base arm's eval-bon, the report."""
    tea = [sys.executable, "-m", "teacli.cli"]
    stages = []
    run_dirs: list[Path] = []
    for recipe_path, name in zip(study.recipes, study.runs):
        recipe = load_recipe(recipe_path)
        for run, seed in study.run_dirs(name):
            label = run.name
            train_cmd = (study.launcher + ["teacli.cli"] if study.launcher else tea) + ["train", str(recipe_path), "--run-dir", str(run)]
            if seed is not None:
                train_cmd += ["--set", f"seed={seed}"]
            stages.append((f"train {label}", train_cmd, training_done(run, recipe.optim.steps)))
            bon = rundir.eval_dir(run, study.checkpoint) / f"{study.split}-M{study.n}.bon.json"
            eval_cmd = tea + ["eval-bon", str(run), "--n", str(study.n), "--split", study.split]
            if study.checkpoint != "selected":
                eval_cmd += ["--checkpoint", study.checkpoint]
            stages.append((f"eval-bon {label}", eval_cmd, bon.exists()))
            run_dirs.append(run)
    base_dir = study.base_dir()
    if base_dir is not None:
        base_recipe = study.recipes[study.runs.index(study.base)]
        bon = rundir.eval_dir(base_dir, "base") / f"{study.split}-M{study.n}.bon.json"
        stages.append((f"eval-bon {base_dir.name} (untrained {study.base})",
                       tea + ["eval-bon", str(base_dir), "--recipe", str(base_recipe), "--checkpoint", "base",
                              "--n", str(study.n), "--split", study.split], bon.exists()))

    def method(name: str) -> str:  # with seeds the report pools NAME-s<seed> into the method NAME
        return name if study.seeds is not None else str(study.runs_dir / name)

    report_cmd = tea + ["report", *map(str, run_dirs), "--baseline", method(study.baseline)]
    for run, base in study.pairs.items():
        report_cmd += ["--pair", f"{method(run)}={method(base)}"]
    if base_dir is not None:
        report_cmd += ["--base-arm", str(base_dir)]
    report_cmd += ["--bootstrap", str(study.bootstrap), "--seed", str(study.seed), "--out", str(study.report_out),
                   "--split", study.split, "--n", str(study.n), "--checkpoint", study.checkpoint]
    if study.endpoints:
        report_cmd += ["--endpoints", ",".join(map(str, study.endpoints))]
    stages.append(("report", report_cmd, False))
    return stages


def run_study(study: Study, dry_run: bool = False, echo: Callable[[str], Any] = print) -> int:
    """Run every stage not yet done; returns the number of stages run (with `dry_run`: that would run).
    Stops at the first failure. Every stage is printed with its command, done or not."""
    ran = 0
    for label, cmd, done in plan(study):
        if done:
            echo(f"skip  {label} (done): {shlex.join(cmd)}")
            continue
        echo(f"run   {label}: {shlex.join(cmd)}")
        if dry_run:
            ran += 1
            continue
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            raise StudyError(f"stage '{label}' failed with exit code {proc.returncode}; fix it and run the study again to resume")
        ran += 1
    return ran
