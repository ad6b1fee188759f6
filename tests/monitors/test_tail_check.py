"""The Gaussian-tail check while training: the per-step statistic, the once-only warning, and a real run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from tiny_lm import tea_env, tiny_recipe, write_recipe  # noqa: E402

from teacli.advantages.tail import tail_check_stats  # noqa: E402
from teacli.monitors.tail_check import WARNING_FILE, TailCheck  # noqa: E402


def gaussian_group(m: int, rng) -> np.ndarray:
    return rng.permutation(2.0 + 0.3 * norm.ppf((np.arange(1, m + 1) - 0.5) / m))


def test_step_statistic_counts_flat_tails_as_zero():
    rng = np.random.default_rng(0)
    g = [gaussian_group(16, rng) for _ in range(2)]
    flat = np.array([0.0] * 10 + [1.0] * 6)  # ranks 14-16 (the range at m = 16) all equal 1
    assert tail_check_stats(np.stack([g[0], g[1], flat])) == pytest.approx({"tail_r2_median": 1.0, "tail_flat_frac": 1 / 3})
    assert tail_check_stats(np.stack([g[0], flat, flat])) == pytest.approx({"tail_r2_median": 0.0, "tail_flat_frac": 2 / 3})
    assert tail_check_stats(np.zeros((4, 8))) == {}  # m = 8: two points in [0.80, 0.99], no check


def test_tensor_input():
    import torch

    rng = np.random.default_rng(1)
    rewards = torch.from_numpy(np.stack([gaussian_group(64, rng) for _ in range(3)])).float()
    assert tail_check_stats(rewards)["tail_r2_median"] == pytest.approx(1.0, abs=1e-6)


def test_warns_once_after_the_window_and_not_again_on_resume(tmp_path):
    notes = []
    check = TailCheck(0.8, 3, tmp_path, notes.append)
    assert check.observe({"step": 1, "tail_r2_median": 0.5}) is None  # window not full yet
    assert check.observe({"step": 2, "tail_r2_median": 0.95}) is None
    text = check.observe({"step": 3, "tail_r2_median": 0.6, "tail_flat_frac": 0.5})  # median(0.5, 0.95, 0.6) = 0.6
    assert text and "0.600" in text and "advantage.tail_check_r2=0.8" in text and "Gaussian upper tail" in text
    assert len(notes) == 1 and (tmp_path / WARNING_FILE).read_text().startswith("step 3: tail check")
    assert check.observe({"step": 4, "tail_r2_median": 0.1}) is None and len(notes) == 1
    resumed = TailCheck(0.8, 3, tmp_path, notes.append)
    for step in range(5, 9):
        assert resumed.observe({"step": step, "tail_r2_median": 0.1}) is None
    assert len(notes) == 1
    healthy = TailCheck(0.8, 2, tmp_path / "other", notes.append)
    (tmp_path / "other").mkdir()
    for step in range(1, 6):
        assert healthy.observe({"step": step, "tail_r2_median": 0.9 if step % 2 else 0.85}) is None
    off = TailCheck(None, 1, tmp_path / "other", notes.append)
    assert off.observe({"step": 1, "tail_r2_median": 0.0}) is None
    assert TailCheck(0.8, 1, tmp_path / "other", notes.append).observe({"step": 1}) is None  # m too small: no value


def test_a_real_run_records_the_statistic_and_warns(tmp_path):
    from tiny_lm import make_causal_lm, make_tokenizer, save

    from teacli.data.prepare import prepare

    tok = make_tokenizer()
    save(make_causal_lm(tok), tok, tmp_path / "policy")
    prepare("builtin", tmp_path / "data")
    # threshold 1.0: a sampled tail is never exactly on a line, so the check must fire after the window.
    recipe = tiny_recipe(tmp_path / "policy", tmp_path / "data", name="tail", rollout__group_size=16, rollout__batch_size=32,
                         optim__steps=2, optim__micro_batch_size=16, kl__beta=0.0, backend__zero_stage=0,
                         checkpoint__save_every=2, validation={"enabled": False},
                         advantage={"name": "tea", "params": {}, "tail_check_r2": 1.0, "tail_check_window": 2})
    write_recipe(tmp_path / "recipe.yaml", recipe)
    cmd = [sys.executable, "-m", "teacli.cli", "train", str(tmp_path / "recipe.yaml"), "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=tea_env(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    for rec in metrics:
        assert 0.0 <= rec["tail_r2_median"] <= 1.0 and 0.0 <= rec["tail_flat_frac"] <= 1.0
    warning = (tmp_path / "run" / WARNING_FILE).read_text()
    assert warning.startswith("step 2: tail check") and "tail check" in proc.stderr
