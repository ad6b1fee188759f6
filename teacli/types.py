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
