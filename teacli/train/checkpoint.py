"""Writing a checkpoint's HF model: what `from_pretrained` loads (the run directory itself is
`teacli.rundir`, shared by every stage)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_hf_model(module, state: dict[str, Any], tokenizer, directory: Path, lora: bool) -> None:
    """An HF-format checkpoint loadable by `from_pretrained`: weights as safetensors, config, tokenizer.

    With LoRA the adapters are merged into the base weights (W + scale·B·A) and PEFT names are
    mapped back to the base model's, so the checkpoint is a plain model.
    """
    from teacli.lora import merged_state_dict

    model = module.get_base_model() if lora else module
    if lora:
        state = merged_state_dict(module, state)
    model.save_pretrained(directory, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(directory)
