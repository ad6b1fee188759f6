"""Cutting length-sorted rows into a fixed number of batches with the least padding (teacli/padding.py), with
expected cuts worked out by hand."""

from __future__ import annotations

import sys

sys.modules["vllm"] = sys.modules["deepspeed"] = None  # a leaf: it must import neither

from teacli.padding import (  # noqa: E402
    FORWARD_TOKENS, computed, even_sizes, least_padding, micro_batches, micro_padding, packed_computed, packed_rows,
    split_sizes,
)


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


def test_a_free_number_of_batches_pays_for_each():
    # [1, 1, 1, 1, 10, 10] from 1 to 6 batches: one computes 6·10 = 60 tokens; two, [4, 2], 24 (nothing padded, so
    # more never compute fewer). At 10 tokens a batch: 60 + 10 = 70 against 24 + 20 = 44, so two; at 40 a batch:
    # 60 + 40 = 100 against 24 + 80 = 104, so one.
    widths = [1, 1, 1, 1, 10, 10]
    assert least_padding(widths, 1, cap=60, most=6) == [4, 2]  # ties (24 tokens in 2 to 6 batches): the fewest
    assert least_padding(widths, 1, cap=60, most=6, per_batch=10) == [4, 2]
    assert least_padding(widths, 1, cap=60, most=6, per_batch=40) == [6]
    assert least_padding(widths[::-1], 1, cap=60, most=6, per_batch=10) == [2, 4]
    # at least `count`: three batches of 24 tokens ([1 | 1, 1, 1 | 10, 10], [4 | 10 | 10], ...), the first found
    three = least_padding(widths, 3, cap=60, most=6, per_batch=40)
    assert len(three) == 3 and sum(computed(widths, three)) == 24


def test_split_sizes():
    # 30 completions of 10 tokens and two of 500 and 512: one forward computes 32·512 = 16,384 tokens; two, [30, 2],
    # 300 + 1,024 = 1,324 and one forward more (FORWARD_TOKENS), which 15,060 tokens saved pay for; three,
    # [30, 1, 1], 1,312 and two more, which saves 12 tokens, not FORWARD_TOKENS.
    assert 12 < FORWARD_TOKENS < 15060
    widths = [10] * 30 + [500, 512]
    assert split_sizes(widths, "auto") == [30, 2]
    assert split_sizes(widths, 3) == [30, 1, 1] and split_sizes(widths, 1) == [32]
    assert split_sizes(widths[:3], 8) == [1, 1, 1]  # at most one forward a row
    # equal lengths: nothing to save, one forward; fewer than two rows: one forward (or none)
    assert split_sizes([300] * 32, "auto") == [32] and split_sizes([7], "auto") == [1] and split_sizes([], 4) == []
    # a completion of no tokens pads to one column, as `pack_shared` pads it
    assert split_sizes([0, 0, 3, 3], 2) == [2, 2]  # 2·1 + 2·3 = 8 tokens; [1, 3] computes 10


def test_shared_micro_padding_counts_each_forward():
    """One prompt of 2 tokens and completions of 1, 1 and 5: one forward computes 2 + 3·5 = 17 tokens, 8 of them
    padding; in two forwards [1, 1 | 5], 2 + 2·1 + 1·5 = 9, none. The completions are counted sorted, as the trainer
    orders a shared micro-batch (here given longest first)."""
    prompts, comps, keys = [2, 2, 2], [5, 1, 1], [0, 0, 0]
    assert micro_padding(prompts, comps, keys, [[0, 1, 2]], True) == (8, 17)
    assert micro_padding(prompts, comps, keys, [[0, 1, 2]], True, 2) == (0, 9)
    assert micro_padding(prompts, comps, keys, [[0, 1, 2]], True, 1) == micro_padding(prompts, comps, keys, [[0, 1, 2]], True)


def test_packed_rows_first_fit_decreasing_and_what_they_compute():
    """optim.completion_splits: packed, counted by hand."""
    assert packed_rows([3, 5, 0, 4, 2, 5]) == [[1], [5], [3], [0, 4]]  # 5, 5, 4, then 3 + 2 = 5; the 0 nowhere
    assert packed_rows([]) == [] and packed_rows([0, 0]) == []
    assert packed_rows([1, 1, 1, 1]) == [[0], [1], [2], [3]]  # rows are as wide as the widest: 1
    assert packed_rows([1, 1, 1, 1], 3) == [[0, 1, 2], [3]]
    assert packed_rows([4, 1, 1, 1, 1, 2, 2]) == [[0], [5, 6], [1, 2, 3, 4]]
    # one prompt, completions 5, 2, 2, 3 → segments 4, 1, 1, 2 → rows [4], [2, 1, 1] of width 4: 4 firsts + 2 × 4
    assert packed_computed([5, 2, 2, 3], ["a"] * 4) == 4 + 2 * 4
    # two prompts: a row holds one prompt's segments only, rows of the micro-batch's width: a's [4], [1]; b's [2, 1]
    assert packed_computed([5, 2, 2, 3], ["a", "a", "b", "b"]) == 4 + 3 * 4
    # micro_padding: prompts of 6 tokens shared; unpacked 4 × 5 = 20 completion tokens, packed 12; 12 real
    for splits, computed in ((1, 6 + 20), ("packed", 6 + 12)):
        pad, total = micro_padding([6] * 4, [5, 2, 2, 3], ["a"] * 4, [[0, 1, 2, 3]], True, splits)
        assert (pad, total) == (computed - 6 - 12, computed)


def test_dealt_micro_batches_mix_short_and_long():
    """micro_batches' deal (optim.completion_splits: packed): the even cut's sizes and each micro-batch's groups as
    without it, each group's sequences dealt across its micro-batches. Lengths by index: group 0 has 5, 1, 4, 2, 3, 6;
    group 1 has 7, 8, 9, 1. Sorted, sizes 4, 3, 3: places 0-3, 4-6, 7-9. Group 0 fills places 0-5: batch 0's at
    (rank + ½)/4 = .125, .375, .625, .875, batch 1's places 4 and 5 at .167, .5; in that key order they take the
    sequences of lengths 1, 2, 3, 4, 5, 6: batch 0 gets 1, 3, 5, 6 (indices 1, 4, 0, 5), batch 1 2 and 4 (3, 2).
    Group 1 fills place 6 (batch 1, .833) and places 7-9 (batch 2: .167, .5, .833); by key, place 7 takes length 1,
    place 8 7, place 6 8 (a tie goes to the lower batch), place 9 9."""
    lengths, groups = [5, 1, 4, 2, 3, 6, 7, 8, 9, 1], [0] * 6 + [1] * 4
    plain = micro_batches(lengths, 3, groups)
    assert plain == [[1, 3, 4, 2], [0, 5, 9], [6, 7, 8]]
    dealt = micro_batches(lengths, 3, groups, deal=True)
    assert dealt == [[1, 4, 0, 5], [3, 2, 7], [9, 6, 8]]
    assert [len(b) for b in dealt] == [len(b) for b in plain]
    assert [sorted({groups[i] for i in b}) for b in dealt] == [sorted({groups[i] for i in b}) for b in plain]
    assert micro_batches(lengths, 3, None, deal=True) == micro_batches(lengths, 3)  # whole sequences: no groups to deal


def test_packed_pads_less_than_one_forward_at_the_paper_lengths():
    """The 1B recipe's step at rehearsal.lengths: realistic (8 prompts × 64, 16 micro-batches of 32, the planner's
    drawn lengths): packed, with each group dealt across its two micro-batches, computes fewer tokens than one padded
    forward or than packing the sorted halves (a half of the longest pairs badly in rows of the longest's width)."""
    from teacli.planner import Lengths

    one = packed_sorted = packed_dealt = 0
    for seed in range(4):
        p, r = Lengths().draw(8, 64, seed, 1024, 512)
        groups = [i // 64 for i in range(len(r))]
        prompts = [p[g] for g in groups]
        total = [a + b for a, b in zip(prompts, r)]
        sorted_cut, dealt_cut = micro_batches(total, 16, groups), micro_batches(total, 16, groups, deal=True)
        one += micro_padding(prompts, r, groups, sorted_cut, True)[1]
        packed_sorted += micro_padding(prompts, r, groups, sorted_cut, True, "packed")[1]
        pad, computed_tokens = micro_padding(prompts, r, groups, dealt_cut, True, "packed")
        packed_dealt += computed_tokens
        real = computed_tokens - pad
        assert real == sum(r) + 2 * sum(p)  # every completion token once, each prompt once in each of its 2 micro-batches
    assert packed_dealt < packed_sorted < one
