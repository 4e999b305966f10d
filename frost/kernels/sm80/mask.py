"""Visibility of keys to queries (SEMANTICS.md, "Visibility"), at block and element level.

Key j is visible to query i of the same sequence iff
    j < Sk_b,  (no left window  or j >= i + delta - window_left),
               (no right window or j <= i + delta + window_right),
with delta = 0 (top-left) or Sk_b - Sq_b (bottom-right); causal is window_right = 0.

``AttentionMask`` answers three questions about a (query block, key block)
tile: which key blocks of a query block (forward) or which query blocks of
a key block (backward) can hold a visible pair at all (the rest are skipped,
never computed), whether a tile needs element masking (tiles entirely inside
the visible band take the unmasked path), and, for a tile that does, which
score elements to set to -inf.

All bounds are in absolute positions within the sequence. With ``mask_rows``
(the backward) query rows past Sq_b are masked too: there every row of a
tile feeds dK and dV, while the forward simply never stores such rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.kernels.sm80 import tiles


@dataclass(frozen=True)
class AttentionMask:
    tile_m: cutlass.Constexpr[int]
    tile_n: cutlass.Constexpr[int]
    has_window_left: cutlass.Constexpr[bool]
    has_window_right: cutlass.Constexpr[bool]
    mask_rows: cutlass.Constexpr[bool]
    seqlen_q: Int32
    seqlen_k: Int32
    delta: Int32          # key index aligned with query 0
    window_left: Int32    # read only when has_window_left
    window_right: Int32   # read only when has_window_right

    @staticmethod
    def for_sequence(tile_m: int, tile_n: int, params, seqlen, window_left: Int32, window_right: Int32,
                     mask_rows: bool) -> "AttentionMask":
        """The mask of one sequence (``seqlen``, a SeqlenInfo) under a kernel's params record
        (its ``has_window_left`` / ``has_window_right`` / ``bottom_right`` fields)."""
        delta = seqlen.seqlen_k - seqlen.seqlen_q if const_expr(params.bottom_right) else Int32(0)
        return AttentionMask(tile_m, tile_n, params.has_window_left, params.has_window_right, mask_rows,
                             seqlen.seqlen_q, seqlen.seqlen_k, delta, window_left, window_right)

    @cute.jit
    def n_block_range(self, m_block: Int32):
        """[n_min, n_max) of key blocks that may hold a key visible to some valid row of m_block."""
        n_max = cute.ceil_div(self.seqlen_k, self.tile_n)
        row_first = m_block * self.tile_m
        row_last = cutlass.min(row_first + self.tile_m, self.seqlen_q) - 1
        if const_expr(self.has_window_right):
            # last visible key of the last valid row, +1; clamp before dividing (division truncates)
            key_end = cutlass.max(row_last + self.delta + self.window_right + 1, 0)
            n_max = cutlass.min(n_max, cute.ceil_div(key_end, self.tile_n))
        n_min = Int32(0)
        if const_expr(self.has_window_left):
            key_start = cutlass.max(row_first + self.delta - self.window_left, 0)
            n_min = key_start // self.tile_n
        if row_last < row_first:  # no valid query row in this block
            n_max = n_min
        return n_min, n_max

    @cute.jit
    def m_block_range(self, n_block: Int32):
        """[m_min, m_max) of query blocks holding a row that sees some valid key of n_block."""
        m_max = cute.ceil_div(self.seqlen_q, self.tile_m)
        key_first = n_block * self.tile_n
        key_last = cutlass.min(key_first + self.tile_n, self.seqlen_k) - 1
        m_min = Int32(0)
        if const_expr(self.has_window_right):
            # first row that sees key_first: i >= j - delta - window_right
            row_start = cutlass.max(key_first - self.delta - self.window_right, 0)
            m_min = row_start // self.tile_m
            if row_start >= self.seqlen_q:  # no valid row sees it: the exact inverse of n_block_range
                m_max = m_min
        if const_expr(self.has_window_left):
            # last row that sees key_last: i <= j - delta + window_left; clamp before dividing
            row_end = cutlass.max(key_last - self.delta + self.window_left + 1, 0)
            m_max = cutlass.min(m_max, cute.ceil_div(row_end, self.tile_m))
        if key_last < key_first:  # no valid key in this block
            m_max = m_min
        return m_min, m_max

    @cute.jit
    def needs_mask(self, m_block: Int32, n_block: Int32) -> cutlass.Boolean:
        """Whether some element of (m_block, n_block) is invisible."""
        key_first = n_block * self.tile_n
        key_last = key_first + self.tile_n - 1
        row_first = m_block * self.tile_m
        row_last = row_first + self.tile_m - 1
        masked = key_last >= self.seqlen_k
        if const_expr(self.mask_rows):
            masked = masked or row_last >= self.seqlen_q
        if const_expr(self.has_window_right):
            masked = masked or key_last > row_first + self.delta + self.window_right
        if const_expr(self.has_window_left):
            masked = masked or key_first < row_last + self.delta - self.window_left
        return masked

    @cute.jit
    def apply(self, acc_S: cute.Tensor, tScS: cute.Tensor, t0ScS: cute.Tensor, m_block: Int32, n_block: Int32):
        """Set invisible elements of the (tile_m, tile_n) score accumulator to -inf.

        ``tScS`` is this thread's partition of the tile's identity tensor,
        ``t0ScS`` thread 0's: its columns are compile-time constants, so each
        test below is one comparison of a register against an immediate once
        this thread's column offset is folded into the limits.
        """
        acc_S_mn = tiles.acc_mn_view(acc_S)
        at = tiles.ScoreCoords.of(tScS, t0ScS, m_block, n_block, self.tile_m, self.tile_n)
        col_base = at.col_base
        seqlen_limit = self.seqlen_k - col_base
        for r in cutlass.range_constexpr(cute.size(acc_S_mn.shape[0])):
            row = at.row(r)
            col_hi = seqlen_limit
            if const_expr(self.has_window_right):
                col_hi = cutlass.min(col_hi, row + self.delta + self.window_right + 1 - col_base)
            col_lo = Int32(0)
            if const_expr(self.has_window_left):
                col_lo = row + self.delta - self.window_left - col_base
            if const_expr(self.mask_rows):
                if row >= self.seqlen_q:
                    col_hi = Int32(0)
            for c in cutlass.range_constexpr(cute.size(acc_S_mn.shape[1])):
                col = at.col(c)
                if const_expr(self.has_window_left):
                    if col >= col_hi or col < col_lo:
                        acc_S_mn[r, c] = -Float32.inf
                else:
                    if col >= col_hi:
                        acc_S_mn[r, c] = -Float32.inf
