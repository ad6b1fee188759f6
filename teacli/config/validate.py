"""Validation on load: a YAML tree is built into the Recipe tree (teacli/config/tree.py) key by key, against each
field's declared type and range, and then checked across fields (the advantage rule against the group size, a judge's
template, a python reward's signature, ...). Every error is one RecipeError naming the dotted key and where its value
came from: `(set in FILE)` or `(set by --set)`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Any, Literal, Union

from teacli.config.tree import (
    REMOVED_KEYS,
    REMOVED_VALUES,
    VLLM_RESERVED_KWARGS,
    Recipe,
    RecipeError,
    RewardConfig,
    RuleParams,
    _type_name,
    judge_template_problem,
)

# ------------------------------------------------------------------------------------------------
# Where a value came from


RECIPE_FILE = "<recipe>"  # origin's entry for the file that was loaded (not a recipe key)
OVERRIDE = "--set"  # the origin of a value given on the command line


def _source(origin: dict[str, str], key: str) -> str | None:
    """The file (or OVERRIDE) that set `key` or, failing that, its nearest parent section."""
    src = origin.get(key)
    while src is None and ("." in key or key.endswith("]")):
        key = key[: key.rindex("[")] if key.endswith("]") else key.rsplit(".", 1)[0]  # a list item: its list
        src = origin.get(key)
    return src


def _set_by(src: str) -> str:
    return "set by --set" if src == OVERRIDE else f"set in {src}"


def _where(origin: dict[str, str], *keys: str) -> str:
    """' (set in FILE)' / ' (set by --set)' for the keys behind an error; each key named when they differ."""
    by_source: dict[str, list[str]] = {}
    for k in keys:
        if (s := _source(origin, k)) is not None:
            by_source.setdefault(s, []).append(k)
    if not by_source:
        return ""
    if len(by_source) == 1 and len(next(iter(by_source.values()))) == len(keys):
        return f" ({_set_by(next(iter(by_source)))})"
    return " (" + "; ".join(f"{', '.join(ks)} {_set_by(s)}" for s, ks in by_source.items()) + ")"


# ------------------------------------------------------------------------------------------------
# Type checking against the dataclass tree


def build(cls: type, data: Any, origin: dict[str, str], prefix: str) -> Any:
    """Instantiate dataclass `cls` from `data`, checking keys, types and bounds."""
    if not isinstance(data, dict):
        raise RecipeError(f"{prefix.rstrip('.') or 'recipe'}: expected a mapping, got {data!r}{_where(origin, prefix.rstrip('.'))}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = f"{prefix}{unknown[0]}"
        if key not in origin:  # a section that holds only what set it (`--set rollout.foo.bar=1`): its keys' source
            origin = {**origin, key: next((s for k, s in origin.items() if k.startswith(key + ".")), _source(origin, key))}
        if key in REMOVED_KEYS:
            raise RecipeError(f"{key}{_where(origin, key)} {REMOVED_KEYS[key]}")
        import difflib

        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f"; did you mean {prefix + close[0]!r}?" if close else f"; valid keys under {prefix.rstrip('.') or 'the top level'}: {', '.join(fields)}"
        raise RecipeError(f"unknown recipe key {key!r}{_where(origin, key)}{hint}")
    values = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        values[name] = _coerce(hints[name], value, origin, key)
        _check_bounds(fields[name].metadata, values[name], origin, key)
    return cls(**values)


def _coerce(tp: Any, value: Any, origin: dict[str, str], key: str) -> Any:
    where = _where(origin, key)
    org = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, origin, key + ".")
    if org in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, origin, key)
            except RecipeError as exc:
                errors.append(str(exc))
        raise RecipeError(errors[0]) if len(errors) == 1 else RecipeError(f"{key}: {value!r} has the wrong type{where}")
    if org is Literal:
        if isinstance(value, str) and (key, value) in REMOVED_VALUES:
            raise RecipeError(f"{key}: {value!r}{where} {REMOVED_VALUES[key, value]}")
        if value not in typing.get_args(tp):
            raise RecipeError(f"{key}: {value!r} is not {_type_name(tp)}{where}")
        return value
    if org is list:
        if not isinstance(value, list):
            raise RecipeError(f"{key}: expected a list, got {value!r}{where}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(item_tp, v, origin, f"{key}[{i}]") for i, v in enumerate(value)]
    if org is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{key}: expected a mapping, got {value!r}{where}")
        if typing.get_args(tp)[:1] == (str,):
            for k in value:
                if not isinstance(k, str):
                    raise RecipeError(f"{key}: {k!r} is not an argument name{_where(origin, key)}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise RecipeError(f"{key}: expected true or false, got {value!r}{where}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise RecipeError(f"{key}: expected an integer, got {value!r}{where}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{key}: expected a number, got {value!r}{where}")
        if not math.isfinite(value):
            raise RecipeError(f"{key}: expected a finite number, got {value!r}{where}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            hint = " (quote it to mean text)" if isinstance(value, (int, float, bool)) else ""
            raise RecipeError(f"{key}: expected a string, got {value!r}{hint}{where}")
        return value
    raise RecipeError(f"{key}: unsupported type {tp}")  # pragma: no cover - a bug in the tree


def _check_bounds(meta: Any, value: Any, origin: dict[str, str], key: str) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    checks = {"ge": (lambda a, b: a >= b, ">="), "gt": (lambda a, b: a > b, ">"), "le": (lambda a, b: a <= b, "<="), "lt": (lambda a, b: a < b, "<")}
    for name, (ok, sym) in checks.items():
        if name in meta and not ok(value, meta[name]):
            raise RecipeError(f"{key}: {value!r} is out of range: must be {sym} {meta[name]}{_where(origin, key)}")
# ------------------------------------------------------------------------------------------------
# Cross-field checks


def validate_recipe(recipe: Recipe, origin: dict[str, str] | None = None, *, runnable: bool = True, advantage: bool = True) -> None:
    """Checks that involve several fields: the advantage rule against the group size, etc."""
    origin = origin or {}
    if advantage:
        _check_advantage(recipe, origin)
    r = recipe.reward
    if r.kind in ("hf", "lm_judge") and not r.name_or_path:
        raise RecipeError(f"reward.name_or_path: required when reward.kind is {r.kind!r}{_where(origin, 'reward.kind')}")
    if r.kind == "lm_judge":
        _check_judge(r, origin)
    elif r.gguf_file:
        raise RecipeError(f"reward.gguf_file: applies to kind 'lm_judge' only, not {r.kind!r}{_where(origin, 'reward.gguf_file')}")
    if r.kind == "python" and (not r.function or ":" not in r.function):
        raise RecipeError(
            f"reward.function: kind 'python' needs a dotted path 'package.module:function', got {r.function!r}{_where(origin, 'reward.function')}"
        )
    _check_reward_params(r, origin)
    if r.kind == "remote" and not (r.url or "").startswith(("http://", "https://")):
        raise RecipeError(
            f"reward.url: kind 'remote' needs the reward server's http(s) URL, e.g. http://127.0.0.1:5000/get_reward, "
            f"got {r.url!r}{_where(origin, 'reward.url') or _where(origin, 'reward.kind')}"
        )
    report_to = recipe.logging.report_to or []
    if len(set(report_to)) != len(report_to):
        raise RecipeError(f"logging.report_to: {report_to!r} names a tracker twice{_where(origin, 'logging.report_to')}")
    if len(recipe.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in recipe.optim.betas):
        raise RecipeError(f"optim.betas: expected two numbers in [0, 1), got {recipe.optim.betas!r}{_where(origin, 'optim.betas')}")
    if recipe.validation.top > recipe.validation.samples:
        raise RecipeError(
            f"validation.top: {recipe.validation.top} exceeds validation.samples={recipe.validation.samples}"
            f"{_where(origin, 'validation.top', 'validation.samples')}"
        )
    ro = recipe.rollout
    if ro.engine == "hf" and ro.is_correction in ("token", "sequence") and ro.max_staleness == 0:
        raise RecipeError(
            f"rollout.is_correction: {ro.is_correction!r} needs the sampler's log-probs, which only the vllm engine "
            f"returns; the hf engine on-policy samples from the trainer's own module (no mismatch): use auto or off"
            f"{_where(origin, 'rollout.is_correction')}"
        )
    if ro.max_staleness > 0:
        if ro.engine == "vllm":
            raise RecipeError(f"rollout.max_staleness: {ro.max_staleness} runs with the hf engine only (vLLM sleeps while the "
                              f"trainer updates); set rollout.engine: hf or rollout.max_staleness: 0"
                              f"{_where(origin, 'rollout.max_staleness', 'rollout.engine')}")
        if ro.dynamic_sampling:
            raise RecipeError(f"rollout.max_staleness: {ro.max_staleness} cannot run with rollout.dynamic_sampling (its rounds "
                              f"agree across ranks through collectives, which a background generation cannot join)"
                              f"{_where(origin, 'rollout.max_staleness', 'rollout.dynamic_sampling')}")
    if not ro.colocated:  # split placement (teacli/train/split.py)
        if ro.engine == "vllm":
            raise RecipeError("rollout.colocated: false runs the hf engine on the generation ranks (the vllm engine lives in "
                              "the trainer's process); set rollout.engine: hf or rollout.colocated: true"
                              f"{_where(origin, 'rollout.colocated', 'rollout.engine')}")
        if ro.dynamic_sampling:
            raise RecipeError("rollout.colocated: false cannot run with rollout.dynamic_sampling (its rounds agree across "
                              "the generating and training ranks through collectives); set one of them off"
                              f"{_where(origin, 'rollout.colocated', 'rollout.dynamic_sampling')}")
    for pattern in recipe.validation.watch_patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise RecipeError(f"validation.watch_patterns: {pattern!r} is not a regex ({exc}){_where(origin, 'validation.watch_patterns')}") from None
    check_vllm_kwargs(recipe.rollout.vllm_kwargs, origin)
    if recipe.policy.kernels == "compile" and recipe.backend.zero_stage == 3:
        raise RecipeError(
            f"policy.kernels: compile is not supported with backend.zero_stage 3 (DeepSpeed's ZeRO-3 parameter hooks run "
            f"outside compilation, splitting every compiled layer at each sub-module): use liger, eager or zero_stage 2"
            f"{_where(origin, 'policy.kernels', 'backend.zero_stage')}"
        )
    if recipe.backend.offload_params and recipe.backend.zero_stage != 3:
        raise RecipeError(f"backend.offload_params: needs backend.zero_stage 3, got {recipe.backend.zero_stage}{_where(origin, 'backend.offload_params')}")
    if runnable:
        _check_runnable(recipe, origin)


def check_vllm_kwargs(kwargs: dict[Any, Any], origin: dict[str, str] | None = None) -> None:
    """RecipeError for a key of `rollout.vllm_kwargs` that tea sets itself (VLLM_RESERVED_KWARGS) or that is
    no argument name. Whether this vLLM has the argument is checked when the engine is built."""
    origin = origin or {}
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise RecipeError(f"rollout.vllm_kwargs: {key!r} is not an argument name{_where(origin, 'rollout.vllm_kwargs')}")
        if key in VLLM_RESERVED_KWARGS:
            dotted = f"rollout.vllm_kwargs.{key}"
            raise RecipeError(f"{dotted}: tea sets vLLM's {key} itself{_where(origin, dotted)}: {VLLM_RESERVED_KWARGS[key]}")


def _check_runnable(recipe: Recipe, origin: dict[str, str]) -> None:
    """A recipe that names no policy or no prompts cannot run (an empty file, a base fragment, a typo'd section)."""
    for key, value in (("policy.name_or_path", recipe.policy.name_or_path), ("data.dir", recipe.data.dir)):
        if not value:
            src = origin.get(RECIPE_FILE)
            where = _where(origin, key) if key in origin else (f" (not set in {src} or its bases)" if src else "")
            raise RecipeError(
                f"{key}: required: a recipe names the policy to train (policy.name_or_path) and its prompts "
                f"(data.dir: a `tea prepare-data` directory, builtin or builtin-hard){where}"
            )


def _check_judge(r: RewardConfig, origin: dict[str, str]) -> None:
    """An LM judge's template slots and verdict words (that each is one token is checked when the judge loads)."""
    problem = judge_template_problem(r.judge_template)
    if problem:
        raise RecipeError(f"reward.judge_template: {problem}{_where(origin, 'reward.judge_template')}")
    for key in ("judge_yes", "judge_no"):
        if getattr(r, key) == "":
            raise RecipeError(f"reward.{key}: an empty verdict word; give one token, e.g. 'Yes' / 'No'{_where(origin, f'reward.{key}')}")
    if r.judge_yes is not None and r.judge_yes == r.judge_no:
        raise RecipeError(f"reward.judge_no: {r.judge_no!r} is also reward.judge_yes; the verdicts must differ{_where(origin, 'reward.judge_no', 'reward.judge_yes')}")


def _check_reward_params(r: RewardConfig, origin: dict[str, str]) -> None:
    """reward.params against what the reward accepts: the rule reward's typed parameters and their ranges;
    a python reward's signature (unless it takes **kwargs); none for a reward model."""
    if r.kind == "rule":
        build(RuleParams, r.params, origin, "reward.params.")
    elif r.kind in ("hf", "lm_judge") and r.params:
        raise RecipeError(f"reward.params: kind {r.kind!r} takes no parameters, got {', '.join(map(str, r.params))}{_where(origin, 'reward.params')}")
    elif r.kind == "python":
        _check_python_reward(r, origin)


def _check_python_reward(r: RewardConfig, origin: dict[str, str]) -> None:
    import difflib
    import importlib
    import inspect

    where = _where(origin, "reward.function")
    module_name, _, attr = (r.function or "").partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise RecipeError(f"reward.function: cannot import module {module_name!r} of {r.function!r}: {exc}{where}") from None
    except (Exception, SystemExit) as exc:  # the module's own code failed (or exited) while it was imported
        text = " ".join(str(exc).split())[:300]
        raise RecipeError(f"reward.function: importing module {module_name!r} of {r.function!r} raised "
                          f"{type(exc).__name__}{f': {text}' if text else ''}{where}") from None
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise RecipeError(f"reward.function: module {module_name!r} has no function or class {attr!r}{where}")
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return  # no introspectable signature (a C function): checked when the reward is built
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    fixed = [] if isinstance(target, type) else [None, None]  # f(prompts, responses, **params); Class(**params)
    try:
        sig.bind(*fixed, **r.params)
    except TypeError as exc:
        accepted = [p.name for p in params[len(fixed):] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = sorted(k for k in r.params if k not in accepted)
        if unknown:
            key = f"reward.params.{unknown[0]}"
            close = difflib.get_close_matches(unknown[0], accepted, n=1)
            hint = f"; did you mean 'reward.params.{close[0]}'?" if close else f"; it accepts: {', '.join(accepted) or 'no parameters'}"
            raise RecipeError(f"{key}: {r.function} takes no parameter {unknown[0]!r}{_where(origin, key)}{hint}") from None
        raise RecipeError(f"reward.params: {r.function} cannot be called with them: {exc}{_where(origin, 'reward.params', 'reward.function')}") from None


def _check_advantage(recipe: Recipe, origin: dict[str, str]) -> None:
    import importlib

    adv = recipe.advantage
    for k, v in adv.params.items():  # e.g. n_target: .inf, which a rule's int(n_target) cannot take
        if isinstance(v, float) and not math.isfinite(v):
            raise RecipeError(f"advantage.params.{k}: expected a finite number, got {v!r}{_where(origin, f'advantage.params.{k}')}")
    # The registry imports torch; a dotted user rule is checked by importing it.
    advantages = importlib.import_module("teacli.advantages")
    try:
        rule = advantages.resolve_rule(adv.name)
        advantages._check_params(adv.name, rule, adv.params)
    except ValueError as exc:
        raise RecipeError(f"advantage: {exc}{_where(origin, 'advantage.name', 'advantage.params')}") from None
    # Run the rule once on a dummy group of the recipe's size: catches m too small for the rule.
    import torch

    m = recipe.rollout.group_size
    dummy = torch.linspace(0.0, 1.0, 2 * m, dtype=torch.float64).reshape(2, m)
    try:
        advantages.compute_advantages(adv.name, dummy, **adv.params)
    except (ValueError, TypeError, OverflowError) as exc:
        raise RecipeError(
            f"advantage / rollout.group_size: {exc}{_where(origin, 'rollout.group_size', 'advantage.name', 'advantage.params')}"
        ) from None
