"""Gradient checkpointing by layer: the first `layers` decoder layers of a transformers model recompute
their activations in backward, the others keep them (the trainer's `checkpointing.layers`, chosen from
memory.py's estimate).


Heavy imports (transformers) happen inside the functions.
"""

from __future__ import annotations

from typing import Any


def checkpointable_layers(model: Any) -> list[Any]:
    """The decoder layers of a transformers model that gradient checkpointing can wrap, in order: its
    `GradientCheckpointingLayer` modules (LlamaDecoderLayer, Qwen2DecoderLayer, ...; what transformers'
    own `every_n_layers` counts)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def set_gradient_checkpointing(model: Any, layers: int) -> None:
    """Gradient-checkpoint the first `layers` decoder layers of `model` (a transformers PreTrainedModel,
    before LoRA or DeepSpeed wrap it) and none of the others; 0 leaves checkpointing off.

    transformers' own switch turns it on everywhere (non-reentrant torch.utils.checkpoint, and inputs that
    require grad for frozen embeddings); then the layers past the first `layers` get their per-layer
    `gradient_checkpointing` flag back off, so they keep their activations. Why the first layers: backward
    reaches them last, when the uncheckpointed layers' activations are already freed, so the one layer
    being recomputed never adds to the step's peak (Megatron's "block" recompute makes the same choice).
    A model without `GradientCheckpointingLayer`s takes all or nothing (ValueError otherwise).
    """
    units = checkpointable_layers(model)
    if layers <= 0:
        if getattr(model, "is_gradient_checkpointing", False):
            model.gradient_checkpointing_disable()
        return
    if not units and layers < getattr(model.config.get_text_config(), "num_hidden_layers", layers):
        raise ValueError(f"{type(model).__name__} has no per-layer gradient checkpointing (transformers' "
                         f"GradientCheckpointingLayer): checkpoint all layers (true) or none (false)")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for unit in units[layers:]:
        unit.gradient_checkpointing = False
    model.config.use_cache = False
