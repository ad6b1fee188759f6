"""What tea's HTTP clients share: the remote reward (teacli/rewards/remote.py) and the pairwise judge
(teacli/eval/judge.py) both retry on httpx with the same backoff, read a server's Retry-After the same way, and
reach a server on this machine or network directly (not through the environment's proxies).

One copy for both: they had drifted (only the judge read a Retry-After HTTP date and `*.localhost`).
Imports only the standard library.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import random
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit


def is_local_url(url: str) -> bool:
    """Whether `url`'s host is on this machine or its network: localhost and `*.localhost` (RFC 6761), a loopback,
    private, link-local or unspecified address (a local `vllm serve` or `tea serve-rm`). Such a server is reached
    directly, never through HTTP(S)_PROXY, and the judge needs no API key for it."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified


def retry_after_seconds(value: str | None, now: dt.datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date (RFC 9110 §10.2.3; a date in the
    past is 0); None without a header or for one that is neither. `now`: the current time (for tests)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": UTC without saying so
        when = when.replace(tzinfo=dt.timezone.utc)
    return max(0.0, (when - (now or dt.datetime.now(dt.timezone.utc))).total_seconds())


def backoff_delay(attempt: int, rng: random.Random, retry_after: float | None = None, *, base_s: float, max_s: float,
                  retry_after_max_s: float) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based): base_s doubling each attempt up to max_s, times a
    jitter in [0.5, 1]; at least a server's Retry-After, as far as retry_after_max_s."""
    delay = min(max_s, base_s * 2 ** (attempt - 1)) * (0.5 + 0.5 * rng.random())
    if retry_after is not None:
        delay = max(delay, min(retry_after, retry_after_max_s))
    return delay
