"""`tea judge` against a real chat-completions server on loopback, started by the tests.

The server reads the scenario and the prompt id from the judged conversation ("Question <id>.
scenario=<name>") and answers by protocol: the winner is the label whose response contains GOOD,
so the expected verdict per prompt is known whatever order the judge showed the responses in.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from teacli.eval import judge as J

KEY = "sk-test-5EcReT-0123456789"


# ------------------------------------------------------------------------------------------------
# The loopback server


class JudgeServer:
    """POST /v1/chat/completions on 127.0.0.1:<free port>; records every request."""

    def __init__(self):
        self.requests: list[dict] = []
        self.attempts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.inflight = self.max_inflight = 0
        self.delay = 0.0  # seconds every reply waits (to observe concurrency)
        self.override = None  # fn(pid, scenario, attempt) -> reply tuple or None
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/v1/chat/completions":
                    return self._send(404, {}, b"not found")
                with server.lock:
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                try:
                    status, headers, payload, sleep, hangup = server.reply(self, body)
                    time.sleep(sleep + server.delay)
                finally:
                    with server.lock:
                        server.inflight -= 1
                if hangup:
                    self.close_connection = True
                    return
                try:
                    self._send(status, headers, payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

            def _send(self, status, headers, payload: bytes):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def completion(content: str, model: str) -> bytes:
        return json.dumps({
            "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }).encode()

    def reply(self, handler, body):
        user = body["messages"][-1]["content"]
        pid = re.search(r"Question (\S+)\.", user).group(1)
        scenario = re.search(r"scenario=(\w+)", user).group(1)
        with self.lock:
            attempt = self.attempts[pid] = self.attempts.get(pid, 0) + 1
            self.requests.append({"pid": pid, "t": time.monotonic(), "auth": handler.headers.get("Authorization"), "body": body})
        if self.override and (r := self.override(pid, scenario, attempt)) is not None:
            return r
        a = re.search(r"<response_A>\n(.*?)\n</response_A>", user, re.S).group(1)
        label = "A" if "GOOD" in a else "B"
        verdict = json.dumps({"winner": label, "confidence": 0.8, "reason": f"{label} is the GOOD one"})
        ok = (200, {"Content-Type": "application/json"}, self.completion(verdict, body["model"]), 0.0, False)
        if scenario == "fenced":
            content = f"Sure. Here is my verdict:\n```json\n{verdict}\n```\nBoth were decent."
            return (200, {}, self.completion(content, body["model"]), 0.0, False)
        if scenario == "prose":
            content = f"<think>compare {{carefully}}</think>After comparing, my answer is {verdict} -- final."
            return (200, {}, self.completion(content, body["model"]), 0.0, False)
        if scenario == "ratelimited" and attempt == 1:
            return (429, {"Retry-After": "1"}, b'{"error": "rate limited"}', 0.0, False)
        if scenario == "fail500" or (scenario == "fail500_once" and attempt == 1):
            return (500, {}, b'{"error": "internal"}', 0.0, False)
        if scenario == "slow" and attempt == 1:
            return (*ok[:3], 4.0, False)  # past the 2 s timeout of the test that uses it
        if scenario == "hangup" and attempt == 1:
            return (*ok[:3], 0.0, True)
        if scenario == "html" and attempt == 1:
            return (200, {"Content-Type": "text/html"}, b"<html>gateway hiccup</html>", 0.0, False)
        if scenario == "malformed":
            return (200, {}, self.completion("Both responses are fine; I cannot decide.", body["model"]), 0.0, False)
        return ok


@pytest.fixture
def server():
    s = JudgeServer()
    yield s
    s.close()


# ------------------------------------------------------------------------------------------------
# Run directories, written the way `tea eval-bon` writes them


def write_run(root: Path, name: str, split: str, m: int, prompts: dict[str, str], samples: dict[str, list[tuple[str, float]]]) -> Path:
    """A finished evaluation: prompts, records, and the bon.json that `tea eval-bon` writes last."""
    from teacli.eval.bon import bon_summary, rewards_matrix

    run = root / name
    (run / "eval").mkdir(parents=True)
    with open(run / "eval" / f"{split}.prompts.jsonl", "w") as f:
        for pid, text in prompts.items():
            f.write(json.dumps({"prompt_id": pid, "messages": [{"role": "user", "content": text}]}) + "\n")
    records = [{"prompt_id": pid, "sample": i, "response": response, "reward": reward, "tokens": 5}
               for pid, rows in samples.items() for i, (response, reward) in enumerate(rows)]
    (run / "eval" / f"{split}-M{m}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    bon = bon_summary(rewards_matrix(records, list(samples), m), list(samples), split, m, 2)
    (run / "eval" / f"{split}-M{m}.bon.json").write_text(json.dumps(bon))
    return run


def make_pair(root: Path, scenarios: list[str], n: int = 4, m: int = 8):
    """Runs 'tea' and 'grpo' over the same prompts; returns (run_a, run_b, expected winner per prompt).

    In each run the bo<n> pick is sample 1 (reward 0.9; sample 3 ties it and loses on index). A sample
    beyond n has a higher reward and says GOOD, so a selection that looks past n would be caught.
    """
    prompts = {f"p{i:02d}": f"Question p{i:02d}. scenario={s}" for i, s in enumerate(scenarios)}
    expected, samples_a, samples_b = {}, {}, {}
    for i, pid in enumerate(prompts):
        a_good = i % 3 != 0
        expected[pid] = "self" if a_good else "other"
        for samples, run, good, size in ((samples_a, "tea", a_good, m), (samples_b, "grpo", not a_good, 2 * m)):
            rows = [(f"{run} {pid} s{j} plain", 0.1 * j / size) for j in range(size)]
            rows[1] = (f"{run} {pid} s1 " + ("GOOD" if good else "meh"), 0.9)
            rows[3] = (f"{run} {pid} s3 tie", 0.9)
            rows[n] = (f"{run} {pid} s{n} beyond GOOD", 5.0)
            samples[pid] = rows
    prompts_a = {**prompts, "onlyA": "Question onlyA. scenario=normal"}
    samples_a["onlyA"] = [("x", 0.0)] * m
    prompts_b = {**prompts, "onlyB1": "Question onlyB1. scenario=normal", "onlyB2": "Question onlyB2. scenario=normal"}
    samples_b["onlyB1"] = samples_b["onlyB2"] = [("y", 0.0)] * (2 * m)
    run_a = write_run(root, "tea", "core", m, prompts_a, samples_a)
    (run_a / "eval" / "core-M2.jsonl").write_text("")  # too few samples for bo4: skipped, M8 chosen
    run_b = write_run(root, "grpo", "core", 2 * m, prompts_b, samples_b)
    return run_a, run_b, expected


def fast_config(url: str, **kw) -> J.JudgeConfig:
    return J.JudgeConfig(**{"model": "judge-test", "base_url": url, "concurrency": 4, "timeout_s": 0.5, "max_attempts": 3,
                            "backoff_s": 0.01, "backoff_max_s": 0.05, **kw})


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------------------------------------
# End to end through the server


def test_scenarios_mapping_retries_invalid_and_secrecy(tmp_path, server, caplog):
    caplog.set_level(logging.DEBUG)
    scenarios = ["normal"] * 6 + ["fenced", "prose", "ratelimited", "fail500_once", "slow", "malformed", "hangup", "html"]
    run_a, run_b, expected = make_pair(tmp_path, scenarios)
    # 2 s: a reply of a loaded 2-core machine stays within it (0.5 s timed out ordinary replies there), the slow one not
    summary = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url, timeout_s=2.0), api_key=KEY)

    path = run_a / "judge" / "grpo-bo4.jsonl"
    assert summary.path == path
    records = read(path)
    by_pid = {r["prompt_id"]: r for r in records}
    assert [r["prompt_id"] for r in records] == list(expected)  # prompt order, common prompts only
    assert (summary.only_self, summary.only_other) == (1, 2)

    invalid = {"p11"}  # malformed: a reply that never parses
    for pid, r in by_pid.items():
        assert r["first"] == J.first_shown(0, pid)
        if pid in invalid:
            assert r["winner"] == "invalid" and r["confidence"] is None and r["attempts"] == 3
        else:
            assert r["winner"] == expected[pid], pid
            assert r["judge_winner"] == ("A" if (r["first"] == "self") == (expected[pid] == "self") else "B")
            assert r["confidence"] == 0.8 and "GOOD" in r["reason"]
        assert (r["self_sample"], r["other_sample"], r["self_file"], r["other_file"]) == (1, 1, "core-M8.jsonl", "core-M16.jsonl")
    assert {r["first"] for r in records} == {"self", "other"}  # the order really is randomized
    assert by_pid["p09"]["attempts"] == 2 and server.attempts["p09"] == 2  # a 500, then a verdict
    assert "unparseable" in by_pid["p11"]["error"] and "cannot decide" in by_pid["p11"]["raw"]
    assert by_pid["p10"]["attempts"] == 2 and by_pid["p12"]["attempts"] == 2 and by_pid["p13"]["attempts"] == 2  # slow / hangup / html

    # The judge saw each run's bo4 pick under the label the record names.
    for req in server.requests:
        user = req["body"]["messages"][1]["content"]
        shown_a = re.search(r"<response_A>\n(.*?)\n</response_A>", user, re.S).group(1)
        assert shown_a.startswith("tea " if by_pid[req["pid"]]["first"] == "self" else "grpo ")
        assert " s1 " in shown_a and "beyond" not in user

    # 429 then success, after waiting the server's Retry-After (1 s), not the 10 ms backoff.
    t = [r["t"] for r in server.requests if r["pid"] == "p08"]
    assert len(t) == 2 and t[1] - t[0] >= 0.95

    n_valid = len(expected) - 1
    wins = sum(expected[p] == "self" for p in expected if p not in invalid)
    assert (summary.wins, summary.losses, summary.invalid) == (wins, n_valid - wins, 1)
    assert summary.win_rate == pytest.approx(wins / n_valid)
    assert summary.requests == len(server.requests) and summary.cache_hits == 0

    # The key went in the Authorization header only.
    assert {r["auth"] for r in server.requests} == {f"Bearer {KEY}"}
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f
    assert KEY not in caplog.text

    # Rerunning costs nothing; --retry-invalid judges only the invalid pairs again.
    before = len(server.requests)
    again = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url), api_key=KEY)
    assert len(server.requests) == before and again.kept == len(expected) and again.judged == 0
    assert read(path) == records
    server.override = lambda pid, scenario, attempt: None if scenario != "malformed" else (
        200, {}, server.completion('{"winner": "B", "confidence": "0.6", "reason": "r"}', "judge-test"), 0.0, False)
    retried = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url, retry_invalid=True), api_key=KEY)
    assert sorted({r["pid"] for r in server.requests[before:]}) == ["p11"]
    assert retried.judged == 1 and retried.invalid == 0
    p11 = {r["prompt_id"]: r for r in read(path)}["p11"]
    assert p11["judge_winner"] == "B" and p11["confidence"] == 0.6
    assert p11["winner"] == ("other" if p11["first"] == "self" else "self")


def test_cache_makes_rerun_free_and_concurrency_is_bounded(tmp_path, server):
    run_a, run_b, expected = make_pair(tmp_path, ["normal"] * 12)
    server.delay = 0.1
    config = fast_config(server.url, concurrency=3)
    first = J.judge_runs(run_a, run_b, 4, split="core", config=config)  # loopback: no key needed
    assert server.max_inflight == 3
    assert {r["auth"] for r in server.requests} == {None}
    path = first.path
    records = read(path)
    path.unlink()
    n = len(server.requests)
    second = J.judge_runs(run_a, run_b, 4, split="core", config=config)
    assert len(server.requests) == n  # the server saw no new request
    assert second.cache_hits == 12 and second.requests == 0
    assert [{**r, "cached": False, "attempts": 1} for r in read(path)] == records
    assert all(r["cached"] for r in read(path))
    assert (second.wins, second.losses) == (first.wins, first.losses) == (8, 4)


def test_resume_after_partial_output(tmp_path, server):
    run_a, run_b, expected = make_pair(tmp_path, ["normal"] * 10)
    config = fast_config(server.url)
    path = J.judge_runs(run_a, run_b, 4, split="core", config=config).path
    full = read(path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:4]) + lines[4][:25])  # interrupted mid-line
    (run_a / "judge" / J.CACHE_FILE).unlink()
    n = len(server.requests)
    resumed = J.judge_runs(run_a, run_b, 4, split="core", config=config)
    assert sorted(r["pid"] for r in server.requests[n:]) == [r["prompt_id"] for r in full[4:]]
    assert resumed.kept == 4 and resumed.judged == 6
    assert read(path)[:4] == full[:4]
    assert [r["winner"] for r in read(path)] == [r["winner"] for r in full]

    with pytest.raises(J.JudgeError, match="seed 0.*seed 1"):
        J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url, seed=1))


def test_an_unfinished_evaluation_is_refused_naming_the_run(tmp_path, server):
    """Records of some prompts and no bon.json (eval-bon stopped mid-way): the judge would compare part of
    the prompts as if it were the evaluation, so it refuses, as `tea report` does."""
    from typer.testing import CliRunner

    from teacli.cli import app

    run_a, run_b, _ = make_pair(tmp_path, ["normal"] * 6)
    records = run_a / "eval" / "core-M8.jsonl"
    records.write_text("".join(records.read_text().splitlines(keepends=True)[: 3 * 8]))  # 3 of 7 prompts
    (run_a / "eval" / "core-M8.bon.json").unlink()
    with pytest.raises(J.JudgeError, match=rf"{re.escape(str(run_a))}: the evaluation core-M8.jsonl is unfinished \(no core-M8.bon.json\)"):
        J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url))
    result = CliRunner().invoke(app, ["judge", str(run_a), str(run_b), "--select", "bo4", "--split", "core", "--base-url", server.url])
    assert result.exit_code == 2 and "unfinished" in result.output and f"tea eval-bon {run_a} --split core --n 8" in result.output
    assert server.requests == [] and not (run_a / "judge").exists()


def test_a_second_judge_on_the_same_output_stops_and_sends_nothing(tmp_path, server):
    run_a, run_b, expected = make_pair(tmp_path, ["normal"] * 6)
    server.delay = 0.3
    config = fast_config(server.url, concurrency=1, timeout_s=10.0)
    first: dict = {}
    thread = threading.Thread(target=lambda: first.update(summary=J.judge_runs(run_a, run_b, 4, split="core", config=config)))
    thread.start()
    try:
        deadline = time.time() + 60
        while not server.requests and time.time() < deadline:
            time.sleep(0.01)
        with pytest.raises(J.JudgeError, match=r"another `tea judge` is writing .*grpo-bo4.jsonl"):
            J.judge_runs(run_a, run_b, 4, split="core", config=config)
    finally:
        thread.join(timeout=60)
    assert sorted(r["pid"] for r in server.requests) == sorted(expected)  # every pair asked once
    assert first["summary"].judged == len(expected)
    assert {r["prompt_id"]: r["winner"] for r in read(first["summary"].path)} == expected
    assert not (run_a / "judge" / ".grpo-bo4.lock").exists()


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:  # bound, never listening, closed: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_unreachable_endpoint_stops_and_records_nothing(tmp_path, server):
    run_a, run_b, expected = make_pair(tmp_path, ["normal"] * 5)
    url = closed_port_url()
    with pytest.raises(J.JudgeUnavailable, match=rf"{url}/chat/completions: no reply after 3 attempt\(s\) \(connection error"):
        J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(url))
    path = run_a / "judge" / "grpo-bo4.jsonl"
    assert read(path) == [] and not (run_a / "judge" / J.CACHE_FILE).exists()  # no failure became a verdict
    again = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url))  # the endpoint is back
    assert (again.kept, again.judged, again.invalid) == (0, 5, 0)
    assert {r["prompt_id"]: r["winner"] for r in read(path)} == expected


def test_failing_endpoint_keeps_the_verdicts_it_got_and_a_rerun_judges_the_rest(tmp_path, server):
    run_a, run_b, expected = make_pair(tmp_path, ["normal"] * 5 + ["fail500"])
    with pytest.raises(J.JudgeUnavailable, match=r"no reply after 3 attempt\(s\) \(HTTP 500\)"):
        # timeout_s well above a loaded machine's reply time: the failure under test is the HTTP 500
        J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url, concurrency=1, timeout_s=10.0))
    path = run_a / "judge" / "grpo-bo4.jsonl"
    first = read(path)
    assert server.attempts["p05"] == 3 and [r["prompt_id"] for r in first] == ["p00", "p01", "p02", "p03", "p04"]
    assert all(r["winner"] == expected[r["prompt_id"]] for r in first)  # no invalid record for p05
    server.override = lambda pid, scenario, attempt: None if scenario != "fail500" else (
        200, {}, server.completion('{"winner": "A", "confidence": 0.9, "reason": "r"}', "judge-test"), 0.0, False)
    n = len(server.requests)
    again = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url))
    assert [r["pid"] for r in server.requests[n:]] == ["p05"] and (again.kept, again.judged, again.invalid) == (5, 1, 0)
    assert read(path)[:5] == first and read(path)[5]["judge_winner"] == "A"


def test_transport_failures_recorded_by_an_older_version_are_judged_again(tmp_path, server):
    run_a, run_b, expected = make_pair(tmp_path, ["normal"] * 3 + ["malformed"])
    path = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url)).path
    records = read(path)
    assert [r["winner"] for r in records][3] == "invalid" and records[3]["error"].startswith("unparseable reply")
    for r, error in zip(records, ["HTTP 503", "timeout after 120 s", "connection error: ConnectError: refused"]):
        r.update(winner="invalid", confidence=None, reason=None, judge_winner=None, error=error)  # as 0.1.0 wrote them
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_a / "judge" / J.CACHE_FILE).unlink()
    n = len(server.requests)
    again = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url))
    assert sorted({r["pid"] for r in server.requests[n:]}) == ["p00", "p01", "p02"]  # the unparseable reply is kept
    assert (again.kept, again.judged, again.invalid) == (1, 3, 1)
    assert [r["winner"] for r in read(path)][:3] == [expected[p] for p in ("p00", "p01", "p02")]


def test_cli_exits_1_naming_the_url_when_the_endpoint_is_down(tmp_path):
    import subprocess
    import sys

    run_a, run_b, _ = make_pair(tmp_path, ["normal"] * 3)
    url = closed_port_url()
    proc = subprocess.run(
        [sys.executable, "-m", "teacli.cli", "judge", str(run_a), str(run_b), "--select", "bo4", "--split", "core",
         "--base-url", url, "--max-attempts", "2", "--timeout", "2"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1 and proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {url}/chat/completions: no reply after 2 attempt(s)"), proc.stderr
    assert read(run_a / "judge" / "grpo-bo4.jsonl") == []


def test_fatal_status_stops_with_a_clear_error(tmp_path, server):
    run_a, run_b, _ = make_pair(tmp_path, ["normal"] * 3)
    server.override = lambda pid, scenario, attempt: (401, {}, b'{"error": "bad key"}', 0.0, False)
    with pytest.raises(J.JudgeError, match="HTTP 401 .*API key") as exc:
        J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url), api_key=KEY)
    assert KEY not in str(exc.value)
    assert (run_a / "judge" / "grpo-bo4.jsonl").read_text() == ""


def test_cli_prints_the_paper_table_and_needs_a_key_for_remote_endpoints(tmp_path, server, monkeypatch):
    from typer.testing import CliRunner

    from teacli.cli import app

    run_a, run_b, _ = make_pair(tmp_path, ["normal"] * 6)
    monkeypatch.setenv("JUDGE_TEST_KEY", KEY)
    args = ["judge", str(run_a), str(run_b), "--select", "bo4", "--split", "core", "--model", "judge-test",
            "--base-url", server.url, "--api-key-env", "JUDGE_TEST_KEY", "--concurrency", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "4–2" in result.output and "66.7%" in result.output and "grpo-bo4.jsonl" in result.output
    assert "3 prompt(s) dropped" in result.output
    assert {r["auth"] for r in server.requests} == {f"Bearer {KEY}"}

    monkeypatch.delenv("JUDGE_TEST_KEY")
    result = CliRunner().invoke(app, args[:-4] + ["--base-url", "https://judge.example.invalid/v1", "--api-key-env", "JUDGE_TEST_KEY"])
    assert result.exit_code == 2 and "JUDGE_TEST_KEY is not set" in result.output

    result = CliRunner().invoke(app, ["judge", str(run_a), str(run_b), "--select", "bo64", "--split", "core", "--base-url", server.url])
    assert result.exit_code == 2 and "core-M8.jsonl (M=8)" in result.output and "M ≥ 64" in result.output


# ------------------------------------------------------------------------------------------------
# Pieces


@pytest.mark.parametrize(
    "text, verdict",
    [
        ('{"winner": "A", "confidence": 0.9, "reason": "more accurate"}', ("A", 0.9, "more accurate")),
        ('```json\n{"winner": "b", "confidence": 1, "reason": "x"}\n```', ("B", 1.0, "x")),
        ('Verdict:\n```\n{"Winner": "Response B", "confidence": "0.75", "reason": "y"}\n```', ("B", 0.75, "y")),
        ('Thinking about {braces}... {"winner": "A", "confidence": 0.6, "reason": "z"} Done.', ("A", 0.6, "z")),
        ('<think>{"winner": "B", "confidence": 0.5}</think>{"winner": "A", "confidence": 0.7}', ("A", 0.7, "")),
    ],
)
def test_parse_verdict_tolerates_wrappers(text, verdict):
    v = J.parse_verdict(text)
    assert (v.winner, v.confidence, v.reason) == verdict


@pytest.mark.parametrize(
    "text, message",
    [
        ("The first one is better.", "no JSON object"),
        ('{"winner": "tie", "confidence": 0.5, "reason": "same"}', "winner must be"),
        ('{"winner": "A", "confidence": 7, "reason": "x"}', r"in \[0, 1\]"),
        ('{"winner": "A", "confidence": "high", "reason": "x"}', "confidence must be a number"),
        ('{"winner": "A", "reason": "x"}', "confidence must be a number"),
        ("", "empty"),
    ],
)
def test_parse_verdict_never_guesses(text, message):
    with pytest.raises(J.VerdictError, match=message):
        J.parse_verdict(text)


def test_selection_is_max_reward_of_first_n_with_lowest_index_on_ties(tmp_path):
    run = write_run(tmp_path, "r", "s", 6, {"p": "q"}, {"p": [("a", 0.1), ("b", 0.5), ("c", 0.2), ("d", 0.5), ("e", 9.0), ("f", 0.0)]})
    path, m = J.find_eval_file(run, "s", 4)
    assert m == 6
    assert J.select_best(path, 4)["p"] == J.Selected("p", 1, "b", 0.5)
    assert J.select_best(path, 6)["p"].sample == 4
    with pytest.raises(J.JudgeError, match="lack some of samples 0..6"):
        J.select_best(path, 7)
    with pytest.raises(J.JudgeError, match="no other-M<M>.jsonl.*s-M6.jsonl"):
        J.find_eval_file(run, "other", 4)
    assert J.parse_select("bo128") == 128
    with pytest.raises(J.JudgeError, match="bo128"):
        J.parse_select("best128")


def test_api_key_order_and_presentation_order():
    assert J.resolve_api_key("https://api.deepseek.com/v1", "K", {"K": "abc"}) == "abc"
    with pytest.raises(J.JudgeError, match="K is not set"):
        J.resolve_api_key("https://api.deepseek.com/v1", "K", {})
    for local in ("http://localhost:8000/v1", "http://127.0.0.1:8000/v1", "http://[::1]:8000/v1", "http://10.1.2.3:8000/v1"):
        assert J.resolve_api_key(local, "K", {}) is None
    assert J.completions_url("http://h/v1/") == "http://h/v1/chat/completions"

    coins = [J.first_shown(0, f"p{i}") for i in range(400)]
    assert coins == [J.first_shown(0, f"p{i}") for i in range(400)]
    assert 160 < coins.count("self") < 240 and coins != [J.first_shown(1, f"p{i}") for i in range(400)]
    # the backoff and Retry-After rules are teacli.http's, shared with the remote reward: tests/test_http.py


def test_cli_defaults_are_the_library_defaults():
    import typer.main

    from teacli.cli import app

    cmd = typer.main.get_command(app).commands["judge"]
    defaults = {p.name: p.default for p in cmd.params}
    config = J.JudgeConfig()
    assert (defaults["model"], defaults["base_url"], defaults["api_key_env"], defaults["split"]) == (
        J.DEFAULT_MODEL, J.DEFAULT_BASE_URL, J.DEFAULT_API_KEY_ENV, J.DEFAULT_SPLIT)
    assert (defaults["concurrency"], defaults["seed"], defaults["timeout"], defaults["max_attempts"]) == (
        config.concurrency, config.seed, config.timeout_s, config.max_attempts)


def test_verdicts_are_never_reused_across_endpoints(tmp_path, server):
    """Two servers that serve the same model name are two judges: the cache is keyed by the endpoint
    too, and a records file made at one endpoint is not resumed at another (issue 22, item 15)."""
    run_a, run_b, expected = make_pair(tmp_path, ["normal"] * 4)
    first = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url))
    assert len(server.requests) == 4 and {r["base_url"] for r in read(first.path)} == {server.url}
    other = JudgeServer()
    try:
        with pytest.raises(J.JudgeError, match=rf"holds verdicts of model judge-test at {server.url}; this call asks {other.url}"):
            J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(other.url))
        first.path.unlink()  # the cache alone must not answer for the other endpoint either
        second = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(other.url))
        assert len(other.requests) == 4 and second.cache_hits == 0 and second.requests == 4
    finally:
        other.close()
    first.path.unlink()
    again = J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url))  # the first endpoint's replies are cached
    assert again.cache_hits == 4 and len(server.requests) == 4


def test_401_names_the_api_key_variable(tmp_path, server):
    run_a, run_b, _ = make_pair(tmp_path, ["normal"] * 2)
    server.override = lambda pid, scenario, attempt: (401, {}, b'{"error": "bad key"}', 0.0, False)
    with pytest.raises(J.JudgeError, match=r"HTTP 401 \(check the API key in \$MY_JUDGE_KEY; --api-key-env names another variable\)"):
        J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url, api_key_env="MY_JUDGE_KEY"), api_key=KEY)
    with pytest.raises(J.JudgeError, match=r"HTTP 401 \(no API key was sent: \$MY_JUDGE_KEY is not set"):
        J.judge_runs(run_a, run_b, 4, split="core", config=fast_config(server.url, api_key_env="MY_JUDGE_KEY"))


def test_cli_exits_1_when_every_verdict_is_invalid(tmp_path, server):
    """A judge whose every reply fails to parse is a failed job, not a 0–0 result: exit 1, one line naming the file."""
    from typer.testing import CliRunner

    from teacli.cli import app

    run_a, run_b, _ = make_pair(tmp_path, ["malformed"] * 3)
    result = CliRunner().invoke(app, ["judge", str(run_a), str(run_b), "--select", "bo4", "--split", "core", "--model", "judge-test",
                                      "--base-url", server.url, "--max-attempts", "1"])
    assert result.exit_code == 1, result.output
    path = run_a / "judge" / "grpo-bo4.jsonl"
    last = " ".join(result.stderr.strip().splitlines()[-1].split())
    assert last.startswith("error: every verdict was invalid (3 of 3 pairs") and f"recorded in {path}" in last, result.stderr
    assert "0–0" not in result.stdout and [r["winner"] for r in read(path)] == ["invalid"] * 3
