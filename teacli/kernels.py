"""Fused kernels for the training phase: `policy.kernels` (issue 21).

The eager transformers modules run RMSNorm, SiLU·gate, rotary embeddings, residual adds and casts
as separate element-wise kernels; on a GPU they take about as long as the matrix multiplies of the
training phase (docs/performance.md, the profile). Two maintained ways to fuse them, applied to the
policy (and the reference model where one is built) after loading and before LoRA and DeepSpeed wrap it:

  * `liger`: liger-kernel's per-architecture patch (`pip install 'teacli[liger]'`, CUDA only: Triton
    kernels) with its RMSNorm, SwiGLU/GeGLU and rotary kernels, picked by `config.model_type` from
    liger's own table (`MODEL_TYPE_TO_APPLY_LIGER_FN`, checked against liger-kernel 0.8.5). Its
    cross-entropy patches stay off: tea computes the head's log-probs itself (teacli/logprobs.py,
    which already uses liger's fused linear cross-entropy there). RMSNorm and the MLP are patched
    on the model instance; liger patches the rotary function in the architecture's transformers
    module, so every model of that architecture in the process gets it. For the policy, which also
    generates with the hf engine, liger's kernels stay out of the engine's generation: its
    patched RMSNorm and MLP forwards only in train mode (the hf engine generates in eval mode), the
    rotary function everywhere but inside the engine's generation (`generating()`, which the hf
    engine enters). So the reference model (eval mode, instance forwards patched without the
    train-mode switch) computes with the same kernels as the policy's training forward: before the
    first update their log-probs, and the KL, agree exactly. (Before, the rotary function ran
    fused only with gradients on, so the reference's no-grad pass used the eager one and the KL at
    step 1 was bf16 rounding, -0.002 a sequence on an H100, instead of 0.) Measured on an H200
    (docs/performance.md): with liger inside the engine's compiled, static-cache generation, that
    generation took 3.3x as long (4.42 s against 1.33 s a step).
  * `compile`: `torch.compile` of each decoder layer's forward (regional compilation: the layers
    share one compiled graph per shape class, and gradient checkpointing, which wraps the layer's
    call, and LoRA, whose adapters live inside the layer, keep working). The policy's layers run
    compiled only in train mode: the hf engine switches the model to eval mode to generate, with
    its own compiled decode step and static cache, and gets the eager layers (no second compilation
    nested in transformers' own, no recompiling for every decode shape). A gradient-checkpointed
    layer recomputes in backward in the same mode as its forward. The reference model (always in
    eval mode, never generating) runs its layers compiled. Not with ZeRO-3 (config.py refuses it):
    DeepSpeed 0.19's ZeRO-3 parameter hooks are excluded from compilation (`torch.compiler.disable`),
    which splits each compiled layer at every sub-module; not tried.
  * `eager`: nothing. `auto`: `liger` when it is importable, the device is CUDA and liger supports
    the architecture; otherwise `eager` (on CPU always: today's behaviour there).

Both fused paths give the eager values up to float rounding (tests/test_kernels.py on CPU for
`compile`; tests/gpu/test_gpu_kernels.py for both in bf16).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

KERNELS = ("auto", "eager", "liger", "compile")
# The loss patches stay off (tea computes the head's log-probs itself); everything else is liger's default.
_LIGER_OFF = {"cross_entropy": False, "fused_linear_cross_entropy": False}


def resolve_kernels(setting: str, model: Any, device: "torch.device | str", key: str = "policy.kernels") -> str:
    """`key` (policy.kernels, reward.kernels) resolved for `model` (a transformers PreTrainedModel) on `device`:
    eager, liger or compile.

    `liger` asked for where it cannot run, or `compile` on a model without decoder layers, is a
    ValueError naming `key` and why; `auto` falls back to eager.
    """
    if setting not in KERNELS:
        raise ValueError(f"{key}: {setting!r} is not one of {', '.join(KERNELS)}")
    if setting == "auto":
        return "liger" if liger_problem(model, device) is None else "eager"
    if setting == "liger":
        require_liger(model, device, key)
    if setting == "compile" and not decoder_layers(model):
        raise ValueError(f"{key}: compile found no decoder layers in {type(model).__name__}; use eager")
    return setting


def liger_problem(model: Any, device: "torch.device | str | None") -> str | None:
    """Why liger's kernels cannot be applied to `model` on `device` (None: they can). `model` None
    checks only the library and the device (before a model is loaded)."""
    import torch

    if device is None or torch.device(device).type != "cuda":
        return "needs a CUDA device (its kernels are Triton)"
    table = _liger_table()
    if isinstance(table, str):
        return table
    if model is None:
        return None
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in table:
        return f"does not support the architecture {model_type!r} (liger-kernel's table of model types)"
    return None


def require_liger(model: Any, device: "torch.device | str | None", key: str = "policy.kernels") -> None:
    """A ValueError naming `key` when liger cannot be applied (`liger_problem`)."""
    if (why := liger_problem(model, device)) is not None:
        raise ValueError(f"{key}: liger {why}; use eager, compile or auto")


def apply_kernels(model: Any, kind: str, *, generates: bool) -> Any:
    """Apply a resolved `kind` (eager, liger, compile) to `model` in place and return it.

    `generates`: the model also generates (the policy, for the hf engine): compiled layers then run
    only in train mode. The reference model passes False.
    """
    if kind == "liger":
        _apply_liger(model, generates=generates)
    elif kind == "compile":
        for layer in decoder_layers(model):
            _compile_layer(layer, train_mode_only=generates)
    elif kind != "eager":
        raise ValueError(f"policy.kernels: {kind!r} is not a resolved kernel choice (eager, liger, compile)")
    return model


def decoder_layers(model: Any) -> list[Any]:
    """The repeated decoder blocks of a transformers model: its `_no_split_modules` classes (the
    unit transformers itself never splits across devices: LlamaDecoderLayer, Qwen2DecoderLayer, ...)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


# ------------------------------------------------------------------------------------------------


def _liger_table() -> "dict[str, Any] | str":
    """liger-kernel's {model_type: apply function}, or why it cannot be had."""
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as exc:
        return f"is not importable ({exc}; pip install 'teacli[liger]')"
    return MODEL_TYPE_TO_APPLY_LIGER_FN


# The architecture-module functions liger replaced (e.g. modeling_llama.apply_rotary_pos_emb), as they
# were before it did: {(module name, attribute): function}; and the architectures with a generating model.
_EAGER_GLOBALS: dict[tuple[str, str], Any] = {}
_GENERATING_ARCHS: set[str] = set()


def _apply_liger(model: Any, *, generates: bool) -> None:
    """liger's patch for the model's architecture; with `generates`, its kernels kept out of generation."""
    import inspect
    import sys

    table = _liger_table()
    apply = table[model.config.model_type]  # resolve_kernels has checked both
    params = inspect.signature(apply).parameters
    arch = sys.modules.get(type(model).__module__)  # e.g. transformers.models.llama.modeling_llama
    before = dict(vars(arch)) if arch is not None else {}
    forwards = {m: m.__dict__.get("forward") for m in model.modules()}
    apply(model=model, **{k: v for k, v in _LIGER_OFF.items() if k in params})
    if generates:
        for module, old in forwards.items():
            new = module.__dict__.get("forward")
            if new is not None and new is not old:
                eager = old if old is not None else type(module).forward.__get__(module)
                module.forward = _in_train_mode(module, new, eager)
    if arch is None:
        return
    for name, new in vars(arch).items():  # functions liger swapped in the architecture's module
        old = before.get(name)
        if new is not old and inspect.isfunction(new) and inspect.isfunction(old):
            _EAGER_GLOBALS.setdefault((arch.__name__, name), old)
    if generates:
        _GENERATING_ARCHS.add(arch.__name__)
    if arch.__name__ in _GENERATING_ARCHS:  # also after a later model's patch put liger's function back
        for (module_name, name), eager in _EAGER_GLOBALS.items():
            current = getattr(arch, name)
            if module_name == arch.__name__ and not getattr(current, "_tea_outside_generation", False):
                setattr(arch, name, _outside_generation(current, eager))


def _in_train_mode(module: Any, fused: Any, eager: Any) -> Any:
    """A forward that runs `fused` while `module` is in train mode and `eager` in eval mode."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        return (fused if module.training else eager)(*args, **kwargs)

    return forward


_GENERATING = threading.local()  # .depth > 0 while an engine generates in this thread with a patched model (`generating`)


@contextlib.contextmanager
def generating() -> Iterator[None]:
    """While an engine generates: the architecture functions liger swapped (the rotary embedding) run
    eagerly, as its instance forwards do in eval mode. Everything else (the training forward, the
    reference model's and the sync check's no-grad scoring) runs liger's, so the reference computes
    exactly what the policy's training forward computes before the first update. Per thread: a one-step-off-policy
    run generates in a background thread while the trainer's forward runs liger's in the main one."""
    _GENERATING.depth = getattr(_GENERATING, "depth", 0) + 1
    try:
        yield
    finally:
        _GENERATING.depth -= 1


def _outside_generation(fused: Any, eager: Any) -> Any:
    """A function that runs `fused`, and `eager` while an engine generates (`generating`)."""
    import functools

    @functools.wraps(eager)
    def function(*args: Any, **kwargs: Any) -> Any:
        return (eager if getattr(_GENERATING, "depth", 0) else fused)(*args, **kwargs)

    function._tea_outside_generation = True  # type: ignore[attr-defined]
    return function


def _compile_layer(layer: Any, *, train_mode_only: bool) -> None:
    """Replace `layer.forward` (on the instance) with its torch.compile'd version; with
    `train_mode_only`, with one that runs compiled in train mode and eager in eval mode."""
    import torch

    eager = layer.forward
    compiled = torch.compile(eager)
    layer.forward = _in_train_mode(layer, compiled, eager) if train_mode_only else compiled
