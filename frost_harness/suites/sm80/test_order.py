"""CPU: the walks of ordered dQ (frost/kernels/sm80/order.py). The rotated walk is a valid order,
ends without deadlock where the plan uses it, and removes the queue that the shared walk builds;
the shared walk with several query heads per CTA keeps a masked key block at its own pace; the
diagonal walk's turns count exactly the key blocks that visit (the mask's two ranges are each
other's inverse), its grouped launch ends without deadlock where the plan uses it, and with
everything resident it never waits."""
from __future__ import annotations

import itertools

import pytest

from frost.kernels.sm80.order import (
    diagonal_turn, grouped_launch, ordered_coords, rotated_m_block, rotated_step, rotated_turn,
)

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


def test_grouped_launch_visits_every_cta_once_and_keeps_a_group_together():
    for num_n, num_heads, group in ((4, 5, 2), (3, 4, 1), (5, 7, 3), (2, 3, 5), (1, 6, 4), (6, 1, 1)):
        seen = [grouped_launch(i, num_n, num_heads, group) for i in range(num_n * num_heads)]
        assert sorted(seen) == sorted((n, h) for n in range(num_n) for h in range(num_heads))
        for start in range(0, num_n * num_heads, group * num_n):  # a group's CTAs are one run
            heads = {h for _, h in seen[start:start + group * num_n]}
            assert heads == set(range(start // num_n, min(start // num_n + group, num_heads)))
        for h in range(num_heads):  # lowest key block first within a head
            assert [n for n, head in seen if head == h] == list(range(num_n))


# The backward's visibility ranges (frost/kernels/sm80/mask.py, ``m_block_range`` with its rows
# masked, ``n_block_range``), mirrored in plain Python: the diagonal walk counts turns with the
# second and walks with the first, so each must be the other's exact inverse.
def _m_block_range(n, tm, tn, sq, sk, delta, wl, wr):
    m_max = -(-sq // tm)
    key_first, key_last = n * tn, min(n * tn + tn, sk) - 1
    m_min = 0
    if wr is not None:
        row_start = max(key_first - delta - wr, 0)
        m_min = row_start // tm
        if row_start >= sq:
            m_max = m_min
    if wl is not None:
        m_max = min(m_max, -(-max(key_last - delta + wl + 1, 0) // tm))
    if key_last < key_first:
        m_max = m_min
    return m_min, max(m_max, m_min)


def _n_block_range(m, tm, tn, sq, sk, delta, wl, wr):
    n_max = -(-sk // tn)
    row_first, row_last = m * tm, min(m * tm + tm, sq) - 1
    if wr is not None:
        n_max = min(n_max, -(-max(row_last + delta + wr + 1, 0) // tn))
    n_min = 0
    if wl is not None:
        n_min = max(row_first + delta - wl, 0) // tn
    if row_last < row_first:
        n_max = n_min
    return n_min, n_max


_MASKS = [(tm, tn, sq, sk, bottom_right, wl, wr)
          for tm, tn in ((128, 128), (64, 128), (128, 64), (64, 64))
          for sq, sk in ((50, 300), (300, 50), (129, 129), (200, 700), (1000, 1000), (64, 1), (700, 200))
          for bottom_right in (False, True)
          for wl, wr in ((None, 0), (None, 37), (100, 0), (0, 0), (300, 129), (None, None), (77, None))]


@pytest.mark.parametrize("tm, tn, sq, sk, bottom_right, wl, wr", _MASKS)
def test_diagonal_turns_count_exactly_the_higher_key_blocks_that_visit(tm, tn, sq, sk, bottom_right, wl, wr):
    """Under a right-bounded mask, every key block that ``n_block_range`` says sees a query block
    visits it (``m_block_range``) and no other does: a key block's diagonal turn is the number of
    higher key blocks that will release the block's counter before it, none missing (a
    deadlock) and none extra (a turn taken out of order)."""
    delta = sk - sq if bottom_right else 0
    args = (tm, tn, sq, sk, delta, wl, wr)
    num_n, num_m = -(-sk // tn), -(-sq // tm)
    visits = {(n, m) for n in range(num_n) for m in range(*_m_block_range(n, *args))}
    for m in range(num_m):
        first, end = _n_block_range(m, *args)
        visitors = sorted(n for n in range(num_n) if (n, m) in visits)
        if wr is not None or visitors:  # (no right bound: the shared walk's turns, from ``first``)
            assert all(diagonal_turn(n, end) == len([v for v in visitors if v > n]) for n in visitors)
        if visitors:
            assert visitors == list(range(visitors[0], visitors[-1] + 1))  # one contiguous run
            assert visitors[0] >= first and (wr is None or visitors[-1] == end - 1)


def _simulate_diagonal(ranges: list[tuple[int, int]], heads: int, capacity: int, group: int) -> int:
    """Rounds until every CTA finishes, or -1 on a deadlock, for the diagonal walk: key block n
    visits the query blocks ``ranges[n]`` upward, turns highest key block first, CTAs dispatched
    in ``grouped_launch`` order (``group`` 0: a head at a time, highest key block first)."""
    num_n = len(ranges)
    order = [grouped_launch(i, num_n, heads, max(group, 1)) for i in range(num_n * heads)]
    if group == 0:
        order = [(num_n - 1 - n, h) for n, h in order]
    counters, step = {}, {(n, h): 0 for n, h in order}
    resident, waiting, rounds = [], list(order), 0
    while resident or waiting:
        while waiting and len(resident) < capacity:
            resident.append(waiting.pop(0))
        ready = []
        for n, h in resident:
            m = ranges[n][0] + step[(n, h)]
            end = max(k for k in range(num_n) if ranges[k][0] <= m < ranges[k][1]) + 1
            if counters.get((h, m), 0) == diagonal_turn(n, end):
                ready.append(((n, h), (h, m)))
        if not ready:
            return -1
        for cta, block in ready:
            counters[block] = counters.get(block, 0) + 1
            step[cta] += 1
        resident = [(n, h) for n, h in resident if step[(n, h)] < ranges[n][1] - ranges[n][0]]
        rounds += 1
    return rounds


def _causal_ranges(num_n: int, ratio: int) -> list[tuple[int, int]]:
    """Key block n of a square causal mask with ``ratio`` query blocks per key block."""
    return [(n * ratio, num_n * ratio) for n in range(num_n)]


@pytest.mark.parametrize("num_n, ratio, heads, capacity", [(4, 1, 3, 4), (8, 2, 5, 8), (5, 1, 4, 11), (16, 2, 3, 16),
                                                           (7, 1, 10, 20), (6, 2, 2, 13)])
def test_diagonal_walk_finishes_when_a_group_fits_and_never_waits_all_resident(num_n, ratio, heads, capacity):
    """The plan's groups (``capacity // num_n`` heads) always finish; a head at a time (group 0)
    finishes with any capacity; with everything resident no key block ever waits: the walk takes
    exactly the heaviest key block's steps, where the shared walk queues the column."""
    ranges = _causal_ranges(num_n, ratio)
    assert _simulate_diagonal(ranges, heads, capacity, capacity // num_n) > 0
    assert _simulate_diagonal(ranges, heads, 1, 0) > 0
    assert _simulate_diagonal(ranges, heads, num_n * heads, heads) == num_n * ratio


def test_diagonal_walk_can_deadlock_when_a_group_does_not_fit():
    """Why the plan's group is at most the device's CTAs over a head's key blocks."""
    assert _simulate_diagonal(_causal_ranges(8, 1), heads=4, capacity=12, group=2) == -1
    assert _simulate_diagonal(_causal_ranges(8, 1), heads=4, capacity=12, group=1) > 0
