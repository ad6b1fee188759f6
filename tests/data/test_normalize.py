import hashlib

from teacli.data.normalize import normalize_text, prompt_id


def test_normalize_text_nfkc_whitespace_and_invisibles():
    raw = "\ufeff  Ｈello\u00a0world\u200b!  \r\n\r\n\r\n\r\n  indented line\t \n"
    assert normalize_text(raw) == "Hello world!\n\n  indented line"


def test_prompt_id_is_sha256_prefix_of_collapsed_text_for_single_user_turn():
    expected = hashlib.sha256(b"Explain how gears work.").hexdigest()[:16]
    assert prompt_id([{"role": "user", "content": "Explain how gears work."}]) == expected
    assert prompt_id([{"role": "user", "content": "Explain how\n\ngears   work."}]) == expected


def test_prompt_id_includes_roles_for_multi_turn():
    one = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    swapped = [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "hello"}, {"role": "user", "content": "bye"}]
    key = "user\x1fhi\x1eassistant\x1fhello\x1euser\x1fbye"
    assert prompt_id(one) == hashlib.sha256(key.encode()).hexdigest()[:16]
    assert prompt_id(one) != prompt_id(swapped)
    assert prompt_id([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]) != prompt_id(
        [{"role": "user", "content": "x y"}]
    )
