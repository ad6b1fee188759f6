"""Chat prompts → token ids through the tokenizer's chat template, without a doubled BOS."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class ChatTemplateError(ValueError):
    """The chat template failed to render a conversation."""


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool) -> list[int]:
    """Token ids of `messages` rendered by the tokenizer's chat template, without a doubled BOS.

    A template that writes BOS itself is tokenized with add_special_tokens=False; one that does
    not lets the tokenizer add its usual special tokens. A template that fails (a syntax error, its
    own raise_exception, any error in its code) is a ChatTemplateError (a ValueError).
    """
    try:
        text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # the template is user code: jinja2 errors, and whatever its expressions raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        roles = ", ".join(str(m.get("role")) for m in messages)
        raise ChatTemplateError(f"the chat template failed on a conversation of roles [{roles}]: {type(exc).__name__}: {first}") from None
    bos = tokenizer.bos_token
    template_has_bos = bool(bos) and text.startswith(bos)
    ids = list(tokenizer(text, add_special_tokens=not template_has_bos)["input_ids"])
    if len(ids) >= 2 and bos and ids[0] == ids[1] == tokenizer.bos_token_id:
        ids = ids[1:]
    return ids
