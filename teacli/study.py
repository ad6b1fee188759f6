"""`tea study`: train, evaluate and report a set of recipes as one comparison, skipping what is done.

A study file (recipes/studies/*.yaml; the reference is docs/recipes.md, "Study files"; its schema, each key
declared and documented once, is teacli/config/study.py):

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

Each stage runs the real `tea` command in its own process and process group, through the launcher
for training when there is one. A stage is skipped when its output already exists: training when
the run's last checkpoint is the recipe's final step, evaluation when `<eval dir>/<split>-M<n>.bon.json`
exists. A killed study is resumed by running it again (an unfinished training run resumes from its
last checkpoint; an unfinished evaluation from its records). The report is always rebuilt: it is
cheap and must see every run's latest evaluation.

Stages run on slots: one by default (one stage at a time, its output on the terminal), or with
`--gpus 0,1,2,3 --per-gpu K` K slots per GPU, each stage with CUDA_VISIBLE_DEVICES set to its GPU,
its own MASTER_PORT and its output in `<runs_dir>/logs/<study>/<stage>.log`. The assignment is
fixed before anything runs, so `--dry-run` prints it: a stage that waits for other pending stages
runs on the slot of the last of them (an evaluation follows its training on the same GPU), any
other is dealt to the next slot in turn. A stage starts when its slot is free and the stages it
needs have finished; a stage that fails stops only the stages that need it, and the study then
exits 1 naming every failed stage and its log. SIGINT, SIGTERM and SIGHUP are passed on to every
running stage's process group; the study waits for them to stop and exits 128 + the signal.
A study checks on load what its stages would otherwise find only after training: `report.endpoints`
among the N that eval.n evaluates, `eval.split` among the splits of every recipe's data, and an
`eval.checkpoint` that every recipe writes and keeps.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from teacli import rundir
from teacli.config import Study, StudyError, load_recipe, read_study, shipped_studies  # noqa: F401  (re-exported)
from teacli.data.prepare import split_names
from teacli.data.sources import PACKAGED

if TYPE_CHECKING:
    from teacli.config import Recipe


class StagesFailed(RuntimeError):
    """The study ran and some stages failed (exit 1); the message names them and their logs."""


class StudyInterrupted(RuntimeError):
    """A signal stopped the study after its running stages were stopped (exit 128 + signum)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


def load_study(path: str | Path, launcher: str | None = None) -> Study:
    """Read and check a study file (teacli/config/study.py: the schema) and what its stages would otherwise find only
    after training (`_check_outputs`); `launcher` (the command line's) replaces the file's `launcher:`."""
    study, recipes = read_study(path, launcher)
    _check_outputs(Path(path), recipes, study.split, study.n, study.checkpoint, study.endpoints)
    return study


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 6 else f"{steps[0]}, {steps[1]}, ..., {steps[-1]}"


def _data_splits(data_dir: str) -> tuple[list[str], str]:
    """The splits a recipe's data.dir offers, and where that list comes from (for the error)."""
    if data_dir in PACKAGED:
        return list(split_names(data_dir)), f"the {data_dir} prompt set"
    if Path(data_dir).is_dir():
        return sorted(p.name[: -len(".jsonl")] for p in Path(data_dir).glob("*.jsonl")), data_dir
    return list(split_names()), f"{data_dir} (not prepared yet: the splits `tea prepare-data` writes)"


def _check_outputs(path: Path, recipes: list["Recipe"], split: str, n: int, checkpoint: str, endpoints: list[int] | None) -> None:
    """What the stages would otherwise find only after training: an endpoint the evaluation has no column
    for, a split the data does not have, a checkpoint no run writes or keeps."""
    from teacli.eval.stats import powers_of_two_dividing  # numpy: only when a study is read

    evaluated = powers_of_two_dividing(n)  # the N of every bon.json (teacli.eval.bon)
    if endpoints:
        missing = [e for e in endpoints if e not in evaluated]
        if missing:
            raise StudyError(f"{path}: report.endpoints {missing}: not among the N that eval.n = {n} evaluates "
                             f"({', '.join(map(str, evaluated))}: the powers of two dividing it)")
    which = rundir.parse_checkpoint_spec(checkpoint)
    for recipe in recipes:
        names, where = _data_splits(recipe.data.dir)
        if split not in names:
            raise StudyError(f"{path}: eval.split {split!r}: recipe {recipe.name}'s data has no such split "
                             f"(data.dir {where}: {', '.join(names) or 'none'})")
        if which == "selected" and not recipe.validation.enabled:
            raise StudyError(f"{path}: eval.checkpoint selected: recipe {recipe.name} sets validation.enabled: false, "
                             "so it never selects a checkpoint; evaluate a fixed one (eval.checkpoint: step_N)")
        if isinstance(which, int):
            every, steps = recipe.checkpoint.save_every, recipe.optim.steps
            saved = sorted({s for s in range(every, steps + 1, every)} | {steps})
            if which not in saved:
                raise StudyError(f"{path}: eval.checkpoint {checkpoint}: recipe {recipe.name} never writes step {which} "
                                 f"(optim.steps {steps}, checkpoint.save_every {every}: steps {_steps_text(saved)})")
            keep = recipe.checkpoint.keep_last
            if keep is not None and which not in saved[-keep:]:
                raise StudyError(f"{path}: eval.checkpoint {checkpoint}: recipe {recipe.name}'s checkpoint.keep_last {keep} "
                                 f"deletes step {which} unless validation selects it (it keeps steps {_steps_text(saved[-keep:])}); "
                                 "set checkpoint.keep_last: null or evaluate a kept step")


def refuse_rehearsal(run_dir: Path) -> None:
    """A study's run directory that holds a rehearsal (random weights: `tea train --rehearse`) is a StudyError:
    a study counts what its runs wrote as results."""
    import yaml

    try:
        tree = yaml.safe_load((run_dir / "recipe.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # absent (not trained yet) or unreadable: the stage's own command says what is wrong
    rehearsal = tree.get("rehearsal") if isinstance(tree, dict) else None
    if isinstance(rehearsal, dict) and rehearsal.get("enabled"):
        raise StudyError(f"{run_dir} holds a rehearsal (rehearsal.enabled in its recipe.yaml), not a run a study can count; "
                         "move it away or use another runs_dir")


def refuse_changed_default(run_dir: Path, recipe: "Recipe", recipe_path: Path) -> None:
    """A StudyError when `run_dir` holds a run written under an older tea_schema that ran with another value of a key
    whose default changed since than the study's recipe gives now (teacli/config/schema.py): counted as the recipe's
    run, it did not run as the runs still to train will, and the report would refuse it only once they are trained."""
    from teacli.config import SCHEMA_VERSION, RecipeError, canonical_tree, default_changes, default_differences, parse_yaml
    from teacli.config import read_yaml, schema_version, to_yaml

    try:
        data = read_yaml(run_dir / "recipe.yaml")
        version = schema_version(data, missing=1) if isinstance(data, dict) else SCHEMA_VERSION
    except RecipeError:
        return  # absent (not trained yet), unreadable or newer: the stage's own command says what is wrong
    before = canonical_tree(data) if default_changes(version, SCHEMA_VERSION) else None
    if before is None:
        return
    changed, _ = default_differences(before, version, parse_yaml(to_yaml(recipe), str(recipe_path)), SCHEMA_VERSION)
    if changed:
        ran = ", ".join(f"{k}: {a!r}" for k, (a, _) in changed.items())
        now = ", ".join(f"{k}: {b!r}" for k, (_, b) in changed.items())
        raise StudyError(f"{run_dir} was trained under tea_schema {version} and ran with {ran}; recipe {recipe.name} gives "
                         f"{now} now (a default that changed since), so the runs still to train would not run as it did: "
                         f"set {ran} in {recipe_path} to go on with the runs recorded, or move {run_dir} away to train it again")


def training_done(run_dir: Path, steps: int) -> bool:
    final = run_dir / "checkpoints" / rundir.step_dir_name(steps)
    return (final / "trainer_state.json").exists() or ((run_dir / "selected.json").exists() and final.exists())


@dataclass(frozen=True)
class Stage:
    """One `tea` command of a study."""

    label: str  # "train NAME", "eval-bon NAME", "report", ...: unique within a study
    cmd: list[str]
    done: bool  # its output exists: skipped
    needs: tuple[str, ...] = ()  # labels of the stages that must finish first

    @property
    def log_name(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.label).strip("_") + ".log"


def select_seeds(study: Study, text: str) -> Study:
    """`--seeds 0,1`: the study restricted to these of its seeds (a study run in parts, e.g. one GPU machine
    per part). Its plan has no report: the report pools every seed, so it runs once all parts are done."""
    if study.seeds is None:
        raise StudyError(f"--seeds: study {study.name} has no seeds: (one run per recipe)")
    try:
        chosen = [int(x) for x in text.split(",")]
    except ValueError:
        raise StudyError(f"--seeds {text!r}: expected seeds separated by commas, e.g. --seeds 0,1") from None
    unknown = [x for x in chosen if x not in study.seeds]
    if unknown:
        raise StudyError(f"--seeds {text!r}: {', '.join(map(str, unknown))} not among study {study.name}'s seeds "
                         f"({', '.join(map(str, study.seeds))})")
    if len(set(chosen)) != len(chosen):
        raise StudyError(f"--seeds {text!r} names a seed twice")
    return replace(study, seeds=[x for x in study.seeds if x in chosen], partial=True)


def plan(study: Study) -> list[Stage]:
    """Every stage, in order: per recipe (and seed) train then eval-bon, the base arm's eval-bon, the report
    (not for part of the seeds: `select_seeds`). An evaluation needs its training; the report needs every other stage."""
    tea = [sys.executable, "-m", "teacli.cli"]
    stages: list[Stage] = []
    run_dirs: list[Path] = []
    for recipe_path, name in zip(study.recipes, study.runs):
        recipe = load_recipe(recipe_path)
        for run, seed in study.run_dirs(name):
            label = run.name
            refuse_rehearsal(run)
            refuse_changed_default(run, recipe if seed is None else replace(recipe, seed=seed), recipe_path)
            train_cmd = (study.launcher + ["teacli.cli"] if study.launcher else tea) + ["train", str(recipe_path), "--run-dir", str(run)]
            if seed is not None:
                train_cmd += ["--set", f"seed={seed}"]
            bon = rundir.eval_dir(run, study.checkpoint) / f"{study.split}-M{study.n}.bon.json"
            # evaluated: trained as far as this study needs, its checkpoints kept or not (removed to free disk,
            # or records collected from another machine): training it again would overwrite what was evaluated
            stages.append(Stage(f"train {label}", train_cmd, training_done(run, recipe.optim.steps) or bon.exists()))
            eval_cmd = tea + ["eval-bon", str(run), "--n", str(study.n), "--split", study.split]
            if study.checkpoint != "selected":
                eval_cmd += ["--checkpoint", study.checkpoint]
            stages.append(Stage(f"eval-bon {label}", eval_cmd, bon.exists(), needs=(f"train {label}",)))
            run_dirs.append(run)
    base_dir = study.base_dir()
    if base_dir is not None:
        base_recipe = study.recipes[study.runs.index(study.base)]
        bon = rundir.eval_dir(base_dir, "base") / f"{study.split}-M{study.n}.bon.json"
        stages.append(Stage(f"eval-bon {base_dir.name} (untrained {study.base})",
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
    if not study.partial:
        stages.append(Stage("report", report_cmd, False, needs=tuple(s.label for s in stages)))
    return stages


# ------------------------------------------------------------------------------------------------
# slots: where each stage runs


def parse_gpus(text: str) -> list[str]:
    """'0,1,2,3' → ['0', '1', '2', '3'] (the values CUDA_VISIBLE_DEVICES takes)."""
    gpus = [g.strip() for g in text.split(",")]
    if not gpus or not all(g.isdigit() for g in gpus):
        raise StudyError(f"--gpus {text!r}: expected GPU indices separated by commas, e.g. --gpus 0,1,2,3")
    if len(set(gpus)) != len(gpus):
        raise StudyError(f"--gpus {text!r} names a GPU twice; use --per-gpu K to run K stages on each GPU")
    return gpus


def make_slots(gpus: list[str] | None, per_gpu: int = 1) -> list[str | None]:
    """The slots stages run on: [None] (one at a time, no GPU pinned) or each GPU `per_gpu` times, GPUs first
    (slot i is GPU gpus[i % len(gpus)]), so stages dealt in turn spread over the GPUs before doubling up."""
    if per_gpu < 1:
        raise StudyError(f"--per-gpu must be an integer >= 1, got {per_gpu}")
    if gpus is None:
        if per_gpu != 1:
            raise StudyError("--per-gpu needs --gpus (the GPUs to run stages on)")
        return [None]
    return [g for _ in range(per_gpu) for g in gpus]


def assign(stages: list[Stage], n_slots: int) -> dict[str, int]:
    """label → slot of every stage still to run: one that waits for pending stages on the slot of the last
    of them (an evaluation after its training, the report after the last evaluation), any other dealt to the
    next slot in turn."""
    slot_of: dict[str, int] = {}
    turn = 0
    for stage in stages:
        if stage.done:
            continue
        waits = [n for n in stage.needs if n in slot_of]
        if waits:
            slot_of[stage.label] = slot_of[waits[-1]]
        else:
            slot_of[stage.label] = turn % n_slots
            turn += 1
    return slot_of


def plan_lines(stages: list[Stage], slots: list[str | None], slot_of: dict[str, int]) -> list[str]:
    """The plan as `--dry-run` prints it and a run prints before it starts."""
    shared = len(slots) > len(set(slots))  # several slots per GPU: name the slot too
    lines = []
    for stage in stages:
        if stage.done:
            lines.append(f"skip  {stage.label} (done): {shlex.join(stage.cmd)}")
            continue
        slot = slot_of[stage.label]
        where = "" if slots[slot] is None else f" [gpu {slots[slot]}{f', slot {slot}' if shared else ''}]"
        lines.append(f"run   {stage.label}{where}: {shlex.join(stage.cmd)}")
    return lines


# ------------------------------------------------------------------------------------------------
# running the stages

STOP_GRACE_S = 60.0  # after passing on a signal, how long the stages get to stop before SIGKILL
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> Callable[[], None] | None:
    """Linux: a stage is killed when the study itself dies, even by SIGKILL (prctl PR_SET_PDEATHSIG). SIGKILL, not
    SIGTERM: `tea train` takes SIGTERM as Ctrl-C and stops at its own pace, saying how to resume, to a terminal that
    is gone with the study; a stage must not outlive it (a study stopped by a signal passes that signal on itself)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGKILL))  # resolved before fork: the child only calls it


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)  # the stage's process group: a launcher's workers too
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class _Running:
    stage: Stage
    proc: subprocess.Popen
    started: float
    gpu: str | None
    log: Path | None
    log_file: IO[bytes] | None
    signalled: bool = False


def execute(
    stages: list[Stage],
    slots: list[str | None],
    slot_of: dict[str, int],
    *,
    logs: Path | None = None,
    note: Callable[[str], Any] = lambda line: print(line, file=sys.stderr),
    status_every: float = 300.0,
    poll_s: float = 0.2,
) -> list[str]:
    """Run every stage not done on its slot (`assign`), each after the stages it needs; returns the labels run.

    With `logs`, a stage's stdout and stderr are appended to logs/<stage>.log and a stage on a GPU slot gets
    CUDA_VISIBLE_DEVICES and a MASTER_PORT of its own; without, it writes to the study's own stdout/stderr.
    Progress goes to `note`: a line per start and finish, a summary every `status_every` seconds.
    Raises StagesFailed when a stage failed (the others still ran) and StudyInterrupted on SIGINT, SIGTERM or
    SIGHUP, after passing the signal on to the running stages and waiting for them.
    """
    labels = {s.label for s in stages}
    for stage in stages:
        unknown = [n for n in stage.needs if n not in labels]
        if unknown:
            raise ValueError(f"stage {stage.label!r} needs unknown stage(s) {unknown}")
    state = {s.label: "skipped" for s in stages if s.done}  # skipped | ok | failed | blocked
    queues: list[list[Stage]] = [[s for s in stages if not s.done and slot_of[s.label] == i] for i in range(len(slots))]
    running: dict[int, _Running] = {}
    failures: list[str] = []
    ran: list[str] = []
    caught: list[int] = []
    t0 = time.monotonic()
    preexec = _die_with_parent()

    def clock() -> str:
        return f"[study {_duration(time.monotonic() - t0)}]"

    def on_signal(signum: int, frame: Any) -> None:
        caught.append(signum)
        for r in running.values():  # the first signal as it came; a second one ends them at once
            _signal_group(r.proc, signum if len(caught) == 1 else signal.SIGKILL)
            r.signalled = True

    def start(slot: int, stage: Stage) -> None:
        gpu = slots[slot]
        env = dict(os.environ)
        if gpu is not None:
            env.update(CUDA_VISIBLE_DEVICES=gpu, MASTER_PORT=str(_free_port()))
        log = log_file = None
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            log = logs / stage.log_name
            log_file = open(log, "ab")
            log_file.write(f"=== {datetime.now().isoformat(timespec='seconds')} {stage.label}"
                           f"{'' if gpu is None else f' on gpu {gpu}'}\n$ {shlex.join(stage.cmd)}\n".encode())
            log_file.flush()
        out, err = (log_file, subprocess.STDOUT) if log_file is not None else (None, None)
        proc = subprocess.Popen(stage.cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True, preexec_fn=preexec)
        running[slot] = _Running(stage, proc, time.monotonic(), gpu, log, log_file)
        note(f"{clock()} start {stage.label}{'' if gpu is None else f' on gpu {gpu}'}{'' if log is None else f' (log: {log})'}")

    def finish(slot: int, code: int) -> None:
        r = running.pop(slot)
        if r.log_file is not None:
            r.log_file.close()
        took = _duration(time.monotonic() - r.started)
        if code == 0:
            state[r.stage.label] = "ok"
            ran.append(r.stage.label)
            note(f"{clock()} done  {r.stage.label} in {took}")
        else:
            state[r.stage.label] = "failed"
            where = f"log: {r.log}" if r.log is not None else "its output is above"
            failures.append(f"{r.stage.label} (exit {code}; {where})")
            note(f"{clock()} FAILED {r.stage.label} (exit {code}) after {took}; {where}")

    def summary() -> str:
        count = {k: sum(v == k for v in state.values()) for k in ("ok", "failed", "blocked")}
        now = time.monotonic()
        busy = ", ".join(f"{r.stage.label} {_duration(now - r.started)}{'' if r.gpu is None else f' gpu {r.gpu}'}" for r in running.values())
        waiting = sum(map(len, queues))
        return (f"{clock()} {count['ok']} done, {len(running)} running{f' ({busy})' if busy else ''}, {waiting} waiting, "
                f"{count['failed']} failed, {count['blocked']} not run")

    previous = {}
    try:
        for signum in FORWARDED:
            previous[signum] = signal.signal(signum, on_signal)
    except ValueError:  # not the main thread: signals stay as they are
        previous = {}
    last_summary = t0
    try:
        while not caught:
            for slot, queue in enumerate(queues):
                while slot not in running and queue and not caught:
                    stage = queue[0]
                    stopped = [n for n in stage.needs if state.get(n) in ("failed", "blocked")]
                    if stopped:
                        queue.pop(0)
                        state[stage.label] = "blocked"
                        note(f"{clock()} not run {stage.label}: it needs {stopped[0]}, which {'failed' if state[stopped[0]] == 'failed' else 'did not run'}")
                    elif all(state.get(n) in ("ok", "skipped") for n in stage.needs):
                        start(slot, queue.pop(0))
                    else:
                        break  # waits for a stage that is still to finish
            if not running:
                if any(queues):  # cannot happen for a plan in dependency order; refuse rather than spin
                    raise RuntimeError(f"stages wait for each other: {[q[0].label for q in queues if q]}")
                break
            time.sleep(poll_s)
            for slot, r in list(running.items()):
                code = r.proc.poll()
                if code is not None:
                    finish(slot, code)
            if status_every > 0 and time.monotonic() - last_summary >= status_every:
                last_summary = time.monotonic()
                note(summary())
    finally:
        if running:  # a signal, or an error in the study itself: stop every stage before leaving
            for r in running.values():
                if not r.signalled:  # (a stage started as the signal came in has not had it yet)
                    _signal_group(r.proc, caught[0] if caught else signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while running and time.monotonic() < deadline:
                for slot, r in list(running.items()):
                    if r.proc.poll() is not None:
                        stopped_stage = running.pop(slot)
                        if stopped_stage.log_file is not None:
                            stopped_stage.log_file.close()
                        note(f"{clock()} stopped {stopped_stage.stage.label}")
                time.sleep(poll_s)
            for r in running.values():
                _signal_group(r.proc, signal.SIGKILL)
                r.proc.wait()
                note(f"{clock()} killed {r.stage.label} (it did not stop within {STOP_GRACE_S:g} s)")
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if caught:
        name = signal.Signals(caught[0]).name
        raise StudyInterrupted(f"stopped by {name}: the running stages were stopped too; run the study again to resume", caught[0])
    if failures:
        blocked = [label for label, v in state.items() if v == "blocked"]
        also = f"; not run because of them: {', '.join(blocked)}" if blocked else ""
        raise StagesFailed(f"{len(failures)} stage(s) failed: {'; '.join(failures)}{also}. "
                           f"The other stages ran; fix these and run the study again to resume")
    return ran


def run_study(
    study: Study,
    dry_run: bool = False,
    echo: Callable[[str], Any] = print,
    *,
    gpus: list[str] | None = None,
    per_gpu: int = 1,
    seeds: str | None = None,
    note: Callable[[str], Any] = lambda line: print(line, file=sys.stderr),
    status_every: float = 300.0,
) -> int:
    """Print the plan (every stage, done or not, with its GPU) through `echo`, then run every stage not yet
    done (`execute`); returns the number of stages run (with `dry_run`: that would run)."""
    slots = make_slots(gpus, per_gpu)
    if gpus is not None and study.launcher:
        raise StudyError(f"--gpus runs every stage in one process on one GPU; it cannot run training through the launcher "
                         f"{shlex.join(study.launcher)!r} (drop --launcher, or the study's launcher:)")
    if seeds is not None:
        study = select_seeds(study, seeds)
    stages = plan(study)
    slot_of = assign(stages, len(slots))
    for line in plan_lines(stages, slots, slot_of):
        echo(line)
    if study.partial:
        echo(f"no report: --seeds {seeds} is part of the study; run `tea study {study.name}` once every seed is trained "
             f"and evaluated (finished stages are skipped) to write it")
    if dry_run:
        return len(slot_of)
    logs = study.runs_dir / "logs" / study.name if gpus is not None else None
    return len(execute(stages, slots, slot_of, logs=logs, note=note, status_every=status_every))
