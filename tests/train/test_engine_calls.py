"""The order in which `tea train` drives its rollout engine (teacli/rollout/base.py's protocol).

The vllm engine's default sleep (level 2) discards its weights, so after every `sleep()` the loop
must push weights (`load_weights`) before it wakes the engine or generates again. A recording
engine around the hf engine checks that on a real run with validation at start and at every
checkpoint (validation used to sleep, and the next step then generated without a push).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent

RECORDER = r"""
import json, sys
import teacli.rollout.factory as factory

real = factory.build_engine
log = open(sys.argv[1], "w")

def write(row):
    log.write(json.dumps(row) + "\n"); log.flush()

class Recorder:
    def __init__(self, engine):
        self.engine = engine
    def __getattr__(self, name):
        attr = getattr(self.engine, name)
        if name in ("generate", "load_weights", "sleep", "wake"):
            def call(*args, **kwargs):
                write({"call": name, **({"sequences": len(args[0]) * args[1]} if name == "generate" else {})})
                return attr(*args, **kwargs)
            return call
        return attr

def build(*args, **kwargs):
    import torch
    write({"call": "build", "max_sequences": kwargs.get("max_sequences"), "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled()})
    return Recorder(real(*args, **kwargs))

factory.build_engine = build
sys.argv = ["tea", *sys.argv[2:]]
from teacli.cli import main
main()
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """One recorded `tea train` for both tests: 3 steps, a checkpoint and a validation after each (and at start),
    validation asking for validation.prompts x validation.samples = 4 x 8 = 32 sequences, a step for 2 x 8 = 16.
    Returns the folder with run/ and calls.jsonl (every build, generate, load_weights, sleep and wake, in order)."""
    sys.path.insert(0, str(TESTS))
    from tiny_lm import make_assets, tea_env, tiny_recipe, write_recipe

    tmp = tmp_path_factory.mktemp("engine_calls")
    assets = make_assets(tmp / "assets")
    rec = write_recipe(tmp / "r.yaml", tiny_recipe(assets / "policy", assets / "data", optim__steps=3, checkpoint__save_every=1,
                                                   validation__samples=8))
    proc = subprocess.run(
        [sys.executable, "-c", RECORDER, str(tmp / "calls.jsonl"), "train", str(rec), "--run-dir", str(tmp / "run")],
        capture_output=True, text=True, env=tea_env(tmp), timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp


def test_every_sleep_is_followed_by_a_push_before_the_next_generation(recorded):
    seq = [row["call"] for row in map(json.loads, (recorded / "calls.jsonl").read_text().splitlines()) if row["call"] != "build"]
    validations = [json.loads(line)["step"] for line in (recorded / "run" / "validation.jsonl").read_text().splitlines()]
    assert validations == [0, 1, 2, 3]  # validation at start and after every step: the case that broke
    assert seq.count("sleep") == 3 and seq[0] == "load_weights"
    for i, name in enumerate(seq):
        if name == "sleep":
            following = [c for c in seq[i + 1 :] if c in ("load_weights", "wake", "generate")]
            assert following[:1] in (["load_weights"], []), (i, seq)


def test_the_engine_is_told_the_largest_generation_call_validation_included(recorded):
    """`rollout.kv_cache_gib: auto` sizes vLLM's KV cache to `max_sequences`, the most sequences one
    generate call asks for. Validation asks for validation.prompts x validation.samples in one call
    (here 4 x 8 = 32) where a step asks for prompts_per_step x group_size (2 x 8 = 16): the engine
    must be told 32, or validation outgrows the cache (it was told the step's 16)."""
    rows = [json.loads(line) for line in (recorded / "calls.jsonl").read_text().splitlines()]
    told = [r["max_sequences"] for r in rows if r["call"] == "build"]
    calls = [r["sequences"] for r in rows if r["call"] == "generate"]
    assert told == [4 * 8] and sorted(set(calls)) == [2 * 8, 4 * 8], rows  # the steps' calls and the validations'
    assert max(calls) <= told[0]


def test_the_run_allows_no_cudnn_attention(recorded):
    """backend.cudnn_attention (default false) reaches torch's switch before the engine and the models are built: the
    trainer's, the reference's and the reward model's forwards never pick cuDNN (whose plans are built per new shape)."""
    rows = [json.loads(line) for line in (recorded / "calls.jsonl").read_text().splitlines()]
    assert [r["cudnn_sdp"] for r in rows if r["call"] == "build"] == [False]
