"""Prompt data: `tea prepare-data` (sources → deduplicated, hashed, disjoint splits + manifest)
and the small built-in prompt set with verifiable constraints (builtin/prompts.jsonl).

Only the standard library is imported here; `datasets` and pyarrow load inside the functions
that need them.
"""

from teacli.data.errors import DataError
from teacli.data.prepare import PrepareSummary, prepare

__all__ = ["DataError", "PrepareSummary", "prepare"]
