"""`tea serve-rm`: the request shapes it accepts (tea's and OpenRLHF's), its status codes, the bearer
token, an hf reward model served = the same model scored locally, and the real command on 127.0.0.1
(start, serve, Ctrl-C, bad options)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from rewards_for_tests import length_reward  # noqa: E402
from tiny_lm import free_port, make_reward_model, make_tokenizer, tea_env  # noqa: E402

from teacli.rewards import FunctionReward  # noqa: E402
from teacli.rewards.hf import HFRewardModel  # noqa: E402
from teacli.rewards.server import BadRequest, build_app, parse_request, score_request  # noqa: E402
from teacli.types import Prompt  # noqa: E402

TEA_BODY = {
    "query": ["ignored by tea's server when messages are present"] * 2,
    "prompts": ["x", "y"],
    "labels": [{"constraints": []}, None],
    "prompt_ids": ["a", "b"],
    "messages": [[{"role": "user", "content": "hi"}], [{"role": "system", "content": "s"}, {"role": "user", "content": "yo"}]],
    "responses": ["the cat", "a dog ran"],
}


def test_parse_tea_and_openrlhf_requests():
    prompts, responses = parse_request(TEA_BODY, texts_ok=True)
    assert responses == ["the cat", "a dog ran"] and [p.id for p in prompts] == ["a", "b"]
    assert prompts[1].messages == ({"role": "system", "content": "s"}, {"role": "user", "content": "yo"})
    assert prompts[0].meta == {"constraints": []} and prompts[1].meta == {}

    openrlhf = {"query": ["<s>Q: hi A: the cat", "<s>Q: yo A: a dog"], "prompts": ["<s>Q: hi A: ", "<s>Q: yo A: "], "labels": ["4", None]}
    assert parse_request(openrlhf, texts_ok=True) == openrlhf["query"]  # a reward model scores the texts as sent
    prompts, responses = parse_request(openrlhf, texts_ok=False)
    assert responses == ["the cat", "a dog"]
    assert prompts[0].messages == ({"role": "user", "content": "<s>Q: hi A: "},) and prompts[0].meta == {"label": "4"}


@pytest.mark.parametrize("body,message", [
    ([1, 2], "must be a JSON object"),
    ({"prompts": ["a"]}, "expected tea's 'messages' and 'responses', or OpenRLHF's 'query'"),
    ({"query": "abc"}, "'query' must be a list of strings"),
    ({"responses": ["a", "b"], "messages": [[{"role": "user", "content": "q"}]]}, "'messages' must be a list of 2"),
    ({"responses": ["a"], "messages": [[{"role": "user"}]]}, r"messages\[0\] must be a non-empty list"),
    ({"responses": ["a"], "messages": [[{"role": "user", "content": "q"}]], "labels": []}, "'labels' must be a list of 1"),
    ({"query": ["a b"], "prompts": ["x"]}, r"query\[0\] does not start with prompts\[0\]"),
    ({"query": ["a b"]}, "send 'prompts' with 'query'"),
])
def test_malformed_requests_name_the_problem(body, message):
    with pytest.raises(BadRequest, match=message):
        parse_request(body, texts_ok=False)


@pytest.fixture(scope="module")
def rm():
    tok = make_tokenizer()
    return HFRewardModel(make_reward_model(tok), tok, batch_size=2)


def test_a_served_reward_model_scores_exactly_like_the_local_one(rm):
    prompts = [Prompt(id=i, messages=tuple(m)) for i, m in zip(TEA_BODY["prompt_ids"], TEA_BODY["messages"])]
    local = rm.score(prompts, ["the cat", "a dog ran"]).tolist()
    assert score_request(rm, TEA_BODY) == pytest.approx(local, abs=1e-6)
    # OpenRLHF sends the whole conversation as text; rendered with the RM's template it is the same input.
    texts = [rm.tokenizer.apply_chat_template([*p.messages, {"role": "assistant", "content": r}], tokenize=False)
             for p, r in zip(prompts, ["the cat", "a dog ran"])]
    assert score_request(rm, {"query": texts}) == pytest.approx(local, abs=1e-6)


def test_statuses_and_the_bearer_token(rm):
    from starlette.testclient import TestClient

    def failing(prompts, responses):
        raise RuntimeError("CUDA out of memory (pretend)")

    def nan(prompts, responses):
        return [float("nan")] * len(responses)

    with TestClient(build_app(FunctionReward(length_reward), token="s3cret")) as c:
        assert c.get("/health").json()["status"] == "ok"
        assert c.post("/get_reward", json=TEA_BODY).status_code == 401
        assert c.post("/get_reward", json=TEA_BODY, headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = c.post("/get_reward", json=TEA_BODY, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["rewards"] == pytest.approx(length_reward(None, TEA_BODY["responses"]))
        assert ok.json()["scores"] == ok.json()["rewards"]
        bad = c.post("/get_reward", content=b"{not json", headers={"Authorization": "Bearer s3cret"})
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
    with TestClient(build_app(FunctionReward(nan))) as c:
        r = c.post("/get_reward", json=TEA_BODY)
        assert r.status_code == 422 and "NaN for prompt 'a'" in r.json()["error"]  # checked as in training; not retried
    with TestClient(build_app(FunctionReward(failing))) as c:
        r = c.post("/get_reward", json=TEA_BODY)
        assert r.status_code == 500 and "CUDA out of memory" in r.json()["error"]  # clients retry 5xx


# -- the real command ----------------------------------------------------------------------------


def start_server(recipe: Path, port: int, tmp: Path, *extra: str, **env: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "teacli.cli", "serve-rm", str(recipe), "--port", str(port), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tea_env(tmp, **env))


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("tea serve-rm did not come up")


def test_serve_rm_command(tmp_path):
    recipe = tmp_path / "rm.yaml"
    recipe.write_text("reward: {kind: python, function: rewards_for_tests:length_reward}\n")
    port = free_port()
    proc = start_server(recipe, port, tmp_path, "--token-env", "TEA_RM_TOKEN", TEA_RM_TOKEN="s3cret")
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        url = f"http://127.0.0.1:{port}/get_reward"
        assert httpx.post(url, json=TEA_BODY).status_code == 401
        r = httpx.post(url, json=TEA_BODY, headers={"Authorization": "Bearer s3cret"})
        assert r.json()["rewards"] == pytest.approx(length_reward(None, TEA_BODY["responses"]))

        # The port is taken now: a second server is a one-line error.
        second = subprocess.run([sys.executable, "-m", "teacli.cli", "serve-rm", str(recipe), "--port", str(port)],
                                capture_output=True, text=True, env=tea_env(tmp_path), timeout=120)
        assert second.returncode == 2 and f"--port {port}: cannot listen" in second.stderr and "Traceback" not in second.stderr
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    lines = err.strip().splitlines()
    assert "serving reward python rewards_for_tests:length_reward at" in lines[0] and "bearer token required" in lines[0]
    requests = [line for line in lines if "POST /get_reward" in line]
    assert len(requests) == 2 and " 401 " in requests[0] and " 200 2 rows " in requests[1]  # one line per request
    assert lines[-1].endswith("stopped") and out == ""


@pytest.mark.parametrize("content,extra,env,message", [
    ("reward: {kind: remote, url: 'http://127.0.0.1:1/get_reward'}\n", (), {}, "tea serve-rm serves a local reward"),
    ("reward: {kind: rule}\n", ("--token-env", "TEA_RM_TOKEN_UNSET"), {}, "--token-env TEA_RM_TOKEN_UNSET: the environment variable is not set"),
    ("reward: {kind: python}\n", (), {}, "reward.function: kind 'python' needs a dotted path"),
])
def test_serve_rm_bad_options_are_one_line_errors(tmp_path, content, extra, env, message):
    recipe = tmp_path / "rm.yaml"
    recipe.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "teacli.cli", "serve-rm", str(recipe), "--port", str(free_port()), *extra],
                          capture_output=True, text=True, env=tea_env(tmp_path, **env), timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_deep_nesting_is_400_and_an_oversized_body_is_413_unread():
    """A body nested 200,000 deep made json recurse out (500, RecursionError); a body over --max-body-mb
    is refused as soon as it passes the limit, whether or not it declares its length (issue 22, item 10)."""
    from starlette.testclient import TestClient

    deep = b'{"responses": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with TestClient(build_app(FunctionReward(length_reward), max_body_mb=8)) as c:
        r = c.post("/get_reward", content=deep)
        assert r.status_code == 400 and "nested too deeply" in r.json()["error"]
        assert c.post("/get_reward", json=TEA_BODY).status_code == 200

    def chunks():  # no Content-Length: chunked transfer, 64 KiB at a time
        for _ in range(64):
            yield b" " * 65536

    with TestClient(build_app(FunctionReward(length_reward), max_body_mb=0.25)) as c:
        r = c.post("/get_reward", content=b" " * (2**20))  # declares 1 MiB
        assert r.status_code == 413 and "larger than 0.25 MiB (tea serve-rm --max-body-mb)" in r.json()["error"]
        assert c.post("/get_reward", content=chunks()).status_code == 413
        assert c.post("/get_reward", json=TEA_BODY).status_code == 200  # small bodies still pass


def test_an_oversized_body_is_not_read_past_the_limit():
    """The test client buffers a streamed body itself, so the server's reader is driven directly: it
    stops at the first chunk past the limit, having held at most the limit plus one chunk."""
    import asyncio

    from teacli.rewards import server

    pulled = []

    class Streamed:
        headers: dict = {}  # no Content-Length

        async def stream(self):
            for _ in range(1000):
                pulled.append(65536)
                yield b" " * 65536

    with pytest.raises(server._TooLarge):
        asyncio.run(server._read_body(Streamed(), limit=2**20))
    assert len(pulled) == 2**20 // 65536 + 1


def test_max_body_mb_must_be_positive(tmp_path):
    recipe = tmp_path / "rm.yaml"
    recipe.write_text("reward: {kind: python, function: rewards_for_tests:length_reward}\n")
    proc = subprocess.run([sys.executable, "-m", "teacli.cli", "serve-rm", str(recipe), "--max-body-mb", "0"],
                          capture_output=True, text=True, env=tea_env(tmp_path), timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --max-body-mb must be > 0, got 0"
