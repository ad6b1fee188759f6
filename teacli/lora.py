"""LoRA through peft: wrapping the policy and merging adapters into plain weights (for saving, and
for pushing to a rollout engine that serves the base architecture, such as vLLM)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from teacli.config import LoraConfig


def apply_lora(model, cfg: "LoraConfig"):
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=list(cfg.target_modules), task_type="CAUSAL_LM"
    )
    try:
        return get_peft_model(model, peft_cfg)
    except ValueError as exc:
        raise ValueError(f"policy.lora.target_modules: {exc}") from None


def merged_state_dict(peft_model, state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """Base-model state dict with every LoRA pair merged: W ← W + (alpha/r)·B·A.

    `state` is a full (gathered, CPU) state dict of the PEFT model. Keys lose the PEFT prefix
    `base_model.model.` and the `.base_layer` infix; `lora_*` tensors are folded in and dropped.
    """
    return dict(merged_named_tensors(peft_model, state.items()))


def merged_named_tensors(peft_model, named: Iterable[tuple[str, "torch.Tensor"]]) -> Iterator[tuple[str, "torch.Tensor"]]:
    """Stream a PEFT model's (name, tensor) pairs as base-model pairs with every LoRA pair merged.

    Names as in `merged_state_dict`. A wrapped layer's base weight is held only until its
    lora_A and lora_B arrive (they follow it in `named_parameters()` order), so streaming a
    model holds at most a layer's worth of extra tensors. The merge runs in fp32 on the tensors'
    device and returns the base weight's dtype. Adapters other than the default adapter's plain
    lora_A/lora_B (DoRA magnitudes, LoRA embeddings) are an error, not silently dropped.
    """
    scaling = _scalings(peft_model)
    held: dict[str, dict[str, Any]] = {}  # wrapped layer → {"base", "A", "B"} seen so far
    for key, value in named:
        layer, part = _lora_part(key)
        if part is None:
            yield peft_to_base_name(key), value
            continue
        parts = held.setdefault(layer, {})
        parts[part] = value
        if len(parts) == 3:
            del held[layer]
            w = parts["base"]
            merged = w.float() + scaling[layer] * (parts["B"].float() @ parts["A"].float())
            yield peft_to_base_name(f"{layer}.weight"), merged.to(w.dtype)
    if held:
        raise ValueError(f"LoRA merge: layers without a complete base weight + lora_A + lora_B: {sorted(held)[:3]}")


_LORA_PARTS = ((".base_layer.weight", "base"), (".lora_A.default.weight", "A"), (".lora_B.default.weight", "B"))


def _lora_part(key: str) -> tuple[str, str | None]:
    """'...q_proj.lora_A.default.weight' → ('...q_proj', 'A'); a tensor outside LoRA → (key, None)."""
    for suffix, part in _LORA_PARTS:
        if key.endswith(suffix):
            return key[: -len(suffix)], part
    if ".lora_" in key:
        raise ValueError(f"LoRA merge: unsupported adapter tensor {key!r} (only the default adapter's lora_A/lora_B merge)")
    return key, None


def _scalings(peft_model) -> dict[str, float]:
    out = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "scaling") and isinstance(getattr(module, "scaling"), dict) and "default" in module.scaling:
            out[name] = float(module.scaling["default"])
    return out


def peft_to_base_name(name: str) -> str:
    """'base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight' → 'model.layers.0.self_attn.q_proj.weight'."""
    return re.sub(r"\.base_layer\.", ".", name.removeprefix("base_model.model."))
