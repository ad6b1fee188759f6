"""`tea judge`'s settings: which endpoint and model judge, and how hard a request is tried. Each field is declared once
below with its documentation; the settings are checked when they are made (`JudgeConfig(...)` raises JudgeError naming
the option). How the judge is asked and answered (HTTP, prompts, records) is teacli/eval/judge.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_MODEL = "deepseek-v4-pro"  # the paper's judge, DeepSeek-v4 Pro, by its name at DeepSeek's API
DEFAULT_BASE_URL = "https://api.deepseek.com/v1"
DEFAULT_API_KEY_ENV = "DEEPSEEK_API_KEY"
DEFAULT_SPLIT = "core250"


class JudgeError(ValueError):
    """Bad input, options or endpoint for `tea judge`; the message says what to do."""


@dataclass(frozen=True)
class JudgeConfig:
    """How to reach the judge and how hard to try."""

    model: str = DEFAULT_MODEL
    """Model name sent to the endpoint (DeepSeek: deepseek-v4-pro, the paper's judge; vllm: the served model name)."""
    base_url: str = DEFAULT_BASE_URL
    """OpenAI-compatible base URL; requests go to <base_url>/chat/completions."""
    concurrency: int = 8
    """At most this many requests in flight."""
    seed: int = 0
    """Seed of the per-prompt presentation order."""
    timeout_s: float = 120.0
    """Deadline of one request (connect + reply), after which it is retried."""
    max_attempts: int = 5
    """Requests per pair, the first included, before it is recorded as invalid (an unparseable reply)
    or the run stops (no reply: a transport failure)."""
    backoff_s: float = 1.0
    """Delay before the first retry; doubles each retry (times a jitter in [0.5, 1])."""
    backoff_max_s: float = 60.0
    """Cap of the exponential delay."""
    retry_after_max_s: float = 300.0
    """Cap of a server's Retry-After that is honoured."""
    temperature: float = 0.0
    """Sampling temperature of the judge's reply (0: its most likely verdict)."""
    max_tokens: int = 8192
    """Room for the reply; DeepSeek-v4 Pro thinks by default and its reasoning counts against this."""
    retry_invalid: bool = False
    """Judge again the pairs whose existing record is invalid (valid ones are always kept)."""
    api_key_env: str = DEFAULT_API_KEY_ENV
    """The environment variable the API key was read from (`--api-key-env`), named when the endpoint answers 401/403."""

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """JudgeError naming the option (`--concurrency`, `--max-attempts`, `--timeout`, `--base-url`) of a value out of range."""
        if self.concurrency < 1:
            raise JudgeError(f"--concurrency must be ≥ 1, got {self.concurrency}")
        if self.max_attempts < 1:
            raise JudgeError(f"--max-attempts must be ≥ 1, got {self.max_attempts}")
        if not self.timeout_s > 0:
            raise JudgeError(f"--timeout must be > 0 seconds, got {self.timeout_s}")
        if urlsplit(self.base_url).scheme not in ("http", "https") or not urlsplit(self.base_url).hostname:
            raise JudgeError(f"--base-url must be an http(s) URL such as {DEFAULT_BASE_URL}, got {self.base_url!r}")
