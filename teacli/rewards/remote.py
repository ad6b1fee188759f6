"""kind 'remote': score responses on an HTTP reward server speaking OpenRLHF's remote-RM API.

The paper's reward models are 8B; a served one can sit on other GPUs or nodes and serve several
training and evaluation jobs (`tea serve-rm`, teacli/rewards/server.py). Existing OpenRLHF reward
servers work unchanged: tea sends what OpenRLHF's `remote_rm_url` client sends and reads the reply
key it reads.

Request: POST `reward.url`, one JSON body per batch of at most `reward.batch_size` responses:

    {"query":      [prompt_text + response + eos, ...],    OpenRLHF: the whole sequence as text
     "prompts":    [prompt_text, ...],                      OpenRLHF: the prompt as the policy saw it
     "labels":     [prompt.meta, ...],                      OpenRLHF: a label per row; tea: the prompt's metadata
     "prompt_ids": [...], "messages": [[{role, content}, ...], ...], "responses": [...]}   tea's additions

`prompt_text` is the policy tokenizer's chat template applied to the prompt messages with the
generation prompt: the exact text tea generated from. OpenRLHF's query ends with the EOS token of a
response that stopped there; from the text alone tea cannot tell a stopped response from one cut at
max_new_tokens, so it appends the tokenizer's EOS to every response (tea's local `hf` reward likewise
closes every assistant turn). The extra keys let `tea serve-rm` score exactly as a local reward
(prompt messages with the reward model's own template); OpenRLHF servers ignore them.

Reply: a JSON object whose "rewards" is a list of numbers, one per row, in order (other keys, e.g.
OpenRLHF's "scores" and "extra_logs", are ignored).

Client behaviour: `reward.concurrency` requests in flight (httpx.AsyncClient), `reward.timeout_s`
per request, and up to `reward.max_retries` retries of a request after a connection error, a
timeout, HTTP 429 or 5xx, with exponential backoff (0.5 s doubling to at most 30 s, times a jitter
in [0.5, 1]; a server's Retry-After, in seconds or as an HTTP date, is honoured up to 60 s). The loop is ours
on httpx, like `tea judge`'s, with its helpers (teacli/http.py; no retry library). A server on this machine or
network (localhost, `*.localhost`, a private address) is reached directly, not through the environment's proxies. Every other failure stops at once with a RemoteRewardError that
names the URL: other HTTP statuses (401/403: the token), a reply that is not JSON, has no
"rewards" list, has the wrong length, or holds a non-number, NaN or inf: never a silent wrong reward.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from teacli.http import backoff_delay, is_local_url, retry_after_seconds

if TYPE_CHECKING:
    import torch

    from teacli.config import RewardConfig
    from teacli.types import Prompt

log = logging.getLogger(__name__)

BACKOFF_S = 0.5  # delay before the first retry; doubles each retry
BACKOFF_MAX_S = 30.0
RETRY_AFTER_MAX_S = 60.0


class RemoteRewardError(ValueError):
    """The reward server is unreachable or answered something that is not one reward per response."""


def parse_rewards(reply: Any, n: int, url: str, prompt_ids: Sequence[str]) -> list[float]:
    """A decoded reply → n finite floats, or a RemoteRewardError naming the URL and the first bad row."""
    if not isinstance(reply, Mapping) or "rewards" not in reply:
        got = f"keys {sorted(reply)[:8]}" if isinstance(reply, Mapping) else type(reply).__name__
        raise RemoteRewardError(f"reward.url {url}: the reply has no 'rewards' list (got {got})")
    rewards = reply["rewards"]
    if not isinstance(rewards, list):
        raise RemoteRewardError(f"reward.url {url}: 'rewards' is a {type(rewards).__name__}, not a list")
    if len(rewards) != n:
        raise RemoteRewardError(f"reward.url {url}: {len(rewards)} rewards for {n} responses")
    out = []
    for i, value in enumerate(rewards):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RemoteRewardError(f"reward.url {url}: reward {i} of the batch (prompt {prompt_ids[i]!r}) is not a number: {value!r}")
        if not math.isfinite(value):
            raise RemoteRewardError(f"reward.url {url}: reward {i} of the batch (prompt {prompt_ids[i]!r}) is {value}")
        out.append(float(value))
    return out


class RemoteReward:
    """The RewardFunction of kind 'remote': `score(prompts, responses)` over HTTP (module docstring)."""

    def __init__(
        self,
        url: str,
        render: Callable[[Sequence[Mapping[str, str]]], str],
        eos: str = "",
        *,
        batch_size: int = 16,
        concurrency: int = 4,
        timeout_s: float = 300.0,
        max_retries: int = 5,
        token: str | None = None,
    ) -> None:
        self.url, self.render, self.eos = url, render, eos
        self.batch_size, self.concurrency, self.timeout_s, self.max_retries = batch_size, concurrency, timeout_s, max_retries
        self.token = token
        self.name = f"remote {url}"
        self.requests = 0  # HTTP requests sent, retries included
        self._rng = random.Random()  # jitter only

    @classmethod
    def from_config(cls, cfg: "RewardConfig", tokenizer: Any, environ: Mapping[str, str] = os.environ) -> "RemoteReward":
        """From the recipe's `reward:` section; `tokenizer` is the policy's (it renders the prompt texts)."""
        if not cfg.url:
            raise ValueError("reward.url: required when reward.kind is 'remote'")
        if tokenizer is None:
            raise ValueError("reward.kind 'remote' needs the policy tokenizer to render the prompts it sends")
        token = None
        if cfg.token_env:
            token = environ.get(cfg.token_env)
            if not token:
                raise ValueError(f"reward.token_env: environment variable {cfg.token_env} is not set; export the reward server's token in it")

        def render(messages: Sequence[Mapping[str, str]]) -> str:
            return tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=True)

        return cls(cfg.url, render, tokenizer.eos_token or "", batch_size=cfg.batch_size, concurrency=cfg.concurrency,
                   timeout_s=cfg.timeout_s, max_retries=cfg.max_retries, token=token)

    # -- the request ------------------------------------------------------------------------------

    def body(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> dict[str, Any]:
        """The JSON body of one request (module docstring)."""
        texts: dict[str, str] = {}
        for p in prompts:
            if p.id not in texts:  # the m responses of a group share one rendering
                texts[p.id] = self.render(p.messages)
        prompt_texts = [texts[p.id] for p in prompts]
        return {
            "query": [t + r + self.eos for t, r in zip(prompt_texts, responses)],
            "prompts": prompt_texts,
            "labels": [dict(p.meta) for p in prompts],
            "prompt_ids": [p.id for p in prompts],
            "messages": [[dict(m) for m in p.messages] for p in prompts],
            "responses": list(responses),
        }

    def score(self, prompts: Sequence["Prompt"], responses: Sequence[str]) -> "torch.Tensor":
        """prompts[B], responses[B] → rewards[B] float32: batches of reward.batch_size, sent concurrently."""
        import torch

        if len(prompts) != len(responses):
            raise ValueError(f"remote reward: {len(prompts)} prompts but {len(responses)} responses")
        bs = self.batch_size
        bodies = [self.body(prompts[i : i + bs], responses[i : i + bs]) for i in range(0, len(responses), bs)]
        rewards = [r for batch in _run(self._post_all(bodies)) for r in batch]
        return torch.tensor(rewards, dtype=torch.float32)

    async def _post_all(self, bodies: list[dict[str, Any]]) -> list[list[float]]:
        import httpx

        headers = {"User-Agent": "teacli-remote-reward"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        semaphore = asyncio.Semaphore(self.concurrency)
        # Environment proxies are for reaching the internet; a server on this network is reached directly.
        async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(self.timeout_s), limits=limits,
                                     trust_env=not is_local_url(self.url)) as client:
            tasks = [asyncio.ensure_future(self._post(client, semaphore, b)) for b in bodies]
            try:
                return list(await asyncio.gather(*tasks))
            finally:  # one batch failed: stop the others before reporting it
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _post(self, client, semaphore: asyncio.Semaphore, body: dict[str, Any]) -> list[float]:
        import httpx

        n, error = len(body["query"]), ""
        for attempt in range(1, self.max_retries + 2):
            retry_after = None
            try:
                async with semaphore:
                    self.requests += 1
                    resp = await client.post(self.url, json=body)
            except httpx.TimeoutException:
                error = f"no reply within reward.timeout_s={self.timeout_s:g} s"
            except httpx.TransportError as exc:  # refused, reset or closed connection
                error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if resp.status_code == 200:
                    try:
                        reply = resp.json()
                    except ValueError:
                        raise RemoteRewardError(f"reward.url {self.url}: the reply is not JSON: {resp.text[:200]!r}") from None
                    return parse_rewards(reply, n, self.url, body["prompt_ids"])
                if resp.status_code == 429 or resp.status_code >= 500:
                    error = f"HTTP {resp.status_code}: {resp.text[:200].strip()}"
                    retry_after = retry_after_seconds(resp.headers.get("retry-after"))
                else:
                    hint = " (check reward.token_env and the server's --token-env)" if resp.status_code in (401, 403) else ""
                    raise RemoteRewardError(f"reward.url {self.url}: HTTP {resp.status_code}{hint}: {resp.text[:300].strip()}")
            if attempt <= self.max_retries:
                delay = backoff_delay(attempt, self._rng, retry_after, base_s=BACKOFF_S, max_s=BACKOFF_MAX_S,
                                      retry_after_max_s=RETRY_AFTER_MAX_S)
                log.warning("reward server %s: attempt %d of %d failed (%s); retrying in %.1f s",
                            self.url, attempt, self.max_retries + 1, error, delay)
                await asyncio.sleep(delay)
        raise RemoteRewardError(
            f"reward.url {self.url}: no reply after {self.max_retries + 1} attempts (last: {error}); "
            f"is the reward server running? (`tea serve-rm RECIPE`)"
        )


def _run(coro):
    """asyncio.run, also from a thread whose event loop is already running (e.g. a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
