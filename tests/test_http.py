"""teacli/http.py, the helpers the remote reward and the judge share: which hosts are local, Retry-After in
seconds or as an HTTP date, and the capped, jittered exponential backoff."""

from __future__ import annotations

import datetime as dt
import random

from teacli.http import backoff_delay, is_local_url, retry_after_seconds


def test_local_hosts():
    for url in ("http://localhost:8000/v1", "http://rm.localhost:5000/get_reward", "http://LOCALHOST/", "http://127.0.0.1:8000/v1",
                "http://[::1]:8000/v1", "http://10.1.2.3:8000/v1", "http://192.168.0.7/", "http://169.254.1.1/", "http://0.0.0.0:5000/"):
        assert is_local_url(url), url
    for url in ("https://api.deepseek.com/v1", "http://8.8.8.8/", "http://localhost.example.com/", "http://notlocalhost/", "not a url"):
        assert not is_local_url(url), url


def test_retry_after_in_seconds_or_as_an_http_date():
    now = dt.datetime(2015, 10, 21, 7, 28, 0, tzinfo=dt.timezone.utc)
    assert retry_after_seconds("2") == 2.0 and retry_after_seconds("-5") == 0.0 and retry_after_seconds("1.5") == 1.5
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:30 GMT", now=now) == 30.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:30 -0000", now=now) == 30.0  # a date without a zone is UTC
    assert retry_after_seconds("Wed, 21 Oct 2015 07:27:00 GMT", now=now) == 0.0  # in the past: at once
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # against the clock
    assert retry_after_seconds("soon") is None and retry_after_seconds("") is None and retry_after_seconds(None) is None


def test_backoff_doubles_to_its_cap_with_jitter_and_honours_retry_after_up_to_its_cap():
    rng = random.Random(0)
    kw = dict(base_s=1.0, max_s=8.0, retry_after_max_s=30.0)
    for attempt, cap in ((1, 1.0), (2, 2.0), (3, 4.0), (6, 8.0)):
        delays = [backoff_delay(attempt, rng, **kw) for _ in range(200)]
        assert cap / 2 <= min(delays) and max(delays) <= cap and max(delays) - min(delays) > cap / 4  # jitter in [0.5, 1]
    assert backoff_delay(1, rng, 20.0, **kw) == 20.0  # a server's Retry-After wins when longer
    assert backoff_delay(1, rng, 999.0, **kw) == 30.0  # ... up to its cap
    assert 0.5 <= backoff_delay(1, rng, 0.0, **kw) <= 1.0  # a shorter one does not shorten the backoff
