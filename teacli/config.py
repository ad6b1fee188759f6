"""The recipe: one typed tree that says everything a run does.

Every field is declared once below, with its default, its documentation and its valid range
(`field(default, doc, ge=..., ...)`); `docs/recipes.md` and `tea recipes show` read the same
declarations. A YAML recipe maps 1:1 onto this tree:

    base: [base/ultrafeedback.yaml, base/llama1b.yaml]   # inherited, in order; later wins
    name: uf_llama1b_tea
    advantage: {name: tea, params: {alpha: 0.25, n_target: 128}}

`load_recipe(path, overrides=["optim.lr=3e-5"])` resolves `base:` files (relative to the file that
names them), applies `--set` overrides, and validates: unknown keys, wrong types and out-of-range
values raise `RecipeError` naming the dotted key and the file that set it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

RECIPES_DIR = Path(__file__).resolve().parent.parent / "recipes"


class RecipeError(ValueError):
    """A recipe problem, naming the dotted key and the file that set it."""


def field(default: Any, doc: str, **bounds: float) -> Any:
    """A recipe field: default, one-line documentation, optional bounds (ge, gt, le, lt)."""
    meta = {"doc": doc, **bounds}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        factory = (lambda d=default: type(d)(d)) if not dataclasses.is_dataclass(default) else type(default)
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# ------------------------------------------------------------------------------------------------
# The tree


@dataclass
class LoraConfig:
    enabled: bool = field(False, "Train LoRA adapters (peft) instead of the full model.")
    r: int = field(16, "LoRA rank.", ge=1)
    alpha: int = field(32, "LoRA scaling numerator (lora_alpha).", ge=1)
    dropout: float = field(0.0, "LoRA dropout.", ge=0.0, lt=1.0)
    target_modules: list[str] = field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Module names that get adapters.",
    )
    merge_on_save: bool = field(True, "Save checkpoints with adapters merged into full weights (loadable by from_pretrained).")


@dataclass
class PolicyConfig:
    name_or_path: str = field("", "Hugging Face hub id or local directory of the policy (and its tokenizer).")
    gguf_file: str | None = field(None, "GGUF file inside name_or_path to load through transformers (e.g. the quickstart's SmolLM2).")
    revision: str | None = field(None, "Hub revision (branch, tag or commit) to pin.")
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = field(
        "auto", "Weight dtype for generation and forward passes; 'auto' = bfloat16 where supported, else float32."
    )
    attn_implementation: str | None = field(None, "transformers attention implementation ('eager', 'sdpa', 'flash_attention_2'); None = library default.")
    gradient_checkpointing: bool = field(True, "Recompute activations in backward to save memory.")
    chat_template: str | None = field(None, "Jinja chat template overriding the tokenizer's (needed when the tokenizer has none).")
    trust_remote_code: bool = field(False, "Allow custom modelling code from the hub.")
    lora: LoraConfig = field(LoraConfig(), "LoRA adapters.")


@dataclass
class RewardConfig:
    kind: Literal["hf", "rule", "python"] = field(
        "rule",
        "'hf': an AutoModelForSequenceClassification reward model (score = scalar logit); 'rule': the built-in "
        "verifiable-constraint reward; 'python': a user function 'package.module:function'.",
    )
    name_or_path: str | None = field(None, "Reward model hub id or local directory (kind: hf).")
    function: str | None = field(None, "Dotted path 'package.module:function' of a reward function (kind: python).")
    revision: str | None = field(None, "Hub revision of the reward model.")
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = field("auto", "Reward model dtype.")
    device: str = field("auto", "Device for the reward model ('auto' = the policy's device).")
    batch_size: int = field(16, "Responses scored per reward-model forward pass (batched by length).", ge=1)
    max_length: int = field(4096, "Truncate prompt+response to this many reward-model tokens.", ge=16)
    params: dict[str, Any] = field({}, "Keyword arguments for the rule or python reward.")


@dataclass
class DataConfig:
    dir: str = field("", "Directory written by `tea prepare-data` (train.jsonl, val.jsonl, heldout.jsonl, core*.jsonl).")
    train_split: str = field("train", "Split file used for training prompts.")
    val_split: str = field("val", "Split file used for checkpoint validation.")
    max_prompt_tokens: int = field(1024, "Prompts longer than this (after the chat template) are skipped, and counted.", ge=8)


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm", "auto"] = field("hf", "Generation engine; 'auto' = vllm when importable, else hf.")
    prompts_per_step: int = field(8, "P: prompts sampled per training step.", ge=1)
    group_size: int = field(64, "m: rollouts per prompt (the advantage rule's group).", ge=2)
    max_new_tokens: int = field(512, "Maximum generated tokens per rollout (stop at EOS).", ge=1)
    temperature: float = field(1.0, "Sampling temperature (on-policy: 1.0).", gt=0.0)
    top_p: float = field(1.0, "Nucleus sampling mass (1.0 = off).", gt=0.0, le=1.0)
    top_k: int = field(0, "Top-k sampling (0 = off). The model's own generation_config is never applied.", ge=0)
    batch_size: int = field(64, "Sequences generated per engine call (hf engine).", ge=1)
    gpu_memory_utilization: float = field(0.5, "vllm: fraction of GPU memory for the engine.", gt=0.0, le=1.0)
    sleep: bool = field(True, "vllm: sleep (level 1) while training, wake for generation (GPU only).")
    verify_sync: bool = field(True, "vllm: after each weight push, check vLLM's log-probs against the trainer's.")


@dataclass
class AdvantageConfig:
    name: str = field("tea", "Advantage rule: tea, tea_raw, prefix_tea, grpo, grpo_z, bon_max_mean, bon_max_second, bon_mean, chow, cat_bon, or 'package.module:function'.")
    params: dict[str, Any] = field({}, "Keyword parameters of the rule (see docs/advantages.md), e.g. {alpha: 0.25, n_target: 128}.")


@dataclass
class OptimConfig:
    steps: int = field(450, "Training steps (one step = P prompts x m rollouts, one optimizer update).", ge=1)
    lr: float = field(1e-5, "AdamW learning rate.", gt=0.0)
    weight_decay: float = field(0.0, "AdamW weight decay.", ge=0.0)
    betas: list[float] = field([0.9, 0.999], "AdamW betas.")
    warmup_steps: int = field(0, "Linear warm-up steps.", ge=0)
    scheduler: Literal["constant", "cosine", "linear"] = field("constant", "Learning-rate schedule after warm-up.")
    max_grad_norm: float = field(1.0, "Gradient clipping norm (0 = off).", ge=0.0)
    micro_batch_size: int = field(8, "Sequences per forward/backward; gradients accumulate over the step's P*m sequences.", ge=1)


@dataclass
class KLConfig:
    beta: float = field(0.1, "KL coefficient (paper: 0.1); 0 disables the reference model.", ge=0.0)
    estimator: Literal["k1", "k2", "k3"] = field("k3", "Per-token KL estimator in the loss (Schulman's k1/k2/k3).")


@dataclass
class BackendConfig:
    zero_stage: int = field(2, "DeepSpeed ZeRO stage (0-3).", ge=0, le=3)
    precision: Literal["auto", "bf16", "fp32"] = field("auto", "Training precision; 'auto' = bf16 where the device supports it (fp32 master weights), else fp32.")
    offload_optimizer: bool = field(False, "ZeRO: offload optimizer state to CPU.")
    offload_params: bool = field(False, "ZeRO-3: offload parameters to CPU.")


@dataclass
class CheckpointConfig:
    save_every: int = field(25, "Save (and validate) every this many steps (paper: 25).", ge=1)
    keep_last: int | None = field(None, "Keep only the newest this many checkpoints (the selected one is always kept); None = keep all.", ge=1)


@dataclass
class ValidationConfig:
    enabled: bool = field(True, "Validate at each checkpoint and select the best.")
    prompts: int = field(128, "Fixed validation prompts (the first of the val split).", ge=1)
    samples: int = field(32, "Completions per validation prompt.", ge=1)
    top: int = field(10, "Score = mean of the top this many rewards per prompt, averaged over prompts.", ge=1)
    at_start: bool = field(True, "Also score the untrained policy (validation.jsonl step 0; not a selectable checkpoint).")


@dataclass
class EvalConfig:
    split: str = field("core250", "Held-out split evaluated by `tea eval-bon`.")
    M: int = field(256, "Completions per prompt for grouped best-of-N (paper 256; 512 for scaling).", ge=1)
    score_batch_size: int = field(64, "Responses scored per reward call during evaluation.", ge=1)


@dataclass
class LoggingConfig:
    tensorboard: bool = field(True, "Also log metrics to TensorBoard when it is installed.")
    log_every: int = field(1, "Print a progress line every this many steps.", ge=1)


@dataclass
class Recipe:
    name: str = field("", "Run name; the default run directory is runs/<name>.")
    description: str = field("", "One line on what this recipe reproduces.")
    seed: int = field(0, "Seed for data order, sampling and the advantage rule's randomness.", ge=0)
    policy: PolicyConfig = field(PolicyConfig(), "The policy model.")
    reward: RewardConfig = field(RewardConfig(), "The reward model or function.")
    data: DataConfig = field(DataConfig(), "Prompt data.")
    rollout: RolloutConfig = field(RolloutConfig(), "Generation.")
    advantage: AdvantageConfig = field(AdvantageConfig(), "Advantage rule.")
    optim: OptimConfig = field(OptimConfig(), "Optimisation.")
    kl: KLConfig = field(KLConfig(), "KL regularisation to the reference policy.")
    backend: BackendConfig = field(BackendConfig(), "DeepSpeed backend.")
    checkpoint: CheckpointConfig = field(CheckpointConfig(), "Checkpoints.")
    validation: ValidationConfig = field(ValidationConfig(), "Validation-based checkpoint selection.")
    eval: EvalConfig = field(EvalConfig(), "Best-of-N evaluation defaults.")
    logging: LoggingConfig = field(LoggingConfig(), "Logging.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------------------------
# Loading: base inheritance, overrides, provenance


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {path}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping at the top level, got {type(data).__name__}")
    return data


def _merge(dst: dict, src: dict, origin: dict[str, str], source: str, prefix: str = "") -> None:
    """Deep-merge src into dst (later wins); record which file set each leaf key."""
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(dst.get(key), dict) and not _is_free_dict(dotted):
            _merge(dst[key], value, origin, source, dotted + ".")
        else:
            dst[key] = value
            origin[dotted] = source
            if isinstance(value, dict):
                _mark(value, origin, source, dotted + ".")


def _mark(value: dict, origin: dict[str, str], source: str, prefix: str) -> None:
    for key, sub in value.items():
        origin[f"{prefix}{key}"] = source
        if isinstance(sub, dict):
            _mark(sub, origin, source, f"{prefix}{key}.")


def _is_free_dict(dotted: str) -> bool:
    """Free-form dict fields (advantage.params, reward.params) are replaced, not merged key by key."""
    return dotted in {"advantage.params", "reward.params"}


def _resolve_file(path: Path, origin: dict[str, str], stack: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in stack:
        raise RecipeError(f"{path}: circular 'base:' inheritance via {' -> '.join(str(p) for p in stack)}")
    data = _read_yaml(path)
    bases = data.pop("base", None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise RecipeError(f"{path}: 'base' must be a file name or a list of file names, got {bases!r}")
    merged: dict[str, Any] = {}
    for base in bases:
        base_path = (path.parent / base) if not Path(base).is_absolute() else Path(base)
        if not base_path.exists() and (RECIPES_DIR / base).exists():
            base_path = RECIPES_DIR / base
        if not base_path.exists():
            raise RecipeError(f"{path}: base recipe {base!r} not found (looked in {path.parent})")
        _merge(merged, _resolve_file(base_path, origin, stack + (path,)), origin, str(base_path.resolve()))
    _merge(merged, data, origin, str(path))
    return merged


def parse_override(item: str) -> tuple[str, Any]:
    """'a.b=c' → ('a.b', YAML-parsed c): numbers, booleans, null and lists parse as in YAML."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {item!r}: expected KEY=VALUE, e.g. optim.lr=3e-5")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and raw.strip() and _looks_like_float(raw.strip()):
        value = float(raw)
    return key.strip(), value


def _looks_like_float(text: str) -> bool:
    # YAML 1.1 reads '3e-5' as a string; recipes mean a number.
    try:
        float(text)
    except ValueError:
        return False
    return True


def apply_overrides(data: dict[str, Any], overrides: list[str], origin: dict[str, str]) -> None:
    for item in overrides:
        key, value = parse_override(item)
        parts = key.split(".")
        node = data
        for part in parts[:-1]:
            if not isinstance(node.setdefault(part, {}), dict):
                raise RecipeError(f"--set {item!r}: {part!r} is not a section")
            node = node[part]
        node[parts[-1]] = value
        origin[key] = "--set"
        if isinstance(value, dict):
            _mark(value, origin, "--set", key + ".")


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Load, inherit, override and validate a recipe file."""
    recipe, _ = load_recipe_with_origin(path, overrides)
    return recipe


def load_recipe_with_origin(path: str | Path, overrides: list[str] | None = None) -> tuple[Recipe, dict[str, str]]:
    origin: dict[str, str] = {}
    data = _resolve_file(Path(path), origin)
    apply_overrides(data, list(overrides or []), origin)
    recipe = build(Recipe, data, origin, "")
    if not recipe.name:
        recipe.name = Path(path).stem
    validate_recipe(recipe, origin)
    return recipe, origin


def recipe_from_dict(data: dict[str, Any], source: str = "<dict>") -> Recipe:
    """Build and validate a Recipe from a plain dict (e.g. a run directory's recipe.yaml)."""
    origin: dict[str, str] = {}
    _mark(data, origin, source, "")
    recipe = build(Recipe, data, origin, "")
    validate_recipe(recipe, origin)
    return recipe


# ------------------------------------------------------------------------------------------------
# Type checking against the dataclass tree


def _where(origin: dict[str, str], key: str) -> str:
    src = origin.get(key)
    while src is None and "." in key:
        key = key.rsplit(".", 1)[0]
        src = origin.get(key)
    return f" (set in {src})" if src else ""


def build(cls: type, data: Any, origin: dict[str, str], prefix: str) -> Any:
    """Instantiate dataclass `cls` from `data`, checking keys, types and bounds."""
    if not isinstance(data, dict):
        raise RecipeError(f"{prefix.rstrip('.') or 'recipe'}: expected a mapping, got {data!r}{_where(origin, prefix.rstrip('.'))}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = f"{prefix}{unknown[0]}"
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


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


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
        raise errors[0] if len(errors) == 1 else RecipeError(f"{key}: {value!r} has the wrong type{where}")
    if org is Literal:
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
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"{key}: expected a string, got {value!r}{where}")
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


def validate_recipe(recipe: Recipe, origin: dict[str, str] | None = None) -> None:
    """Checks that involve several fields: the advantage rule against the group size, etc."""
    origin = origin or {}
    _check_advantage(recipe, origin)
    r = recipe.reward
    if r.kind == "hf" and not r.name_or_path:
        raise RecipeError(f"reward.name_or_path: required when reward.kind is 'hf'{_where(origin, 'reward.kind')}")
    if r.kind == "python" and (not r.function or ":" not in r.function):
        raise RecipeError(
            f"reward.function: kind 'python' needs a dotted path 'package.module:function', got {r.function!r}{_where(origin, 'reward.function')}"
        )
    if len(recipe.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in recipe.optim.betas):
        raise RecipeError(f"optim.betas: expected two numbers in [0, 1), got {recipe.optim.betas!r}{_where(origin, 'optim.betas')}")
    if recipe.validation.top > recipe.validation.samples:
        raise RecipeError(
            f"validation.top: {recipe.validation.top} exceeds validation.samples={recipe.validation.samples}{_where(origin, 'validation.top')}"
        )
    if recipe.backend.offload_params and recipe.backend.zero_stage != 3:
        raise RecipeError(f"backend.offload_params: needs backend.zero_stage 3, got {recipe.backend.zero_stage}{_where(origin, 'backend.offload_params')}")


def _check_advantage(recipe: Recipe, origin: dict[str, str]) -> None:
    import importlib

    adv = recipe.advantage
    # The registry imports torch; a dotted user rule is checked by importing it.
    advantages = importlib.import_module("teacli.advantages")
    try:
        rule = advantages.resolve_rule(adv.name)
        advantages._check_params(adv.name, rule, adv.params)
    except ValueError as exc:
        raise RecipeError(f"advantage: {exc}{_where(origin, 'advantage.name')}") from None
    # Run the rule once on a dummy group of the recipe's size: catches m too small for the rule.
    import torch

    m = recipe.rollout.group_size
    dummy = torch.linspace(0.0, 1.0, 2 * m, dtype=torch.float64).reshape(2, m)
    try:
        advantages.compute_advantages(adv.name, dummy, **adv.params)
    except (ValueError, TypeError) as exc:
        raise RecipeError(
            f"advantage / rollout.group_size: {exc}{_where(origin, 'rollout.group_size') or _where(origin, 'advantage.name')}"
        ) from None


# ------------------------------------------------------------------------------------------------
# Introspection for docs and `tea recipes`


def field_docs(cls: type = Recipe, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, doc) for every leaf field of the tree."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(field_docs(tp, key + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((key, _type_name(tp), default, f.metadata.get("doc", "")))
    return rows


def to_yaml(recipe: Recipe) -> str:
    import yaml

    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=None, width=100)


def discover_recipes(root: Path | None = None) -> list[Path]:
    """Every runnable recipe under recipes/ (base/ and studies/ hold fragments and studies, not recipes)."""
    root = root or RECIPES_DIR
    return sorted(p for p in root.rglob("*.yaml") if p.relative_to(root).parts[0] not in {"base", "studies"})


def find_recipe(name_or_path: str) -> Path:
    """A recipe path from a path or a bare name (`uf_llama1b_tea` → recipes/uf_llama1b_tea.yaml)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    for candidate in discover_recipes():
        if candidate.stem == name_or_path or candidate.name == name_or_path:
            return candidate
    raise RecipeError(f"no recipe file or name {name_or_path!r} (see `tea recipes list`)")
