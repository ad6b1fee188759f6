"""The rollout protocol: what the training loop and `eval-bon` ask of a generation engine.

An engine turns tokenized prompts into sampled completions with exactly the recipe's sampling
parameters (`SamplingConfig`): the policy's distribution reshaped by temperature, top-p and top-k,
and nothing else, so that switching engines changes speed, not the samples' distribution.

Two engines plug in behind `RolloutEngine`:
  * `hf` (teacli/rollout/hf.py): transformers `generate` on the trainer's own module (CPU or GPU).
    It shares the weights, so `load_weights` is a no-op, and it has no memory to release.
  * `vllm` (teacli/rollout/vllm_engine.py): a colocated `vllm.LLM` whose weights the trainer
    pushes before the first step and after each update (`load_weights`), which sleeps (level 1:
    weights offloaded, KV cache freed) while the trainer runs and wakes to generate, and which
    checks after each push that its log-probs agree with the trainer's.
    `teacli.rollout.factory.build_engine` constructs it as `VLLMEngine(cfg, model, tokenizer, **options)`;
    it is the only module that imports vllm.

The loop calls `engine.load_weights(named_parameters)` once before the first step, then per step:
`engine.wake()`, `engine.generate(...)`, `engine.sleep()`, train, `engine.load_weights(...)`, and
records `engine.stats()` in metrics.jsonl. Every method must be safe to call in that order on
every engine. An engine's `shares_weights` attribute says whether it generates with the trainer's own
module (hf: True, the default where an engine lacks it); only then does ZeRO-3 gather the whole weights for
generation (`teacli.train.backend.generation_weights`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from teacli.types import Completion, SamplingConfig

if TYPE_CHECKING:
    import torch

    from teacli.config import RolloutConfig


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(
        self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingConfig, seed: int
    ) -> list[list[Completion]]:
        """prompt_token_ids[P] (chat-templated, unpadded) → completions[P][n], prompt-major.

        Reproducible: the same inputs, engine settings and `seed` give the same completions.
        """
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        """Receive the trainer's updated weights (HF parameter names). No-op for an engine that
        generates with the trainer's own module."""
        ...

    def sleep(self) -> None:
        """Release generation memory while the trainer runs (no-op where unsupported)."""
        ...

    def wake(self) -> None:
        """Undo `sleep` before generating (no-op where unsupported)."""
        ...

    def stats(self) -> dict[str, float]:
        """Engine facts for the step's metrics.jsonl line (e.g. the vllm engine's weight-sync
        agreement); the same keys every step, or none."""
        ...


class RolloutSyncError(ValueError):
    """The engine's weights do not match the trainer's after a push (it would sample off-policy).

    A ValueError so that `tea` reports it as a clear error naming the recipe key, not a traceback.
    """


def sampling_from(cfg: "RolloutConfig") -> SamplingConfig:
    """The recipe's rollout sampling parameters as the engines' `SamplingConfig`."""
    return SamplingConfig(
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens
    )


def sampling_settings(cfg: "RolloutConfig") -> dict[str, Any]:
    """What a stored sample was drawn with, for the settings files that a resume compares (eval-bon, the alignment
    pool): `sampling_from`'s values, and `rollout.stop_tokens` only when set (files written before the key compare equal)."""
    s = sampling_from(cfg)
    out: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "max_new_tokens": s.max_new_tokens}
    if cfg.stop_tokens:
        out["stop_tokens"] = list(cfg.stop_tokens)
    return out


def stop_token_ids(tokenizer: Any, stop_tokens: Sequence[str] = ()) -> list[int]:
    """The ids that end a completion: the tokenizer's EOS, then each of `rollout.stop_tokens` (one token
    of the vocabulary each; anything else is a ValueError naming the key and what the string encodes to)."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the policy tokenizer has no eos token: generation could never stop (set one in the tokenizer)")
    ids = [tokenizer.eos_token_id]
    for token in stop_tokens:
        encoded = tokenizer(token, add_special_tokens=False)["input_ids"] if token else []
        if len(encoded) != 1:
            raise ValueError(f"rollout.stop_tokens: {token!r} is {len(encoded)} tokens of the policy's vocabulary "
                             f"({encoded[:8]}), not one: list single tokens (e.g. a chat template's turn marker)")
        if encoded[0] == tokenizer.unk_token_id:
            raise ValueError(f"rollout.stop_tokens: {token!r} is not in the policy's vocabulary (it encodes to the unknown token)")
        if encoded[0] not in ids:
            ids.append(encoded[0])
    return ids


def cut_at_eos(token_ids: Sequence[int], eos_token_ids: Iterable[int]) -> tuple[list[int], bool]:
    """Generated ids → (ids up to and including the first EOS, whether an EOS was found).

    Everything after the first EOS is padding (which may itself be the EOS token) or, for an
    engine that does not stop, text the policy never meant to write.
    """
    eos = set(eos_token_ids)
    for i, tok in enumerate(token_ids):
        if tok in eos:
            return list(token_ids[: i + 1]), True
    return list(token_ids), False
