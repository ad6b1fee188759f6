"""`tea study`: train, evaluate and report a set of recipes as one comparison, skipping what is done.

A study file (recipes/studies/*.yaml):

    name: uf_core250
    recipes: [uf_llama1b_tea, uf_llama1b_grpo, ...]   # names under recipes/ or paths
    baseline: uf_llama1b_grpo                          # the report's deltas are against this run
    eval: {split: core250, n: 256}
    report: {out: report/uf_core250, bootstrap: 1000}
    runs_dir: runs                                     # run directories: <runs_dir>/<recipe name>
    launcher: null                                     # e.g. "deepspeed --num_gpus 8 --module"

Each stage runs the real `tea` command in its own process (so every training run gets a fresh
process group), through `launcher` for training when given. A stage is skipped when its output
already exists: training when the run's last checkpoint is the recipe's final step, evaluation
when `eval/<split>-M<n>.bon.json` exists. A killed study is resumed by running it again (an
unfinished training run resumes from its last checkpoint; an unfinished evaluation from its
records).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from teacli.config import RecipeError, find_recipe, load_recipe


class StudyError(ValueError):
    """A study file problem, naming the key and the file."""


@dataclass
class Study:
    name: str
    recipes: list[Path]
    baseline: str
    split: str
    n: int
    report_out: Path
    bootstrap: int = 1000
    runs_dir: Path = Path("runs")
    launcher: list[str] = field(default_factory=list)


KEYS = {"name", "recipes", "baseline", "eval", "report", "runs_dir", "launcher"}


def load_study(path: str | Path) -> Study:
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise StudyError(f"study file not found: {path}") from None
    if not isinstance(data, dict):
        raise StudyError(f"{path}: a study must be a YAML mapping")
    unknown = sorted(set(data) - KEYS)
    if unknown:
        raise StudyError(f"{path}: unknown study key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(KEYS))}")
    names = data.get("recipes")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise StudyError(f"{path}: 'recipes' must be a non-empty list of recipe names or paths")
    recipes = []
    for name in names:
        try:
            candidate = (path.parent / name) if (path.parent / name).exists() else find_recipe(name)
            load_recipe(candidate)  # validate now: a bad recipe fails before hours of training
        except RecipeError as exc:
            raise StudyError(f"{path}: recipes: {exc}") from None
        recipes.append(Path(candidate))
    ev, rep = data.get("eval") or {}, data.get("report") or {}
    if not isinstance(ev, dict) or not isinstance(rep, dict):
        raise StudyError(f"{path}: 'eval' and 'report' must be mappings")
    stems = [r.stem for r in recipes]
    baseline = data.get("baseline", stems[0])
    if baseline not in stems:
        raise StudyError(f"{path}: baseline {baseline!r} is not one of the study's recipes ({', '.join(stems)})")
    launcher = data.get("launcher") or []
    return Study(
        name=str(data.get("name", path.stem)),
        recipes=recipes,
        baseline=baseline,
        split=str(ev.get("split", "core250")),
        n=int(ev.get("n", 256)),
        report_out=Path(rep.get("out", f"report/{data.get('name', path.stem)}")),
        bootstrap=int(rep.get("bootstrap", 1000)),
        runs_dir=Path(data.get("runs_dir", "runs")),
        launcher=shlex.split(launcher) if isinstance(launcher, str) else list(launcher),
    )


def training_done(run_dir: Path, steps: int) -> bool:
    final = run_dir / "checkpoints" / f"step_{steps:06d}"
    return (final / "trainer_state.json").exists() or ((run_dir / "selected.json").exists() and final.exists())


def plan(study: Study) -> list[tuple[str, list[str], bool]]:
    """(label, command, already done) for every stage, in order."""
    tea = [sys.executable, "-m", "teacli.cli"]
    stages = []
    runs = []
    for recipe_path in study.recipes:
        recipe = load_recipe(recipe_path)
        run = study.runs_dir / recipe.name
        runs.append(run)
        train_cmd = (study.launcher + ["teacli.cli"] if study.launcher else tea) + ["train", str(recipe_path), "--run-dir", str(run)]
        stages.append((f"train {recipe.name}", train_cmd, training_done(run, recipe.optim.steps)))
        bon = run / "eval" / f"{study.split}-M{study.n}.bon.json"
        stages.append((f"eval-bon {recipe.name}", tea + ["eval-bon", str(run), "--n", str(study.n), "--split", study.split], bon.exists()))
    baseline_run = study.runs_dir / study.baseline
    report_cmd = tea + ["report", *map(str, runs), "--baseline", str(baseline_run), "--bootstrap", str(study.bootstrap),
                        "--out", str(study.report_out), "--split", study.split, "--n", str(study.n)]
    stages.append(("report", report_cmd, False))  # cheap, and it must see every run's latest evaluation
    return stages


def run_study(study: Study, dry_run: bool = False, echo: Callable[[str], Any] = print) -> int:
    """Run every stage not yet done; returns the number of stages run. Stops at the first failure."""
    ran = 0
    for label, cmd, done in plan(study):
        if done:
            echo(f"skip  {label} (done)")
            continue
        echo(f"run   {label}: {shlex.join(cmd)}")
        if dry_run:
            continue
        proc = subprocess.run(cmd)
        if proc.returncode != 0:
            raise StudyError(f"stage '{label}' failed with exit code {proc.returncode}; fix it and run the study again to resume")
        ran += 1
    return ran
