"""Text normalization and the stable prompt id.

`normalize_text` is what gets written: NFKC, Unix newlines, no control or zero-width
characters, no trailing spaces, at most one blank line in a row, stripped ends. It keeps
line structure and indentation inside lines (code prompts need them).

`prompt_id` hashes a stricter key: every run of whitespace collapsed to one space, so that
two prompts differing only in spacing or line breaks are duplicates. A single user message
is keyed by its text alone; anything else (multi-turn, system messages) is keyed by
role-tagged turns, so the same words said by different roles never collide.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Sequence

ID_HEX_CHARS = 16  # 64 bits: collision odds ~1e-9 for a million prompts

# C0/C1 controls except \t and \n, zero-width characters, BOM.
_INVISIBLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200d\u2060\ufeff]")
_BLANK_RUN = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _INVISIBLE.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANK_RUN.sub("\n\n", text).strip()


def normalize_messages(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": normalize_text(m["content"])} for m in messages]


def dedup_key(messages: Sequence[dict[str, str]]) -> str:
    """The string that `prompt_id` hashes (messages must already be normalized)."""
    collapsed = [(m["role"], " ".join(m["content"].split())) for m in messages]
    if len(collapsed) == 1 and collapsed[0][0] == "user":
        return collapsed[0][1]
    # \x1e / \x1f cannot occur in normalized text, so the encoding is unambiguous.
    return "\x1e".join(f"{role}\x1f{content}" for role, content in collapsed)


def prompt_id(messages: Sequence[dict[str, str]]) -> str:
    """sha256 hex prefix of the normalized prompt (see module docstring)."""
    return hashlib.sha256(dedup_key(messages).encode("utf-8")).hexdigest()[:ID_HEX_CHARS]
