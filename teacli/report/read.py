"""Reading run directories for `tea report`: evaluations, completion records, judge records, recipe.yaml.

Everything `report` reads comes through here (the run-directory contract, teacli/rundir.py):
    eval/<split>-M<M>.bon.json    per-prompt grouped best-of-N values and the checkpoint step
    eval/<split>-M<M>.jsonl       completion records: `tokens` (lengths) and `reward` of every sample
    eval/<split>-M<M>.run.json    the evaluation's settings: the reward that scored it (runs scored by
                                  different rewards are not compared; an evaluation without one is not checked),
                                  the sampling settings and chat template (a base arm sampled otherwise than a
                                  run is not compared; an evaluation that records none is not checked)
    judge/<other-run>-bo<N>.jsonl pairwise judge records, when present
    recipe.yaml                   rollout.group_size (the Budget column) and the advantage rule (which
                                  run is TEA, GRPO-Z or a test-time-aware baseline), read with PyYAML; the
                                  whole recipe at the defaults of its tea_schema, which says which runs are
                                  seeds of one method (teacli/report/pool.py)
(`eval/base/` or `eval/step_XXXXXX/` instead of `eval/` with --checkpoint base / step_N.)

Nothing is skipped silently: a value that is missing, of the wrong type or not finite, a records line
that is not a complete record, and a records file that does not hold every (prompt, sample) its bon.json
implies are errors naming the file (and line), so no table is computed from part of the data.
Imports only the standard library, PyYAML, teacli.rundir and teacli.config's schema (docs/architecture.md import rule).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from teacli import rundir
from teacli.config import applicable, canonical_tree, default_differences, schema_version

_JUDGE_FILE = re.compile(r"^(?P<other>.+)-bo(?P<N>\d+)\.jsonl$")


class ReportError(ValueError):
    """A report problem the user can act on (names the runs and files)."""


@dataclass
class JudgeRow:
    other: str
    N: int
    win: int
    loss: int
    invalid: int

    @property
    def total(self) -> int:
        return self.win + self.loss + self.invalid


@dataclass(frozen=True)
class RecipeInfo:
    """What the report needs from a run's recipe.yaml."""

    group_size: int  # rollout.group_size: m, the per-prompt training rollout budget
    advantage: str  # advantage.name: the run's advantage rule
    params: dict[str, Any]  # advantage.params
    name: str | None = None  # the recipe's name (a method's name when its seeds are pooled)
    seed: int | None = None  # the training seed
    identity: str | None = None  # the whole recipe but its seed and the keys it does not read, canonical JSON: equal for seeds of one method
    schema: int = 1  # its tea_schema (1: written before versions were recorded)
    tree: dict[str, Any] | None = None  # the whole recipe but its seed, as this version writes it (None: it does not build)


@dataclass
class RunEval:
    name: str
    path: Path
    split: str
    M: int
    checkpoint: int | str
    N: list[int]
    per_prompt: dict[str, list[float]]  # prompt_id → value per N
    tokens: dict[str, list[int]] | None  # prompt_id → tokens of samples 0..M-1 (None: no records file)
    rewards: dict[str, list[float]] | None  # prompt_id → reward of samples 0..M-1 (None: no records file)
    group_size: int
    advantage: str
    params: dict[str, Any] = field(default_factory=dict)
    judge: list[JudgeRow] = field(default_factory=list)
    recipe: RecipeInfo | None = None
    seeds: list["RunEval"] = field(default_factory=list)  # a pooled method: its seed runs (teacli/report/pool.py)
    reward: dict[str, Any] | None = None  # the reward that scored the evaluation (run.json); None: not recorded
    settings: Path | None = None  # that run.json
    generation: dict[str, Any] | None = None  # what the samples were drawn with (run.json, `read_generation`); None: not recorded


# ------------------------------------------------------------------------------------------------
# Which evaluations exist


def eval_dir(run: Path, checkpoint: str = "selected") -> Path:
    """eval/ (validation-selected), eval/base/ or eval/step_XXXXXX/ (the run-directory contract)."""
    try:
        return rundir.eval_dir(run, checkpoint)
    except ValueError as exc:
        raise ReportError(str(exc)) from None


def available_evals(directory: Path) -> dict[tuple[str, int], Path]:
    """(split, M) → bon.json for every finished evaluation in `directory`."""
    return rundir.finished_evals(directory)


def default_report_runs(cwd: Path | None = None, checkpoint: str = "selected") -> list[Path]:
    """The current directory if it is a run directory, else every run under runs/ with a finished evaluation."""
    cwd = Path.cwd() if cwd is None else cwd
    if (cwd / "recipe.yaml").is_file():
        return [cwd]
    runs = sorted(d for d in (cwd / "runs").iterdir() if d.is_dir()) if (cwd / "runs").is_dir() else []
    found = [d for d in runs if available_evals(eval_dir(d, checkpoint))]
    if not found:
        raise ReportError("no RUN_DIR given and no run under runs/ has an evaluation (run `tea eval-bon` first)")
    return found


def run_names(paths: Sequence[Path]) -> list[str]:
    """Directory names, or parent/name where two runs share a name."""
    names = [p.resolve().name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [f"{p.resolve().parent.name}/{p.resolve().name}" for p in paths]


def choose_eval(runs: Sequence[Path], names: Sequence[str], checkpoint: str | Sequence[str], split: str | None,
                M: int | None) -> tuple[str, int]:
    """The (split, M) every run has; an error naming the runs when there is none or the choice is ambiguous.
    `checkpoint`: one for every run, or one per run (a base arm reads eval/base/)."""
    checkpoints = [checkpoint] * len(runs) if isinstance(checkpoint, str) else list(checkpoint)
    have, found = {}, {}
    for run, name, ckpt in zip(runs, names, checkpoints):
        found[name] = set(available_evals(eval_dir(run, ckpt)))
        have[name] = {k for k in found[name] if (split is None or k[0] == split) and (M is None or k[1] == M)}
    listing = "; ".join(  # every finished evaluation, also those of other splits and M than asked
        f"{name}: {', '.join(f'{s}-M{m}' for s, m in sorted(ev)) or 'none'}" for name, ev in found.items()
    )
    if any(not ev for ev in have.values()):
        missing = [n for n, ev in have.items() if not ev]
        wheres = sorted({f"{eval_dir(Path('RUN'), c).relative_to('RUN').as_posix()}/" for n, c in zip(names, checkpoints) if n in missing})
        where = " or ".join(wheres)
        want = f" for split {split!r}" if split else ""
        want += f" with M={M}" if M else ""
        raise ReportError(f"run(s) {', '.join(missing)} have no finished evaluation{want} in {where} "
                          f"(run `tea eval-bon` there). Evaluations found: {listing}")
    common = set.intersection(*have.values())
    if not common:
        raise ReportError(f"the runs were evaluated on different splits or M, so they cannot be compared: {listing}. "
                          "Evaluate them with the same --split and --n")
    if len(common) > 1:
        raise ReportError(f"the runs share several evaluations ({', '.join(f'{s}-M{m}' for s, m in sorted(common))}); "
                          "choose one with --split and --n")
    return next(iter(common))


# ------------------------------------------------------------------------------------------------
# The files of one run


def read_recipe(path: Path) -> RecipeInfo:
    """rollout.group_size, advantage.name and advantage.params of a run's recipe.yaml (any YAML style)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path}: not found (every run directory written by `tea train` has one; the report needs "
                          "rollout.group_size and advantage.name from it)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        raise ReportError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if data is None:
        raise ReportError(f"{path}: is empty (the run's resolved recipe, written by `tea train`)")
    if not isinstance(data, dict):
        raise ReportError(f"{path}: a recipe must be a YAML mapping, got {type(data).__name__}")

    rehearsal = data.get("rehearsal")
    if isinstance(rehearsal, dict) and rehearsal.get("enabled"):
        raise ReportError(f"{path.parent} is a rehearsal (rehearsal.enabled in its recipe.yaml): random weights of the recipe's "
                          "model shapes, for time and memory only; tea report compares real runs")

    def get(dotted: str) -> Any:
        node: Any = data
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ReportError(f"{path}: {dotted} is missing")
            node = node[part]
        return node

    m = get("rollout.group_size")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ReportError(f"{path}: rollout.group_size must be a positive integer, got {m!r}")
    rule = get("advantage.name")
    if not isinstance(rule, str) or not rule:
        raise ReportError(f"{path}: advantage.name must be a rule name, got {rule!r}")
    params = data["advantage"].get("params") or {}
    if not isinstance(params, dict):
        raise ReportError(f"{path}: advantage.params must be a mapping, got {params!r}")
    name, seed = data.get("name"), data.get("seed")
    try:
        schema = schema_version(data, missing=1)
    except ValueError as exc:
        raise ReportError(f"{path}: {exc}") from None
    # as this version writes it, the keys it lacks at the defaults of its tea_schema: a recipe.yaml from before a key
    # existed pools with seeds written since that ran alike, and not with seeds under a default that changed since;
    # without the keys the recipe does not read (config.APPLIES_WHEN: reward.kernels of a rule reward), whatever they hold
    tree = canonical_tree(data)
    rest = {k: v for k, v in (tree or data).items() if k != "seed"}
    try:
        identity = json.dumps(applicable(rest), sort_keys=True, default=str)
    except (TypeError, ValueError):
        identity = None
    return RecipeInfo(m, rule, params, name if isinstance(name, str) and name else None,
                      seed if isinstance(seed, int) and not isinstance(seed, bool) else None, identity, schema,
                      rest if tree is not None else None)


def default_split(a: RecipeInfo, b: RecipeInfo) -> dict[str, tuple[Any, Any]]:
    """key → (a's value, b's value) where two recorded recipes, written under different tea_schema versions, differ
    only in keys whose default changed between those versions: the same recipe that ran otherwise because a default
    changed. {} when they were written under one version, agree, or differ in another key too (two recipes)."""
    if a.schema == b.schema or a.tree is None or b.tree is None:
        return {}
    moved, other = default_differences(a.tree, a.schema, b.tree, b.schema)
    return moved if not other else {}


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def read_bon(path: Path, split: str, M: int) -> tuple[int | str, list[int], dict[str, list[float]]]:
    """bon.json → (checkpoint, N, per_prompt), every value checked (type, length, finite)."""
    try:
        bon = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: cannot read ({exc})") from None
    if not isinstance(bon, dict):
        raise ReportError(f"{path}: expected a JSON object written by `tea eval-bon`, got {type(bon).__name__}")
    for key in ("split", "M", "checkpoint", "N", "mean", "per_prompt"):
        if key not in bon:
            raise ReportError(f"{path}: missing key {key!r}")
    if bon["split"] != split or bon["M"] != M:
        raise ReportError(f"{path}: says split {bon['split']!r}, M={bon['M']!r}, but its name says {split}-M{M}")
    Ns = bon["N"]
    if not isinstance(Ns, list) or not Ns or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= M for n in Ns):
        raise ReportError(f"{path}: N must be a non-empty list of integers in 1..{M}, got {Ns!r}")
    checkpoint = bon["checkpoint"]
    if not (isinstance(checkpoint, str) or (isinstance(checkpoint, int) and not isinstance(checkpoint, bool))):
        raise ReportError(f"{path}: checkpoint must be a step number or 'base', got {checkpoint!r}")
    per_prompt = bon["per_prompt"]
    if not isinstance(per_prompt, dict) or not per_prompt:
        raise ReportError(f"{path}: per_prompt must be a non-empty mapping prompt_id → [value per N]")
    out: dict[str, list[float]] = {}
    for pid, values in per_prompt.items():
        if not isinstance(values, list) or len(values) != len(Ns):
            got = f"{len(values)} values" if isinstance(values, list) else repr(values)
            raise ReportError(f"{path}: per_prompt[{pid!r}] has {got} for {len(Ns)} N")
        if not all(_number(v) for v in values):
            bad = next(v for v in values if not _number(v))
            raise ReportError(f"{path}: per_prompt[{pid!r}] holds {bad!r}; every value must be a finite number "
                              "(rerun `tea eval-bon` on this run)")
        out[str(pid)] = [float(v) for v in values]
    return checkpoint, [int(n) for n in Ns], out


def read_records(path: Path, M: int, prompts: Sequence[str]) -> tuple[dict[str, list[int]], dict[str, list[float]]]:
    """<split>-M<M>.jsonl → (tokens, rewards) per prompt, samples 0..M-1 in order.

    Every line must be a complete record; every prompt of bon.json must have each sample exactly once
    and nothing else may be there. Anything else is an error naming `file:line` or the counts, because
    a table over part of the records (a torn file, a lost line) would look complete.
    """
    tokens: dict[str, dict[int, int]] = {pid: {} for pid in prompts}
    rewards: dict[str, dict[int, float]] = {pid: {} for pid in prompts}
    hint = "rerun `tea eval-bon` on this run to complete it"
    try:
        with open(path, encoding="utf-8") as f:  # line by line: records files of M = 512 run to hundreds of MB
            for lineno, line in enumerate(f, 1):
                _read_record(path, lineno, line, M, tokens, rewards, hint)
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read ({exc})") from None
    have = sum(len(t) for t in tokens.values())
    if have != M * len(prompts):
        short = next(pid for pid in prompts if len(tokens[pid]) < M)
        raise ReportError(f"{path}: holds {have} of the {M * len(prompts)} records its bon.json implies "
                          f"({len(prompts)} prompts × M={M}); e.g. prompt {short!r} has {len(tokens[short])} of {M} samples; {hint}")
    return ({pid: [t[s] for s in range(M)] for pid, t in tokens.items()},
            {pid: [r[s] for s in range(M)] for pid, r in rewards.items()})


def _read_record(path: Path, lineno: int, line: str, M: int, tokens: dict[str, dict[int, int]],
                 rewards: dict[str, dict[int, float]], hint: str) -> None:
    """Check one records line and file its tokens and reward (keyed by prompt, then sample)."""
    if not line.strip():
        raise ReportError(f"{path}:{lineno}: empty line inside the records")
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        what = "not a JSON record" if line.endswith("\n") else "a record cut short (the file ends inside it)"
        raise ReportError(f"{path}:{lineno}: {what}; {hint}") from None
    if not isinstance(rec, dict):
        raise ReportError(f"{path}:{lineno}: not a JSON object")
    missing = [k for k in ("prompt_id", "sample", "reward", "tokens") if k not in rec]
    if missing:
        raise ReportError(f"{path}:{lineno}: record has no {', '.join(repr(k) for k in missing)}")
    pid, sample, reward, tok = str(rec["prompt_id"]), rec["sample"], rec["reward"], rec["tokens"]
    if isinstance(sample, bool) or not isinstance(sample, int) or not 0 <= sample < M:
        raise ReportError(f"{path}:{lineno}: sample must be an integer in 0..{M - 1}, got {sample!r}")
    if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
        raise ReportError(f"{path}:{lineno}: tokens must be a non-negative integer, got {tok!r}")
    if not _number(reward):
        raise ReportError(f"{path}:{lineno}: reward must be a finite number, got {reward!r}")
    if pid not in tokens:
        raise ReportError(f"{path}:{lineno}: prompt {pid!r} is not in the evaluation's bon.json")
    if sample in tokens[pid]:
        raise ReportError(f"{path}:{lineno}: prompt {pid!r} sample {sample} appears twice")
    tokens[pid][sample] = tok
    rewards[pid][sample] = float(reward)


def read_judge(run: Path) -> list[JudgeRow]:
    """judge/<other-run>-bo<N>.jsonl → one row per file: self wins, other wins, invalid verdicts."""
    directory = run / "judge"
    rows = []
    if not directory.is_dir():
        return rows
    for p in sorted(directory.iterdir()):
        m = _JUDGE_FILE.match(p.name)
        if not (m and p.is_file()):
            continue
        win = loss = invalid = 0
        lines = p.read_text().split("\n")
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                winner = json.loads(line)["winner"]
            except (json.JSONDecodeError, KeyError, TypeError):
                if lineno == len(lines):
                    continue  # a torn last line of an interrupted judge run
                raise ReportError(f"{p}:{lineno}: not a judge record with a 'winner'") from None
            win += winner == "self"
            loss += winner == "other"
            invalid += winner not in ("self", "other")
        rows.append(JudgeRow(m["other"], int(m["N"]), win, loss, invalid))
    return sorted(rows, key=lambda r: (r.other, r.N))


def load_run(run: Path, name: str, checkpoint: str, split: str, M: int, info: RecipeInfo | None = None) -> RunEval:
    """Everything the report reads from one run directory, checked (`info`: its recipe.yaml, when read already)."""
    directory = eval_dir(run, checkpoint)
    step, Ns, per_prompt = read_bon(directory / f"{split}-M{M}.bon.json", split, M)
    tokens = rewards = None
    records = directory / f"{split}-M{M}.jsonl"
    if records.is_file():
        tokens, rewards = read_records(records, M, list(per_prompt))
    info = info or read_recipe(run / "recipe.yaml")
    settings = directory / f"{split}-M{M}.run.json"
    recorded = read_settings(settings)
    return RunEval(
        name=name, path=run, split=split, M=M, checkpoint=step, N=Ns, per_prompt=per_prompt, tokens=tokens,
        rewards=rewards, group_size=info.group_size, advantage=info.advantage, params=info.params, judge=read_judge(run),
        recipe=info, reward=read_reward(settings, recorded), settings=settings,
        generation=read_generation(settings, recorded),
    )


def read_settings(path: Path) -> dict[str, Any] | None:
    """An evaluation's run.json (None: no run.json, as before it was written)."""
    if not path.exists():
        return None
    try:
        settings = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: cannot read ({exc}); it records the evaluation's settings") from None
    if not isinstance(settings, dict):
        raise ReportError(f"{path}: expected a JSON object (the evaluation's settings), got {type(settings).__name__}")
    return settings


def read_reward(path: Path, settings: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The `reward` an evaluation's run.json records (None: no run.json, as before it was written)."""
    settings = read_settings(path) if settings is None else settings
    if settings is None:
        return None
    reward = settings.get("reward")
    if not isinstance(reward, dict):
        raise ReportError(f"{path}: has no 'reward' mapping (the reward that scored the evaluation)")
    return reward


def read_generation(path: Path, settings: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """What an evaluation's samples were drawn with, as its run.json records it (teacli/eval/bon.py `_settings`):
    every `sampling` key (temperature, top_p, top_k, max_new_tokens, stop_tokens) as `sampling.<key>`, and
    `chat_template` (the recipe's policy.chat_template; None: the tokenizer's own). Keys eval-bon writes only when
    set (sampling.stop_tokens, chat_template) read as None when absent. None: no run.json, or one without `sampling`."""
    settings = read_settings(path) if settings is None else settings
    if settings is None or "sampling" not in settings:
        return None
    sampling = settings["sampling"]
    if not isinstance(sampling, dict):
        raise ReportError(f"{path}: 'sampling' must be a mapping (the settings the evaluation sampled with), got {sampling!r}")
    out = {f"sampling.{k}": sampling.get(k) for k in ("temperature", "top_p", "top_k", "max_new_tokens", "stop_tokens")}
    out.update({f"sampling.{k}": v for k, v in sampling.items() if f"sampling.{k}" not in out})
    out["chat_template"] = settings.get("chat_template")
    return out


def check_same_reward(runs: Sequence[RunEval]) -> None:
    """Best-of-N values scored by different rewards are on different scales: refuse to compare them, naming
    the first run whose reward differs from the first run's, both rewards and where they are recorded."""
    known = [r for r in runs if r.reward is not None]
    for r in known[1:]:
        first = known[0]
        if r.reward == first.reward:
            continue
        keys = _differing(first.reward, r.reward)

        def said(x: RunEval) -> str:
            return ", ".join(f"reward.{k}={x.reward.get(k)!r}" for k in keys) + f" ({x.settings})"

        raise ReportError(f"runs {first.name} and {r.name} were scored with different rewards, so their best-of-N values "
                          f"cannot be compared: {first.name} with {said(first)}, {r.name} with {said(r)}; evaluate them "
                          "with the same reward (`tea eval-bon` with the same --set reward.…)")


def _differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The keys whose values differ between two recorded settings, in the order they first appear."""
    return [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_same_generation(runs: Sequence[RunEval], arm: RunEval | None) -> None:
    """A base arm is the untrained policy of the runs' distribution only when its samples were drawn the same way:
    refuse to compare a run whose evaluation's sampling settings or chat template differ from the base arm's, naming
    the differing keys, both values and both run.json files (an evaluation that records none is not checked)."""
    if arm is None or arm.generation is None:
        return
    for r in runs:
        if r.generation is None or r.generation == arm.generation:
            continue
        keys = _differing(r.generation, arm.generation)

        def said(x: RunEval) -> str:
            return ", ".join(f"{k}={_shown(x.generation.get(k))}" for k in keys) + f" ({x.settings})"

        raise ReportError(f"run {r.name} and the base arm {arm.name} were sampled with different settings, so the "
                          f"base arm is not the untrained policy of the same distribution: {r.name} with {said(r)}, "
                          f"{arm.name} with {said(arm)}; evaluate the base arm with the runs' settings (`tea eval-bon "
                          f"{arm.path} --checkpoint base` with the same rollout.* sampling keys and policy.chat_template)")
