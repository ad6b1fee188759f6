"""Dynamic sampling (rollout.dynamic_sampling): which groups are kept, how many prompts each step
draws from the data order, and how ranks agree — with generation replaced by known rewards."""

import threading

import pytest
import torch

from teacli.train.dynamic import Round, collect, informative, select
from teacli.train.batching import prompt_order, stream_prompts

M = 4  # group size


def round_of(flat_at: set[int], start: int, count: int) -> Round:
    """Groups for data positions [start, start + count): all rewards equal where the position is in
    `flat_at`, else 0, 1, 2, 3 shifted by the position. Prompts are the positions themselves."""
    positions = list(range(start, start + count))
    rewards = torch.stack([torch.full((M,), 0.5) if p in flat_at else torch.arange(M, dtype=torch.float32) + p for p in positions])
    return Round(prompts=positions, prompt_ids=[[p] for p in positions], groups=[[f"{p}:{j}" for j in range(M)] for p in positions], rewards=rewards)


def test_informative_is_rewards_not_all_equal():
    r = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.000001], [0.0, 0.0, 0.0], [3.0, -1.0, 3.0]])
    assert informative(r).tolist() == [False, True, False, True]


def test_select_keeps_informative_groups_in_generation_order():
    rounds = [round_of({0, 2}, 0, 4), round_of({5}, 4, 2)]  # informative: 1, 3 | 4
    sel = select(rounds, want=3)
    assert sel.prompts == [1, 3, 4] and sel.prompt_ids == [[1], [3], [4]] and sel.groups[2][0] == "4:0"
    torch.testing.assert_close(sel.rewards, torch.stack([torch.arange(M, dtype=torch.float32) + p for p in (1, 3, 4)]))
    assert not sel.filled.any()
    assert sel.stats == {"dynamic_extra_rounds": 1.0, "dynamic_dropped_groups": 3.0, "dynamic_surplus_groups": 0.0, "dynamic_filled_groups": 0.0}
    surplus = select([round_of(set(), 0, 4)], want=2)  # more than wanted: the first two, the rest surplus
    assert surplus.prompts == [0, 1] and surplus.stats["dynamic_surplus_groups"] == 2.0


def test_select_fills_the_shortfall_with_flagged_uninformative_groups():
    sel = select([round_of({0, 1, 3}, 0, 4)], want=3)  # one informative group (2) of the 3 wanted
    assert sel.prompts == [0, 1, 2]  # fills: the first uninformative ones, in generation order
    assert sel.filled.tolist() == [True, True, False]
    assert sel.stats["dynamic_filled_groups"] == 2.0 and sel.stats["dynamic_dropped_groups"] == 1.0


def test_collect_draws_the_next_prompts_until_enough_and_advances_the_position():
    flat = {0, 1, 4, 5, 6}
    calls = []

    def run_round(start, count, k):
        calls.append((start, count, k))
        return round_of(flat, start, count)

    rounds, pos = collect(run_round, want=3, position=0, world_size=1, rank=0, max_extra_rounds=10, dynamic=True, reduce_max=lambda v: v)
    # round 0: 0,1,2 → 1 informative (2); round 1: 2 more at 3,4 → (3); round 2: 1 more at 5 → none; round 3: 6 → none; round 4: 7 ✓
    assert calls == [(0, 3, 0), (3, 2, 1), (5, 1, 2), (6, 1, 3), (7, 1, 4)]
    assert pos == 8 and select(rounds, 3).prompts == [2, 3, 7]


def test_collect_stops_at_the_bound():
    rounds, pos = collect(lambda s, c, k: round_of(set(range(100)), s, c), want=2, position=10, world_size=1, rank=0,
                          max_extra_rounds=3, dynamic=True, reduce_max=lambda v: v)
    assert len(rounds) == 4 and pos == 10 + 4 * 2  # round 0 and 3 extra rounds of the 2 missing groups
    sel = select(rounds, 2)
    assert sel.filled.all() and sel.stats["dynamic_extra_rounds"] == 3.0 and sel.stats["dynamic_filled_groups"] == 2.0


def test_off_is_one_round_of_the_steps_share_whatever_the_rewards():
    for rank in (0, 1):
        rounds, pos = collect(lambda s, c, k: round_of(set(range(100)), s, c), want=2, position=8, world_size=2, rank=rank,
                              max_extra_rounds=10, dynamic=False, reduce_max=pytest.fail)
        assert len(rounds) == 1 and rounds[0].prompts == [8 + 2 * rank, 9 + 2 * rank] and pos == 12


def test_stream_prompts_per_step_are_the_fixed_step_order():
    """Without dynamic sampling, step s's prompts are positions [s·P, (s+1)·P) of epoch-wise permutations:
    the data order from before the option existed."""
    prompts = [f"p{i}" for i in range(7)]
    P, seed = 3, 11
    for step in range(6):
        old = [prompts[prompt_order(7, seed, k // 7)[k % 7]] for k in range(step * P, step * P + P)]
        assert stream_prompts(prompts, step * P, P, seed) == old
    epoch0 = stream_prompts(prompts, 0, 7, seed)
    assert sorted(epoch0) == sorted(prompts) and epoch0 != prompts  # a permutation, shuffled


def test_ranks_agree_on_rounds_and_position():
    """Two ranks (threads) with different informative rates: the all-reduced max shortfall makes both run
    the same rounds and end at the same data position, each with exactly its share of groups."""
    flat = {0, 1, 4, 5, 8, 9, 12, 13}  # rank 0's early positions are flat more often
    barrier = threading.Barrier(2)
    box: dict[int, int] = {}
    lock = threading.Lock()

    def reduce_max(v):
        with lock:
            box[len(box)] = v
        barrier.wait()
        out = max(box.values())
        barrier.wait()
        with lock:
            box.clear()
        barrier.wait()
        return out

    results = {}

    def rank_main(rank):
        calls = []

        def run_round(s, c, k):
            calls.append((s, c, k))
            return round_of(flat, s, c)

        rounds, pos = collect(run_round, want=2, position=0, world_size=2, rank=rank, max_extra_rounds=10, dynamic=True, reduce_max=reduce_max)
        results[rank] = (calls, pos, select(rounds, 2))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(timeout=30) for t in threads]
    (c0, p0, s0), (c1, p1, s1) = results[0], results[1]
    # round 0: rank 0 gets 0,1 (both flat: short 2), rank 1 gets 2,3 (fine) → max 2;
    # round 1 at 4: rank 0 gets 4,5 (flat), rank 1 6,7 → max 2; round 2 at 8: rank 0 8,9 flat; round 3 at 12: 12,13 flat;
    # round 4 at 16: rank 0 gets 16,17 ✓
    assert [c[1:] for c in c0] == [c[1:] for c in c1] == [(2, 0), (2, 1), (2, 2), (2, 3), (2, 4)]
    assert p0 == p1 == 20
    assert s0.prompts == [16, 17] and s1.prompts == [2, 3]
    assert s1.stats["dynamic_surplus_groups"] == 8.0  # rank 1 generated (and dropped) groups it did not need
