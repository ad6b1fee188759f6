"""kind 'lm_judge' through the real CLI on tiny in-process models: `tea train` with a judge reward, `tea eval-bon`
of the run (its records' rewards are the judge's scores of their responses), `tea serve-rm` serving the judge
(its rewards are the local judge's), and a judge that will not load (one line naming the key, exit 2)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from test_remote_e2e import SPLIT, M, assets, jsonl, tea  # noqa: E402,F401  (assets: the tiny policy, prompts and split)
from test_server import wait_healthy  # noqa: E402
from tiny_lm import free_port, make_causal_lm, make_tokenizer, save, tea_env, tiny_recipe, write_recipe  # noqa: E402

from teacli.config import RewardConfig  # noqa: E402
from teacli.rewards import build_reward  # noqa: E402
from teacli.types import Prompt  # noqa: E402


@pytest.fixture(scope="module")
def judged(assets):
    """The shared tiny assets plus a judge: another tiny causal LM (not the policy)."""
    tok = make_tokenizer()
    save(make_causal_lm(tok, seed=1), tok, assets / "judge")
    return assets


def judge_section(judged: Path, **extra) -> dict:
    # The tiny vocabulary's words 'one' / 'two' are the verdicts ('Yes' and 'No' are both <unk> there).
    return {"kind": "lm_judge", "name_or_path": str(judged / "judge"), "judge_yes": "one", "judge_no": "two",
            "dtype": "float32", "batch_size": 5, **extra}


@pytest.mark.slow
def test_train_and_eval_bon_with_an_lm_judge(judged, tmp_path):
    recipe = write_recipe(tmp_path / "judge.yaml", tiny_recipe(
        judged / "policy", judged / "data", optim__steps=2, checkpoint__save_every=2, reward=judge_section(judged),
        eval={"split": SPLIT, "M": M, "score_batch_size": 4},
    ))
    run = tmp_path / "run"
    trained = tea(tmp_path, "train", str(recipe), "--run-dir", str(run))
    assert trained.returncode == 0, trained.stderr[-3000:]
    metrics = jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2] and all(m["reward_std"] > 0 for m in metrics)  # continuous scores
    evaluated = tea(tmp_path, "eval-bon", str(run))
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]

    # The records' rewards are the judge's log-odds of their responses, scored here in-process.
    records = jsonl(run / "eval" / f"{SPLIT}-M{M}.jsonl")
    prompts = {p["prompt_id"]: Prompt(id=p["prompt_id"], messages=tuple(p["messages"])) for p in jsonl(run / "eval" / f"{SPLIT}.prompts.jsonl")}
    assert len(records) == 3 * M
    reward = build_reward(RewardConfig(**judge_section(judged)), device="cpu")
    expected = reward.score([prompts[r["prompt_id"]] for r in records], [r["response"] for r in records])
    torch.testing.assert_close(torch.tensor([r["reward"] for r in records]), expected, atol=1e-4, rtol=1e-4)
    assert len(set(r["reward"] for r in records)) > len(records) // 2

    # Another question gives other rewards: resuming this evaluation with it is refused, nothing changed.
    before = (run / "eval" / f"{SPLIT}-M{M}.jsonl").read_text()
    other = tea(tmp_path, "eval-bon", str(run), "--set", "reward.judge_template='rate {prompt} and {response}'")
    assert other.returncode == 2 and "holds an evaluation with other settings (reward: on disk" in other.stderr, other.stderr[-2000:]
    assert "judge_template" in other.stderr and (run / "eval" / f"{SPLIT}-M{M}.jsonl").read_text() == before


def test_serve_rm_serves_the_judge(judged, tmp_path):
    recipe = tmp_path / "rm.yaml"
    recipe.write_text(json.dumps({"reward": judge_section(judged)}))  # JSON is YAML
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "teacli.cli", "serve-rm", str(recipe), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tea_env(tmp_path))
    body = {"messages": [[{"role": "user", "content": "what is the capital of france"}],
                         [{"role": "system", "content": "please answer"}, {"role": "user", "content": "a dog ran"}]],
            "responses": ["paris is the capital", "the dog ran in the park"], "prompt_ids": ["a", "b"]}
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc)
        reply = httpx.post(f"http://127.0.0.1:{port}/get_reward", json=body, timeout=60).json()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert f"serving reward lm_judge {judged / 'judge'} at" in err
    local = build_reward(RewardConfig(**judge_section(judged)), device="cpu")
    prompts = [Prompt(id=i, messages=tuple(m)) for i, m in zip(body["prompt_ids"], body["messages"])]
    assert reply["rewards"] == pytest.approx(local.score(prompts, body["responses"]).tolist(), abs=1e-4)


@pytest.mark.parametrize("section,message", [
    ({"name_or_path": "./no/such/judge"}, "error: reward.name_or_path: no such directory './no/such/judge'"),
    ({"judge_yes": "one two"}, "error: reward.judge_yes: 'one two' is 2 tokens for the tokenizer of judge"),
])
def test_a_bad_judge_stops_train_with_one_line(judged, tmp_path, section, message):
    recipe = write_recipe(tmp_path / "bad.yaml", tiny_recipe(judged / "policy", judged / "data", reward=judge_section(judged, **section)))
    proc = tea(tmp_path, "train", str(recipe), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), proc.stderr[-2000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
