"""The `vllm` rollout engine: one colocated `vllm.LLM` per training rank, fed the trainer's weights.

The only module that imports vllm. Each rank builds its own engine on its own device (tensor
parallel 1) from the trainer's model config and tokenizer, with placeholder ("dummy") weights;
the real weights always come from the trainer through `load_weights`, so the engine never
reads a checkpoint that could disagree with the policy being trained.

One training step, as the loop calls it (the order of `teacli.rollout.base`):

    wake()          wake the KV cache (weights are already awake: see load_weights)
    generate(...)   sample; right after a push, also check the push took (below)
    sleep()         level 1: weights offloaded to CPU RAM, KV cache freed, while the trainer runs
    load_weights()  wake the weights only, push the new ones, reset the prefix cache

Failures of peer systems this design avoids, and how:
  * Stale weights after a sync (TRL #5312): every push is followed, on the next generation, by a
    check that re-scores a few just-sampled tokens with the trainer and compares vLLM's log-probs
    within a dtype-aware tolerance (`rollout.verify_sync`); a mismatch stops the run. The prefix
    cache is reset after every push, so no KV computed with old weights is reused.
  * Buffers lost in sleep (OpenRLHF #723): only level 1 is used, which keeps everything vLLM
    allocated (rotary caches included) in CPU RAM; level 2 would discard it.
  * LoRA weights never reaching vLLM (OpenRLHF #1349): adapters are merged into the pushed base
    weights (`teacli.lora.merged_named_tensors`); PEFT names never reach vLLM.
  * OOM on wake-up (verl #2186): torch's cached blocks are returned to the driver before
    waking, and the weights wake before the KV cache, with the push in between.
  * Tied embeddings: `lm_head.weight` is pushed as well when the config ties it to the input
    embedding, since some vLLM builds hold a separate (repacked) copy of it.

Sampling is the `hf` engine's contract: temperature, then top-k (0 = off), then top-p, stop at the
tokenizer's EOS, nothing else; the model's generation_config is not read (`generation_config=
"vllm"`). Each prompt's request gets its own seed (derived from the call's seed and the prompt's
index; vLLM gives sample j of a request seed + j), so a call is reproducible given its inputs
and seed. vLLM's batched kernels can still make logits depend on batch composition on GPU.

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
import tempfile
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from teacli.logprobs import base_model
from teacli.rollout.base import RolloutSyncError, cut_at_eos
from teacli.types import Completion, SamplingConfig

if TYPE_CHECKING:
    import torch

    from teacli.config import PolicyConfig, RolloutConfig

log = logging.getLogger(__name__)

# Tolerance on the mean |Δ log p| between vLLM and the trainer over the checked tokens, by the
# coarser of the two dtypes. fp32 agreement is ~1e-5 (kernels differ, the math does not); bf16
# rounding of weights and activations gives ~1e-2 on real models. A stale or missing push moves
# the log-probs of sampled tokens by far more than these after any real optimizer step.
SYNC_TOLERANCE = {"float32": 1e-3, "float16": 0.05, "bfloat16": 0.1}
_SYNC_CHECK_SEQUENCES = 4  # completions re-scored by the trainer after each push
_SYNC_CHECK_TOKENS = 32  # first tokens of each of them
VLLM_TEMPERATURES = (0.01, 2.0)  # vLLM clamps below and refuses above (vllm/sampling_params.py)
_CPU_KV_CACHE_GIB = 1  # default KV cache on CPU, unless VLLM_CPU_KVCACHE_SPACE says otherwise


class VLLMEngine:
    """A `vllm.LLM` on this rank's device, generating with the trainer's pushed weights.

    model: the trainer's module (HF causal LM, possibly peft-wrapped; `engine.module` under
    DeepSpeed) — its config builds the engine and it re-scores tokens for the sync check.
    Options (from `build_engine`): `policy` (PolicyConfig: dtype, trust_remote_code), `seed`
    (the engine's seed; give each rank its own), `max_model_len` (prompt + completion tokens),
    `dtype` (overrides policy.dtype), `llm_kwargs` (extra `vllm.LLM` arguments).
    """

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
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        from teacli.models import resolve_dtype

        self.cfg = cfg
        self.model = model
        self.tokenizer = tokenizer
        if tokenizer.eos_token_id is None:
            raise ValueError("the policy tokenizer has no eos token: generation could never stop (set one in the tokenizer)")
        self.eos_token_ids = [tokenizer.eos_token_id]
        base = base_model(model)
        self.device = next(base.parameters()).device
        self.dtype = resolve_dtype(dtype if dtype is not None else (policy.dtype if policy else "auto"), self.device)
        self.tie_word_embeddings = bool(getattr(base.config, "tie_word_embeddings", False))

        import vllm
        from vllm.platforms import current_platform

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
        if self.device.type == "cuda":
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
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
        kwargs.update(llm_kwargs or {})
        # In-process engine core: weights are pushed as Python iterators of tensors, never pickled.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

        self._owns_process_group = not (dist.is_available() and dist.is_initialized())  # vLLM will create it
        self._tmp = tempfile.TemporaryDirectory(prefix="tea-vllm-")
        _write_model_dir(base, tokenizer, self.dtype, self._tmp.name)
        with _preserved_process_state():
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
        """prompt_token_ids[P] → completions[P][n] (prompt-major), each with its sampled tokens' log-probs."""
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
        params = [
            SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k > 0 else -1,  # -1 = off in every vLLM version
                min_p=0.0,
                repetition_penalty=1.0,
                max_tokens=sampling.max_new_tokens,
                min_tokens=0,
                stop_token_ids=list(self.eos_token_ids),
                seed=_prompt_seed(seed, i),
                logprobs=0,  # the sampled token's log-prob only
                detokenize=False,  # we decode exactly as the hf engine does
            )
            for i in range(len(prompt_token_ids))
        ]
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids]
        with _preserved_rng():
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        groups = [[self._completion(o) for o in out.outputs] for out in outputs]
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
            _release_cached_memory(self.device)
            self.llm.wake_up(tags=["weights"])
            self._weights_awake = True
        self._push(self.vllm_weights(named_tensors))
        if not self.llm.reset_prefix_cache():  # KV computed with the old weights must never be reused
            raise RuntimeError("vLLM could not reset its prefix cache after the weight push (requests still running?)")
        self._synced = True
        self._verify_pending = True

    def sleep(self) -> None:
        """Level 1: weights to CPU RAM, KV cache freed (no-op where sleep mode is unavailable)."""
        if not self.sleep_enabled or self._asleep:
            return
        self.llm.sleep(level=1)
        self._asleep, self._weights_awake = True, False
        _release_cached_memory(self.device)

    def wake(self) -> None:
        """Weights (unless a push already woke them), then the KV cache."""
        if not self._asleep:
            return
        _release_cached_memory(self.device)
        if not self._weights_awake:
            self.llm.wake_up(tags=["weights"])
        self.llm.wake_up(tags=["kv_cache"])
        self.llm.reset_prefix_cache()  # the KV blocks were discarded
        self._asleep, self._weights_awake = False, True

    def stats(self) -> dict[str, float]:
        """The latest sync check (see `check_sync`), for metrics.jsonl; empty before the first or when off."""
        return dict(self._last_check)

    # -- the sync check ---------------------------------------------------------------------------

    def check_sync(self, prompt_token_ids: list[list[int]], groups: list[list[Completion]]) -> dict[str, float]:
        """Re-score a few just-sampled tokens with the trainer's module; raise if vLLM disagrees.

        Takes the first completion of up to 4 prompts, their first 32 tokens, and compares the
        trainer's log-probs with the ones vLLM sampled them with. Returns the agreement
        ({"sync_logprob_mean_abs_diff", "sync_logprob_max_abs_diff", "sync_tokens_checked"}).
        """
        import torch

        from teacli.logprobs import token_logprobs

        diffs: list[torch.Tensor] = []
        picks = [(p, g[0]) for p, g in zip(prompt_token_ids, groups) if g and g[0].token_ids][:_SYNC_CHECK_SEQUENCES]
        module = self.model
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                for prompt, completion in picks:
                    if completion.logprobs is None:
                        raise RuntimeError("vLLM returned no log-probs for the sampled tokens (SamplingParams.logprobs=0)")
                    tokens = completion.token_ids[:_SYNC_CHECK_TOKENS]
                    ids = torch.tensor([list(prompt) + tokens], device=self.device)
                    trainer = token_logprobs(module, ids, torch.ones_like(ids), len(prompt))[0].float().cpu()
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
        logprobs = [float(out.logprobs[t][tok].logprob) for t, tok in enumerate(ids)] if out.logprobs is not None else None
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


def _prompt_seed(seed: int, index: int) -> int:
    """A 48-bit seed per (call seed, prompt index); vLLM seeds the prompt's sample j with seed + j."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=6).digest()
    return int.from_bytes(digest, "big")


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
