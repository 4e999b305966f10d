"""Per-CTA sequence facts: where sequence ``b`` starts in each tensor and how long it is
(the grid over them: sm80/grid.py).

Read once at the top of a CTA (from cu_seqlens for packed input, from
seqlens for dense padding, or from the static extents), so the main loop
never touches those tensors again.

The default backward's flat fp32 dQ accumulator is laid out per (sequence,
head) as a *slab* of whole query-block *chunks* (``tile_m * tile_hdim``
floats each, ``tile_hdim`` the flavor's Q/K tile, in the dQ MMA fragment's
register order, see sm80/bwd.py): dense ``[B, H, ceil(S / tile_m) * chunk]``;
packed ``[H, (T + B * tile_m) * tile_hdim]`` with sequence b's slab at row
``cu_seqlens_q[b] + b * tile_m``, so each sequence's last chunk has room to
run past its end. With sliced dQ (deterministic mode) the head axis holds
the slices one after another: slice s of head h is head ``h + s * H``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32, const_expr


class SeqlenTensors(NamedTuple):
    """A kernel's sequence-length inputs, as it receives them: cu_seqlens (packed) or
    seqlens (dense padding) for queries and keys, None where the call has none."""

    cu_seqlens_q: cute.Tensor | None
    cu_seqlens_k: cute.Tensor | None
    seqlens_q: cute.Tensor | None
    seqlens_k: cute.Tensor | None


def heads_of(mX: cute.Tensor, packed: bool):
    return mX.shape[1] if const_expr(packed) else mX.shape[2]


def accum_slices(mAcc: cute.Tensor, heads, packed: bool):
    """How many slices of ``heads`` heads the flat dQ accumulator's head axis holds (sliced dQ,
    module docstring)."""
    return (mAcc.shape[0] if const_expr(packed) else mAcc.shape[1]) // heads


@dataclass(frozen=True)
class SeqlenInfo:
    offset_q: Int32   # first row of sequence b in packed q/o (0 for dense)
    offset_k: Int32   # first row of sequence b in packed k/v (0 for dense)
    seqlen_q: Int32   # valid query rows of sequence b
    seqlen_k: Int32   # valid key rows of sequence b
    rows_q: Int32     # query rows a CTA must write: the padded S for dense, seqlen_q for packed
    rows_k: Int32     # key rows likewise (dk, dv of padded keys are written as zeros)
    packed: cutlass.Constexpr[bool]

    @staticmethod
    def create(batch: Int32, mQ: cute.Tensor, mK: cute.Tensor, lengths: SeqlenTensors) -> "SeqlenInfo":
        if const_expr(lengths.cu_seqlens_q is not None):
            offset_q = lengths.cu_seqlens_q[batch]
            offset_k = lengths.cu_seqlens_k[batch]
            seqlen_q = lengths.cu_seqlens_q[batch + 1] - offset_q
            seqlen_k = lengths.cu_seqlens_k[batch + 1] - offset_k
            return SeqlenInfo(offset_q, offset_k, seqlen_q, seqlen_k, seqlen_q, seqlen_k, True)
        rows_q, rows_k = mQ.shape[1], mK.shape[1]
        if const_expr(lengths.seqlens_q is not None):
            seqlen_q, seqlen_k = lengths.seqlens_q[batch], lengths.seqlens_k[batch]
            return SeqlenInfo(Int32(0), Int32(0), seqlen_q, seqlen_k, rows_q, rows_k, False)
        return SeqlenInfo(Int32(0), Int32(0), rows_q, rows_k, rows_q, rows_k, False)

    def rows_of(self, mX: cute.Tensor, batch, head, offset) -> cute.Tensor:
        """(seq, d) view of sequence ``batch``, head ``head`` of a q/k/v/o tensor."""
        if const_expr(not self.packed):
            return mX[batch, None, head, None]
        return cute.domain_offset((offset, 0), mX[None, head, None])

    def q_rows(self, mX: cute.Tensor, batch, head) -> cute.Tensor:
        return self.rows_of(mX, batch, head, self.offset_q)

    def k_rows(self, mX: cute.Tensor, batch, head) -> cute.Tensor:
        return self.rows_of(mX, batch, head, self.offset_k)

    def q_rows_accum(self, mAcc: cute.Tensor, batch, head) -> cute.Tensor:
        """(seq, d) view of the fp32 dQ accumulator: [B, H, S, D] dense, [H, T, D] packed."""
        if const_expr(not self.packed):
            return mAcc[batch, head, None, None]
        return cute.domain_offset((self.offset_q, 0), mAcc[head, None, None])

    def lse_row(self, mLSE: cute.Tensor, batch, head) -> cute.Tensor:
        """(seq,) view of the lse of one sequence and head: [B, H, S] dense, [H, T] packed."""
        if const_expr(not self.packed):
            return mLSE[batch, head, None]
        return cute.domain_offset((self.offset_q,), mLSE[head, None])

    def dq_accum_slab(self, mAcc: cute.Tensor, batch, head, tile_m: int, tile_hdim: int) -> cute.Tensor:
        """(slab,) view of sequence ``batch``, head ``head`` of the flat dQ accumulator (module doc)."""
        if const_expr(not self.packed):
            return mAcc[batch, head, None]
        return cute.domain_offset(((self.offset_q + batch * tile_m) * tile_hdim,), mAcc[head, None])

    def dq_accum_chunk(self, mAcc: cute.Tensor, batch, head, m_block, tile_m: int, tile_hdim: int) -> cute.Tensor:
        """(tile_m * tile_hdim,) chunk of query block ``m_block`` in that slab."""
        slab = self.dq_accum_slab(mAcc, batch, head, tile_m, tile_hdim)
        return cute.local_tile(slab, (tile_m * tile_hdim,), (m_block,))


def dq_accum_slice(chunk: cute.Tensor, j, tidx, threads: int, width: int):
    """Start of thread ``tidx``'s ``j``-th run of ``width`` dQ fragment values in a chunk of the
    flat accumulator: ``(j * threads + tidx) * width``, so a warp's runs are adjacent (whole
    lines). The one layout ``sm80/bwd`` reduces into and ``sm80/bwd_convert`` reads back."""
    return chunk.iterator + (j * threads + tidx) * width
