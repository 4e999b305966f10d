"""The order in which the key blocks of one head reduce into a query block's dQ (ordered dQ,
deterministic mode: sm80/bwd.py): the walk of a CTA's steps (shared, rotated or diagonal), and
the order in which the diagonal walk's CTAs launch.

Shared walk (``ordered_coords``, any mask): a key block visits its query blocks from its last
down, and the query heads of its GQA share are the fastest index: at step ``i`` it is on head
``i % heads`` of block ``m_block_max - 1 - i // heads``. The turns go by key block, lowest first.
Under a causal or window mask the key blocks of a column see different numbers of query blocks;
with the heads the fastest index every one reaches (h, m) at step ``(m_block_max - 1 - m) * heads
+ h``, where ``m_block_max`` (one past its last block) grows with the key block, so a lower key
block is never later than a higher one. With the heads outer, a key block that saw few blocks of
head h would reach head h+1 early and wait there for the lowest, which sees them all.

Rotated walk (``BwdParams.dq_walk == "rotated"``, unmasked problems): key block ``n`` visits query block
``(n + i) mod M`` at its step ``i`` (M query blocks, N key blocks of the sequence), so at any step
the key blocks of a head run on different query blocks instead of queueing for the same one.
A query block's turn order is the order in which the key blocks reach it in that lockstep:
by step, then by key block. Every key block of the head sees every query block, so the turns of
one query block are a permutation of 0..N-1, and a key block that is on time never waits.

Deadlock: a key block may wait on higher ones, so the plan uses the walk only when a head's N
CTAs fit on the device at once and the grid launches them together (key blocks its fastest
index); the head launched first then always has every CTA it waits on resident.

Diagonal walk (``BwdParams.dq_walk == "diagonal"``, masks with a right bound: causal, right
windows): key block ``n`` walks its query blocks up from its first, the query heads of its share
the fastest index (``diagonal_coords``), and the turns of a query block go from the highest key
block that sees it down (``diagonal_turn``). Under such a mask both ends of a key block's run of
query blocks grow with the key block, so key block n + 1 reaches any block it shares with n at
least one step before n does (causal with square tiles: at step m - n - 1 against m - n): key
blocks on time never wait, where lowest-first turns would queue them all on the same block.

Its CTAs launch in groups of ``group`` heads (``grouped_launch``): a group's key blocks lowest
(heaviest) first, its heads the fastest index, so the long CTAs start early and the short ones
fill the tail, as heavy-first does for a whole grid. A key block waits on higher ones, launched
after it but in the same group, so the plan takes ``group`` no larger than the device's CTAs at
once over the key blocks of a head: a group then always fits. ``group`` 0 (a head's key blocks
outnumber the device's CTAs) launches one head at a time, highest key block first: every CTA a
key block waits on launched before it, at the cost of a heavy tail.

``rotated_turn`` and ``grouped_launch`` are plain arithmetic with the ``lo`` / ``hi`` (min / max)
they are given, so the kernel (``cutlass.min`` / ``cutlass.max`` on Int32) and the host's tests
(``min`` / ``max``) run the same code.
"""
from __future__ import annotations


def ordered_coords(step, heads, m_block_max):
    """The shared walk's (head offset in the CTA's share, query block) at ``step``."""
    return step % heads, m_block_max - 1 - step // heads


def rotated_step(n_block, m_block, num_m):
    """The step at which key block ``n_block`` reaches query block ``m_block``."""
    return (m_block - n_block % num_m + num_m) % num_m


def rotated_m_block(n_block, step, num_m):
    """The query block key block ``n_block`` visits at ``step`` (``step`` < ``num_m``)."""
    return (n_block % num_m + step) % num_m


def rotated_turn(n_block, m_block, num_m, num_n, lo=min, hi=max):
    """How many of the ``num_n`` key blocks reduce into query block ``m_block`` before
    ``n_block``: those that reach it at an earlier step, then the lower ones of the same step.

    At steps 0..s-1 the block is reached by the key blocks congruent to ``m_block - j`` (mod M),
    j < s: ``num_n // M`` of each residue, one more for residues below ``num_n % M``; those
    residues are the run m, m-1, .., m-s+1 taken cyclically, counted below ``rem`` in its part
    inside [0, m] and its wrapped part at the top of [0, M).
    """
    step = rotated_step(n_block, m_block, num_m)
    per_residue, rem = num_n // num_m, num_n % num_m
    first = m_block - step + 1  # the run's lowest value, unwrapped (negative when it wraps)
    inside = hi(lo(m_block, rem - 1) - hi(first, 0) + 1, 0)
    wrapped = hi(lo(num_m - 1, rem - 1) - (num_m + first) + 1, 0)
    return step * per_residue + inside + wrapped + n_block // num_m


def diagonal_coords(step, heads, m_block_min):
    """The diagonal walk's (head offset in the CTA's share, query block) at ``step``."""
    return step % heads, m_block_min + step // heads


def diagonal_turn(n_block, n_block_end):
    """How many key blocks reduce into a query block before ``n_block`` on the diagonal walk: the
    higher ones that see it (``n_block_end``: one past the last)."""
    return n_block_end - 1 - n_block


def grouped_launch(linear, num_n, num_heads, group, lo=min):
    """The (key block, head) of the diagonal walk's CTA launched ``linear``-th of ``num_n`` key
    blocks x ``num_heads`` heads, in groups of ``group`` (>= 1) heads. Launching one head at a
    time highest key block first (``group`` 0) is ``group`` 1 with the key block mirrored."""
    per_group = group * num_n
    first_head = linear // per_group * group
    within = linear - first_head * num_n
    size = lo(group, num_heads - first_head)
    n_block = within // size
    return n_block, first_head + within - n_block * size
