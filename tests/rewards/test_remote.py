"""The remote reward client (reward.kind: remote) against scripted HTTP servers on 127.0.0.1: the request
format, batching, bounded concurrency, retries with backoff, and a clear error naming the URL for a
server that is down or answers garbage."""

from __future__ import annotations

import json
import random
import socket
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiny_lm import make_tokenizer  # noqa: E402

from teacli.config import RewardConfig  # noqa: E402
from teacli.rewards import build_reward, checked_score  # noqa: E402
from teacli.rewards import remote  # noqa: E402
from teacli.http import backoff_delay  # noqa: E402
from teacli.rewards.remote import RemoteReward, RemoteRewardError, parse_rewards  # noqa: E402
from teacli.types import Prompt  # noqa: E402

PROMPTS = [Prompt(id=f"p{i}", messages=({"role": "user", "content": f"question {i}"},), meta={"constraints": [{"type": "no_commas"}]})
           for i in range(3)]


class Scripted:
    """A real HTTP server on 127.0.0.1 whose replies come from a script: each entry is used once, in order,
    then the last one repeats. An entry is (status, body) or "close" (drop the connection unanswered); a
    body of None means the correct reply: reward = number of words of each response."""

    def __init__(self, script, delay: float = 0.0):
        self.script, self.delay = list(script), delay
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append(body)
                    outer.headers.append(dict(self.headers))
                    entry = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                try:
                    time.sleep(outer.delay)
                    if entry == "close":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    status, reply = entry
                    if reply is None:
                        reply = json.dumps({"rewards": [float(len(r.split())) for r in body["responses"]], "scores": []})
                    data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
                    self.send_response(status)
                    if status == 429:
                        self.send_header("Retry-After", "0")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/get_reward"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


OK = (200, None)


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)  # the schedule itself is tested in test_backoff_schedule


def client(tokenizer, url, **kw) -> RemoteReward:
    cfg = RewardConfig(kind="remote", url=url, **kw)
    reward = build_reward(cfg, tokenizer=tokenizer)
    assert isinstance(reward, RemoteReward)
    return reward


def test_request_follows_openrlhf_and_adds_the_prompt_messages(tokenizer):
    with Scripted([OK]) as srv:
        rewards = checked_score(client(tokenizer, srv.url), PROMPTS[:2], ["the cat sat", "one"])
    assert rewards.tolist() == [3.0, 1.0]
    (body,) = srv.requests
    # The tiny tokenizer's template: "<bos>" + "<|role|> content <eos>" per message + "<|assistant|> ".
    prompt_text = ["<bos><|user|> question 0 <eos><|assistant|> ", "<bos><|user|> question 1 <eos><|assistant|> "]
    assert body["prompts"] == prompt_text
    assert body["query"] == [prompt_text[0] + "the cat sat<eos>", prompt_text[1] + "one<eos>"]
    assert body["labels"] == [{"constraints": [{"type": "no_commas"}]}] * 2
    assert body["prompt_ids"] == ["p0", "p1"] and body["responses"] == ["the cat sat", "one"]
    assert body["messages"] == [[{"role": "user", "content": "question 0"}], [{"role": "user", "content": "question 1"}]]
    assert "authorization" not in {k.lower() for k in srv.headers[0]}


def test_batches_keep_order_and_concurrency_is_bounded(tokenizer):
    responses = [" ".join(["w"] * (i % 7 + 1)) for i in range(40)]
    prompts = [PROMPTS[i % 3] for i in range(40)]
    with Scripted([OK], delay=0.15) as srv:
        rewards = client(tokenizer, srv.url, batch_size=3, concurrency=4).score(prompts, responses)
    assert rewards.tolist() == [float(i % 7 + 1) for i in range(40)]
    assert [len(b["query"]) for b in srv.requests].count(3) == 13 and sum(len(b["query"]) for b in srv.requests) == 40
    assert srv.max_in_flight == 4  # 14 requests of 0.15 s: the limit is reached, never passed


@pytest.mark.parametrize("failure", [(503, "busy"), (500, '{"error": "oom"}'), (429, "slow down"), "close"])
def test_retries_429_5xx_and_dropped_connections_then_succeeds(tokenizer, failure, fast_backoff):
    with Scripted([failure, failure, OK]) as srv:
        reward = client(tokenizer, srv.url, max_retries=2)
        assert reward.score(PROMPTS[:1], ["a b"]).tolist() == [2.0]
    assert reward.requests == 3 and len(srv.requests) == 3


def test_a_server_down_is_an_error_naming_the_url(tokenizer, caplog, fast_backoff):
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/get_reward"
    reward = client(tokenizer, url, max_retries=2)
    with pytest.raises(RemoteRewardError, match=rf"reward.url {url}: no reply after 3 attempts \(last: ConnectError.*tea serve-rm"):
        reward.score(PROMPTS[:1], ["a"])
    assert reward.requests == 3
    assert sum("retrying" in r.message for r in caplog.records) == 2


def test_a_timeout_is_retried_then_reported(tokenizer, fast_backoff):
    with Scripted([OK], delay=1.0) as srv:
        reward = client(tokenizer, srv.url, timeout_s=0.2, max_retries=1)
        with pytest.raises(RemoteRewardError, match=r"no reply after 2 attempts \(last: no reply within reward.timeout_s=0.2 s\)"):
            reward.score(PROMPTS[:1], ["a"])


@pytest.mark.parametrize("reply,message", [
    ("<html>bad gateway</html>", "the reply is not JSON"),
    ({"scores": [1.0]}, r"the reply has no 'rewards' list \(got keys \['scores'\]\)"),
    ([1.0, 2.0], r"the reply has no 'rewards' list \(got list\)"),
    ({"rewards": 1.5}, "'rewards' is a float, not a list"),
    ({"rewards": [1.0]}, "1 rewards for 2 responses"),
    ('{"rewards": [1.0, NaN]}', r"reward 1 of the batch \(prompt 'p1'\) is nan"),
    ('{"rewards": [Infinity, 1.0]}', r"reward 0 of the batch \(prompt 'p0'\) is inf"),
    ({"rewards": [1.0, "0.5"]}, r"reward 1 of the batch \(prompt 'p1'\) is not a number: '0.5'"),
    ({"rewards": [True, 1.0]}, "is not a number: True"),
])
def test_garbage_is_an_error_naming_the_url_and_is_not_retried(tokenizer, reply, message):
    with Scripted([(200, reply)]) as srv:
        reward = client(tokenizer, srv.url)
        with pytest.raises(RemoteRewardError, match=message) as err:
            reward.score(PROMPTS[:2], ["a", "b"])
    assert srv.url in str(err.value) and len(srv.requests) == 1


def test_other_statuses_stop_at_once_and_the_token_is_sent(tokenizer, monkeypatch):
    monkeypatch.setenv("RM_TOKEN_FOR_TEST", "s3cret")
    with Scripted([(401, '{"error": "missing or wrong bearer token"}')]) as srv:
        reward = client(tokenizer, srv.url, token_env="RM_TOKEN_FOR_TEST")
        with pytest.raises(RemoteRewardError, match=r"HTTP 401 \(check reward.token_env and the server's --token-env\)"):
            reward.score(PROMPTS[:1], ["a"])
    assert len(srv.requests) == 1 and srv.headers[0]["Authorization"] == "Bearer s3cret"
    monkeypatch.delenv("RM_TOKEN_FOR_TEST")
    with pytest.raises(ValueError, match="reward.token_env: environment variable RM_TOKEN_FOR_TEST is not set"):
        client(tokenizer, srv.url, token_env="RM_TOKEN_FOR_TEST")


def test_backoff_schedule():
    """The remote reward's schedule: teacli.http.backoff_delay (tests/test_http.py) with the module's constants."""
    rng = random.Random(0)

    def delay(attempt: int, retry_after: float | None = None) -> float:
        return backoff_delay(attempt, rng, retry_after, base_s=remote.BACKOFF_S, max_s=remote.BACKOFF_MAX_S,
                             retry_after_max_s=remote.RETRY_AFTER_MAX_S)

    for attempt, full in [(1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (12, 30.0)]:  # 0.5 s doubling, capped at 30 s
        delays = [delay(attempt) for _ in range(200)]
        assert min(delays) >= full / 2 and max(delays) <= full and max(delays) - min(delays) > full / 4  # jitter in [0.5, 1]
    assert delay(1, retry_after=5.0) == 5.0  # a server's Retry-After wins when longer
    assert delay(1, retry_after=3600.0) == 60.0  # ... up to a minute


def test_a_retry_after_date_is_honoured_and_a_dot_localhost_server_is_reached_directly(tokenizer, monkeypatch):
    """A 429 whose Retry-After is an HTTP date 30 s ahead waits about 30 s (it was read as no Retry-After: a 0.5 s
    backoff), and `*.localhost` is local (RFC 6761): no environment proxy (it was sent through HTTP_PROXY). The
    server is httpx's in-process mock transport, so rm.localhost needs no name resolution."""
    import asyncio
    from email.utils import format_datetime

    import httpx

    replies = iter([429, 200])
    trust_env: list[bool] = []
    slept: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(replies)
        if status == 429:
            later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
            return httpx.Response(429, headers={"Retry-After": later}, text="slow down")
        return httpx.Response(200, json={"rewards": [1.0]})

    real_client, real_sleep = httpx.AsyncClient, asyncio.sleep

    def recording_client(**kw):
        trust_env.append(kw["trust_env"])
        return real_client(transport=httpx.MockTransport(handler), **kw)

    async def no_wait(seconds: float) -> None:
        slept.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(httpx, "AsyncClient", recording_client)
    monkeypatch.setattr(remote.asyncio, "sleep", no_wait)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    reward = client(tokenizer, "http://rm.localhost:5000/get_reward", max_retries=1)
    assert reward.score(PROMPTS[:1], ["a"]).tolist() == [1.0]
    assert trust_env == [False]
    assert len(slept) == 1 and 25 < slept[0] <= 30


def test_parse_rewards_accepts_ints_and_floats():
    assert parse_rewards({"rewards": [1, 2.5, -3], "extra_logs": {}}, 3, "u", ["a", "b", "c"]) == [1.0, 2.5, -3.0]


def test_recipe_and_build_errors_name_the_key():
    from teacli.config import RecipeError, recipe_from_dict

    runnable = {"policy": {"name_or_path": "some/model"}, "data": {"dir": "builtin"}}

    with pytest.raises(RecipeError, match=r"reward.url: kind 'remote' needs the reward server's http\(s\) URL.*got None"):
        recipe_from_dict({**runnable, "reward": {"kind": "remote"}})
    with pytest.raises(RecipeError, match="reward.url: .*got 'rm-host:5000'"):
        recipe_from_dict({**runnable, "reward": {"kind": "remote", "url": "rm-host:5000"}})
    cfg = recipe_from_dict({**runnable, "reward": {"kind": "remote", "url": "http://127.0.0.1:5000/get_reward"}}).reward
    with pytest.raises(ValueError, match="needs the policy tokenizer"):
        build_reward(cfg)
