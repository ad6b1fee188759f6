"""The `tea` command line.

Each command parses its options, loads what it needs and calls one library function.
Heavy imports (torch, transformers, deepspeed, vllm) happen inside the commands so that
`tea --help` stays fast.

Conventions every command follows (docs/cli.md): results on stdout; progress bars, notes and
warnings on stderr; a user error is one line `error: ...` on stderr and exit 2 (a failing remote
service, exit 1); `NO_COLOR` turns colour off; `-h`/`--help`, `--version`, shell completion.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import re
from pathlib import Path
from typing import Any, Optional

import typer
import typer.core

from teacli import __version__
from teacli.diagnostics.synthetic import DEFAULT_BIAS_REPS, DEFAULT_MS, DEFAULT_REPS  # stdlib-only at import


class _Group(typer.core.TyperGroup):
    """Help that reads the same for every command, whoever adds it: flags are shown as `--force`
    (not `--force <bool>`) and positional arguments in capitals (`RECIPE`, `[RUN_DIR]...`)."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _tidy_params(cmd, ctx)
        return cmd

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _tidy_params(self, ctx)
        super().format_help(ctx, formatter)

    def invoke(self, ctx: Any) -> Any:
        """Every command: a file-system error (a full disk, a read-only or unwritable directory, a file where a
        directory should be) is one `error:` line naming the path, exit 2, not a traceback."""
        try:
            return super().invoke(ctx)
        except typer.BadParameter as exc:  # typer's click (vendored in typer >= 0.24)
            if any(c.__name__ == "MissingParameter" for c in type(exc).__mro__):  # syntax: keeps the usage line (docs/cli.md)
                raise
            _fail(_bad_parameter_message(exc))  # a value out of range or of the wrong type: bad input, one line
        except OSError as exc:
            if exc.errno not in _FS_HINTS:
                raise
            _fail(_os_error_message(exc))


_FULL = "free space there (or write elsewhere) and run the command again"
_FS_HINTS = {
    errno.ENOSPC: _FULL, errno.EDQUOT: _FULL, errno.EFBIG: "",
    errno.EROFS: "write elsewhere", errno.EACCES: "check its permissions, or write elsewhere",
    errno.EPERM: "check its permissions and attributes (e.g. lsattr: immutable), or write elsewhere",
    errno.ENOTDIR: "", errno.EISDIR: "", errno.EEXIST: "", errno.ENOENT: "", errno.ENAMETOOLONG: "",
}


def _bad_parameter_message(exc: Any) -> str:
    """click's BadParameter as one line: `--steps: input should be greater than or equal to 1`."""
    param = exc.param
    name = exc.param_hint if isinstance(exc.param_hint, str) else None
    if name is None and param is not None:
        name = param.opts[0] if getattr(param, "opts", None) and param.param_type_name == "option" else (param.human_readable_name or param.name)
    message = " ".join(str(exc.message).split())
    return f"{name or 'an option'}: {message[:1].lower()}{message[1:]}"


def _os_error_message(exc: OSError) -> str:
    what = (exc.strerror or str(exc)).rstrip(".")
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    head = f"{' -> '.join(paths)}: {what[:1].lower()}{what[1:]}" if paths else what
    from teacli.cache import cache_dir, cache_setting

    cache = cache_setting()
    if cache and any(_under(p, str(cache_dir())) for p in paths):  # the user's setting made that path: name it
        return f"{head}; it is in tea's cache, TEA_CACHE={cache}: set TEA_CACHE to a directory tea can create and write (or unset it for ~/.cache/tea)"
    return f"{head}; {_FS_HINTS[exc.errno]}" if _FS_HINTS.get(exc.errno) else head


def _under(path: str, root: str) -> bool:
    a, b = os.path.abspath(os.path.expanduser(path)), os.path.abspath(os.path.expanduser(root))
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def _tidy_params(cmd: Any, ctx: Any) -> None:
    if cmd.help:
        cmd.help = _unwrap_paragraphs(cmd.help)
    for param in cmd.get_params(ctx):  # includes the help option
        if getattr(param, "is_flag", False):
            param.metavar = ""
        elif param.param_type_name == "argument" and param.metavar is None:
            param.metavar = param.name.upper()


def _unwrap_paragraphs(text: str) -> str:
    """A docstring's paragraphs as single lines, for the terminal to wrap: typer's rich help keeps the
    source's line breaks inside a paragraph, which breaks sentences mid-line on a wide terminal. A paragraph
    that starts with click's no-rewrap marker `\\b` or holds a list (`- item` lines) keeps its lines."""
    head, sep, tail = inspect.cleandoc(text).partition("\f")
    paragraphs = []
    for paragraph in head.split("\n\n"):
        lines = paragraph.splitlines()
        keep = paragraph.startswith("\b") or any(line.lstrip().startswith(("- ", "* ")) for line in lines)
        paragraphs.append(paragraph if keep else " ".join(line.strip() for line in lines))
    return "\n\n".join(paragraphs) + sep + tail


_HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="tea",
    help="Post-train language models for best-of-N deployment (TEA / Prefix-TEA).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings=_HELP,
    cls=_Group,
)
recipes_app = typer.Typer(help="List, show and validate recipes.", no_args_is_help=True, cls=_Group, context_settings=_HELP)
diagnose_app = typer.Typer(help="Diagnostics of the estimators and of the paper's tail model.", no_args_is_help=True, cls=_Group, context_settings=_HELP)
app.add_typer(recipes_app, name="recipes")
app.add_typer(diagnose_app, name="diagnose")


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tea {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Post-train language models for best-of-N deployment (TEA / Prefix-TEA)."""


def _color() -> Optional[bool]:
    """False when NO_COLOR is set (https://no-color.org): click's echo does not read it, rich does."""
    return False if os.environ.get("NO_COLOR") else None


def _fail(message: str, code: int = 2) -> None:
    """Print a one-line error to stderr and exit (no traceback for user errors)."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True, color=_color())
    raise typer.Exit(code)


def _plain_progress() -> None:
    """Off a terminal, transformers' and huggingface_hub's tqdm bars off (a log would get their `\\r`-joined
    redraws); tea's own lines say what is being loaded (docs/cli.md)."""
    from teacli.models import plain_progress

    plain_progress()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"


class _LazyBar:
    """Progress on stderr, drawn at the first report, so that an error found while checking the inputs is
    not preceded by an empty bar. `update(done, total, stage="")` is the callback the library functions
    take; the first report's `done` (work found on disk) is not counted as speed.

    On a terminal, a rich bar per stage. Elsewhere (a log file, CI, a cluster job's output) rich draws
    nothing until the end, so a plain line per stage instead: at its first progress, then every
    TEA_PROGRESS_EVERY seconds (default 30; 0 = every report) while it runs, and when it completes:
    `LABEL STAGE: done/total (pct%), elapsed, ~left, rate/s`. Nothing before the first progress (unless
    a whole interval passes), so an error found at the start stays the one line on stderr."""

    def __init__(self, *columns: Any, console: Any, transient: bool = False, label: str = ""):
        self.columns, self.console, self.transient, self.label = columns, console, transient, label
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}
        self.lines: dict[str, dict[str, Any]] = {}
        text = os.environ.get("TEA_PROGRESS_EVERY", "30")
        try:
            self.every = float(text)
            if not self.every >= 0:
                raise ValueError
        except ValueError:
            _fail(f"TEA_PROGRESS_EVERY={text!r}: give the seconds between progress lines, a number >= 0")

    def update(self, done: int, total: int, stage: str = "") -> None:
        if self.console.is_terminal:
            if self.bar is None:
                from rich.progress import Progress

                self.bar = Progress(*self.columns, console=self.console, transient=self.transient)
                self.bar.start()
            if stage not in self.tasks:
                self.tasks[stage] = self.bar.add_task(stage, total=total, completed=done)
            else:
                self.bar.update(self.tasks[stage], completed=done, total=total)
            return
        import time

        now = time.monotonic()
        line = self.lines.setdefault(stage, {"t0": now, "d0": done, "last": now, "printed": False, "finished": False})
        finished = total > 0 and done >= total
        first_progress = not line["printed"] and done > line["d0"]
        if line["finished"] or not (finished or first_progress or now - line["last"] >= self.every):
            return
        line.update(last=now, printed=True, finished=finished)
        elapsed, new = now - line["t0"], done - line["d0"]
        parts = [f"{done:,}/{total:,} ({100 * done / total if total else 0:.0f}%)", f"{_duration(elapsed)} elapsed"]
        if new > 0 and elapsed > 0:
            rate = new / elapsed
            if not finished:
                parts.append(f"~{_duration((total - done) / rate)} left")
            parts.append(f"{rate:.1f}/s")
        name = " ".join(x for x in (self.label, stage) if x)
        self.console.print(f"{name}: {', '.join(parts)}", markup=False, highlight=False)

    def __enter__(self) -> "_LazyBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


@app.command("prepare-data")
def prepare_data(
    source: str = typer.Argument(..., help="ultrafeedback | hh-helpful | files | builtin | builtin-hard"),
    out: Path = typer.Option(..., "--out", help="Output directory, e.g. data/uf."),
    inputs: Optional[list[Path]] = typer.Option(
        None, "--input", help="Local copy of the source rows (.jsonl[.gz], .json, .parquet, .csv; UTF-8); repeatable. Required for files."
    ),
    test_inputs: Optional[list[Path]] = typer.Option(
        None, "--test-input", help="Local copy of the test split whose prompts are removed; repeatable."
    ),
    prompt_column: Optional[str] = typer.Option(
        None, "--prompt-column", help="Column holding the prompt (str) or chat messages (files: default messages, then prompt)."
    ),
    train_size: Optional[int] = typer.Option(None, "--train-size", help="Default: the paper's size for the source."),
    val_size: Optional[int] = typer.Option(None, "--val-size"),
    heldout_size: Optional[int] = typer.Option(None, "--heldout-size"),
    seed: int = typer.Option(0, "--seed", help="Seed of the deterministic split."),
    max_prompt_chars: Optional[int] = typer.Option(
        None, "--max-prompt-chars", help="Drop prompts longer than this many characters, all turns (default 4096)."
    ),
    exclude_source: Optional[list[str]] = typer.Option(
        None, "--exclude-source", help="Drop rows whose origin matches (glob; repeatable; 'none' = keep all)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an output directory with different content."),
) -> None:
    """Build train / val / heldout / core250 / core500 prompt splits and a manifest."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from teacli.data import DataError, prepare

    try:
        summary = prepare(
            source, out, inputs=inputs or (), test_inputs=test_inputs or (), prompt_column=prompt_column,
            train_size=train_size, val_size=val_size, heldout_size=heldout_size, seed=seed,
            exclude_sources=exclude_source, force=force,
            **({} if max_prompt_chars is None else {"max_prompt_chars": max_prompt_chars}),
        )
    except DataError as e:
        _fail(str(e))
        return
    m = summary.manifest
    console = Console()
    filters = Table(title=f"prepare-data {m['source']}: filters")
    filters.add_column("step")
    filters.add_column("prompts", justify="right")
    for step, n in m["filters"].items():
        filters.add_row(step, f"{n:,}")
    console.print(filters)
    splits = Table(title=f"splits (seed {m['options']['seed']}, {m['unused']:,} unused)")
    for col in ("file", "prompts", "sha256"):
        splits.add_column(col, justify="right" if col == "prompts" else "left")
    for entry in m["splits"].values():
        note = " (capped)" if entry.get("capped") else ""
        splits.add_row(entry["file"], f"{entry['size']:,}{note}", entry["sha256"][:16])
    console.print(splits)
    warn = Console(stderr=True)
    for line in summary.bad_samples:
        warn.print(f"[yellow]skipped undecodable row[/yellow] {escape(line)}")
    checks = m["checks"]
    ok = checks["disjoint"] and checks["cores_nested_in_heldout"] and not checks["test_overlap_in_outputs"]
    console.print(f"checks: {'ok' if ok else 'FAILED'} (disjoint splits, cores nested, no test overlap)")
    verb = "unchanged (identical files already there)" if summary.status == "unchanged" else "written"
    console.print(f"{escape(str(summary.out))}: {verb}")


# ------------------------------------------------------------------------------------------------
# tea train


def _only_with(ctx: Any, flag: str, names: tuple[str, ...]) -> None:
    """One `error:` line when an option that only applies with `flag` (e.g. --estimate) was given without it:
    it would be ignored silently otherwise."""
    given = []
    for name in names:
        source = ctx.get_parameter_source(name)  # click's (or typer's vendored click's) ParameterSource
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            given.append(next(p.opts[0] for p in ctx.command.params if p.name == name))
    if given:
        options = " and ".join(given)
        _fail(f"{options} appl{'ies' if len(given) == 1 else 'y'} only with {flag}, which was not given; "
              f"add {flag} or drop {options}")


def _gpu_count(text: Optional[str]) -> int:
    """train's --gpus: a count of GPUs; a list of indices (study's --gpus) is an error saying which is which."""
    if text is None:
        return 1
    if not text.strip().isdigit():
        got = "a list of GPU indices" if "," in text else repr(text)
        _fail(f"--gpus {text}: tea train's --gpus is a count of GPUs (with --estimate, e.g. --gpus 8), not {got}; "
              f"tea study's --gpus takes GPU indices (e.g. tea study NAME --gpus 0,1)")
    if int(text) < 1:
        _fail(f"--gpus {text}: give at least 1 (the number of GPUs the run trains on)")
    return int(text)


@app.command()
def train(
    ctx: typer.Context,
    recipe: str = typer.Argument(..., help="Recipe YAML file or name (see `tea recipes list`)."),
    set_: list[str] = typer.Option([], "--set", help="Override a recipe key, e.g. --set optim.lr=3e-5 (repeatable)."),
    run_dir: str = typer.Option(None, "--run-dir", help="Run directory (default: runs/<recipe name>, runs/<recipe name>-rehearsal with --rehearse). An existing one is resumed."),
    rehearse: bool = typer.Option(False, "--rehearse", help="Rehearse with shape-exact stand-ins (random weights, stand-in tokenizer and prompts) to measure time and memory on GPUs; needs CUDA unless the models are small (at most 500M parameters in all); not evidence (docs/reproducing.md). On a CPU machine, use --estimate."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Train this many steps (sets optim.steps)."),
    estimate: bool = typer.Option(False, "--estimate", help="Print the predicted time per phase, peak memory a GPU and GPU-hours of the run; train nothing (docs/reproducing.md)."),
    card: str = typer.Option("h100", "--card", help="With --estimate only: the GPU model, h100 or h200."),
    gpus: Optional[str] = typer.Option(
        None, "--gpus", metavar="COUNT", show_default=False,
        help="With --estimate only: the number of GPUs the run trains on, e.g. 8 (default 1). A count, not GPU indices "
        "as `tea study --gpus` takes; to train on several GPUs, launch with deepspeed or torchrun (below).",
    ),
) -> None:
    """Train a policy with the recipe's advantage rule; resumes an existing run directory.

    Multi-GPU / multi-node: launch with `deepspeed --num_gpus N -m teacli.cli train RECIPE` or
    `torchrun --nproc_per_node N -m teacli.cli train RECIPE`.
    """
    from pathlib import Path

    from teacli.config import RecipeError, find_recipe, load_recipe

    count = _gpu_count(gpus)
    if not estimate:
        _only_with(ctx, "--estimate", ("card", "gpus"))
    set_ = [*set_, *(["rehearsal.enabled=true"] if rehearse else []), *([f"optim.steps={steps}"] if steps else [])]
    try:
        r = load_recipe(find_recipe(recipe), set_)
    except RecipeError as exc:
        _fail(str(exc))
    if estimate:
        from teacli.planner import estimate as predict, format_estimate

        try:
            typer.echo(format_estimate(predict(r, gpus=count, card=card)))
        except ValueError as exc:
            _fail(str(exc))
        return
    if r.rehearsal.enabled:  # before anything is built: a rehearsal of big shapes on CPU is killed minutes later
        import torch

        from teacli.standins import require_gpu

        try:
            require_gpu(r, torch.cuda.is_available(), "--rehearse" if rehearse else "a rehearsal (rehearsal.enabled)")
        except ValueError as exc:
            _fail(str(exc))
    from teacli.data.errors import DataError
    from teacli.train.errors import Interrupted, TrainError
    from teacli.rundir import check_run_dir_path
    from teacli.train.loop import train as run_training

    directory = Path(run_dir) if run_dir else Path("runs") / (r.name + ("-rehearsal" if r.rehearsal.enabled else ""))
    _plain_progress()
    main_rank = os.environ.get("RANK", "0") == "0"  # the other ranks of a launch stop with the same code, silently
    import signal

    stopped_by = [signal.SIGINT]

    def on_sigterm(signum: int, frame: Any) -> None:  # SIGTERM (kill, a cluster's scheduler) stops as Ctrl-C does
        stopped_by[0] = signum
        signal.signal(signal.SIGTERM, previous)  # a second one is not caught
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGTERM)
    previous = signal.SIG_DFL if previous is None else previous  # None: a handler not set from Python
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: signals stay as they are
        previous = None
    try:
        check_run_dir_path(directory)
        path = run_training(r, directory)
    except (TrainError, DataError, RecipeError, ValueError) as exc:
        if main_rank:
            _fail(str(exc))
        raise typer.Exit(2)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: where it stopped (Interrupted says, once training), the command that resumes
        import shlex

        if main_rank:
            where = str(exc) if isinstance(exc, Interrupted) else f"interrupted while setting up {directory} (nothing trained in this attempt); to go on"
            again = ["tea", "train", recipe, *(a for item in set_ for a in ("--set", item)), "--run-dir", str(directory)]
            typer.echo(f"{where}, run: {shlex.join(again)}", err=True)
        raise typer.Exit(128 + stopped_by[0])
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if main_rank:
        typer.echo(f"run directory: {path}")


# ------------------------------------------------------------------------------------------------
# tea study


@app.command()
def study(
    ctx: typer.Context,
    study_file: str = typer.Argument(..., help="Study name (e.g. uf_core250, see recipes/studies/) or a study YAML file."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the stages (and their GPU) and whether each is done; run nothing."),
    launcher: Optional[str] = typer.Option(
        None, "--launcher", help='Launch training through this command, e.g. "deepspeed --num_gpus 8 --module" or '
        '"torchrun --nproc_per_node 8 -m" (replaces the study\'s launcher:; default: one process).',
    ),
    gpus: Optional[str] = typer.Option(
        None, "--gpus", metavar="INDICES", help="GPU indices, comma-separated, e.g. 0,1,2,3 (not a count, unlike "
        "`tea train --gpus`): run independent stages at the same time, one process per stage on one of these GPUs "
        "(CUDA_VISIBLE_DEVICES and MASTER_PORT per stage; output in <runs_dir>/logs/<study>/).",
    ),
    per_gpu: int = typer.Option(1, "--per-gpu", help="With --gpus: the number of stages run at once on each GPU (small models)."),
    seeds: Optional[str] = typer.Option(
        None, "--seeds", help="Run only these of the study's seeds, e.g. 0,1: a study in parts (one machine each); "
        "the report is left out until a run without --seeds.",
    ),
    status_every: float = typer.Option(300.0, "--status-every", help="Seconds between progress summaries on stderr (0: none)."),
    estimate: bool = typer.Option(False, "--estimate", help="Print each run's predicted time and peak memory and the study's GPU-hours; run nothing (docs/reproducing.md)."),
    card: str = typer.Option("h100", "--card", help="With --estimate only: the GPU model, h100 or h200."),
    gpus_per_run: int = typer.Option(8, "--gpus-per-run", min=1, help="With --estimate only: the number of GPUs each training run takes."),
) -> None:
    """Train, evaluate and report a set of recipes as one comparison, skipping finished stages.

    Run it again after an interruption: finished stages are skipped, an unfinished training run
    resumes from its last checkpoint and an unfinished evaluation from its records. Exit 1 when
    stages failed (the others still ran), 128 + N when stopped by signal N.
    """
    from teacli.config import RecipeError, find_study
    from teacli.study import StagesFailed, StudyError, StudyInterrupted, load_study, parse_gpus, run_study

    if not estimate:
        _only_with(ctx, "--estimate", ("card", "gpus_per_run"))
    if estimate:
        from teacli.planner import estimate_study, format_study

        try:
            s = load_study(find_study(study_file))
            typer.echo(format_study(s.name, estimate_study(s, gpus=gpus_per_run, card=card)))
        except (StudyError, RecipeError, ValueError) as exc:
            _fail(str(exc))
        return
    try:
        ran = run_study(
            load_study(find_study(study_file), launcher=launcher), dry_run=dry_run, echo=typer.echo,
            gpus=None if gpus is None else parse_gpus(gpus), per_gpu=per_gpu, seeds=seeds,
            note=lambda line: typer.echo(line, err=True), status_every=status_every,
        )
    except (StudyError, RecipeError) as exc:
        _fail(str(exc))
    except StagesFailed as exc:
        _fail(str(exc), code=1)
    except StudyInterrupted as exc:
        _fail(str(exc), code=128 + exc.signum)
    typer.echo(f"dry run: {ran} stage(s) would run; nothing was run" if dry_run else f"study done ({ran} stage(s) run)")


# ------------------------------------------------------------------------------------------------
# tea recipes


def _recipe_row(path, recipe) -> dict:
    from pathlib import Path

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


@recipes_app.command("list")
def recipes_list(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the recipes (./recipes, then the packaged ones) with their method and setting."""
    import json

    from teacli.config import RecipeError, discover_recipes, load_recipe

    rows = []
    for path in discover_recipes():
        try:
            rows.append(_recipe_row(path, load_recipe(path, advantage=False)))
        except RecipeError as exc:
            _fail(str(exc))
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    cells = {
        "name": [r["name"] for r in rows],
        "advantage": [r["advantage"] for r in rows],
        "m": [str(r["m"]) for r in rows],
        "N_target": ["" if r["n_target"] is None else str(r["n_target"]) for r in rows],
        "policy": [r["policy"] for r in rows],
        "reward": [str(r["reward"]) for r in rows],
        "dataset": [r["dataset"] for r in rows],
        "LoRA": ["yes" if r["lora"] else "" for r in rows],
    }
    # Narrow terminals: shorten hub ids to their last part, then hide whole columns, rather than
    # folding every name over several lines.
    hidden: list[str] = []
    for step in ("shorten", "dataset", "reward", "policy"):
        widths = [max(len(c), *(len(v) for v in vals)) for c, vals in cells.items()]
        if sum(widths) + 3 * len(widths) + 1 <= console.width:
            break
        if step == "shorten":
            for col in ("policy", "reward", "dataset"):
                cells[col] = [v.rstrip("/").rsplit("/", 1)[-1] for v in cells[col]]
        else:
            del cells[step]
            hidden.append(step)
    caption = f"{', '.join(hidden)} hidden at this width: `--json` or `tea recipes show NAME` has them" if hidden else None
    table = Table(title=f"{len(rows)} recipes", caption=caption)
    for col in cells:
        table.add_column(col, no_wrap=col == "name", justify="right" if col in ("m", "N_target") else "left")
    for i in range(len(rows)):
        table.add_row(*(vals[i] for vals in cells.values()))
    console.print(table)


@recipes_app.command("show")
def recipes_show(
    name: str = typer.Argument(..., help="Recipe name (e.g. uf_llama1b_tea) or path to a YAML file."),
    set_: list[str] = typer.Option([], "--set", help="Override a key, e.g. --set optim.lr=3e-5 (repeatable)."),
) -> None:
    """Print the fully resolved recipe (inheritance and overrides applied) as YAML."""
    from teacli.config import RecipeError, find_recipe, load_recipe, to_yaml

    try:
        typer.echo(to_yaml(load_recipe(find_recipe(name), set_)), nl=False)
    except RecipeError as exc:
        _fail(str(exc))


@recipes_app.command("validate")
def recipes_validate(
    paths: list[str] = typer.Argument(None, help="Recipe files or names; default: every recipe (./recipes, then the packaged ones)."),
) -> None:
    """Load and validate recipes; exit 1 if any is invalid, naming the key and the file (every one is checked)."""
    from teacli.config import RecipeError, discover_recipes, find_recipe, load_recipe

    targets = [str(p) for p in discover_recipes()] if not paths else list(paths)
    bad = 0
    for target in targets:
        try:
            load_recipe(find_recipe(target))
            typer.echo(f"ok       {target}")
        except RecipeError as exc:
            bad += 1
            typer.secho(f"invalid  {target}: {exc}", fg=typer.colors.RED, err=True, color=_color())
    if bad:
        raise typer.Exit(1)
    typer.echo(f"{len(targets)} recipe(s) valid")


# ------------------------------------------------------------------------------------------------
# tea diagnose


@diagnose_app.command(
    "synthetic", context_settings={"allow_extra_args": True, "ignore_unknown_options": False}
)
def diagnose_synthetic(
    ctx: typer.Context,
    m: Optional[list[int]] = typer.Option(
        None,
        "--m",
        help=f"Rollout budgets, space-separated (--m 256 512 1024) or repeated. Default: {' '.join(map(str, DEFAULT_MS))}.",
    ),
    reps: int = typer.Option(DEFAULT_REPS, "--reps", help="Replicates of the full Prefix-TEA estimator per m (its variance)."),
    bias_reps: int = typer.Option(
        DEFAULT_BIAS_REPS, "--bias-reps", help="Replicates per m for TEA (bias and variance) and Prefix-TEA's Rao-Blackwellized bias."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed; the output is deterministic given it."),
    out: Path = typer.Option(Path("out/diagnostics/synthetic"), "--out", help="Output directory."),
) -> None:
    """Synthetic Gaussian-tail bias/variance diagnostic of TEA vs Prefix-TEA (paper appendix)."""
    extra = list(ctx.args)
    if extra and (m is None or not all(a.lstrip("-").isdigit() for a in extra)):
        _fail(f"unexpected argument(s) {' '.join(extra)}; rollout budgets go after --m, e.g. --m 256 512")
    budgets = [*(m or []), *(int(a) for a in extra)] or None

    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from teacli.diagnostics import synthetic

    budgets = budgets or list(DEFAULT_MS)
    try:
        synthetic.check_arguments(budgets, reps, bias_reps)
    except ValueError as exc:
        _fail(str(exc))
    from rich.console import Console

    columns = (TextColumn("synthetic"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"), TimeElapsedColumn(), TimeRemainingColumn())
    total, done = synthetic.work_units(budgets, reps, bias_reps), [0]

    def advance(units: int) -> None:
        done[0] += units
        bar.update(done[0], total)

    with _LazyBar(*columns, console=Console(stderr=True), label="synthetic") as bar:
        bar.update(0, total)
        rows = synthetic.run_synthetic(budgets, reps, bias_reps, seed, advance)
    paths = synthetic.write_outputs(rows, out)
    typer.echo(synthetic.markdown_table(rows))
    for path in paths.values():
        typer.echo(f"wrote {path}")


@diagnose_app.command("alignment", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def diagnose_alignment(
    ctx: typer.Context,
    recipe: str = typer.Argument(..., help="Recipe YAML file or name: its policy, data, rollout sampling and reward."),
    set_: list[str] = typer.Option([], "--set", help="Override a recipe key (repeatable)."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="HF checkpoint directory to use instead of the recipe's base policy (e.g. runs/x/checkpoints/step_000025)."),
    prompts: int = typer.Option(128, "--prompts", help="P: pool prompts (the first P of the recipe's training split)."),
    pool: int = typer.Option(512, "--pool", help="K: stored completions per pool prompt."),
    grad_prompts: Optional[int] = typer.Option(
        None, "--grad-prompts", help="Pool prompts whose gradients are averaged (the first ones; default 32, at most --prompts).",
        show_default=False,
    ),
    m: Optional[list[int]] = typer.Option(None, "--m", help="Rollout budgets, space-separated (--m 16 24 32) or repeated. Default: 16 24 32 48 64 96."),
    n: int = typer.Option(128, "--n", help="N of the expected-best-of-N oracle (and the rules' n_target)."),
    seeds: int = typer.Option(5, "--seeds", help="Seeds: subsamples of m rollouts per prompt."),
    rules: Optional[list[str]] = typer.Option(None, "--rules", help="Advantage rules, space-separated or repeated; 'oracle' = the plug-in oracle. Default: every built-in rule but tea_raw."),
    block: str = typer.Option("-1", "--block", help="The block whose gradients are compared: an index into the transformer layers (-1 = last) or a parameter-name prefix."),
    split: Optional[str] = typer.Option(None, "--split", help="Split of the recipe's data.dir the pool prompts come from (default: data.train_split)."),
    grad_batch_size: int = typer.Option(8, "--grad-batch-size", help="Completions per forward pass (and per backward, when the block allows the batched gradients: docs/diagnostics.md) when computing gradients."),
    grad_memory: float = typer.Option(8.0, "--grad-memory", help="GiB of per-completion gradients held at once (more: the Gram matrix is built in row blocks)."),
    out: Path = typer.Option(Path("out/diagnostics/alignment"), "--out", help="Output directory (the pool and Gram matrices are stored there and reused)."),
) -> None:
    """Oracle-gradient alignment: cosine of each rule's policy gradient to the expected-best-of-N oracle gradient."""
    from teacli.config import RecipeError, find_recipe, load_recipe
    from teacli.diagnostics import alignment as AL

    budgets, names = list(m or []), list(rules or [])
    for arg in ctx.args:
        if arg.lstrip("-").isdigit() and m is not None:
            budgets.append(int(arg))
        elif not arg.startswith("-") and rules is not None:
            names.append(arg)
        else:
            _fail(f"unexpected argument {arg}; budgets go after --m (--m 16 32), rules after --rules (--rules tea grpo)")
    names = [x for name in names for x in name.split(",") if x]
    try:
        r = load_recipe(find_recipe(recipe), set_)
    except RecipeError as exc:
        _fail(str(exc))
        return
    settings = AL.Settings(recipe=r, out=out, checkpoint=checkpoint, prompts=prompts, pool=pool, grad_prompts=grad_prompts,
                           ms=tuple(budgets or AL.DEFAULT_MS), N=n, seeds=seeds, rules=tuple(names or AL.DEFAULT_RULES),
                           block=block, split=split, grad_batch_size=grad_batch_size, grad_memory_gib=grad_memory)
    try:
        settings.check()
    except AL.AlignmentError as exc:
        _fail(str(exc))
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from teacli.data.errors import DataError

    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    try:
        with _LazyBar(*columns, console=console, label="alignment") as bar:
            table = AL.run_alignment(settings, lambda stage, done, total: bar.update(done, total, stage),
                                     log=lambda msg: console.print(msg, markup=False, highlight=False))
    except (AL.AlignmentError, DataError, ValueError) as exc:
        _fail(str(exc))
        return
    from teacli.tables import markdown

    meta = json.loads((out / "alignment.run.json").read_text())
    typer.echo(markdown(AL.tables(table, meta)[0]))
    for rule, row in table.items():
        skipped = [mm for mm, c in row.items() if c.get("skipped")]
        if skipped:
            typer.echo(f"{rule}: skipped at m = {', '.join(skipped)} ({row[skipped[0]]['skipped']})", err=True)
    typer.echo(f"wrote {out / 'alignment.json'}, alignment.{{md,tex,csv}}, alignment.png (pool and Gram matrices kept in {out} for reuse)")


@diagnose_app.command("tail-fit")
def diagnose_tail_fit(
    run_dirs: list[Path] = typer.Argument(..., help="Run directories with `tea eval-bon` records.", show_default=False, metavar="RUN_DIR"),
    out: Path = typer.Option(Path("out/diagnostics/tail_fit"), "--out", help="Output directory."),
    checkpoint: str = typer.Option("selected", "--checkpoint", help="Which evaluation: selected (eval/), base (eval/base/) or step_N."),
    split: Optional[str] = typer.Option(None, "--split", help="Evaluated split (needed only when a run has several)."),
    n: Optional[int] = typer.Option(None, "--n", min=1, help="M of the evaluation (needed only when a run has several)."),
    q_low: float = typer.Option(0.80, "--q-low", help="Lower end of the fitted quantile range."),
    q_high: float = typer.Option(0.99, "--q-high", help="Upper end of the fitted quantile range."),
    fit_samples: Optional[int] = typer.Option(None, "--fit-samples", help="K: samples per prompt the prediction is fitted on (default min(64, M))."),
    max_n: Optional[int] = typer.Option(None, "--max-n", help="Largest predicted N (default 4·M)."),
    alpha: float = typer.Option(0.25, "--alpha", help="Upper-tail fraction of the prediction's tail model."),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write qq.png and prediction.png."),
) -> None:
    """Gaussian QQ upper-tail check per prompt and a best-of-N prediction from eval records (no model)."""
    from teacli.diagnostics import tail_fit as TF
    from teacli.tables import markdown

    try:
        TF.check_arguments(q_low, q_high, fit_samples, max_n, alpha)
        runs = TF.read_runs(run_dirs, checkpoint, split, n)
        result = TF.tail_fit(runs, q_low, q_high, fit_samples, max_n, alpha)
        written = TF.write_outputs(result, runs, out, plots)
    except TF.TailFitError as exc:
        _fail(str(exc))
        return
    for name, e in result["runs"].items():
        degenerate = e["degenerate"]["flat"] + e["degenerate"]["too_few"]
        if degenerate:
            typer.echo(f"{name}: {degenerate} of {e['prompts']} prompt(s) degenerate ({e['degenerate']['flat']} flat, "
                       f"{e['degenerate']['too_few']} with fewer than 3 samples in the range); left out of the summary", err=True)
    for table in TF.tables(result):
        typer.echo(markdown(table))
    typer.echo(f"wrote {len(written)} files to {out} (tail_fit.json, tables{', plots' if plots else ''})")


@diagnose_app.command("hacking")
def diagnose_hacking(
    run_dirs: list[Path] = typer.Argument(..., help="Training run directories.", show_default=False, metavar="RUN_DIR"),
    pattern: list[str] = typer.Option([], "--pattern", help="Regex a gamed pick would match (repeatable; case-insensitive, ^ and $ match at lines)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help="Best-of-N picks of the untrained policy (an eval-bon *.best.json.gz) for the new-phrase share."),
) -> None:
    """Reward-hacking watch: per run, steps where the batch's best reward jumps, and the share of best-of-N picks matching the patterns or sharing a new phrase."""
    import gzip
    import json

    from teacli.monitors import hacking as H

    try:
        patterns = H.compile_patterns(pattern)
    except re.error as exc:
        _fail(f"--pattern {exc}")
        return
    base = None
    if baseline is not None:
        try:
            base = [p["response"] for p in json.loads(gzip.open(baseline, "rt").read())]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _fail(f"--baseline {baseline}: unreadable best-of-N picks ({exc})")
            return
    results = []
    for d in run_dirs:
        try:
            results.append(H.watch_run(d, patterns, base))
        except H.WatchError as exc:
            _fail(str(exc))
            return

    def pct(v: Optional[float]) -> str:
        return "–" if v is None else f"{v:.0%}"

    typer.echo("| run | reward_max jumps (steps) | checkpoints: pattern share | eval picks | pattern share | new-phrase share |")
    typer.echo("|---|---|---|---|---|---|")
    for r in results:
        ck = ", ".join(f"{c['step']}: {pct(c.get('watch_pattern_share'))}" for c in r["checkpoints"]) or "–"
        ev = r["eval"][0] if r["eval"] else {}
        typer.echo(f"| {r['run']} | {', '.join(map(str, r['jumps'])) or 'none'} | {ck} | {ev.get('watch_picks', '–')} | "
                   f"{pct(ev.get('watch_pattern_share'))} | {pct(ev.get('watch_new_ngram_share'))} |")


# ------------------------------------------------------------------------------------------------
# tea judge


@app.command()
def judge(
    run_a: Path = typer.Argument(..., help="Run directory whose responses are 'self' (output goes to RUN_A/judge/)."),
    run_b: Path = typer.Argument(..., help="Run directory compared against ('other')."),
    select: str = typer.Option(..., "--select", help="Selection rule: boN = max-reward response among samples 0..N-1."),
    split: str = typer.Option("core250", "--split", help="Evaluated split (RUN/eval/<split>-M<M>.jsonl)."),
    model: str = typer.Option("deepseek-v4-pro", "--model", help="Judge model name at the endpoint (default: the paper's judge, DeepSeek-v4 Pro)."),
    base_url: str = typer.Option("https://api.deepseek.com/v1", "--base-url", help="OpenAI-compatible API base URL."),
    api_key_env: str = typer.Option(
        "DEEPSEEK_API_KEY", "--api-key-env", help="Environment variable holding the API key (optional for a local endpoint)."
    ),
    concurrency: int = typer.Option(8, "--concurrency", help="Requests in flight at most."),
    seed: int = typer.Option(0, "--seed", help="Seed of the randomized presentation order."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds per request before it is retried."),
    max_attempts: int = typer.Option(5, "--max-attempts", help="Requests per pair before it is recorded as invalid."),
    retry_invalid: bool = typer.Option(False, "--retry-invalid", help="Judge again the pairs recorded as invalid."),
) -> None:
    """Pairwise LLM judge of RUN_A's vs RUN_B's best-of-N responses (position-randomized); prints W–L and win rate."""
    import logging

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from teacli.eval.judge import JudgeConfig, JudgeError, JudgeUnavailable, judge_runs, parse_select, resolve_api_key

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        n = parse_select(select)
        config = JudgeConfig(
            model=model, base_url=base_url, concurrency=concurrency, seed=seed, timeout_s=timeout,
            max_attempts=max_attempts, retry_invalid=retry_invalid, api_key_env=api_key_env,
        )
        config.check()
        key = resolve_api_key(base_url, api_key_env)
        columns = (TextColumn("judge"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with _LazyBar(*columns, console=Console(stderr=True), transient=True, label="judge") as bar:
            summary = judge_runs(run_a, run_b, n, split=split, config=config, api_key=key, progress=bar.update)
    except JudgeUnavailable as exc:  # the endpoint failed, not the input: rerunning resumes
        _fail(str(exc), code=1)
        return
    except JudgeError as exc:
        _fail(str(exc))
        return
    if summary.pairs and summary.wins + summary.losses == 0:  # a failed job, not a 0–0 result
        _fail(f"every verdict was invalid ({summary.invalid} of {summary.pairs} pairs: no reply of {summary.model} parsed "
              f"as a verdict); they are recorded in {summary.path} (fields error and raw); check --model and --base-url, "
              f"then rerun with --retry-invalid", code=1)
    win = "–" if summary.win_rate is None else f"{100 * summary.win_rate:.1f}%"
    table = Table(title=f"judge {summary.model} ({summary.split})")
    for col in ("Self", "Sel.", "Other", "Pairs", "W–L", "Win", "Invalid"):
        table.add_column(col, justify="right" if col in ("Pairs", "W–L", "Win", "Invalid") else "left")
    table.add_row(
        summary.self_name, summary.select, summary.other_name, str(summary.pairs),
        f"{summary.wins}–{summary.losses}", win, str(summary.invalid),
    )
    Console().print(table)
    dropped = summary.only_self + summary.only_other
    if dropped:
        typer.echo(f"{dropped} prompt(s) dropped: {summary.only_self} only in RUN_A, {summary.only_other} only in RUN_B")
    typer.echo(
        f"{summary.judged} judged now ({summary.cache_hits} from the cache, {summary.requests} request(s)), "
        f"{summary.kept} kept from before"
    )
    typer.echo(f"wrote {summary.path}")


# ------------------------------------------------------------------------------------------------
# tea eval-bon, tea report


@app.command("eval-bon")
def eval_bon(
    run_dirs: Optional[list[Path]] = typer.Argument(
        None,
        help="Run directories to evaluate, one after another. Default: the current directory if it holds a "
        "recipe.yaml, else the most recently active run under runs/ (the one whose recipe/metrics/validation/"
        "selection files changed last).",
        show_default=False,
        metavar="RUN_DIR",
    ),
    n: Optional[int] = typer.Option(None, "--n", min=1, help="M: completions per prompt (default: the recipe's eval.M; paper 256, scaling 512)."),
    split: Optional[str] = typer.Option(None, "--split", help="Held-out split of the run's data.dir (default: the recipe's eval.split, e.g. core250)."),
    checkpoint: str = typer.Option(
        "selected", "--checkpoint",
        help="selected (selected.json; files in eval/), step_N (checkpoints/step_N; eval/step_XXXXXX/) or base (the untrained policy; eval/base/).",
    ),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="Where the split files live, when not at the run's data.dir."),
    set_: list[str] = typer.Option([], "--set", help="Override a key of the run's recipe, e.g. --set rollout.engine=vllm (repeatable)."),
    recipe: Optional[str] = typer.Option(
        None, "--recipe", help="With --checkpoint base: make RUN_DIR a run-like directory of this recipe (writes its "
        "recipe.yaml) to evaluate its untrained policy without training, e.g. a study's base arm.",
    ),
    rehearse: bool = typer.Option(False, "--rehearse", help="With --recipe: rehearse with shape-exact stand-ins (sets rehearsal.enabled; a rehearsal run's own evaluations always are)."),
) -> None:
    """Sample M completions per held-out prompt, score them, write records and grouped best-of-N.

    Writes eval/<split>-M<M>.jsonl (one line per completion), eval/<split>.prompts.jsonl and
    eval/<split>-M<M>.bon.json (bo<N> for every power of two N dividing M). Re-running resumes a
    killed evaluation where it stopped, without duplicating or losing records (docs/evaluation.md).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
    from rich.text import Text

    from teacli.eval.bon import EvalError, EvalInterrupted, default_run_dir, evaluate, init_base_arm

    _plain_progress()

    class Speed(ProgressColumn):
        def render(self, task) -> Text:
            return Text("– completions/s" if not task.speed else f"{task.speed:.2f} completions/s")

    console = Console(stderr=True)
    try:
        runs = list(run_dirs) if run_dirs else [default_run_dir()]
    except EvalError as exc:
        _fail(str(exc))
        return
    if rehearse and recipe is None:
        _fail("--rehearse: give --recipe R and --checkpoint base (a rehearsal run's own evaluations are rehearsals already)")
    if recipe is not None:
        if checkpoint != "base" or not run_dirs or len(runs) != 1:
            _fail("--recipe: give exactly one RUN_DIR and --checkpoint base (it evaluates the recipe's untrained policy)")
        try:
            init_base_arm(runs[0], recipe, ["rehearsal.enabled=true"] if rehearse else [])
        except EvalError as exc:
            _fail(str(exc))
    if not run_dirs:
        why = "the current directory" if runs[0] == Path.cwd() else "the most recently active run under runs/"
        typer.echo(f"no RUN_DIR given: evaluating {runs[0]} ({why})", err=True)
    for i, run in enumerate(runs):
        columns = (TextColumn(run.name), BarColumn(), MofNCompleteColumn(), Speed(), TimeElapsedColumn(), TimeRemainingColumn())
        try:
            with _LazyBar(*columns, console=console, label=run.name) as bar:
                result = evaluate(run, M=n, split=split, checkpoint=checkpoint, data_dir=data_dir, overrides=set_,
                                  progress=bar.update, log=lambda msg: console.print(f"{run.name}: {msg}", markup=False, highlight=False))
        except (EvalError, ValueError) as exc:
            _fail(str(exc) if str(run) in str(exc) else f"{run}: {exc}")
            return
        except KeyboardInterrupt as exc:  # Ctrl-C: what is on disk, and the command that goes on from it (this run and the rest)
            import shlex

            where = str(exc) if isinstance(exc, EvalInterrupted) else f"interrupted before evaluating {run} (nothing sampled in it)"
            again = ["tea", "eval-bon", *(str(r) for r in runs[i:]), *(["--n", str(n)] if n else []),
                     *(["--split", split] if split else []), *(["--checkpoint", checkpoint] if checkpoint != "selected" else []),
                     *(["--data-dir", data_dir] if data_dir else []), *(["--recipe", recipe] if recipe else []),
                     *(a for item in set_ for a in ("--set", item))]
            typer.echo(f"{where}; to go on from there, run: {shlex.join(again)}", err=True)
            raise typer.Exit(130)
        s = result.summary
        values = "  ".join(f"bo{k} {v:.3f}" for k, v in zip(s["N"], s["mean"]))
        typer.echo(f"{run} (checkpoint {s['checkpoint']}, {s['split']}, M={s['M']}, {result.prompts} prompts): {values}")
        typer.echo(f"  {result.new_completions} completions sampled now, {result.resumed_completions} found on disk; wrote {result.files.bon}")


@app.command()
def report(
    run_dirs: Optional[list[Path]] = typer.Argument(
        None,
        help="Run directories to compare. Default: the current directory if it holds a recipe.yaml, else every run "
        "under runs/ with a finished evaluation.",
        show_default=False,
        metavar="RUN_DIR",
    ),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples, 41 (a 95% interval's fewest) to 100000."),
    bootstrap_levels: str = typer.Option(
        "auto", "--bootstrap-levels", help="What the intervals resample: prompts (the paired prompt bootstrap), seeds-prompts "
        "(two-level: a method's seeds, then prompts, paired across methods with the same seeds) or auto (seeds-prompts when "
        "some method has two or more seeds, else prompts).",
    ),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="Run every delta is taken against (name or path; default: the first RUN_DIR)."),
    pair: list[str] = typer.Option(
        [], "--pair", help="RUN=BASELINE: compare RUN with its own baseline instead (names or paths; repeatable), e.g. "
        "--pair tea_m16=grpo_m16. A run that is a baseline is compared only when paired.",
    ),
    out: Path = typer.Option(Path("report"), "--out", help="Output directory for tables (md, tex, csv) and plots (png)."),
    split: Optional[str] = typer.Option(None, "--split", help="Evaluated split to report (needed only when the runs have several)."),
    n: Optional[int] = typer.Option(None, "--n", min=1, help="M of the evaluation to report (needed only when the runs have several)."),
    checkpoint: str = typer.Option("selected", "--checkpoint", help="Which evaluation: selected (eval/), base (eval/base/) or step_N (eval/step_XXXXXX/)."),
    endpoints: Optional[str] = typer.Option(None, "--endpoints", help="High-N columns, e.g. 64,128,256 (default: the three largest N)."),
    seed: int = typer.Option(0, "--seed", help="Bootstrap seed (>= 0)."),
    base_arm: Optional[Path] = typer.Option(
        None, "--base-arm", help="A run directory whose untrained policy's evaluation (eval/base/, `tea eval-bon --checkpoint "
        "base`) is reported as an arm every run is compared with (run − base at every N).",
    ),
) -> None:
    """Compare runs' best-of-N evaluations: bootstrap deltas to a baseline, win/tie/loss, lengths, judge W–L.

    Reads run directories only (eval/, judge/, recipe.yaml) and writes the paper's table layouts as
    Markdown, LaTeX and CSV plus frontier.png and delta.png (docs/evaluation.md).
    """
    from teacli.report.build import ReportError, build_report, default_report_runs
    from teacli.tables import markdown

    try:
        ends = [int(x) for x in endpoints.replace(" ", "").split(",") if x] if endpoints else None
    except ValueError:
        _fail(f"--endpoints {endpoints!r}: expected numbers separated by commas, e.g. 64,128,256")
        return
    pairs: dict[str, str] = {}
    for item in pair:
        run, sep, base = item.partition("=")
        if not sep or not run.strip() or not base.strip():
            _fail(f"--pair {item!r}: expected RUN=BASELINE, e.g. --pair runs/tea_m16=runs/grpo_m16")
        if pairs.get(run.strip(), base.strip()) != base.strip():
            _fail(f"--pair {run.strip()}: given two baselines ({pairs[run.strip()]} and {base.strip()})")
        pairs[run.strip()] = base.strip()
    try:
        runs = list(run_dirs) if run_dirs else default_report_runs(checkpoint=checkpoint)
        if not run_dirs:
            typer.echo(f"no RUN_DIR given: reporting {', '.join(str(r) for r in runs)}", err=True)
        result = build_report(runs, out, baseline=baseline, pairs=pairs, resamples=bootstrap, seed=seed, split=split, M=n,
                              checkpoint=checkpoint, endpoints=ends, base_arm=base_arm, levels=bootstrap_levels)
    except ReportError as exc:
        _fail(str(exc))
        return
    for table in result.tables:
        if table.name in ("frontier", "endpoints", "win_tie_loss", "best_tta", "vs_base", "seeds", "judge"):
            typer.echo(markdown(table))
    for r in result.report.runs:  # a failed judge is left out of the judge table (report.md's notes say so too)
        for j in r.judge:
            if not j.win + j.loss:
                typer.echo(f"{r.name}: judge/{j.other}-bo{j.N}.jsonl has no valid verdict ({j.invalid} invalid); left out "
                           f"of the judge table (rerun tea judge with --retry-invalid)", err=True)
    plotted = ", plots" if any(p.suffix == ".png" for p in result.files) else ""
    typer.echo(f"wrote {len(result.files)} files to {result.out} (report.md, report.tex, summary.json, tables{plotted})")


# ------------------------------------------------------------------------------------------------
# tea serve-rm


@app.command("serve-rm")
def serve_rm(
    recipe: str = typer.Argument(..., help="Recipe YAML file or name whose reward section (hf, rule or python) is served."),
    set_: list[str] = typer.Option([], "--set", help="Override a recipe key, e.g. --set reward.batch_size=32 (repeatable)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface; use --token-env then)."),
    port: int = typer.Option(5000, "--port", min=0, max=65535, help="TCP port."),
    token_env: Optional[str] = typer.Option(
        None, "--token-env", help="Environment variable holding a bearer token that every request must send (e.g. TEA_RM_TOKEN)."
    ),
    max_body_mb: float = typer.Option(16.0, "--max-body-mb", help="Largest request body in MiB; a larger one gets HTTP 413."),
) -> None:
    """Serve the recipe's reward over HTTP with OpenRLHF's remote-RM API (POST /get_reward) until Ctrl-C.

    Training and evaluation jobs use it with `reward.kind: remote` and
    `reward.url: http://HOST:PORT/get_reward`; OpenRLHF's --remote_rm_url works too (docs/models.md).
    """
    from teacli.config import RecipeError, find_recipe, load_recipe
    from teacli.rewards.server import serve

    try:
        serve(load_recipe(find_recipe(recipe), set_, runnable=False), host=host, port=port, token_env=token_env,
              max_body_mb=max_body_mb)
    except (RecipeError, ValueError) as exc:
        _fail(str(exc))


def main() -> None:
    """Console entry point. Accepts the `--local_rank=N` (or `--local_rank N`) that the deepspeed launcher adds."""
    import sys

    args = sys.argv[1:]
    for i, arg in enumerate(args):
        if arg == "--local_rank" or arg.startswith("--local_rank="):
            inline = "=" in arg
            value = arg.partition("=")[2] if inline else (args[i + 1] if i + 1 < len(args) else "")
            if not value.isdigit():
                _main_fail(f"--local_rank expects a GPU index (the deepspeed launcher passes --local_rank=N), got {value!r}")
            os.environ.setdefault("LOCAL_RANK", value)
            del args[i : i + (1 if inline else 2)]
            sys.argv[1:] = args
            break
    app(prog_name="tea")


def _main_fail(message: str) -> None:
    try:
        _fail(message)
    except typer.Exit as exc:
        raise SystemExit(exc.exit_code) from None


if __name__ == "__main__":  # pragma: no cover
    main()
