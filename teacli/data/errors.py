"""The one error type of `tea prepare-data`: a user-facing message, no traceback needed."""

from __future__ import annotations


class DataError(ValueError):
    """Bad input, options or environment for prepare-data; the message says what to do."""
