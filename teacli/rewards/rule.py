"""Rule reward: graded, deterministic scores for verifiable instruction-following constraints.

The embedded default reward (no model, pure Python). Each prompt carries
`meta["constraints"]`, a list like `[{"type": "word_count", "min": 40, "max": 80}, ...]`
(IFEval-style). Each constraint scores in [0, 1] with smooth partial credit, so that a
near miss beats a far miss; best-of-N training needs a reward with a tail and few ties,
which 0/1 checks do not give. The reward of a response is

    R = (1 − ε) · mean_c s_c + ε · D        (ε = `tie_break`, default 0.02)

with D the distinct-word ratio (unique words / words, case-folded) in [0, 1]: a small,
verifiable tie-breaker that separates responses meeting every constraint and charges
repetition (keyword stuffing, loops). A response without a single word scores 0: empty
output must not collect credit from "absence" constraints such as no_commas.

Partial credit uses one decay, decay(d) = exp(−d / τ) with τ = `tolerance` (default 0.5),
on a relative distance d; violation counts v score 1 / (1 + v). Per type (params):

  word_count      {min?, max?}    1 in range; else decay(shortfall/min or excess/max)
  num_sentences   {min?, max?}    same, counting sentences (ending in . ! ? or the text end)
  num_paragraphs  {n}             decay(|k − n| / n), paragraphs = blocks between blank lines
  num_bullets     {n}             decay(|k − n| / n), lines starting "-", "*", "•", "1." or "1)"
  include_keywords {keywords}     fraction of keywords present
  keyword_frequency {keyword, min} min(1, occurrences / min)
  forbidden_words {words}         1 / (1 + total occurrences)
  start_with      {text}          1 at the start; 0.5·(1 − offset/length) if later; 0 if absent
  ends_with       {text}          1 at the end; 0.5·(end offset/length) if earlier; 0 if absent
  no_commas       {}              1 / (1 + commas)
  lowercase       {}              1 / (1 + uppercase letters)

Keywords match whole words, case-insensitively, with an optional inflection suffix
(s, es, d, ed, ing, 's): "salt" matches "Salts" and "salted", not "basalt" or "saltwater".
start_with / ends_with compare case-folded text with whitespace collapsed, ignoring
surrounding whitespace.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from teacli.config import RuleParams  # the parameters' ranges, which the recipe loader checks
from teacli.types import Prompt

if TYPE_CHECKING:
    import torch

_WORD = re.compile(r"\w+(?:['’]\w+)*")
_SENTENCE_END = re.compile(r"[.!?]+(?=\s|$)")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_BULLET = re.compile(r"^[ \t]*(?:[-*•]|\d+[.)])[ \t]+\S", re.MULTILINE)


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def count_sentences(text: str) -> int:
    pieces = _SENTENCE_END.split(text)
    return sum(1 for piece in pieces if _WORD.search(piece))


def count_paragraphs(text: str) -> int:
    return sum(1 for block in _PARAGRAPH_BREAK.split(text.strip()) if block.strip())


def count_bullets(text: str) -> int:
    return len(_BULLET.findall(text))


@lru_cache(maxsize=4096)
def _keyword_pattern(keyword: str) -> re.Pattern[str]:
    body = r"\s+".join(re.escape(part) for part in keyword.split())
    return re.compile(rf"(?<!\w){body}(?:s|es|d|ed|ing|['’]s)?(?!\w)", re.IGNORECASE)


def count_keyword(text: str, keyword: str) -> int:
    return len(_keyword_pattern(keyword).findall(text))


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


# ---------------------------------------------------------------------------- partial credit


def decay(distance: float, tolerance: float) -> float:
    """exp(−d/τ): 1 at distance 0, e^-1 at one tolerance, never exactly 0."""
    return math.exp(-distance / tolerance)


def range_score(k: int, lo: int | None, hi: int | None, tolerance: float) -> float:
    if lo is not None and k < lo:
        return decay((lo - k) / lo, tolerance)
    if hi is not None and k > hi:
        return decay((k - hi) / hi, tolerance)
    return 1.0


def count_score(k: int, n: int, tolerance: float) -> float:
    return decay(abs(k - n) / n, tolerance)


def violations_score(v: int) -> float:
    return 1.0 / (1.0 + v)


# ---------------------------------------------------------------------------- constraint types


def _word_count(text: str, c: Mapping[str, Any], tol: float) -> float:
    return range_score(len(words(text)), c.get("min"), c.get("max"), tol)


def _num_sentences(text: str, c: Mapping[str, Any], tol: float) -> float:
    return range_score(count_sentences(text), c.get("min"), c.get("max"), tol)


def _num_paragraphs(text: str, c: Mapping[str, Any], tol: float) -> float:
    return count_score(count_paragraphs(text), c["n"], tol)


def _num_bullets(text: str, c: Mapping[str, Any], tol: float) -> float:
    return count_score(count_bullets(text), c["n"], tol)


def _include_keywords(text: str, c: Mapping[str, Any], tol: float) -> float:
    keywords = c["keywords"]
    return sum(1 for k in keywords if count_keyword(text, k) > 0) / len(keywords)


def _keyword_frequency(text: str, c: Mapping[str, Any], tol: float) -> float:
    return min(1.0, count_keyword(text, c["keyword"]) / c["min"])


def _forbidden_words(text: str, c: Mapping[str, Any], tol: float) -> float:
    return violations_score(sum(count_keyword(text, w) for w in c["words"]))


def _start_with(text: str, c: Mapping[str, Any], tol: float) -> float:
    body, target = _fold(text), _fold(c["text"])
    pos = body.find(target)
    if pos < 0:
        return 0.0
    return 1.0 if pos == 0 else 0.5 * (1.0 - pos / len(body))


def _ends_with(text: str, c: Mapping[str, Any], tol: float) -> float:
    body, target = _fold(text), _fold(c["text"])
    pos = body.rfind(target)
    if pos < 0:
        return 0.0
    end = pos + len(target)
    return 1.0 if end == len(body) else 0.5 * end / len(body)


def _no_commas(text: str, c: Mapping[str, Any], tol: float) -> float:
    return violations_score(text.count(",") + text.count("，"))


def _lowercase(text: str, c: Mapping[str, Any], tol: float) -> float:
    return violations_score(sum(1 for ch in text if ch.isupper()))


ConstraintFn = Callable[[str, Mapping[str, Any], float], float]

# type → (scoring function, {param: (python types, required)})
CONSTRAINTS: dict[str, tuple[ConstraintFn, dict[str, tuple[tuple[type, ...], bool]]]] = {
    "word_count": (_word_count, {"min": ((int,), False), "max": ((int,), False)}),
    "num_sentences": (_num_sentences, {"min": ((int,), False), "max": ((int,), False)}),
    "num_paragraphs": (_num_paragraphs, {"n": ((int,), True)}),
    "num_bullets": (_num_bullets, {"n": ((int,), True)}),
    "include_keywords": (_include_keywords, {"keywords": ((list,), True)}),
    "keyword_frequency": (_keyword_frequency, {"keyword": ((str,), True), "min": ((int,), True)}),
    "forbidden_words": (_forbidden_words, {"words": ((list,), True)}),
    "start_with": (_start_with, {"text": ((str,), True)}),
    "ends_with": (_ends_with, {"text": ((str,), True)}),
    "no_commas": (_no_commas, {}),
    "lowercase": (_lowercase, {}),
}


def validate_constraints(constraints: Any, prompt_id: str) -> list[dict[str, Any]]:
    """Check a prompt's constraint list; errors name the prompt id (and the type)."""
    if not isinstance(constraints, list) or not constraints:
        raise ValueError(f"prompt {prompt_id}: the rule reward needs a non-empty 'constraints' list")
    for c in constraints:
        ctype = c.get("type") if isinstance(c, dict) else None
        if ctype not in CONSTRAINTS:
            raise ValueError(
                f"prompt {prompt_id}: unknown constraint type {ctype!r}; known: {', '.join(CONSTRAINTS)}"
            )
        schema = CONSTRAINTS[ctype][1]
        for key, value in c.items():
            if key == "type":
                continue
            if key not in schema:
                raise ValueError(f"prompt {prompt_id}: constraint {ctype!r} has unknown parameter {key!r}")
            types = schema[key][0]
            if not isinstance(value, types) or isinstance(value, bool):
                raise ValueError(f"prompt {prompt_id}: constraint {ctype!r} parameter {key!r} must be {types[0].__name__}")
        missing = [k for k, (_, required) in schema.items() if required and k not in c]
        if missing:
            raise ValueError(f"prompt {prompt_id}: constraint {ctype!r} is missing {', '.join(missing)}")
        _check_values(c, ctype, prompt_id)
    return constraints


def _check_values(c: dict[str, Any], ctype: str, prompt_id: str) -> None:
    def bad(why: str) -> ValueError:
        return ValueError(f"prompt {prompt_id}: constraint {ctype!r}: {why}")

    if ctype in ("word_count", "num_sentences"):
        lo, hi = c.get("min"), c.get("max")
        if lo is None and hi is None:
            raise bad("needs min, max or both")
        if (lo is not None and lo < 1) or (hi is not None and hi < 1) or (lo is not None and hi is not None and lo > hi):
            raise bad(f"needs 1 <= min <= max, got min={lo} max={hi}")
    for key in ("n", "min"):
        if ctype not in ("word_count", "num_sentences") and key in c and c[key] < 1:
            raise bad(f"{key} must be >= 1, got {c[key]}")
    for key in ("keywords", "words"):
        if key in c and (not c[key] or not all(isinstance(w, str) and w.strip() for w in c[key])):
            raise bad(f"{key} must be a non-empty list of non-empty strings")
    for key in ("text", "keyword"):
        if key in c and not c[key].strip():
            raise bad(f"{key} must not be empty")


# ---------------------------------------------------------------------------- the reward


class RuleReward:
    """score(prompts, responses) → Tensor[B] float32 in [0, 1]; see the module docstring."""

    name = "rule"

    def __init__(self, tolerance: float = RuleParams.tolerance, tie_break: float = RuleParams.tie_break) -> None:
        if not tolerance > 0:
            raise ValueError(f"rule reward: tolerance must be > 0, got {tolerance}")
        if not 0 <= tie_break < 1:
            raise ValueError(f"rule reward: tie_break must be in [0, 1), got {tie_break}")
        self.tolerance = float(tolerance)
        self.tie_break = float(tie_break)

    def constraint_scores(self, prompt: Prompt, response: str) -> list[float]:
        """One score in [0, 1] per constraint of `prompt`, in order."""
        constraints = validate_constraints(prompt.meta.get("constraints"), prompt.id)
        return [CONSTRAINTS[c["type"]][0](response, c, self.tolerance) for c in constraints]

    def score_one(self, prompt: Prompt, response: str) -> float:
        scores = self.constraint_scores(prompt, response)  # validates even a degenerate response
        tokens = [w.casefold() for w in words(response)]
        if not tokens:
            return 0.0
        diversity = len(set(tokens)) / len(tokens)
        return (1.0 - self.tie_break) * sum(scores) / len(scores) + self.tie_break * diversity

    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> "torch.Tensor":
        """prompts[B], responses[B] → rewards[B] (float32)."""
        if len(prompts) != len(responses):
            raise ValueError(f"rule reward: {len(prompts)} prompts but {len(responses)} responses")
        import torch

        return torch.tensor([self.score_one(p, r) for p, r in zip(prompts, responses)], dtype=torch.float32)
