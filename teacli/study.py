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

Runs are named by their recipe's `name` (for shipped recipes, the file name); `baseline` and `pairs`
name runs of the study. Several studies share run directories: a run trained for one study is
skipped by the next (uf_core500 and uf_step450 evaluate the uf_core250 runs on core500).

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
from teacli.config import RECIPES_DIR, RecipeError, find_recipe, load_recipe


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


KEYS = {"name", "recipes", "baseline", "pairs", "eval", "report", "runs_dir", "launcher"}
EVAL_KEYS = {"split", "n", "checkpoint"}
REPORT_KEYS = {"out", "bootstrap", "seed", "endpoints"}


def studies_dir() -> Path:
    return RECIPES_DIR / "studies"


def shipped_studies() -> list[Path]:
    return sorted(studies_dir().glob("*.yaml"))


def find_study(name_or_path: str) -> Path:
    """A study path from a path or a bare name (`uf_core250` → recipes/studies/uf_core250.yaml), like `tea train`."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    for candidate in shipped_studies():
        if name_or_path in (candidate.stem, candidate.name):
            return candidate
    names = ", ".join(p.stem for p in shipped_studies())
    raise StudyError(f"no study file or name {name_or_path!r} (shipped studies: {names})")


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
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise StudyError(f"study file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise StudyError(f"{path}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        raise StudyError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
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
    )


def training_done(run_dir: Path, steps: int) -> bool:
    final = run_dir / "checkpoints" / rundir.step_dir_name(steps)
    return (final / "trainer_state.json").exists() or ((run_dir / "selected.json").exists() and final.exists())


def plan(study: Study) -> list[tuple[str, list[str], bool]]:
    """(label, command, already done) for every stage, in order."""
    tea = [sys.executable, "-m", "teacli.cli"]
    stages = []
    for recipe_path, name in zip(study.recipes, study.runs):
        recipe = load_recipe(recipe_path)
        run = study.runs_dir / name
        train_cmd = (study.launcher + ["teacli.cli"] if study.launcher else tea) + ["train", str(recipe_path), "--run-dir", str(run)]
        stages.append((f"train {name}", train_cmd, training_done(run, recipe.optim.steps)))
        bon = rundir.eval_dir(run, study.checkpoint) / f"{study.split}-M{study.n}.bon.json"
        eval_cmd = tea + ["eval-bon", str(run), "--n", str(study.n), "--split", study.split]
        if study.checkpoint != "selected":
            eval_cmd += ["--checkpoint", study.checkpoint]
        stages.append((f"eval-bon {name}", eval_cmd, bon.exists()))
    runs = [str(study.runs_dir / name) for name in study.runs]
    report_cmd = tea + ["report", *runs, "--baseline", str(study.runs_dir / study.baseline)]
    for run, base in study.pairs.items():
        report_cmd += ["--pair", f"{study.runs_dir / run}={study.runs_dir / base}"]
    report_cmd += ["--bootstrap", str(study.bootstrap), "--seed", str(study.seed), "--out", str(study.report_out),
                   "--split", study.split, "--n", str(study.n), "--checkpoint", study.checkpoint]
    if study.endpoints:
        report_cmd += ["--endpoints", ",".join(map(str, study.endpoints))]
    stages.append(("report", report_cmd, False))
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
