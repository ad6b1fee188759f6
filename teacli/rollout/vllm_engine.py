"""The `vllm` rollout engine: one colocated `vllm.LLM` per training rank, fed the trainer's weights.

The only module that imports vllm. Each rank builds its own engine on its own device (tensor
parallel 1) from the trainer's model config and tokenizer, with placeholder ("dummy") weights;
the real weights always come from the trainer through `load_weights`, so the engine never
reads a checkpoint that could disagree with the policy being trained.

One training step, as the loop calls it (the order of `teacli.rollout.base`):

    wake()          wake the KV cache (weights are already awake: see load_weights)
    generate(...)   sample; right after a push, also check the push took (below)
    sleep()         while the trainer runs: KV cache freed, weights discarded (level 2, the default:
                    a push follows every update) or offloaded to CPU RAM (level 1)
    load_weights()  wake the weights only, push the new ones, reset the prefix cache

Memory (CUDA). vLLM 0.26 takes `gpu_memory_utilization` as its own share of the card's total and
refuses to start unless that much is free. The engine is built after the trainer's models and
optimizer, so it sizes that share from what the trainer leaves (`rollout.gpu_memory_utilization:
auto`), counting also what the trainer allocates only at its first step (`trainer_bytes`), and a
share or `rollout.kv_cache_gib` that cannot fit stops the run at start-up with the value that would.
Before each wake it checks that what sleep released is free again, so a trainer that grew is one
clear error naming the keys, not an out-of-memory inside vLLM.

Failures of peer systems this design avoids, and how:
  * Stale weights after a sync (TRL #5312): every push is followed, on the next generation, by a
    check that re-scores a few just-sampled tokens with the trainer and compares vLLM's log-probs
    within a dtype-aware tolerance (`rollout.verify_sync`); a mismatch stops the run. The prefix
    cache is reset after every push, so no KV computed with old weights is reused.
  * Buffers lost in sleep (OpenRLHF #723): vLLM 0.26 saves the model's buffers (rotary caches)
    to CPU at level 2 and restores them on wake; the weights it discards are all pushed again
    before the next generation (a wake without a push in between is refused), and the sync check
    compares the result with the trainer.
  * LoRA weights never reaching vLLM (OpenRLHF #1349): adapters are merged into the pushed base
    weights (`teacli.lora.merged_named_tensors`); PEFT names never reach vLLM.
  * OOM on wake-up (verl #2186): torch's cached blocks are returned to the driver before
    waking, and the weights wake before the KV cache, with the push in between.
  * Tied embeddings: `lm_head.weight` is pushed as well when the config ties it to the input
    embedding, since some vLLM builds hold a separate (repacked) copy of it.

Sampling is the `hf` engine's contract: temperature, then top-k (0 = off), then top-p, stop at the
tokenizer's EOS (and `rollout.stop_tokens`), nothing else; the model's generation_config is not read (`generation_config=
"vllm"`). Each prompt's request gets its own seed (derived from the call's seed and the prompt's
index; vLLM gives sample j of a request seed + j), so a call is reproducible given its inputs
and seed, across processes too (a resumed run samples what the uninterrupted one did: a GPU test
checks it). Requests without a seed would not be: vLLM 0.26's GPU model runner (V2) then draws one
from NumPy's global generator, which nothing seeds. Seeded requests cost nothing extra there (its
Gumbel sampler takes a seed per request). vLLM's batched kernels can still make logits depend on
batch composition on GPU.

Where sleep mode is unavailable (vLLM's CPU build) the engine runs without it and says so once.
On CPU, vLLM rebinds OpenMP threads in the calling process and replaces `torch.set_num_threads`
with a no-op; the original function is put back after the engine is built.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from teacli.logprobs import base_model
from teacli.memory import kv_bytes_per_token, memory_plan
from teacli.rollout.base import RolloutSyncError, cut_at_eos, stop_token_ids
from teacli.types import Completion, SamplingConfig

if TYPE_CHECKING:
    import torch

    from teacli.config import PolicyConfig, RolloutConfig

log = logging.getLogger(__name__)

# Tolerance on the mean |Δ log p| between vLLM and the trainer over the checked tokens, by the
# coarser of the two dtypes. fp32 agreement is ~1e-5 (kernels differ, the math does not). bf16 on an
# H100 (vLLM 0.26, docs/vllm.md): per-step means of 0.035-0.056 for SmolLM2-135M, 0.020-0.023 for a
# Llama-3.2-1B shape; 0.1 is 1.8x the largest. A missing push moves the log-probs of sampled tokens
# by far more than that after a real optimizer step (not after one tiny one, which bf16 rounds away).
SYNC_TOLERANCE = {"float32": 1e-3, "float16": 0.05, "bfloat16": 0.1}
_SYNC_CHECK_SEQUENCES = 4  # completions re-scored by the trainer after each push
_SYNC_CHECK_TOKENS = 32  # first tokens of each of them
VLLM_TEMPERATURES = (0.01, 2.0)  # vLLM clamps below and refuses above (vllm/sampling_params.py)
_CPU_KV_CACHE_GIB = 1  # default KV cache on CPU, unless VLLM_CPU_KVCACHE_SPACE says otherwise
# The vllm.LLM arguments tea sets that rollout.vllm_kwargs may replace (every other one it sets is in
# teacli.config.VLLM_RESERVED_KWARGS): the log-stats switch, and on CPU the whole-prompt scheduling below.
TEA_DEFAULT_KWARGS = ("disable_log_stats", "enable_chunked_prefill", "max_num_batched_tokens")
_GiB = 2**30


def collective_picks(picks: list[tuple[Any, Any]], prompt_token_ids: list[list[int]], forwards: int) -> list[tuple[Any, Any, bool]]:
    """The sync check's (prompt, completion, counted) forwards: every pick once, counted; with `forwards` > 0
    (ZeRO-3, where each forward gathers layers from every rank), exactly that many, the picks repeated (not
    counted again) or, where there are none, the first prompt alone (completion None) to fill up."""
    out = [(p, c, True) for p, c in picks]
    if forwards <= 0:
        return out
    fill = [(p, c, False) for p, c in picks] or [(prompt_token_ids[0] if prompt_token_ids else [0], None, False)]
    while len(out) < forwards:
        out.append(fill[(len(out) - len(picks)) % len(fill)])
    return out[:forwards]


class VLLMEngine:
    """A `vllm.LLM` on this rank's device, generating with the trainer's pushed weights.

    model: the trainer's module (HF causal LM, possibly peft-wrapped; `engine.module` under
    DeepSpeed) — its config builds the engine and it re-scores tokens for the sync check.
    Options (from `build_engine`): `policy` (PolicyConfig: dtype, trust_remote_code), `seed` (the
    engine's seed; give each rank its own), `max_model_len` (prompt + completion tokens), `dtype`
    (overrides policy.dtype), `trainer_bytes` (what the trainer will hold between steps, for the memory
    plan: `backend.model_state_bytes`), `sampler_logprobs` (every completion carries its sampled tokens'
    log-probs, what `rollout.is_correction` needs; False: only the completions the sync check re-scores
    do, which spares vLLM's per-token log-prob bookkeeping in this process: docs/vllm.md),
    `max_sequences` (the most sequences one `generate` call asks for, for `rollout.kv_cache_gib: auto`).
    `cfg.vllm_kwargs` (rollout.vllm_kwargs) go to `vllm.LLM` after tea's own arguments: keys tea sets
    itself are refused (`teacli.config.VLLM_RESERVED_KWARGS`), except the defaults in
    `TEA_DEFAULT_KWARGS`, which they may replace; keys this vLLM lacks are refused.
    """

    shares_weights = False  # its own copy of the weights (pushed by load_weights): ZeRO-3 gathers nothing to generate

    def __init__(
        self,
        cfg: "RolloutConfig",
        model: Any,
        tokenizer: Any,
        *,
        policy: "PolicyConfig | None" = None,
        seed: int = 0,
        max_model_len: int | None = None,
        dtype: "str | torch.dtype | None" = None,
        trainer_bytes: int | None = None,
        sampler_logprobs: bool = True,
        max_sequences: int | None = None,
    ) -> None:
        from teacli.config import check_vllm_kwargs
        from teacli.models import resolve_dtype

        check_vllm_kwargs(cfg.vllm_kwargs)  # a recipe was checked on load; a RolloutConfig built in code is here

        self.cfg = cfg
        self.sampler_logprobs = sampler_logprobs
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = stop_token_ids(tokenizer, cfg.stop_tokens)  # EOS + rollout.stop_tokens
        base = base_model(model)
        self.device = next(base.parameters()).device
        self.dtype = resolve_dtype(dtype if dtype is not None else (policy.dtype if policy else "auto"), self.device)
        self.tie_word_embeddings = bool(getattr(base.config, "tie_word_embeddings", False))
        # vLLM's copy of the weights (ZeRO-3 shards count whole: ds_numel), for the memory plan and wake checks
        self._weights_bytes = sum(getattr(p, "ds_numel", p.numel()) for p in base.parameters()) * self.dtype.itemsize
        self._sleep_freed = 0

        import vllm
        from vllm.platforms import current_platform

        _check_vllm_arguments(cfg.vllm_kwargs, vllm)

        self.sleep_enabled = cfg.sleep and current_platform.is_sleep_mode_available()
        if cfg.sleep and not self.sleep_enabled:
            log.warning(
                "rollout.sleep: vLLM sleep mode is not supported on this platform (%s); the engine keeps its "
                "weights and KV cache while the trainer runs", current_platform.device_type or "unknown",
            )
        kwargs: dict[str, Any] = dict(
            dtype=str(self.dtype).removeprefix("torch."),
            seed=seed,
            tensor_parallel_size=1,
            load_format="dummy",  # the real weights are always pushed by the trainer
            generation_config="vllm",  # never the checkpoint's sampling defaults (see hf.py)
            logprobs_mode="raw_logprobs",  # the policy's log-probs before temperature/top-k/top-p
            enable_sleep_mode=self.sleep_enabled,
            enable_prefix_caching=True,
            trust_remote_code=bool(policy and policy.trust_remote_code),
            disable_log_stats=True,
        )
        if max_model_len is not None:  # the recipe's prompt + completion budget, within the model's context
            kwargs["max_model_len"] = min(max_model_len, getattr(base.config, "max_position_embeddings", None) or max_model_len)
        self.memory: dict[str, float] = {}  # the plan (GiB), then what sleep and wake measured
        if self.device.type == "cuda":
            kv_needed = None
            per_token = kv_bytes_per_token(base.config, self.dtype)
            if max_sequences and kwargs.get("max_model_len") and per_token:
                kv_needed = (max_sequences, kwargs["max_model_len"], per_token)
            kwargs.update(self._cuda_memory_plan(cfg, trainer_bytes, kv_needed))
            if cfg.compile is False:  # rollout.compile: auto and true keep vLLM's compile and CUDA graphs
                kwargs["enforce_eager"] = True
        else:
            # On CPU gpu_memory_utilization reserves that fraction of RAM; a fixed KV cache is saner beside a trainer.
            kwargs["enforce_eager"] = True  # no torch.compile warm-up (minutes on a few cores)
            # vLLM 0.32's CPU runner crashes when a seeded request's prefill is split over steps
            # ("CPU Generator does not use offset"): schedule whole prompts only.
            context = kwargs.get("max_model_len") or getattr(base.config, "max_position_embeddings", None) or 0
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(4096, context)
            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                kwargs["kv_cache_memory_bytes"] = _CPU_KV_CACHE_GIB * 2**30
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # One engine per trainer rank inside the trainer's process group (vLLM's documented
            # setup for colocated RL); it reads RANK/LOCAL_RANK as set by the launcher.
            kwargs["distributed_executor_backend"] = "external_launcher"
        replaced = {k: kwargs[k] for k in cfg.vllm_kwargs if k in kwargs}  # TEA_DEFAULT_KWARGS only: the rest are refused
        kwargs.update(cfg.vllm_kwargs)
        if cfg.vllm_kwargs:
            shown = ", ".join(f"{k}={v!r}" for k, v in cfg.vllm_kwargs.items())
            instead = f" (instead of tea's {', '.join(f'{k}={v!r}' for k, v in replaced.items())})" if replaced else ""
            print(f"tea: vllm engine on {self.device}: rollout.vllm_kwargs {shown}{instead}", file=sys.stderr, flush=True)
        # In-process engine core: weights are pushed as Python iterators of tensors, never pickled.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

        self._owns_process_group = not (dist.is_available() and dist.is_initialized())  # vLLM will create it
        self._tmp = tempfile.TemporaryDirectory(prefix="tea-vllm-")
        _write_model_dir(base, tokenizer, self.dtype, self._tmp.name)
        with _preserved_process_state(), _memory_errors_name_the_keys():
            self.llm = vllm.LLM(model=self._tmp.name, tokenizer=self._tmp.name, **kwargs)
        self._asleep = False  # both weights and KV cache released
        self._weights_awake = True
        self._synced = False
        self._verify_pending = False
        self._last_check: dict[str, float] = {}
        params = [p for _, p in model.named_parameters()]
        if not any(hasattr(p, "ds_numel") for p in params):  # whole weights here (not ZeRO-3 shards): push them now
            self.load_weights(model.named_parameters())

    # -- protocol ---------------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingConfig, seed: int
    ) -> list[list[Completion]]:
        """prompt_token_ids[P] → completions[P][n] (prompt-major), each with its sampled tokens' log-probs.

        No prompts (a rank whose share of a validation is empty) generate nothing, but a pending sync check still
        runs its forwards: under ZeRO-3 the other ranks' checks gather layers from this one (`collective_picks`)."""
        if not prompt_token_ids:
            if self._verify_pending and self.cfg.verify_sync:
                self._last_check = self.check_sync([], []) or self._last_check
            self._verify_pending = False
            return []
        from vllm import SamplingParams

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not VLLM_TEMPERATURES[0] <= sampling.temperature <= VLLM_TEMPERATURES[1]:
            # vLLM raises temperatures below 0.01 to 0.01 and refuses those above 2: say so rather than sample otherwise.
            raise ValueError(
                f"rollout.temperature: the vllm engine samples at temperatures in [{VLLM_TEMPERATURES[0]}, "
                f"{VLLM_TEMPERATURES[1]}] (vLLM's limits), got {sampling.temperature}; use rollout.engine: hf for others"
            )
        if any(len(p) == 0 for p in prompt_token_ids):
            raise ValueError("an empty prompt (no tokens) cannot be generated from")
        if not self._synced:
            raise RuntimeError("the vllm engine holds no trainer weights yet: call load_weights(...) before generate")
        limit = self.llm.llm_engine.model_config.max_model_len
        longest = max((len(p) for p in prompt_token_ids), default=0)
        if longest + sampling.max_new_tokens > limit:
            raise ValueError(
                f"a prompt of {longest} tokens + rollout.max_new_tokens={sampling.max_new_tokens} exceeds the vllm engine's "
                f"max_model_len={limit}; lower data.max_prompt_tokens or rollout.max_new_tokens"
            )
        self.wake()
        # Flat log-probs (vLLM >= 0.12): a few lists per request instead of a dict and a Logprob object per
        # token, built in this process's output loop at every decode step (the engine core runs in-process).
        flat = {"flat_logprobs": True} if "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ()) else {}
        # With sampler_logprobs off, only the prompts the sync check reads ask for log-probs, and only for
        # their first sample: (n = 1, seed s) + (n - 1, seed s + 1) draws exactly what (n, seed s) draws,
        # since vLLM seeds a request's sample j with seed + j.
        checked = _SYNC_CHECK_SEQUENCES if self._verify_pending and self.cfg.verify_sync else 0

        def request(i: int, count: int, first: int, logprobs: bool) -> tuple[int, Any]:
            return i, SamplingParams(
                n=count,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,  # -1 = off in every vLLM version
                min_p=0.0,
                repetition_penalty=1.0,
                max_tokens=sampling.max_new_tokens,
                min_tokens=0,
                stop_token_ids=list(self.eos_token_ids),
                seed=_prompt_seed(seed, i) + first,
                logprobs=0 if logprobs else None,  # the sampled token's log-prob only
                detokenize=False,  # we decode exactly as the hf engine does
                **flat,
            )

        requests: list[tuple[int, Any]] = []
        for i in range(len(prompt_token_ids)):
            if self.sampler_logprobs:
                requests.append(request(i, n, 0, True))
            elif i < checked:
                requests.append(request(i, 1, 0, True))
                if n > 1:
                    requests.append(request(i, n - 1, 1, False))
            else:
                requests.append(request(i, n, 0, False))
        prompts = [{"prompt_token_ids": list(prompt_token_ids[i])} for i, _ in requests]
        with _preserved_rng():
            outputs = self.llm.generate(prompts, [p for _, p in requests], use_tqdm=False)
        groups: list[list[Completion]] = [[] for _ in prompt_token_ids]
        for (i, _), out in zip(requests, outputs):
            groups[i].extend(self._completion(o) for o in out.outputs)
        if any(len(g) != n for g in groups):
            raise RuntimeError(f"vLLM returned {[len(g) for g in groups]} completions per prompt, expected {n}")
        if self._verify_pending and self.cfg.verify_sync:
            self._last_check = self.check_sync(prompt_token_ids, groups)
        self._verify_pending = False
        return groups

    def load_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        """Push the trainer's weights (HF/PEFT parameter names; LoRA merged here), then reset the prefix cache.

        While asleep, only the weights wake for the push; the KV cache wakes in `wake()`.
        """
        if self._asleep and not self._weights_awake:
            self._wake_up("weights")
        self._push(self.vllm_weights(named_tensors))
        if not self.llm.reset_prefix_cache():  # KV computed with the old weights must never be reused
            raise RuntimeError("vLLM could not reset its prefix cache after the weight push (requests still running?)")
        self._synced = True
        self._verify_pending = True

    def sleep(self) -> None:
        """Free the KV cache and the weights (level 2: discarded; level 1: to CPU RAM) until `wake`.

        A no-op where sleep mode is unavailable. After a level-2 sleep the engine holds no weights:
        the next generation needs a push first (`load_weights`), which the training loop always makes.
        """
        if not self.sleep_enabled or self._asleep:
            return
        import torch

        level = self.cfg.sleep_level
        t0 = time.perf_counter()
        _release_cached_memory(self.device)
        free_before = _free_bytes(self.device)
        self.llm.sleep(level=level)
        torch.cuda.synchronize(self.device)
        self._sleep_freed = max(0, _free_bytes(self.device) - free_before)
        self.memory.update(vllm_sleep_s=time.perf_counter() - t0, vllm_sleep_freed_gib=self._sleep_freed / _GiB)
        self._asleep, self._weights_awake = True, False
        if level == 2:
            self._synced = False  # the weights are gone: generating before a push is refused

    def wake(self) -> None:
        """Weights (unless a push already woke them), then the KV cache."""
        if not self._asleep:
            return
        if not self._weights_awake:
            if self.cfg.sleep_level == 2:
                raise RuntimeError("the vllm engine slept at level 2 and holds no weights: push them (load_weights) before waking it")
            self._wake_up("weights")
        self._wake_up("kv_cache")
        self.llm.reset_prefix_cache()  # the KV blocks were discarded
        self._asleep = False

    def _wake_up(self, tag: str) -> None:
        """Wake the weights or the KV cache, after checking that the memory they need is free again."""
        import torch

        t0 = time.perf_counter()
        _release_cached_memory(self.device)
        # What the last sleep released: the weights' bytes, and the rest is the KV cache (and its graphs).
        need = self._weights_bytes if tag == "weights" else max(0, self._sleep_freed - self._weights_bytes)
        free = _free_bytes(self.device)
        if free < need:
            raise ValueError(
                f"rollout.gpu_memory_utilization: the vllm engine needs {need / _GiB:.1f} GiB to wake its "
                f"{tag.replace('_', ' ')} but only {free / _GiB:.1f} GiB is free: the trainer holds more memory than when the "
                "engine was built. Lower rollout.gpu_memory_utilization or rollout.kv_cache_gib, then resume"
            )
        self.llm.wake_up(tags=[tag])
        torch.cuda.synchronize(self.device)
        self.memory[f"vllm_wake_{tag}_s"] = time.perf_counter() - t0
        if tag == "weights":
            self._weights_awake = True
            self.memory["gpu_free_gib_before_wake"] = free / _GiB

    def _cuda_memory_plan(self, cfg: "RolloutConfig", trainer_bytes: int | None,
                          kv_needed: "tuple[int, int, int] | None") -> dict[str, Any]:
        """`vllm.LLM`'s memory arguments from what the trainer leaves on this rank's GPU (`teacli.memory.memory_plan`)."""
        import torch

        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        kwargs, how = memory_plan(
            cfg.gpu_memory_utilization, cfg.kv_cache_gib, self.sleep_enabled, free=free, total=total,
            allocated=torch.cuda.memory_allocated(self.device), trainer_bytes=trainer_bytes or 0, weights_bytes=self._weights_bytes,
            kv_needed=kv_needed,
        )
        print(f"tea: vllm engine on {self.device}: {how}", file=sys.stderr, flush=True)
        self.memory["vllm_share_gib"] = kwargs["gpu_memory_utilization"] * total / _GiB
        if self.sleep_enabled:  # every metrics line gets the same keys
            self.memory.update(dict.fromkeys(
                ["vllm_sleep_s", "vllm_sleep_freed_gib", "vllm_wake_weights_s", "vllm_wake_kv_cache_s", "gpu_free_gib_before_wake"], 0.0
            ))
        return kwargs

    def stats(self) -> dict[str, float]:
        """For metrics.jsonl: the latest sync check (see `check_sync`; empty before the first or when off),
        and on CUDA the memory plan and the last sleep and wake (seconds, GiB freed, GiB free before waking)."""
        return {**self._last_check, **self.memory}

    # -- the sync check ---------------------------------------------------------------------------

    def check_sync(self, prompt_token_ids: list[list[int]], groups: list[list[Completion]]) -> dict[str, float]:
        """Re-score a few just-sampled tokens with the trainer's module; raise if vLLM disagrees.

        Takes the first completion of up to 4 prompts, their first 32 tokens, and compares the
        trainer's log-probs with the ones vLLM sampled them with. Returns the agreement
        ({"sync_logprob_mean_abs_diff", "sync_logprob_max_abs_diff", "sync_tokens_checked"}).
        Under ZeRO-3 the trainer's module gathers each layer from every rank as it runs, so every rank runs
        exactly 4 forwards (`collective_picks`), whatever number of prompts it generated for.
        """
        import torch

        from teacli.logprobs import token_logprobs

        diffs: list[torch.Tensor] = []
        # the first sample of each of the first prompts: the ones `generate` asked log-probs for in any case
        picks = [(p, g[0]) for p, g in zip(prompt_token_ids[:_SYNC_CHECK_SEQUENCES], groups) if g and g[0].token_ids]
        module = self.model
        partitioned = any(hasattr(p, "ds_numel") for p in module.parameters())  # ZeRO-3: forwards are collective
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                for prompt, completion, counted in collective_picks(picks, prompt_token_ids, _SYNC_CHECK_SEQUENCES if partitioned else 0):
                    if completion is None:  # a forward only to take part in the ranks' gathers
                        module(input_ids=torch.tensor([list(prompt)], device=self.device))
                        continue
                    if completion.logprobs is None:
                        raise RuntimeError("vLLM returned no log-probs for the sampled tokens (SamplingParams.logprobs=0)")
                    tokens = completion.token_ids[:_SYNC_CHECK_TOKENS]
                    ids = torch.tensor([list(prompt) + tokens], device=self.device)
                    trainer = token_logprobs(module, ids, torch.ones_like(ids), len(prompt))[0].float().cpu()
                    if not counted:
                        continue
                    sampler = torch.tensor(completion.logprobs[: len(tokens)], dtype=torch.float32)
                    diffs.append((trainer - sampler).abs())
        finally:
            module.train(was_training)
        if not diffs:
            return {}
        d = torch.cat(diffs)
        mean, worst = float(d.mean()), float(d.max())
        coarse = self._coarser_dtype()
        tol = SYNC_TOLERANCE[coarse]
        if not math.isfinite(mean) or mean > tol:
            raise RolloutSyncError(
                f"rollout.verify_sync: after the weight push, vLLM's log-probs disagree with the trainer's "
                f"(mean |Δ log p| = {mean:.3g}, max {worst:.3g} over {d.numel()} sampled tokens; tolerance {tol:g} "
                f"for {coarse}). vLLM is generating with stale or wrong weights, so the rollouts would be off-policy. "
                "Check that the pushed names match the model, or set rollout.verify_sync: false to skip this check."
            )
        return {"sync_logprob_mean_abs_diff": mean, "sync_logprob_max_abs_diff": worst, "sync_tokens_checked": float(d.numel())}

    def _coarser_dtype(self) -> str:
        import torch

        trainer = next(self.model.parameters()).dtype
        order = [torch.float32, torch.float16, torch.bfloat16]  # tolerance grows along this list
        return str(order[max(order.index(self.dtype), order.index(trainer))]).removeprefix("torch.")

    # -- weights ----------------------------------------------------------------------------------

    def vllm_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> Iterator[tuple[str, "torch.Tensor"]]:
        """The trainer's named tensors as the checkpoint names vLLM loads: LoRA merged, PEFT names
        stripped, and `lm_head.weight` added for tied embeddings."""
        named = iter(named_tensors)
        if _is_peft(self.model):
            from teacli.lora import merged_named_tensors

            named = merged_named_tensors(_unwrap(self.model), named)
        embedding, has_head = None, False
        for name, tensor in named:
            has_head = has_head or name == "lm_head.weight"
            if name.endswith("embed_tokens.weight"):
                embedding = tensor
            yield name, tensor
        if self.tie_word_embeddings and not has_head and embedding is not None:
            yield "lm_head.weight", embedding

    def _push(self, weights: Iterator[tuple[str, "torch.Tensor"]]) -> None:
        # reload_weights runs the model's own load_weights (fusing q/k/v, gate/up, ...) and then
        # re-runs its post-load processing (e.g. oneDNN weight packing on CPU), which a bare
        # `model.load_weights` would skip.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})

    # -- helpers ----------------------------------------------------------------------------------

    def _completion(self, out: Any) -> Completion:
        generated = list(out.token_ids)
        ids, finished = cut_at_eos(generated, self.eos_token_ids)
        logprobs = None if out.logprobs is None else sampled_logprobs(out.logprobs, ids)
        return Completion(
            token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True), finished=finished, logprobs=logprobs
        )

    def close(self) -> None:
        """Shut the engine down and free its memory, so that another can be built in this process.

        vLLM keeps its parallel groups in process globals: one engine per process at a time. The
        torch.distributed group is destroyed only if vLLM created it (never the trainer's).
        """
        import gc

        llm = getattr(self, "llm", None)
        if llm is not None:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()
            self.llm = None
            del llm
            destroy_model_parallel()
            if self._owns_process_group:
                destroy_distributed_environment()
            gc.collect()
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()
            self._tmp = None


# ------------------------------------------------------------------------------------------------


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)  # DeepSpeedEngine → module


def _is_peft(model: Any) -> bool:
    return hasattr(_unwrap(model), "get_base_model")


def _write_model_dir(base: Any, tokenizer: Any, dtype: "torch.dtype", path: str) -> None:
    """config.json (no weights) and the tokenizer: all vLLM needs to build the architecture."""
    config = copy.deepcopy(base.config)
    config.architectures = [type(base).__name__]
    config.dtype = dtype
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(path)
    tokenizer.save_pretrained(path)


def _check_vllm_arguments(kwargs: dict[str, Any], vllm: Any) -> None:
    """A ValueError naming the first key of rollout.vllm_kwargs that this vLLM's `vllm.LLM` does not take: neither
    a field of `vllm.EngineArgs` nor a named parameter of `vllm.LLM` (e.g. older vLLMs' cuda_graph_sizes, which
    vLLM 0.32 no longer has: cudagraph_capture_sizes). Checked before the engine is built: vLLM would say less."""
    import dataclasses
    import difflib
    import inspect

    named = inspect.signature(vllm.LLM.__init__).parameters.values()
    known = {f.name for f in dataclasses.fields(vllm.EngineArgs)} | {
        p.name for p in named if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    }
    for key in kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean rollout.vllm_kwargs.{close[0]}?" if close else ""
            raise ValueError(f"rollout.vllm_kwargs.{key}: vLLM {vllm.__version__} has no engine argument {key!r} "
                             f"(not a field of vllm.EngineArgs){hint}")


def _prompt_seed(seed: int, index: int) -> int:
    """A 48-bit seed per (call seed, prompt index); vLLM seeds the prompt's sample j with seed + j."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def sampled_logprobs(logprobs: Any, ids: list[int]) -> list[float]:
    """The sampled tokens' log-probs from vLLM's per-position log-probs (SamplingParams.logprobs=0): a
    FlatLogprobs (flat lists, `start_indices` per position) or the classic list of {token id: Logprob}."""
    if hasattr(logprobs, "start_indices"):
        out = []
        for t, tok in enumerate(ids):
            lo, hi = logprobs.start_indices[t], logprobs.end_indices[t]
            at = logprobs.token_ids.index(tok, lo, hi)  # the sampled token's entry (the only one with logprobs=0)
            out.append(float(logprobs.logprobs[at]))
        return out
    return [float(logprobs[t][tok].logprob) for t, tok in enumerate(ids)]


def _free_bytes(device: "torch.device") -> int:
    import torch

    return torch.cuda.mem_get_info(device)[0]


@contextlib.contextmanager
def _memory_errors_name_the_keys() -> Iterator[None]:
    """vLLM's start-up memory errors (KV cache too small for one sequence, no memory for its blocks, or an
    out-of-memory while profiling) as one ValueError naming the recipe keys that change them."""
    import torch

    keys = (
        "raise rollout.gpu_memory_utilization or rollout.kv_cache_gib, or lower data.max_prompt_tokens + "
        "rollout.max_new_tokens (the engine's max_model_len)"
    )
    try:
        yield
    except torch.OutOfMemoryError as exc:
        raise ValueError(f"rollout.gpu_memory_utilization: out of GPU memory while building the vllm engine ({str(exc).splitlines()[0][:200]}); lower it or rollout.kv_cache_gib, or free memory for it") from None
    except ValueError as exc:
        text = str(exc)
        if "KV cache" in text or "cache blocks" in text or "memory" in text.lower():
            raise ValueError(f"rollout.gpu_memory_utilization / rollout.kv_cache_gib: vLLM does not fit its memory share: {text.splitlines()[0][:400]} ({keys})") from None
        raise


def _release_cached_memory(device: "torch.device") -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.empty_cache()


@contextlib.contextmanager
def _preserved_rng() -> Iterator[None]:
    """Leave the caller's torch (CPU), Python and NumPy RNG states as they were."""
    import numpy as np
    import torch

    states = torch.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])


@contextlib.contextmanager
def _preserved_process_state() -> Iterator[None]:
    """Building an in-process vLLM engine reseeds the global RNGs and, on CPU, replaces
    `torch.set_num_threads` with a no-op; undo both for the trainer sharing the process."""
    import torch

    set_num_threads = torch.set_num_threads
    try:
        with _preserved_rng():
            yield
    finally:
        torch.set_num_threads = set_num_threads
