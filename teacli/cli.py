"""The `tea` command line.

Each command parses its options, loads what it needs and calls one library function.
Heavy imports (torch, transformers, deepspeed, vllm) happen inside the commands so that
`tea --help` stays fast.

Conventions every command follows (docs/cli.md): results on stdout; progress bars, notes and
warnings on stderr; a user error is one line `error: ...` on stderr and exit 2 (a failing remote
service, exit 1); `NO_COLOR` turns colour off; `-h`/`--help`, `--version`, shell completion. Those are
teacli/console.py's; what a command prints about its results lives with the library function it calls.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional

import typer

from teacli import __version__
from teacli.console import Group, color as _color, fail as _fail, only_with, print_table, progress_bar, take_local_rank
from teacli.console import LazyBar as _LazyBar  # noqa: F401  (tests/test_cli_progress.py)
from teacli.diagnostics.synthetic import DEFAULT_BIAS_REPS, DEFAULT_MS, DEFAULT_REPS  # stdlib-only at import


_HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    name="tea",
    help="Post-train language models for best-of-N deployment (TEA / Prefix-TEA).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings=_HELP,
    cls=Group,
)
recipes_app = typer.Typer(help="List, show and validate recipes.", no_args_is_help=True, cls=Group, context_settings=_HELP)
diagnose_app = typer.Typer(help="Diagnostics of the estimators and of the paper's tail model.", no_args_is_help=True, cls=Group, context_settings=_HELP)
app.add_typer(recipes_app, name="recipes")
app.add_typer(diagnose_app, name="diagnose")


def _recipe(name: str, overrides: list[str], **options: Any) -> Any:
    """Load the recipe NAME (a file or a name) with its --set overrides; a RecipeError is the one `error:` line."""
    return _recipe_with_origin(name, overrides, **options)[0]


def _recipe_with_origin(name: str, overrides: list[str], **options: Any) -> tuple[Any, dict[str, str]]:
    """`_recipe`, and where each key the recipe files or --set name was set (keys left at their defaults are absent)."""
    from teacli.config import RecipeError, find_recipe, load_recipe_with_origin

    try:
        return load_recipe_with_origin(find_recipe(name), overrides, **options)
    except RecipeError as exc:
        _fail(str(exc))


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"tea {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Post-train language models for best-of-N deployment (TEA / Prefix-TEA)."""


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
    from teacli.data import DataError, prepare
    from teacli.data.prepare import print_summary

    try:
        summary = prepare(
            source, out, inputs=inputs or (), test_inputs=test_inputs or (), prompt_column=prompt_column,
            train_size=train_size, val_size=val_size, heldout_size=heldout_size, seed=seed,
            exclude_sources=exclude_source, force=force,
            **({} if max_prompt_chars is None else {"max_prompt_chars": max_prompt_chars}),
        )
    except DataError as e:
        _fail(str(e))
    print_summary(summary)


# ------------------------------------------------------------------------------------------------
# tea train


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
    lengths: Optional[str] = typer.Option(
        None, "--lengths", metavar="fixed|realistic|PROMPT,RESPONSE", show_default=False,
        help="With --estimate only: the sequence lengths to price. fixed: every prompt rehearsal.prompt_tokens, every "
        "completion rollout.max_new_tokens; realistic: the lengths rehearsal.lengths realistic draws; PROMPT,RESPONSE: "
        "your data's mean token counts, e.g. 225,320 (the same log-normal shapes). Default: the recipe's rehearsal.lengths.",
    ),
) -> None:
    """Train a policy with the recipe's advantage rule; resumes an existing run directory.

    Multi-GPU / multi-node: launch with `deepspeed --num_gpus N -m teacli.cli train RECIPE` or
    `torchrun --nproc_per_node N -m teacli.cli train RECIPE`.
    """
    from teacli.config import RecipeError

    count = _gpu_count(gpus)
    if not estimate:
        only_with(ctx, "--estimate", ("card", "gpus", "lengths"))
    set_ = [*set_, *(["rehearsal.enabled=true"] if rehearse else []), *([f"optim.steps={steps}"] if steps else [])]
    r, origin = _recipe_with_origin(recipe, set_)
    if estimate:
        from teacli.planner import estimate as predict, format_estimate, layout_note, parse_lengths

        try:
            priced = parse_lengths(lengths) if lengths is not None else None
            typer.echo(format_estimate(predict(r, gpus=count, card=card, lengths=priced)))
            if count > 1:  # colocated or split placement (rollout.colocated), by the same phases
                typer.echo(layout_note(r, count, card, lengths=priced))
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
    from teacli.rundir import check_run_dir_path
    from teacli.train.errors import TrainError
    from teacli.train.loop import train as run_training
    from teacli.train.resume import resume_line, sigterm_as_interrupt

    directory = Path(run_dir) if run_dir else Path("runs") / (r.name + ("-rehearsal" if r.rehearsal.enabled else ""))
    from teacli.models import plain_progress

    plain_progress()  # off a terminal: transformers' and huggingface_hub's bars off, tea's lines instead (docs/cli.md)
    main_rank = os.environ.get("RANK", "0") == "0"  # the other ranks of a launch stop with the same code, silently
    with sigterm_as_interrupt() as stopped_by:
        try:
            check_run_dir_path(directory)
            path = run_training(r, directory, explicit=frozenset(origin))
        except (TrainError, DataError, RecipeError, ValueError) as exc:
            if main_rank:
                _fail(str(exc))
            raise typer.Exit(2)
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: where it stopped, the command that resumes
            if main_rank:
                typer.echo(resume_line(exc, recipe, set_, directory), err=True)
            raise typer.Exit(128 + stopped_by[0])
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
        only_with(ctx, "--estimate", ("card", "gpus_per_run"))
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


@recipes_app.command("list")
def recipes_list(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the recipes (./recipes, then the packaged ones) with their method and setting."""
    from teacli.config import RecipeError, discover_recipes, load_recipe, recipe_summary

    rows = []
    for path in discover_recipes():
        try:
            rows.append(recipe_summary(path, load_recipe(path, advantage=False)))
        except RecipeError as exc:
            _fail(str(exc))
    if json_out:
        typer.echo(json.dumps(rows, indent=2))
        return
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
    print_table(f"{len(rows)} recipes", cells, right=("m", "N_target"), no_wrap=("name",), shorten=("policy", "reward", "dataset"),
                drop=("dataset", "reward", "policy"), hidden="hidden at this width: `--json` or `tea recipes show NAME` has them")


@recipes_app.command("show")
def recipes_show(
    name: str = typer.Argument(..., help="Recipe name (e.g. uf_llama1b_tea) or path to a YAML file."),
    set_: list[str] = typer.Option([], "--set", help="Override a key, e.g. --set optim.lr=3e-5 (repeatable)."),
) -> None:
    """Print the fully resolved recipe (inheritance and overrides applied) as YAML."""
    from teacli.config import to_yaml

    typer.echo(to_yaml(_recipe(name, set_)), nl=False)


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

    from teacli.diagnostics import synthetic

    budgets = budgets or list(DEFAULT_MS)
    try:
        synthetic.check_arguments(budgets, reps, bias_reps)
    except ValueError as exc:
        _fail(str(exc))
    total, done = synthetic.work_units(budgets, reps, bias_reps), [0]

    def advance(units: int) -> None:
        done[0] += units
        bar.update(done[0], total)

    with progress_bar("synthetic", percent=True) as bar:
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
    r = _recipe(recipe, set_)
    settings = AL.Settings(recipe=r, out=out, checkpoint=checkpoint, prompts=prompts, pool=pool, grad_prompts=grad_prompts,
                           ms=tuple(budgets or AL.DEFAULT_MS), N=n, seeds=seeds, rules=tuple(names or AL.DEFAULT_RULES),
                           block=block, split=split, grad_batch_size=grad_batch_size, grad_memory_gib=grad_memory)
    try:
        settings.check()
    except AL.AlignmentError as exc:
        _fail(str(exc))
    from rich.console import Console

    from teacli.data.errors import DataError

    console = Console(stderr=True)
    try:
        with progress_bar("alignment", title="{task.description}", console=console) as bar:
            table = AL.run_alignment(settings, lambda stage, done, total: bar.update(done, total, stage),
                                     log=lambda msg: console.print(msg, markup=False, highlight=False))
    except (AL.AlignmentError, DataError, ValueError) as exc:
        _fail(str(exc))
    from teacli.tables import markdown

    meta = json.loads((out / "alignment.run.json").read_text())
    typer.echo(markdown(AL.tables(table, meta)[0]))
    for line in AL.skipped_notes(table):
        typer.echo(line, err=True)
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
    for line in TF.degenerate_notes(result):
        typer.echo(line, err=True)
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
    from teacli.monitors import hacking as H

    try:
        patterns = H.compile_patterns(pattern)
    except re.error as exc:
        _fail(f"--pattern {exc}")
    try:
        base = None if baseline is None else H.read_picks(baseline)
    except H.WatchError as exc:
        _fail(f"--baseline {exc}")
    results = []
    for d in run_dirs:
        try:
            results.append(H.watch_run(d, patterns, base))
        except H.WatchError as exc:
            _fail(str(exc))
    for line in H.markdown_rows(results):
        typer.echo(line)


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

    from teacli.eval.judge import JudgeConfig, JudgeError, JudgeUnavailable, judge_runs, parse_select, resolve_api_key

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        n = parse_select(select)
        config = JudgeConfig(  # checked as it is made: JudgeError names the option
            model=model, base_url=base_url, concurrency=concurrency, seed=seed, timeout_s=timeout,
            max_attempts=max_attempts, retry_invalid=retry_invalid, api_key_env=api_key_env,
        )
        key = resolve_api_key(base_url, api_key_env)
        with progress_bar("judge", remaining=False, transient=True) as bar:
            summary = judge_runs(run_a, run_b, n, split=split, config=config, api_key=key, progress=bar.update)
    except JudgeUnavailable as exc:  # the endpoint failed, not the input: rerunning resumes
        _fail(str(exc), code=1)
    except JudgeError as exc:
        _fail(str(exc))
    failed = summary.no_valid_verdict()
    if failed:
        _fail(failed, code=1)
    summary.show()


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

    from teacli.eval.bon import EvalError, default_run_dir, evaluate, init_base_arm, resume_line
    from teacli.models import plain_progress

    plain_progress()  # off a terminal: transformers' and huggingface_hub's bars off, tea's lines instead (docs/cli.md)
    console = Console(stderr=True)
    try:
        runs = list(run_dirs) if run_dirs else [default_run_dir()]
    except EvalError as exc:
        _fail(str(exc))
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
        try:
            with progress_bar(run.name, speed="completions", console=console) as bar:
                result = evaluate(run, M=n, split=split, checkpoint=checkpoint, data_dir=data_dir, overrides=set_,
                                  progress=bar.update, log=lambda msg: console.print(f"{run.name}: {msg}", markup=False, highlight=False))
        except (EvalError, ValueError) as exc:
            _fail(str(exc) if str(run) in str(exc) else f"{run}: {exc}")
        except KeyboardInterrupt as exc:  # Ctrl-C: what is on disk, and the command that goes on from it (this run and the rest)
            typer.echo(resume_line(exc, runs[i:], M=n, split=split, checkpoint=checkpoint, data_dir=data_dir, recipe=recipe,
                                   overrides=set_), err=True)
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
    from teacli.report.build import ReportError, build_report, default_report_runs, judge_warnings, parse_endpoints, parse_pairs
    from teacli.tables import markdown

    try:
        ends, pairs = parse_endpoints(endpoints), parse_pairs(pair)
        runs = list(run_dirs) if run_dirs else default_report_runs(checkpoint=checkpoint)
        if not run_dirs:
            typer.echo(f"no RUN_DIR given: reporting {', '.join(str(r) for r in runs)}", err=True)
        result = build_report(runs, out, baseline=baseline, pairs=pairs, resamples=bootstrap, seed=seed, split=split, M=n,
                              checkpoint=checkpoint, endpoints=ends, base_arm=base_arm, levels=bootstrap_levels)
    except ReportError as exc:
        _fail(str(exc))
    for table in result.tables:
        if table.name in ("frontier", "endpoints", "win_tie_loss", "best_tta", "vs_base", "seeds", "judge"):
            typer.echo(markdown(table))
    for line in judge_warnings(result.report):
        typer.echo(line, err=True)
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
    from teacli.rewards.server import serve

    r = _recipe(recipe, set_, runnable=False)
    try:
        serve(r, host=host, port=port, token_env=token_env, max_body_mb=max_body_mb)
    except ValueError as exc:  # RecipeError included
        _fail(str(exc))


def main() -> None:
    """Console entry point. Accepts the `--local_rank=N` (or `--local_rank N`) that the deepspeed launcher adds."""
    import sys

    sys.argv[1:] = take_local_rank(sys.argv[1:])
    app(prog_name="tea")


if __name__ == "__main__":  # pragma: no cover
    main()
