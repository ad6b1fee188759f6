"""The `hf` rollout engine: transformers `generate` on the trainer's own module.

Sampling contract (shared with the vllm engine): each token is drawn from the policy's next-token
distribution with the recipe's temperature, then top-k (0 = off), then top-p, and nothing else.
transformers fills every generation setting we leave unset from the model's `generation_config`
(a checkpoint's `top_k: 50`, `repetition_penalty: 1.1`, `min_new_tokens`, ...), then from library
defaults (`top_k = 50`). We therefore pass a complete `GenerationConfig` and, during the call,
swap the model's own for a blank one, so a checkpoint cannot change what "on-policy" means.

Sequences are generated in batches of at most `batch_size` (each prompt repeated n times,
left-padded). Sampling draws from torch's global RNG, seeded per call inside `fork_rng`, so results
are reproducible given (inputs, seed, batch_size) and the caller's RNG state is left untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from teacli.rollout.base import cut_at_eos
from teacli.types import Completion, SamplingConfig

if TYPE_CHECKING:
    import torch


class HFEngine:
    """Batched sampling with `model.generate` (model: an HF causal LM, possibly peft-wrapped)."""

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 64, eos_token_ids: Iterable[int] | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"rollout.batch_size: must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        eos = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
        if not eos or any(e is None for e in eos):
            raise ValueError("the policy tokenizer has no eos token: generation could never stop (set one in the tokenizer)")
        self.eos_token_ids = eos
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else eos[0]

    # -- protocol ---------------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: list[list[int]], n: int, sampling: SamplingConfig, seed: int
    ) -> list[list[Completion]]:
        """prompt_token_ids[P] → completions[P][n] (prompt-major), sampled with exactly `sampling`."""
        import torch

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if any(len(p) == 0 for p in prompt_token_ids):
            raise ValueError("an empty prompt (no tokens) cannot be generated from")
        flat = [ids for ids in prompt_token_ids for _ in range(n)]  # [P*n], prompt-major
        config = self._generation_config(sampling)
        module = _generating_module(self.model)
        device = next(module.parameters()).device
        outputs: list[list[int]] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), _blank_generation_config(module), _seeded(seed, device):
                for start in range(0, len(flat), self.batch_size):
                    outputs.extend(self._generate_batch(flat[start : start + self.batch_size], config, device))
        finally:
            self.model.train(was_training)
        completions = [self._completion(ids) for ids in outputs]
        return [completions[i * n : (i + 1) * n] for i in range(len(prompt_token_ids))]

    def load_weights(self, named_tensors: Iterable[tuple[str, "torch.Tensor"]]) -> None:
        """No-op: this engine generates with the trainer's module, which already has the new weights."""

    def sleep(self) -> None:
        """No-op: nothing is held between calls (the KV cache lives only inside `generate`)."""

    def wake(self) -> None:
        """No-op (see `sleep`)."""

    def stats(self) -> dict[str, float]:
        """Nothing to report: the engine samples from the trainer's own module."""
        return {}

    # -- helpers ----------------------------------------------------------------------------------

    def _generation_config(self, sampling: SamplingConfig) -> Any:
        from transformers import GenerationConfig

        if sampling.temperature <= 0:
            raise ValueError(f"rollout.temperature: must be > 0 for sampling, got {sampling.temperature}")
        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,  # 0 = off; set explicitly so the library default (50) never applies
            max_new_tokens=sampling.max_new_tokens,
            min_new_tokens=0,
            num_beams=1,
            num_return_sequences=1,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            use_cache=True,
        )

    def _generate_batch(self, batch: list[list[int]], config: Any, device: "torch.device") -> list[list[int]]:
        import torch

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):  # left padding: every prompt ends at the last column
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config
        )
        return out[:, width:].tolist()

    def _completion(self, generated: list[int]) -> Completion:
        ids, finished = cut_at_eos(generated, self.eos_token_ids)
        return Completion(token_ids=ids, text=self.tokenizer.decode(ids, skip_special_tokens=True), finished=finished)


def _generating_module(model: Any) -> Any:
    """The transformers PreTrainedModel whose `generate` runs (unwrapping DeepSpeed and peft)."""
    module = getattr(model, "module", model)  # DeepSpeedEngine
    if hasattr(module, "get_base_model"):  # peft PeftModel
        module = module.get_base_model()
    return module


@contextlib.contextmanager
def _blank_generation_config(module: Any) -> Iterator[None]:
    """Hide the model's own generation_config for the duration of a call (see the module docstring)."""
    from transformers import GenerationConfig

    saved = getattr(module, "generation_config", None)
    module.generation_config = GenerationConfig()
    try:
        yield
    finally:
        module.generation_config = saved


@contextlib.contextmanager
def _seeded(seed: int, device: "torch.device") -> Iterator[None]:
    import torch

    # Only the CPU generator and the generating CUDA device's are forked and seeded.
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield
