"""`tea serve-rm`: the recipe's own reward (hf, lm_judge, rule or python) behind OpenRLHF's remote-RM API.

One reward process (say an 8B reward model on its own GPU) serves several training and evaluation
jobs, each with `reward.kind: remote` and `reward.url: http://HOST:PORT/get_reward`.

    POST /get_reward   a request as sent by teacli/rewards/remote.py or by OpenRLHF's client
                       → {"rewards": [...], "scores": [...]}  (scores = rewards, as in OpenRLHF's serve_rm)
    GET  /health       → {"status": "ok", "reward": "<kind and name>"}

Which fields are scored:
  * tea's requests carry "messages" and "responses" (and "prompt_ids", "labels" = the prompts'
    metadata): each row is scored exactly as a local reward would score it, e.g. an hf reward model
    renders the prompt messages and the response with its own chat template.
  * OpenRLHF's requests carry "query" (the whole conversation as text), "prompts" and "labels".
    An hf reward model scores each query text as it is, without adding special tokens (what
    OpenRLHF's own serve_rm does). A rule, python or lm_judge reward gets response = query minus its prompt
    prefix and a prompt whose one user message is the prompt text, with the label as metadata
    when it is a mapping (else as {"label": value}); a query that does not start with its prompt
    is a 400 error naming the row.

The reward runs under one lock (a GPU reward model scores one batch at a time; requests queue) in
a worker thread, so /health answers while a batch is scored. Errors are JSON {"error": ...}: a
malformed request is 400 (a body nested too deeply for the JSON decoder too), a body over
`--max-body-mb` (default 16 MiB) 413, read no further than the limit, a missing or wrong bearer
token 401, a reward that rejects its input or
returns NaN/inf (ValueError, checked as in training) 422, any other failure of the reward 500, which
tea's client retries. One line per request goes to stderr. Starlette and uvicorn (the `serve`
extra) were chosen over the standard library's http.server, which Python's documentation does not
recommend for production use; uvicorn also gives the clean Ctrl-C shutdown.
"""

from __future__ import annotations

import hmac
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from teacli.rewards import RewardError, RewardFunction, build_reward, checked_score
from teacli.types import Prompt

if TYPE_CHECKING:
    from teacli.config import Recipe

log = logging.getLogger("teacli.serve_rm")


class BadRequest(ValueError):
    """A request body that is not one of the two accepted shapes (module docstring)."""


def _str_list(body: Mapping[str, Any], key: str, n: int | None = None) -> list[str]:
    value = body.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"'{key}' must be a list of strings")
    if n is not None and len(value) != n:
        raise BadRequest(f"'{key}' has {len(value)} entries for {n} rows")
    return value


def _meta(label: Any) -> dict[str, Any]:
    if label is None:
        return {}
    return dict(label) if isinstance(label, Mapping) else {"label": label}


def parse_request(body: Any, texts_ok: bool) -> tuple[list[Prompt], list[str]] | list[str]:
    """A request body → (prompts, responses), or → the query texts when the request holds only
    OpenRLHF's fields and `texts_ok` (the reward can score whole conversation texts)."""
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object")
    labels = body.get("labels")
    if "responses" in body or "messages" in body:
        responses = _str_list(body, "responses")
        messages = body.get("messages")
        if not isinstance(messages, list) or len(messages) != len(responses):
            raise BadRequest(f"'messages' must be a list of {len(responses)} conversations (one per response)")
        ids = _str_list(body, "prompt_ids", len(responses)) if "prompt_ids" in body else [f"row{i}" for i in range(len(responses))]
        if labels is not None and (not isinstance(labels, list) or len(labels) != len(responses)):
            raise BadRequest(f"'labels' must be a list of {len(responses)} entries")
        prompts = []
        for i, conv in enumerate(messages):
            if not isinstance(conv, list) or not conv or not all(
                isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in conv
            ):
                raise BadRequest(f"messages[{i}] must be a non-empty list of {{'role': str, 'content': str}}")
            meta = _meta(labels[i] if labels is not None else None)
            prompts.append(Prompt(id=ids[i], messages=tuple({"role": m["role"], "content": m["content"]} for m in conv), meta=meta))
        return prompts, responses
    if "query" not in body:
        raise BadRequest("expected tea's 'messages' and 'responses', or OpenRLHF's 'query' (and 'prompts')")
    queries = _str_list(body, "query")
    if texts_ok:
        return queries
    if "prompts" not in body:
        raise BadRequest("this server's reward scores a prompt and a response: send 'prompts' with 'query'")
    texts = _str_list(body, "prompts", len(queries))
    if labels is not None and (not isinstance(labels, list) or len(labels) != len(queries)):
        raise BadRequest(f"'labels' must be a list of {len(queries)} entries")
    prompts, responses = [], []
    for i, (q, p) in enumerate(zip(queries, texts)):
        if not q.startswith(p):
            raise BadRequest(f"query[{i}] does not start with prompts[{i}]")
        meta = _meta(labels[i] if labels is not None else None)
        prompts.append(Prompt(id=f"row{i}", messages=({"role": "user", "content": p},), meta=meta))
        responses.append(q[len(p):])
    return prompts, responses


def score_request(reward: RewardFunction, body: Any) -> list[float]:
    """Score one request body: BadRequest for a malformed body, ValueError from the reward's checks."""
    parsed = parse_request(body, texts_ok=callable(getattr(reward, "score_texts", None)))
    if isinstance(parsed, list):  # OpenRLHF's query texts, for a reward model
        import torch

        scores = reward.score_texts(parsed)  # type: ignore[attr-defined]
        bad = (~torch.isfinite(scores)).nonzero()
        if len(bad):
            raise ValueError(f"the reward model returned {float(scores[int(bad[0, 0])])} for query {int(bad[0, 0])}")
        return [float(x) for x in scores]
    prompts, responses = parsed
    return [float(x) for x in checked_score(reward, prompts, responses)]


DEFAULT_MAX_BODY_MB = 16.0


class _TooLarge(Exception):
    pass


async def _read_body(request, limit: int) -> bytes:
    """The request body, read chunk by chunk: _TooLarge as soon as it passes `limit` bytes (or declares
    more in Content-Length), so an oversized body is never held in memory whole."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(reward: RewardFunction, token: str | None = None, label: str = "reward", max_body_mb: float = DEFAULT_MAX_BODY_MB):
    """The Starlette application of the module docstring around one reward object."""
    import json

    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    lock = threading.Lock()

    limit = int(max_body_mb * 2**20)

    def locked_score(body: Any) -> list[float]:
        with lock:
            try:
                return score_request(reward, body)
            except RecursionError:  # labels nested deeper than the reward walks
                raise BadRequest("the body is nested too deeply") from None

    async def get_reward(request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        rows, status, payload = 0, 200, None
        if token is not None and not _authorized(request.headers.get("authorization"), token):
            status, payload = 401, {"error": "missing or wrong bearer token (Authorization: Bearer ...)"}
        else:
            try:
                body = json.loads(await _read_body(request, limit))
            except _TooLarge:
                body, status, payload = None, 413, {"error": f"the body is larger than {max_body_mb:g} MiB (tea serve-rm --max-body-mb)"}
            except RecursionError:  # json's decoder recurses once per nesting level
                body, status, payload = None, 400, {"error": "the body is not JSON this server reads: nested too deeply"}
            except ValueError as exc:
                body, status, payload = None, 400, {"error": f"the body is not JSON: {exc}"}
            if status == 200:
                rows = _rows(body)
                try:
                    scores = await run_in_threadpool(locked_score, body)
                    payload = {"rewards": scores, "scores": scores}
                except BadRequest as exc:
                    status, payload = 400, {"error": str(exc)}
                except RewardError as exc:  # the user's function raised: as what it raised (a ValueError: 422)
                    status, payload = 422 if isinstance(exc.original, ValueError) else 500, {"error": str(exc)}
                except ValueError as exc:  # the reward's own checks (wrong length, NaN): retrying will not help
                    status, payload = 422, {"error": str(exc)}
                except Exception as exc:  # the reward failed: 500, which clients retry
                    status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
        client = request.client.host if request.client else "-"
        log.info("%s POST /get_reward %d %d rows %.3f s%s", client, status, rows, time.perf_counter() - t0,
                 f" ({payload['error'][:200]})" if status != 200 else "")
        return JSONResponse(payload, status_code=status)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "reward": label})

    return Starlette(routes=[Route("/get_reward", get_reward, methods=["POST"]), Route("/health", health, methods=["GET"])])


def _rows(body: Any) -> int:
    value = body.get("responses", body.get("query")) if isinstance(body, Mapping) else None
    return len(value) if isinstance(value, list) else 0


def _authorized(header: str | None, token: str) -> bool:
    scheme, _, value = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def reward_label(recipe: "Recipe") -> str:
    r = recipe.reward
    return f"{r.kind} {r.name_or_path or r.function or ''}".strip()


def serve(recipe: "Recipe", host: str = "127.0.0.1", port: int = 5000, token_env: str | None = None,
          environ: Mapping[str, str] = os.environ, max_body_mb: float = DEFAULT_MAX_BODY_MB) -> None:
    """Serve `recipe.reward` until Ctrl-C (SIGINT) or SIGTERM. ValueError for bad options, naming them."""
    if not max_body_mb > 0:
        raise ValueError(f"--max-body-mb must be > 0, got {max_body_mb:g}")
    if recipe.reward.kind == "remote":
        raise ValueError("reward.kind is 'remote': tea serve-rm serves a local reward (hf, lm_judge, rule or python); "
                         "give it the recipe whose reward section names the model or function")
    token = None
    if token_env:
        token = environ.get(token_env)
        if not token:
            raise ValueError(f"--token-env {token_env}: the environment variable is not set or empty")
    try:
        import starlette  # noqa: F401
        import uvicorn
    except ImportError:
        raise ValueError("tea serve-rm needs starlette and uvicorn: pip install 'teacli[serve]'") from None
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise ValueError(f"--host {host} --port {port}: cannot listen ({exc.strerror or exc})") from None
    _configure_logging()
    try:
        if token is None and not _is_loopback(host):
            log.warning("warning: listening on %s without --token-env: anyone who reaches port %d can use this reward", host, port)
        label = reward_label(recipe)
        reward = build_reward(recipe.reward)  # an hf reward model goes to reward.device, 'auto' = CUDA if present
        server = uvicorn.Server(uvicorn.Config(build_app(reward, token, label, max_body_mb), log_level="warning", access_log=False, lifespan="off"))
        shown = f"[{host}]" if ":" in host else host
        log.info("serving reward %s at http://%s:%d/get_reward%s (Ctrl-C stops)", label, shown, sock.getsockname()[1],
                 " (bearer token required)" if token else "")
        # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal: both end here.
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
        log.info("stopped")
    finally:
        sock.close()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _configure_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
