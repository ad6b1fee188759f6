"""`tea eval-bon`: sample M completions per held-out prompt, score them, grouped best-of-N.

Protocol (paper, appendix "Training and Evaluation Details", "Reported best-of-N reward scores"):
for each prompt of the held-out split, M completions from the chosen checkpoint with the run's
rollout engine and sampling parameters, scored by the run's reward; bo<N> for every power of two
N dividing M is the grouped best-of-N of `teacli.eval.stats.grouped_bon` (consecutive groups of N
in sample order, mean of group maxima per prompt, mean over prompts).

Files (the run-directory contract, teacli/rundir.py), under `eval/` for the validation-selected
checkpoint, `eval/step_XXXXXX/` for an explicit one, `eval/base/` for the untrained policy:
    <split>-M<M>.jsonl       one line per completion {prompt_id, sample, response, reward, tokens}
    <split>.prompts.jsonl    the evaluated prompts {prompt_id, messages}
    <split>-M<M>.bon.json    {split, M, checkpoint, N, mean, per_prompt}
    <split>-M<M>.run.json    the evaluation's settings (checkpoint, seed, sampling, chat template, reward), checked on resume
`tokens` counts the generated tokens including the EOS token when the completion stopped there.

Batching: one engine call samples the M completions of k = max(1, rollout.batch_size // M)
consecutive prompts (of the split's evaluated prompts, in order), so a small M still fills the
generation batch. The calls are fixed by (prompts, M, batch size) alone (`call_groups`), each with
seed = derive_seed(recipe.seed, the group's prompt ids joined by "+"); a one-prompt group's seed is
derive_seed(recipe.seed, prompt_id), so with k = 1 (M ≥ batch_size) the records are exactly those
of the one-call-per-prompt evaluation before this batching; with k > 1 they are other, equally valid
draws of the same distribution.

Resume (append-only): records are appended one prompt at a time (all M lines in one write, then
flush + fsync). A restarted evaluation keeps every complete line, cuts a torn last line, and
regenerates only the call groups that have a prompt with samples missing; the seeded call gives the
same completions again, and only the missing sample indices are appended, so a resumed evaluation
ends with exactly the records of an uninterrupted one (same engine, device and batch size; on a
different engine or batch size the kept records stay valid samples, the new ones come from another
random stream). Settings that change the distribution (checkpoint, sampling, policy.chat_template,
reward, prompt-length limit) must match `<split>-M<M>.run.json`, else the evaluation stops with an error.

Departures: prompts longer than `data.max_prompt_tokens` after the chat template are skipped (as
in training) and counted; `<split>.prompts.jsonl` lists the prompts actually evaluated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.eval.stats import grouped_bon, powers_of_two_dividing
from teacli.rundir import exclusive, with_traceback_file, write_text_atomic, writing

if TYPE_CHECKING:
    from teacli.config import Recipe

RECORD_KEYS = ("prompt_id", "sample", "response", "reward", "tokens")
# Settings that change what the samples are; a resume must not mix two of them in one file.
_COMPARED = ("split", "M", "checkpoint", "checkpoint_path", "seed", "sampling", "chat_template", "reward", "max_prompt_tokens")


class EvalError(RuntimeError):
    """An evaluation problem the user can act on (named file, run or option)."""


class EvalInterrupted(KeyboardInterrupt):
    """Ctrl-C during an evaluation; its text says what is safely on disk (whole records only)."""


def resume_line(exc: KeyboardInterrupt, runs: Sequence[Path], *, M: int | None, split: str | None, checkpoint: str,
                data_dir: str | None, recipe: str | None, overrides: Sequence[str]) -> str:
    """What Ctrl-C during `tea eval-bon` prints: what is on disk (an EvalInterrupted says) and the command that goes
    on from there, for runs[0], the run it stopped in, and the runs after it."""
    import shlex

    where = str(exc) if isinstance(exc, EvalInterrupted) else f"interrupted before evaluating {runs[0]} (nothing sampled in it)"
    again = ["tea", "eval-bon", *(str(r) for r in runs), *(["--n", str(M)] if M else []),
             *(["--split", split] if split else []), *(["--checkpoint", checkpoint] if checkpoint != "selected" else []),
             *(["--data-dir", data_dir] if data_dir else []), *(["--recipe", recipe] if recipe else []),
             *(a for item in overrides for a in ("--set", item))]
    return f"{where}; to go on from there, run: {shlex.join(again)}"


# ------------------------------------------------------------------------------------------------
# Which run, which checkpoint, which files


def default_run_dir(cwd: Path | None = None) -> Path:
    """The current directory if it is a run directory, else the most recently active run under runs/."""
    cwd = Path.cwd() if cwd is None else cwd
    if (cwd / "recipe.yaml").is_file():
        return cwd
    runs = cwd / "runs"
    candidates = [d for d in runs.iterdir() if (d / "recipe.yaml").is_file()] if runs.is_dir() else []
    if not candidates:
        raise EvalError("no RUN_DIR given, and neither ./recipe.yaml nor runs/*/recipe.yaml exists; name a run directory")

    def activity(d: Path) -> float:
        files = [d / n for n in ("recipe.yaml", "metrics.jsonl", "validation.jsonl", "selected.json")]
        return max(f.stat().st_mtime for f in files if f.exists())

    return max(candidates, key=activity)


@dataclass(frozen=True)
class Checkpoint:
    label: int | str  # the training step, or "base"
    path: Path | None  # the HF checkpoint directory; None = the recipe's policy
    eval_dir: Path  # where this checkpoint's evaluation files go


def resolve_checkpoint(run: Path, spec: str, validation: bool = True) -> Checkpoint:
    """'selected' (selected.json), 'step_N' / 'N' (checkpoints/step_00000N) or 'base' (the recipe's policy).

    `validation`: the run's validation.enabled; without it no checkpoint is ever selected.
    """
    from teacli.rundir import RunDir, eval_dir, parse_checkpoint_spec

    rd = RunDir(run)
    try:
        which = parse_checkpoint_spec(spec)
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    if which == "base":
        return Checkpoint("base", None, eval_dir(run, "base"))
    if which == "selected":
        try:
            sel = rd.read_selected()
        except ValueError as exc:  # rundir.RecordError: a damaged selected.json, named
            raise EvalError(str(exc)) from None
        if not sel:
            have = _listing(rd) or "none yet"
            if not validation:
                raise EvalError(
                    f"{run} was trained with validation.enabled: false, so it never selects a checkpoint (no "
                    f"{rd.selected.name}); pass --checkpoint step_N (checkpoints: {have}) or --checkpoint base"
                )
            raise EvalError(
                f"{rd.selected} not found: the run has no validation-selected checkpoint yet; "
                f"use --checkpoint step_N (checkpoints: {have}) or --checkpoint base"
            )
        path = run / sel["path"]
        if not path.is_dir():
            raise EvalError(f"{rd.selected} names {sel['path']}, which does not exist (pruned?)")
        return Checkpoint(int(sel["step"]), path, eval_dir(run, "selected"))
    path = rd.checkpoint(which)
    if not (path / "config.json").is_file():
        have = _listing(rd) or "none"
        raise EvalError(f"--checkpoint {spec}: no checkpoint {path} (checkpoints in this run: {have})")
    return Checkpoint(which, path, eval_dir(run, which))


def _listing(rd) -> str:
    """The run's complete checkpoints as --checkpoint values: 'step_2, step_4'."""
    return ", ".join(f"step_{s}" for s, _ in rd.complete_checkpoints())


@dataclass(frozen=True)
class EvalFiles:
    records: Path
    prompts: Path
    bon: Path
    settings: Path
    lock: Path

    @classmethod
    def of(cls, eval_dir: Path, split: str, M: int) -> "EvalFiles":
        stem = f"{split}-M{M}"
        return cls(eval_dir / f"{stem}.jsonl", eval_dir / f"{split}.prompts.jsonl", eval_dir / f"{stem}.bon.json",
                   eval_dir / f"{stem}.run.json", eval_dir / f".{stem}.lock")


def call_groups(prompt_ids: Sequence[str], M: int, batch_size: int) -> list[list[int]]:
    """Indices into `prompt_ids`, one list per engine call: k = max(1, batch_size // M) consecutive prompts."""
    k = max(1, batch_size // M)
    return [list(range(i, min(i + k, len(prompt_ids)))) for i in range(0, len(prompt_ids), k)]


def group_seed(seed: int, prompt_ids: Sequence[str]) -> int:
    """The sampling seed of one engine call; for one prompt, that prompt's `derive_seed`."""
    return derive_seed(seed, "+".join(prompt_ids))


def derive_seed(seed: int, prompt_id: str) -> int:
    """The sampling seed of one prompt: a function of (recipe seed, prompt id) only, < 2**31."""
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (2**31 - 1)


# ------------------------------------------------------------------------------------------------
# Records


def read_records(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """Every complete record of `path`. A torn last line (no newline: a kill mid-write) is ignored,
    and cut from the file when `repair` (so the next append starts on a fresh line). Any other line that
    is not a record as eval-bon writes it (UTF-8 JSON with every key, an integer sample, a finite number
    reward) is an EvalError naming the file and line."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data) and repair:
        with open(path, "r+b") as f:
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
    damaged = "the file is damaged, move it away to re-evaluate"
    out = []
    for lineno, raw in enumerate(data[:end].split(b"\n")[:-1], 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EvalError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                            f"{damaged}") from None
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{path}:{lineno}: not a JSON record ({exc}); {damaged}") from None
        if not isinstance(rec, dict) or any(k not in rec for k in RECORD_KEYS):
            raise EvalError(f"{path}:{lineno}: a record needs the keys {', '.join(RECORD_KEYS)}")
        sample, reward = rec["sample"], rec["reward"]
        if isinstance(sample, bool) or not isinstance(sample, int):
            raise EvalError(f"{path}:{lineno}: sample must be an integer, got {sample!r}; {damaged}")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise EvalError(f"{path}:{lineno}: reward must be a finite number, got {reward!r} (prompt "
                            f"{rec['prompt_id']!r}, sample {sample}); {damaged}")
        out.append(rec)
    return out


def append_records(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Append records in one write, then flush and fsync (a kill leaves at most one torn line)."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    with writing(path), open(path, "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def rewards_matrix(records: Sequence[dict[str, Any]], prompt_ids: Sequence[str], M: int, source: str = "records") -> "Any":
    """records → rewards[P, M] (rows in `prompt_ids` order, columns by sample index); every cell required."""
    import numpy as np

    row = {pid: i for i, pid in enumerate(prompt_ids)}
    out = np.full((len(prompt_ids), M), np.nan)
    for rec in records:
        i, s = row.get(rec["prompt_id"]), int(rec["sample"])
        if i is not None and 0 <= s < M:
            out[i, s] = float(rec["reward"])
    missing = np.argwhere(np.isnan(out))
    if len(missing):
        p, s = missing[0]
        raise EvalError(f"{source}: {len(missing)} of {out.size} completions are missing (first: prompt {prompt_ids[p]!r}, sample {s})")
    return out


def bon_summary(rewards: "Any", prompt_ids: Sequence[str], split: str, M: int, checkpoint: int | str) -> dict[str, Any]:
    """rewards[P, M] → the bon.json object: grouped best-of-N for every power of two N dividing M."""
    Ns = powers_of_two_dividing(M)
    per_n = [grouped_bon(rewards, n) for n in Ns]  # each [P]
    return {
        "split": split,
        "M": M,
        "checkpoint": checkpoint,
        "N": Ns,
        "mean": [float(v.mean()) for v in per_n],
        "per_prompt": {pid: [float(v[i]) for v in per_n] for i, pid in enumerate(prompt_ids)},
    }


def _write_json_atomic(path: Path, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------------------------------------
# The evaluation


@dataclass
class EvalResult:
    run: Path
    files: EvalFiles
    summary: dict[str, Any]  # bon.json
    prompts: int
    skipped_prompts: int
    resumed_completions: int  # completions found on disk at the start
    new_completions: int
    seconds: float


def init_base_arm(run: Path, recipe: str, overrides: Sequence[str] = ()) -> Path:
    """Make `run` a run-like directory of `recipe` (name or path) for `--checkpoint base`: its resolved
    recipe.yaml, as `tea train` writes it, and nothing else. A study's base arm (the untrained policy
    evaluated as an arm) lives there. An existing recipe.yaml must be the same recipe. Returns the file."""
    from teacli.config import RecipeError, canonical_tree, find_recipe, load_recipe, parse_yaml, read_yaml, recipe_changes
    from teacli.config import to_yaml

    try:
        resolved = to_yaml(load_recipe(find_recipe(recipe), overrides))
    except RecipeError as exc:
        raise EvalError(f"--recipe: {exc}") from None
    path = Path(run) / "recipe.yaml"
    if path.exists():
        try:  # the same recipe as this version writes it: one written before a key existed has it at its default, and
            # a key the recipe does not read (config.APPLIES_WHEN) differs in nothing that ran
            before = canonical_tree(read_yaml(path))
            same = path.read_text() == resolved or (
                before is not None and not recipe_changes(before, parse_yaml(resolved, "--recipe")))
        except RecipeError:
            same = False
        if not same:
            raise EvalError(f"{path} holds another recipe than --recipe {recipe}; evaluate into another RUN_DIR")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, resolved)
    return path


def load_run_recipe(run: Path, overrides: Sequence[str] = ()) -> "Recipe":
    """The run's resolved recipe.yaml, with optional `--set` overrides applied; a key it lacks at the default of the
    tea_schema that wrote it (what the run ran under), not today's."""
    from teacli.config import RecipeError, read_yaml, recipe_from_dict

    path = run / "recipe.yaml"
    if not path.is_file():
        raise EvalError(f"{run} is not a run directory (no recipe.yaml)")
    try:
        return recipe_from_dict(read_yaml(path) or {}, source=str(path), overrides=overrides, record=True)
    except RecipeError as exc:
        raise EvalError(str(exc)) from None


def evaluate(
    run: Path,
    *,
    M: int | None = None,
    split: str | None = None,
    checkpoint: str = "selected",
    data_dir: str | None = None,
    overrides: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] = lambda msg: None,
) -> EvalResult:
    """Evaluate (or resume evaluating) one checkpoint of `run`; returns the written bon.json and counts.

    M, split: default the recipe's eval.M and eval.split. `progress(done, total)` is called with
    completions done (including those found on disk) after each prompt.
    """
    run = Path(run)
    recipe = load_run_recipe(run, overrides)
    M = M or recipe.eval.M
    split = split or recipe.eval.split
    if M < 1:
        raise EvalError(f"--n: M must be >= 1, got {M}")
    ckpt = resolve_checkpoint(run, checkpoint, validation=recipe.validation.enabled)
    loaded = recipe  # what is loaded: in a rehearsal, stand-ins of the recipe's models and data
    if recipe.rehearsal.enabled:
        from teacli import standins

        import torch

        log(standins.banner(recipe))
        try:
            standins.require_gpu(recipe, torch.cuda.is_available(), "a rehearsal's evaluation")  # before anything is built
            loaded = standins.stand_in(recipe)
        except ValueError as exc:
            raise EvalError(str(exc)) from None
    prompts = _split_prompts(loaded, split, data_dir)  # a wrong --split fails before anything is created
    files = EvalFiles.of(ckpt.eval_dir, split, M)
    from teacli.rollout.factory import AUTO_WITHOUT_CHOICE, recipe_engine

    engine, why = recipe_engine(recipe, max(M, recipe.rollout.batch_size))
    if recipe.rollout.engine == "auto" and why not in AUTO_WITHOUT_CHOICE:
        log(f"rollout.engine auto: {engine} ({why})")
    settings = _settings(recipe, run, ckpt, split, M, overrides, engine)
    ckpt.eval_dir.mkdir(parents=True, exist_ok=True)
    busy = f"another `tea eval-bon` is writing {ckpt.eval_dir} (lock {files.lock.name}); wait for it to finish"
    from teacli.rewards import RewardError

    with exclusive(files.lock, busy, EvalError):
        try:
            return _evaluate_locked(run, recipe, loaded, ckpt, files, settings, split, M, data_dir, prompts, progress, log)
        except RewardError as exc:  # the user's reward failed: one line, its traceback beside the records
            raise EvalError(with_traceback_file(str(exc), exc.details, files.records.with_name(f"{split}-M{M}.reward_error.log"))) from None
        except SystemExit as exc:  # code the evaluation called exited: not a finished evaluation
            raise EvalError(f"evaluating {run} stopped: code it called exited (sys.exit({exc.code!r})); the records "
                            f"written so far are kept, rerun the command to go on") from None
        except KeyboardInterrupt:
            raise EvalInterrupted(stopped_at(run, files, M)) from None


def stopped_at(run: Path, files: EvalFiles, M: int) -> str:
    """Where an interrupted evaluation stopped: the whole records on disk (what a rerun keeps)."""
    try:
        records = read_records(files.records)
        prompts = [line for line in files.prompts.read_text(encoding="utf-8").split("\n") if line.strip()] if files.prompts.exists() else []
    except (EvalError, OSError, ValueError):
        return f"interrupted while evaluating {run} (its records so far: {files.records})"
    if not records:
        return f"interrupted while evaluating {run}, before its first prompt's completions were written"
    per_prompt: dict[str, int] = {}
    for rec in records:
        per_prompt[rec["prompt_id"]] = per_prompt.get(rec["prompt_id"], 0) + 1
    complete = sum(1 for n in per_prompt.values() if n >= M)
    return (f"interrupted while evaluating {run}: {len(records):,} of {len(prompts) * M:,} completions are written to "
            f"{files.records} ({complete} of {len(prompts)} prompts complete)")


def _split_prompts(recipe: "Recipe", split: str, data_dir: str | None) -> list:
    from teacli.data.errors import DataError
    from teacli.data.load import load_split

    try:
        prompts = load_split(data_dir or recipe.data.dir, split)
    except DataError as exc:
        raise EvalError(f"{exc} (the run's data.dir; pass --data-dir where the data lives elsewhere)") from None
    if len({p.id for p in prompts}) != len(prompts):
        raise EvalError(f"split {split!r} holds duplicate prompt ids")
    return prompts


def _settings(recipe: "Recipe", run: Path, ckpt: Checkpoint, split: str, M: int, overrides: Sequence[str],
              engine: str) -> dict[str, Any]:
    """What an evaluation records in its settings file; `engine`: rollout.engine as resolved."""
    from teacli.config import JUDGE_KEYS
    from teacli.rollout.base import sampling_settings

    r, w = recipe.rollout, recipe.reward
    full = w.settings()  # with the lm_judge keys for a judge: another question gives other rewards
    reward = {k: full[k] for k in ("kind", "name_or_path", "function", "revision", "max_length", "params", *JUDGE_KEYS) if k in full}
    return {
        "split": split,
        "M": M,
        "checkpoint": ckpt.label,
        "checkpoint_path": ckpt.path.relative_to(run).as_posix() if ckpt.path else recipe.policy.name_or_path,
        "seed": recipe.seed,
        "sampling": sampling_settings(r),
        # the prompts' template: recorded only when the recipe sets one, so files written before compare equal
        **({"chat_template": recipe.policy.chat_template} if recipe.policy.chat_template else {}),
        "reward": reward,
        "max_prompt_tokens": recipe.data.max_prompt_tokens,
        # Recorded, not compared: they change speed or the random stream, not the distribution.
        "engine": engine,
        "rollout_batch_size": r.batch_size,
        "score_batch_size": recipe.eval.score_batch_size,
        "overrides": list(overrides),
        **({"rehearsal": True} if recipe.rehearsal.enabled else {}),  # random weights: for time and memory only
    }


def _check_settings(files: EvalFiles, settings: dict[str, Any], log: Callable[[str], None]) -> None:
    if not files.settings.exists():
        return
    old = json.loads(files.settings.read_text())
    differ = [k for k in _COMPARED if old.get(k) != settings.get(k)]
    if differ:
        lines = "; ".join(f"{k}: on disk {old.get(k)!r}, now {settings.get(k)!r}" for k in differ)
        raise EvalError(
            f"{files.records.parent} holds an evaluation with other settings ({lines}). Resume with the same "
            f"settings, or move {files.records.name}, {files.settings.name} and {files.bon.name} away to start over"
        )
    changed = [k for k in ("engine", "rollout_batch_size") if old.get(k) != settings[k]]
    if changed:
        log(f"note: {', '.join(changed)} changed since the evaluation started; new samples use another random stream")


def _evaluate_locked(run, recipe, loaded, ckpt, files, settings, split, M, data_dir, prompts, progress, log) -> EvalResult:
    import torch

    from teacli import models
    from teacli.session import Sampler, encode_prompts, open_tokenizer, policy_config

    t_start = time.perf_counter()
    _check_settings(files, settings, log)

    policy_cfg = policy_config(loaded.policy, ckpt.path)  # a checkpoint loads with its own tokenizer
    try:
        tokenizer = open_tokenizer(policy_cfg, recipe.rollout.stop_tokens)  # a bad stop token stops before any file is written
    except ValueError as exc:
        raise EvalError(str(exc)) from None
    encoded, _ = encode_prompts(tokenizer, prompts, recipe.data.max_prompt_tokens)
    kept, prompt_ids = [p for p, _ in encoded], [ids for _, ids in encoded]
    skipped = len(prompts) - len(kept)
    if not kept:
        raise EvalError(f"every prompt of split {split!r} exceeds data.max_prompt_tokens={recipe.data.max_prompt_tokens}")
    if skipped:
        log(f"skipped {skipped} of {len(prompts)} prompts longer than data.max_prompt_tokens={recipe.data.max_prompt_tokens}")
    order = [p.id for p in kept]

    prompt_lines = [{"prompt_id": p.id, "messages": [dict(m) for m in p.messages]} for p in kept]
    if files.prompts.exists():
        on_disk = [json.loads(line)["prompt_id"] for line in files.prompts.read_text().split("\n") if line.strip()]
        if on_disk != order:
            raise EvalError(
                f"{files.prompts} lists other prompts than split {split!r} of {data_dir or recipe.data.dir} now gives; "
                "evaluate with the same data, or move the eval files away"
            )
    else:
        write_text_atomic(files.prompts, "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in prompt_lines))
    if not files.settings.exists():
        _write_json_atomic(files.settings, settings)

    # What is on disk already.
    records = read_records(files.records, repair=True)
    known = set(order)
    have: dict[str, set[int]] = {pid: set() for pid in order}
    for i, rec in enumerate(records):
        pid, s = rec["prompt_id"], int(rec["sample"])
        if pid not in known or not 0 <= s < M:
            raise EvalError(f"{files.records}: record {i + 1} (prompt {pid!r}, sample {s}) is not part of this evaluation "
                            f"({len(order)} prompts of {split!r}, M={M})")
        if s in have[pid]:
            raise EvalError(f"{files.records}: prompt {pid!r} sample {s} appears twice; the file was written by two processes")
        have[pid].add(s)
    resumed = len(records)
    total = len(order) * M
    todo = [(p, ids) for p, ids in zip(kept, prompt_ids) if len(have[p.id]) < M]
    if resumed:
        log(f"resuming: {resumed} of {total} completions on disk, {len(todo)} prompts to sample")
    if progress:
        progress(resumed, total)

    new = 0
    if todo:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if device.type == "cpu":
            models.keep_cpu_memory()
        try:
            sampler = Sampler.open(recipe, policy_cfg, tokenizer, device, reward=loaded.reward,
                                   rollout=dataclasses.replace(recipe.rollout, engine=settings["engine"]))
            from teacli.standins import end_responses

            end_responses(recipe, sampler.engine)  # rehearsal.lengths realistic: responses end at drawn lengths, as in training
        except ValueError as exc:
            raise EvalError(str(exc)) from None
        done = resumed
        for members in call_groups(order, M, recipe.rollout.batch_size):
            if all(len(have[order[i]]) == M for i in members):
                continue
            samples = sampler.generate([prompt_ids[i] for i in members], M, group_seed(recipe.seed, [order[i] for i in members]))
            for i, group in zip(members, samples):
                prompt = kept[i]
                missing = [s for s in range(M) if s not in have[prompt.id]]
                if not missing:  # complete on disk; regenerated only because a group member was not
                    continue
                scores = sampler.score(prompt, [group[s].text for s in missing])
                append_records(files.records, [
                    {"prompt_id": prompt.id, "sample": s, "response": group[s].text, "reward": r, "tokens": len(group[s].token_ids)}
                    for s, r in zip(missing, scores)
                ])
                new += len(missing)
                done += len(missing)
                if progress:
                    progress(done, total)
        records = read_records(files.records)

    summary = bon_summary(rewards_matrix(records, order, M, str(files.records)), order, split, M, ckpt.label)
    if recipe.rehearsal.enabled:
        summary["rehearsal"] = True
    _write_json_atomic(files.bon, summary)
    return EvalResult(run, files, summary, len(order), skipped, resumed, new, time.perf_counter() - t_start)
