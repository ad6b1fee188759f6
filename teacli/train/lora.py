"""LoRA through peft: wrapping the policy and merging adapters into plain weights for saving."""

from __future__ import annotations

import re
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
    scaling = _scalings(peft_model)
    out: dict[str, Any] = {}
    for key, value in state.items():
        if ".lora_" in key:
            continue
        clean = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        if key.endswith(".base_layer.weight"):
            prefix = key[: -len(".base_layer.weight")]
            a, b = state.get(f"{prefix}.lora_A.default.weight"), state.get(f"{prefix}.lora_B.default.weight")
            if a is not None and b is not None:
                value = (value.float() + scaling[prefix] * (b.float() @ a.float())).to(value.dtype)
        out[clean] = value
    return out


def _scalings(peft_model) -> dict[str, float]:
    out = {}
    for name, module in peft_model.named_modules():
        if hasattr(module, "scaling") and isinstance(getattr(module, "scaling"), dict) and "default" in module.scaling:
            out[name] = float(module.scaling["default"])
    return out


def peft_to_base_name(name: str) -> str:
    """'base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight' → 'model.layers.0.self_attn.q_proj.weight'."""
    return re.sub(r"\.base_layer\.", ".", name.removeprefix("base_model.model."))
