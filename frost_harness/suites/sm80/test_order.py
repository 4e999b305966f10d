"""CPU: the walks of ordered dQ (frost/kernels/sm80/order.py). The rotated walk is a valid order,
ends without deadlock where the plan uses it, and removes the queue that the shared walk builds;
the shared walk with several query heads per CTA keeps a masked key block at its own pace."""
from __future__ import annotations

import itertools

import pytest

from frost.kernels.sm80.order import ordered_coords, rotated_m_block, rotated_step, rotated_turn

pytestmark = pytest.mark.L0


@pytest.mark.parametrize("num_m, num_n", list(itertools.product(range(1, 12), (1, 2, 3, 5, 8, 11, 12, 13, 25))))
def test_turns_are_the_walks_arrival_order(num_m, num_n):
    for m_block in range(num_m):
        turns = [rotated_turn(n, m_block, num_m, num_n) for n in range(num_n)]
        arrival = sorted(range(num_n), key=lambda n: (rotated_step(n, m_block, num_m), n))
        assert sorted(turns) == list(range(num_n))  # a permutation: each turn taken once
        assert turns == [arrival.index(n) for n in range(num_n)]
        for n in range(num_n):
            assert rotated_m_block(n, rotated_step(n, m_block, num_m), num_m) == m_block


def _simulate(num_n: int, num_m: int, heads: int, capacity: int, rotated: bool) -> int:
    """Rounds until every CTA finishes, or -1 on a deadlock. CTAs (head, key block) are dispatched
    in grid order (key blocks fastest) into ``capacity`` slots as slots free; in a round each
    resident CTA does its step's reduction if its turn has come (the counters as the previous
    round left them), else waits. The shared walk: every key block from the last query block
    down, turn = its index."""
    order = [(h, n) for h in range(heads) for n in range(num_n)]
    counters = {}
    step = {cta: 0 for cta in order}
    resident, waiting, rounds = [], list(order), 0
    while resident or waiting:
        while waiting and len(resident) < capacity:
            resident.append(waiting.pop(0))
        ready = []
        for h, n in resident:
            i = step[(h, n)]
            m = rotated_m_block(n, i, num_m) if rotated else num_m - 1 - i
            turn = rotated_turn(n, m, num_m, num_n) if rotated else n
            if counters.get((h, m), 0) == turn:
                ready.append(((h, n), (h, m)))
        if not ready:
            return -1
        for cta, block in ready:
            counters[block] = counters.get(block, 0) + 1
            step[cta] += 1
        resident = [cta for cta in resident if step[cta] < num_m]
        rounds += 1
    return rounds


@pytest.mark.parametrize("num_n, num_m, heads, capacity", [(4, 4, 3, 4), (8, 8, 5, 11), (5, 9, 4, 6), (9, 5, 4, 9),
                                                           (16, 16, 3, 16), (7, 7, 10, 20)])
def test_rotated_walk_finishes_whenever_a_head_fits(num_n, num_m, heads, capacity):
    """The plan's condition (a head's key blocks fit at once, grid order) is enough to finish.
    Whether the walk is faster than the shared one, when heads are only partly resident, is for
    the GPU benchmark: in this step-granular model it can lose a few rounds there."""
    assert _simulate(num_n, num_m, heads, capacity, rotated=True) > 0


@pytest.mark.parametrize("num_n, num_m", [(4, 4), (5, 9), (16, 16), (1, 3)])
def test_rotated_walk_never_waits_where_the_shared_walk_queues(num_n, num_m):
    """Everything resident, no more key blocks than query blocks: the rotated walk takes exactly
    one round per query block; the shared walk queues the key blocks of a column one behind
    the other (num_n - 1 rounds more)."""
    capacity = 3 * num_n
    assert _simulate(num_n, num_m, 3, capacity, rotated=True) == num_m
    assert _simulate(num_n, num_m, 3, capacity, rotated=False) == num_m + num_n - 1


def test_rotated_walk_can_deadlock_when_a_head_does_not_fit():
    """Why the plan takes the walk only while one head's key blocks fit on the device at once."""
    assert _simulate(num_n=8, num_m=8, heads=2, capacity=5, rotated=True) == -1
    assert _simulate(num_n=8, num_m=8, heads=2, capacity=5, rotated=False) > 0


def _causal_residency(num_blocks: int, heads: int, heads_inner: bool) -> list[int]:
    """Rounds each key block of one GQA share stays resident under a causal mask (square blocks:
    key block n sees query blocks n..num_blocks-1 of each of its ``heads``), everything resident
    at once; turn at (h, m) = n, the key blocks below n all see m. Heads inner is the kernel's
    shared walk (``ordered_coords``); heads outer is how it walked before."""
    def coords(n: int, i: int) -> tuple[int, int]:
        if heads_inner:
            return ordered_coords(i, heads, num_blocks)
        return i // (num_blocks - n), num_blocks - 1 - i % (num_blocks - n)

    counters, step, done_at, rounds = {}, [0] * num_blocks, [0] * num_blocks, 0
    while any(step[n] < heads * (num_blocks - n) for n in range(num_blocks)):
        rounds += 1
        ready = [n for n in range(num_blocks) if step[n] < heads * (num_blocks - n)
                 and counters.get(coords(n, step[n]), 0) == n]
        assert ready, "deadlock"
        for n in ready:
            counters[coords(n, step[n])] = counters.get(coords(n, step[n]), 0) + 1
            step[n] += 1
            done_at[n] = rounds
    return done_at


@pytest.mark.parametrize("num_blocks, heads", [(4, 2), (8, 4), (16, 4), (9, 3), (32, 8)])
def test_shared_walk_keeps_masked_key_blocks_at_their_own_pace(num_blocks, heads):
    """Heads inner: key block n holds its SM for its own steps plus the one-time lag of the n
    below it; heads outer: past the first head it waits for the lowest key block on every head,
    so every key block is resident nearly as long as the heaviest (a likely share of deterministic
    mode's 1.3-1.5x on causal GQA / MQA before: benchmarks/NOTES.md)."""
    inner = _causal_residency(num_blocks, heads, heads_inner=True)
    outer = _causal_residency(num_blocks, heads, heads_inner=False)
    assert inner == [heads * (num_blocks - n) + n for n in range(num_blocks)]
    assert all(outer[n] >= heads * num_blocks - (num_blocks - n) for n in range(num_blocks))
    assert sum(outer) > sum(inner)


def test_shared_walk_visits_each_head_and_block_once():
    for heads, m_block_max, count in ((1, 5, 5), (3, 7, 4), (4, 2, 2)):
        seen = [ordered_coords(i, heads, m_block_max) for i in range(heads * count)]
        assert sorted(seen) == sorted((h, m) for h in range(heads) for m in range(m_block_max - count, m_block_max))
