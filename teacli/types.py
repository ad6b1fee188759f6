"""Records passed between stages.

Shapes in comments use P = prompts in a batch, m = rollouts per prompt (group size),
T = generated tokens. Records are plain dataclasses: cheap to build, easy to serialize,
and free of trainer state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Prompt:
    """One prompt as written by `tea prepare-data` (one line of a split file).

    `id` is the stable hash of the normalized prompt text; `messages` is the chat
    conversation up to (not including) the assistant turn to generate; `meta` carries
    source-specific fields, e.g. the verifiable `constraints` that the rule reward checks.
    """

    id: str
    messages: tuple[dict[str, str], ...]
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Prompt":
        known = {"id", "messages", "source"}
        return cls(
            id=str(obj["id"]),
            messages=tuple({"role": str(m["role"]), "content": str(m["content"])} for m in obj["messages"]),
            source=str(obj.get("source", "")),
            meta={k: v for k, v in obj.items() if k not in known},
        )

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "messages": [dict(m) for m in self.messages], "source": self.source, **self.meta}


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters shared by every rollout engine, so switching engines changes speed only.

    Sampling is exactly the policy's distribution shaped by these values; nothing from the model's
    own generation_config (e.g. its top_k = 50) is added.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 512


@dataclass
class Completion:
    """One sampled completion of one prompt."""

    token_ids: list[int]  # [T] generated tokens, up to and including the first EOS if it stopped
    text: str  # decoded response (special tokens skipped)
    finished: bool  # True if it stopped at EOS, False if cut at max_new_tokens
    logprobs: list[float] | None = None  # [T] the sampler's log-probs (vllm engine): sync check, importance correction
