"""Sequence-classification reward models (kind 'hf'), e.g. Skywork-Reward-V2.

The score of a response is the reward model's scalar logit for the conversation
[prompt messages..., assistant: response], rendered with the reward model's OWN chat template
(not the policy's) and tokenized without a doubled BOS (`teacli.models.encode_chat`).

Responses are scored in batches of `reward.batch_size`, grouped by token length (sorted, batched,
unsorted) so that padding is small; the result does not depend on the batching. Departures from
calling the model's forward on each example:

  * Pooling. transformers' sequence classifiers score the rightmost token that is not the pad
    token. When pad = eos (a Llama tokenizer without a pad token) and the template ends the turn
    with eos, that is the token BEFORE the end of the turn. For the generic classifiers (Llama,
    Qwen, Mistral, Gemma, ...) we run the backbone and apply the score head at the last attended
    token ourselves, so the score is the last token's whatever the pad id; other architectures
    use their own forward (right padding, `config.pad_token_id` set).
  * Truncation keeps the END of a conversation longer than `reward.max_length` (and a leading
    BOS): the response and the end-of-turn token the score is read from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from teacli.models import encode_chat, is_standin, load_errors, looks_like_path, random_model, resolve_dtype

if TYPE_CHECKING:
    import torch

    from teacli.config import RewardConfig
    from teacli.types import Prompt

log = logging.getLogger(__name__)


class HFRewardModel:
    """A reward model: AutoModelForSequenceClassification (num_labels = 1) and its own tokenizer."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        batch_size: int = 16,
        max_length: int = 4096,
        name: str | None = None,
    ) -> None:
        import torch

        if batch_size < 1 or max_length < 2:
            raise ValueError(f"reward.batch_size / reward.max_length: got {batch_size} / {max_length}")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"reward.name_or_path: the tokenizer of reward model {name or '?'} has no chat template; "
                "a reward model must come with the template it was trained on"
            )
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id  # Llama RMs: needed to batch at all
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        self.device = next(model.parameters()).device
        self.truncated = 0  # conversations cut to max_length so far
        self.tokens_scored = 0  # tokens of every conversation scored so far (benchmarks/phases.py: the phase's floor)
        self._own_pooling = _is_generic_classifier(model) and isinstance(getattr(model, "score", None), torch.nn.Module)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        revision: str | None = None,
        dtype: str = "auto",
        device: "str | torch.device | None" = None,
        batch_size: int = 16,
        max_length: int = 4096,
        trust_remote_code: bool = False,
        kernels: str = "eager",
    ) -> "HFRewardModel":
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        path = _local_or_hub(name_or_path)
        kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
        if revision:
            kwargs["revision"] = revision
        with load_errors("reward.name_or_path", name_or_path, path):
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            if is_standin(path):  # a rehearsal: random weights of the reward model's shape
                model = random_model(path, "reward", resolve_dtype(dtype, device), device)
            else:
                model = AutoModelForSequenceClassification.from_pretrained(
                    path, num_labels=1, dtype=resolve_dtype(dtype, device), **kwargs
                )
        from teacli.kernels import apply_kernels, resolve_kernels

        model = model.to(device)
        apply_kernels(model, resolve_kernels(kernels, model, device, "reward.kernels"), generates=False)
        return cls(model, tokenizer, batch_size=batch_size, max_length=max_length, name=name_or_path)

    @classmethod
    def from_config(cls, cfg: "RewardConfig", device: "str | torch.device | None" = None) -> "HFRewardModel":
        """From the recipe's `reward:` section; `device` is the policy's (used when reward.device is 'auto')."""
        if not cfg.name_or_path:
            raise ValueError("reward.name_or_path: required when reward.kind is 'hf'")
        return cls.from_pretrained(
            cfg.name_or_path,
            revision=cfg.revision,
            dtype=cfg.dtype,
            device=device if cfg.device == "auto" else cfg.device,
            batch_size=cfg.batch_size,
            max_length=cfg.max_length,
            kernels=cfg.kernels,
        )

    # -- scoring ----------------------------------------------------------------------------------

    def encode(self, prompt: "Prompt", response: str) -> list[int]:
        """Token ids of [prompt messages..., assistant: response] under the RM's template, ≤ max_length."""
        ids = encode_chat(self.tokenizer, [*prompt.messages, {"role": "assistant", "content": response}], add_generation_prompt=False)
        return self._truncate(ids)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a conversation already rendered as text (OpenRLHF's `query`), no special tokens added."""
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise ValueError(f"reward model: a query of {len(text)} characters has no tokens to score")
        return self._truncate(ids)

    def _truncate(self, ids: list[int]) -> list[int]:
        if len(ids) <= self.max_length:
            return ids
        self.truncated += 1
        if self.truncated == 1:
            log.warning("reward model: a conversation of %d tokens was cut to reward.max_length=%d (keeping its end)", len(ids), self.max_length)
        bos = self.tokenizer.bos_token_id
        if bos is not None and ids[0] == bos:
            return [bos] + ids[len(ids) - self.max_length + 1 :]
        return ids[len(ids) - self.max_length :]

    def score(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> "torch.Tensor":
        """prompts[B], responses[B] → rewards[B] float32 on CPU: the RM's scalar logit per response."""
        if len(prompts) != len(responses):
            raise ValueError(f"reward model: {len(prompts)} prompts but {len(responses)} responses")
        return self._score_encoded([self.encode(p, r) for p, r in zip(prompts, responses)])

    def score_texts(self, texts: Sequence[str]) -> "torch.Tensor":
        """texts[B] (whole conversations in the RM's chat format, as OpenRLHF clients send) → rewards[B]."""
        return self._score_encoded([self.encode_text(t) for t in texts])

    def _score_encoded(self, encoded: list[list[int]]) -> "torch.Tensor":
        """encoded[B] token ids → rewards[B] float32 on CPU, batched by length (the result does not depend on it)."""
        self.tokens_scored += sum(len(ids) for ids in encoded)
        return score_by_length(self.model, encoded, self.batch_size, self._pack, self._forward)

    def _pack(self, batch: list[list[int]]) -> "tuple[torch.Tensor, torch.Tensor]":
        """batch[b] token ids → (input_ids, attention_mask) [b, L] on the host, right-padded."""
        import torch

        width = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        return input_ids, mask

    def _forward(self, input_ids: "torch.Tensor", mask: "torch.Tensor") -> "torch.Tensor":
        """A right-padded batch on the device → scores [b] float32 on the device, pooled at each row's last token.

        A decoder pooled by tea (`_own_pooling`) runs without the attention mask: attention is causal and the padding
        comes after every real token, so no real token sees it, and the forward takes the causal path (no mask to
        build, SDPA's flash kernel). Neither keeps a KV cache (a reward model's config may ask for one: it would hold
        every layer's keys and values until the forward returns, and a compiled forward recompiles on it)."""
        import torch

        if self._own_pooling:
            hidden = self.model.base_model(input_ids=input_ids, use_cache=False).last_hidden_state  # [b, L, H]
            last = mask.sum(dim=1) - 1  # [b]
            logits = self.model.score(hidden[torch.arange(len(input_ids), device=input_ids.device), last])  # [b, labels]
        else:
            logits = self.model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits  # [b, labels]
        return logits[:, 0].float()


def score_by_length(
    model: Any, encoded: list[list[int]], batch_size: int,
    pack: "Callable[[list[list[int]]], tuple[torch.Tensor, ...]]", forward: "Callable[..., torch.Tensor]",
) -> "torch.Tensor":
    """encoded[B] token ids → forward's scores [B] float32 on CPU, in original order: sorted by length (longest
    first), `batch_size` rows per forward of `pack`'s tensors, under no_grad with `model` in eval mode.

    Every batch is packed before the first forward and copied to a GPU from pinned memory without waiting, and the
    scores come back in one copy after the last: a copy from the host's pageable memory, like reading a value back,
    waits for the device to finish its queue, which once a batch left the GPU idle while the host built and launched
    the next."""
    import torch

    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]), reverse=True)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    packed = [tuple(t.pin_memory().to(device, non_blocking=True) if cuda else t.to(device) for t in pack([encoded[i] for i in rows]))
              for rows in batches]
    scores = torch.empty(len(encoded), dtype=torch.float32)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            outs = [forward(*tensors) for tensors in packed]
    finally:
        model.train(was_training)
    if outs:
        scores[order] = torch.cat(outs).float().cpu()
    return scores


def _is_generic_classifier(model: Any) -> bool:
    try:
        from transformers.modeling_layers import GenericForSequenceClassification
    except ImportError:
        return False
    return isinstance(model, GenericForSequenceClassification)


def _local_or_hub(name: str) -> str:
    from pathlib import Path

    if looks_like_path(name) and not Path(name).expanduser().exists():
        raise ValueError(f"reward.name_or_path: no such directory {name!r}")
    return str(Path(name).expanduser()) if looks_like_path(name) else name
