"""Cutting length-sorted rows into a fixed number of batches with the least padding (teacli/padding.py), with
expected cuts worked out by hand."""

from __future__ import annotations

import sys

sys.modules["vllm"] = sys.modules["deepspeed"] = None  # a leaf: it must import neither

from teacli.padding import computed, even_sizes, least_padding  # noqa: E402


def test_even_sizes_put_the_extra_rows_first():
    assert even_sizes(7, 3) == [3, 2, 2] and even_sizes(4, 4) == [1, 1, 1, 1] and even_sizes(2, 4) == [1, 1, 0, 0]


def test_computed_is_rows_times_the_widest():
    assert computed([1, 3, 3, 5, 7, 9, 12], [3, 2, 2]) == [3 * 3, 2 * 7, 2 * 12]
    assert computed([12, 9, 7], [1, 2]) == [12, 2 * 9]  # sorted longest first: the first row is the widest


def test_the_fewest_tokens_under_the_cap():
    # Four short rows and two long ones in two batches: the even cut [3, 3] pads the fourth short row to 10
    # (3·1 + 3·10 = 33 tokens for 24 real); [4, 2] computes 4·1 + 2·10 = 24, nothing padded.
    widths = [1, 1, 1, 1, 10, 10]
    assert least_padding(widths, 2, cap=30) == [4, 2]
    assert least_padding(widths[::-1], 2, cap=30) == [2, 4]  # longest first: the same cut, mirrored
    # A cap of 20 tokens rules out neither; 19 rules out [4, 2]'s second batch (20 tokens) and every other cut too.
    assert least_padding(widths, 2, cap=20) == [4, 2] and least_padding(widths, 2, cap=19) is None
    # The test of tests/train/test_exact_steps.py: the even cut [1, 3, 3 | 5, 7 | 9, 12] = 9 + 14 + 24 = 47 tokens is
    # the least of all (the next, [1, 3, 3 | 5, 7, 9 | 12], computes 48); under a cap of 23 the only cut left is
    # [1, 3, 3, 5 | 7, 9 | 12] = 20 + 18 + 12 = 50.
    assert least_padding([1, 3, 3, 5, 7, 9, 12], 3, cap=24) == [3, 2, 2]
    assert least_padding([1, 3, 3, 5, 7, 9, 12], 3, cap=23) == [4, 2, 1]


def test_what_it_cannot_cut_is_none():
    assert least_padding([1, 2], 3, cap=100) is None  # more batches than rows
    assert least_padding([5] * 400, 400, cap=100) is None  # too large a search (400 · 400²): the caller's even cut
    assert least_padding([4], 1, cap=4) == [1]
