"""The order in which the key blocks of one head reduce into a query block's dQ (ordered dQ,
deterministic mode: sm80/bwd.py): the walk of a CTA's steps, shared or rotated.

Shared walk (``ordered_coords``, any mask): a key block visits its query blocks from its last
down, and the query heads of its GQA share are the fastest index: at step ``i`` it is on head
``i % heads`` of block ``m_block_max - 1 - i // heads``. The turns go by key block, lowest first.
Under a causal or window mask the key blocks of a column see different numbers of query blocks;
with the heads the fastest index every one reaches (h, m) at step ``(m_block_max - 1 - m) * heads
+ h``, where ``m_block_max`` (one past its last block) grows with the key block, so a lower key
block is never later than a higher one. With the heads outer, a key block that saw few blocks of
head h would reach head h+1 early and wait there for the lowest, which sees them all.

Rotated walk (``BwdParams.dq_rotated``, unmasked problems): key block ``n`` visits query block
``(n + i) mod M`` at its step ``i`` (M query blocks, N key blocks of the sequence), so at any step
the key blocks of a head run on different query blocks instead of queueing for the same one.
A query block's turn order is the order in which the key blocks reach it in that lockstep:
by step, then by key block. Every key block of the head sees every query block, so the turns of
one query block are a permutation of 0..N-1, and a key block that is on time never waits.

Deadlock: a key block may wait on higher ones, so the plan uses the walk only when a head's N
CTAs fit on the device at once and the grid launches them together (key blocks its fastest
index); the head launched first then always has every CTA it waits on resident.

``rotated_turn`` is plain arithmetic with the ``lo`` / ``hi`` (min / max) it is given, so the
kernel (``cutlass.min`` / ``cutlass.max`` on Int32) and the host's tests (``min`` / ``max``) run
the same code.
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
