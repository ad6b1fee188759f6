"""Rule reward: expected values worked out by hand, monotone partial credit, errors.

Shared rule: decay(d) = exp(-d / 0.5) for a relative distance d; violation counts v give 1/(1+v).
"""

import math
import sys

import pytest

sys.modules.setdefault("vllm", None)
sys.modules.setdefault("deepspeed", None)

from teacli.rewards import load_reward  # noqa: E402
from teacli.rewards.rule import RuleReward  # noqa: E402
from teacli.types import Prompt  # noqa: E402

E_2_3 = math.exp(-2 / 3)  # decay(1/3) = 0.513417
E_1 = math.exp(-1)  # decay(1/2) = 0.367879


def P(*constraints, pid="p1"):
    return Prompt(pid, ({"role": "user", "content": "task"},), meta={"constraints": list(constraints)})


def s(constraint, response):
    """The score of a single constraint."""
    (value,) = RuleReward().constraint_scores(P(constraint), response)
    return value


# ---------------------------------------------------------------------------- each type, by hand


def test_word_count():
    c = {"type": "word_count", "min": 4, "max": 6}
    assert s(c, "one two three four five") == 1.0
    assert s(c, "one two three four five six seven eight") == pytest.approx(E_2_3)  # (8-6)/6 = 1/3
    assert s(c, "one two") == pytest.approx(E_1)  # (4-2)/4 = 1/2
    assert s({"type": "word_count", "max": 3}, "don't stop-now") == 1.0  # don't = 1 word, stop-now = 2
    assert s({"type": "word_count", "max": 2}, "don't stop-now") == pytest.approx(E_1)  # (3-2)/2
    assert s({"type": "word_count", "min": 10}, "a " * 40) == 1.0


def test_num_sentences():
    c = {"type": "num_sentences", "min": 2, "max": 2}
    assert s(c, "It rains. We stay in!") == 1.0
    assert s(c, "One. Two. Three. Four.") == pytest.approx(math.exp(-2))  # (4-2)/2 = 1
    assert s(c, "no final punctuation") == pytest.approx(E_1)  # 1 sentence: (2-1)/2
    assert s(c, "Pi is 3.14 roughly. Right?") == 1.0  # a decimal point is not a sentence end


def test_num_paragraphs():
    c = {"type": "num_paragraphs", "n": 3}
    assert s(c, "a\n\nb\n\nc") == 1.0
    assert s(c, "a\n\nb") == pytest.approx(E_2_3)  # |2-3|/3
    assert s(c, "\n\na\n \nb\n\n\n\nc\n\nd\n") == pytest.approx(E_2_3)  # 4 blocks; blank-ish lines split


def test_num_bullets():
    c = {"type": "num_bullets", "n": 3}
    assert s(c, "Tips:\n- a\n- b\n- c") == 1.0
    assert s(c, "* a\n• b\n1. c\n  2) d") == pytest.approx(E_2_3)  # 4 items: |4-3|/3
    assert s(c, "-no space is not a bullet\n- a") == pytest.approx(math.exp(-4 / 3))  # 1 item: 2/3


def test_include_keywords():
    c = {"type": "include_keywords", "keywords": ["ocean", "salt", "deep sea"]}
    # "oceans" matches ocean (+s), "salty" does not match salt, "deep\nsea" matches the phrase
    assert s(c, "The oceans are salty and deep\nsea fish glow.") == pytest.approx(2 / 3)
    assert s(c, "OCEAN salted deep sea") == 1.0
    assert s(c, "basalt rocks") == 0.0


def test_keyword_frequency():
    c = {"type": "keyword_frequency", "keyword": "step", "min": 4}
    assert s(c, "Step by step, steps add up.") == pytest.approx(3 / 4)
    assert s(c, "step step step step step") == 1.0
    assert s(c, "footsteps") == 0.0


def test_forbidden_words():
    c = {"type": "forbidden_words", "words": ["very", "really"]}
    assert s(c, "Very good, really very good.") == pytest.approx(1 / 4)  # 3 occurrences
    assert s(c, "Everything is fine.") == 1.0


def test_start_with():
    c = {"type": "start_with", "text": "Dear Maya,"}
    assert s(c, "  dear   maya, thanks!") == 1.0  # case and whitespace are folded
    # folded body "hello. dear maya, thanks" (24 chars), found at offset 7: 0.5 * (1 - 7/24)
    assert s(c, "Hello. Dear Maya, thanks") == pytest.approx(0.5 * 17 / 24)
    assert s(c, "Hi Maya, thanks") == 0.0


def test_ends_with():
    c = {"type": "ends_with", "text": "Thanks for asking!"}
    assert s(c, "Good question. Thanks for asking!  \n") == 1.0
    # folded body "thanks for asking! bye." (23 chars), the text ends at 18: 0.5 * 18/23
    assert s(c, "Thanks for asking! Bye.") == pytest.approx(0.5 * 18 / 23)
    assert s(c, "Thanks for reading!") == 0.0


def test_no_commas_and_lowercase():
    assert s({"type": "no_commas"}, "a, b, c") == pytest.approx(1 / 3)
    assert s({"type": "no_commas"}, "a b c") == 1.0
    assert s({"type": "lowercase"}, "hello World") == pytest.approx(1 / 2)
    assert s({"type": "lowercase"}, "ALL CAPS") == pytest.approx(1 / 8)
    assert s({"type": "lowercase"}, "all lower, 123!") == 1.0


# ---------------------------------------------------------------------------- the reward


def test_reward_is_mixed_mean_plus_diversity_tie_breaker():
    prompt = P({"type": "word_count", "min": 3, "max": 5}, {"type": "no_commas"})
    # 6 words: decay((6-5)/5) = exp(-0.4) = 0.670320; no commas: 1 → mean 0.835160
    # distinct words {the, cat, sat, on, mat} = 5 of 6 → D = 0.833333
    # R = 0.98 * 0.835160 + 0.02 * 0.833333 = 0.818457 + 0.016667 = 0.835124
    expected = 0.98 * (math.exp(-0.4) + 1) / 2 + 0.02 * 5 / 6
    assert expected == pytest.approx(0.835124, abs=1e-6)
    rewards = RuleReward().score([prompt, prompt, prompt], ["the cat sat on the mat", "", " ... "])
    assert rewards.dtype.is_floating_point and str(rewards.dtype) == "torch.float32" and rewards.shape == (3,)
    assert rewards[0].item() == pytest.approx(expected, abs=1e-6)
    assert rewards[1].item() == 0.0 and rewards[2].item() == 0.0  # no words: degenerate, no credit


def test_tie_breaker_separates_perfect_responses_and_charges_repetition():
    prompt = P({"type": "include_keywords", "keywords": ["tea"]}, {"type": "word_count", "max": 20})
    varied = "Green tea is brewed cooler than black tea."  # 7 distinct of 8 words
    stuffed = "tea tea tea tea tea tea tea tea"  # 1 distinct of 8
    r = RuleReward().score([prompt, prompt], [varied, stuffed]).tolist()
    assert r[0] == pytest.approx(0.98 + 0.02 * 7 / 8) and r[1] == pytest.approx(0.98 + 0.02 / 8)
    assert 0.98 < r[1] < r[0] < 1.0
    assert RuleReward(tie_break=0.0).score([prompt], [stuffed]).item() == 1.0


def test_graded_credit_is_monotone():
    def ladder(constraint, responses):
        values = [s(constraint, r) for r in responses]
        assert values == sorted(values) and len(set(values)) == len(values), values

    ladder({"type": "word_count", "min": 10, "max": 20}, ["w " * k for k in (0, 2, 5, 8, 10)])
    ladder({"type": "word_count", "min": 10, "max": 20}, ["w " * k for k in (60, 40, 30, 22, 20)])
    ladder({"type": "num_bullets", "n": 4}, ["- x\n" * k for k in (0, 1, 2, 3, 4)])
    ladder({"type": "num_bullets", "n": 4}, ["- x\n" * k for k in (12, 8, 6, 5, 4)])
    ladder({"type": "num_paragraphs", "n": 3}, ["\n\n".join(["p"] * k) for k in (8, 5, 4, 3)])
    ladder({"type": "num_sentences", "max": 3}, ["Go. " * k for k in (9, 6, 4, 3)])
    ladder({"type": "include_keywords", "keywords": ["a1", "b2", "c3"]}, ["x", "a1", "a1 b2", "a1 b2 c3"])
    ladder({"type": "keyword_frequency", "keyword": "yes", "min": 3}, ["no", "yes", "yes yes", "yes yes yes"])
    ladder({"type": "forbidden_words", "words": ["bad"]}, ["bad bad bad", "bad bad", "bad", "good"])
    ladder({"type": "no_commas"}, ["a,b,c,d", "a,b,c", "a,b", "a b"])
    ladder({"type": "lowercase"}, ["ABC", "ABc", "Abc", "abc"])
    ladder({"type": "start_with", "text": "Once"}, ["never", "x x x x x x once", "x once", "Once upon"])
    ladder({"type": "ends_with", "text": "The end."}, ["nothing", "The end. x x x x x x", "The end. x", "So. The end."])


def test_rewards_of_varied_responses_rarely_tie():
    prompt = P({"type": "word_count", "min": 5, "max": 8}, {"type": "include_keywords", "keywords": ["moon"]},
               {"type": "no_commas"})
    responses = [
        "The moon pulls the oceans.", "Gravity from the moon makes tides rise and fall daily.",
        "The moon, the sun, and the earth.", "Tides follow the moon.", "Water rises twice a day",
        "moon moon moon moon moon", "The Moon's gravity lifts the sea a little.",
    ]
    values = RuleReward().score([prompt] * len(responses), responses).tolist()
    assert len(set(values)) == len(values)


# ---------------------------------------------------------------------------- errors


def test_errors_name_the_prompt_and_type():
    reward = RuleReward()
    with pytest.raises(ValueError, match="prompt p9: the rule reward needs a non-empty 'constraints' list"):
        reward.score([Prompt("p9", ({"role": "user", "content": "x"},))], ["y"])
    with pytest.raises(ValueError, match="prompt p7: unknown constraint type 'rhymes'"):
        reward.score([P({"type": "rhymes"}, pid="p7")], ["y"])
    with pytest.raises(ValueError, match="prompt p1: constraint 'num_bullets' is missing n"):
        reward.score([P({"type": "num_bullets"})], ["y"])
    with pytest.raises(ValueError, match="constraint 'word_count' has unknown parameter 'minimum'"):
        reward.score([P({"type": "word_count", "minimum": 3})], ["y"])
    with pytest.raises(ValueError, match="constraint 'word_count': needs 1 <= min <= max"):
        reward.score([P({"type": "word_count", "min": 9, "max": 3})], ["y"])
    with pytest.raises(ValueError, match="parameter 'n' must be int"):
        reward.score([P({"type": "num_paragraphs", "n": "3"})], ["y"])
    with pytest.raises(ValueError, match="keywords must be a non-empty list"):
        reward.score([P({"type": "include_keywords", "keywords": []})], ["y"])
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        reward.score([P({"type": "no_commas"})] * 2, ["y"])
    with pytest.raises(ValueError, match="tolerance must be > 0"):
        RuleReward(tolerance=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'temperature'"):
        RuleReward(temperature=1.0)


def test_load_reward_by_name_and_dotted_path():
    assert isinstance(load_reward("rule"), RuleReward)
    assert load_reward("teacli.rewards.rule:RuleReward", tie_break=0.0).tie_break == 0.0
    with pytest.raises(ValueError, match="unknown reward 'skywork'"):
        load_reward("skywork")
