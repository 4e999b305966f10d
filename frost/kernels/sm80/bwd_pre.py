"""SM80 backward, step 1: per query row, D = rowsum(dO * O) and lse in log2 units.

Specialized by ``PARAMS`` (a ``config.BwdPreParams``). One CTA per (query
tile, head, sequence); ``tile_m`` rows of O and dO are read with 128-bit
loads, multiplied in fp32, and reduced over the eight threads that share a
64-column slab of a row (shuffles). Written, in the lse layout ([B, H, S]
dense, [H, T] packed):

- ``mD``: D_i (0 for padded rows);
- ``mLSE2``: lse_i * log2(e), with -inf replaced by +inf, so the main kernel's
  exp2(s * scale_log2 - lse2) is 0 for rows that see no key (and padded rows)
  instead of exp2(+inf);
- with sinks, ``mDsinkPartial[h, b * num_m_blocks + m_block]``: this tile's
  share of dsink_h = -sum_i exp(sink_h - lse_i) D_i over valid rows, reduced
  in a fixed order (warp shuffles, then warps in index order) so the final sum
  (torch, over the last dim) is deterministic.

Packed rows past a sequence belong to the next one and are not written.

With ``accum_tile_m`` (the default mode) it also zeroes the flat dQ
accumulator that ``sm80/bwd`` reduces into (layout: ``seqlen.py``): CTA m
zeroes floats ``[m, m + 1) * tile_m * tile_hdim_qk`` of its (sequence, head)
slab, coalesced, and the grid covers whole accumulator chunks
(``BwdPreParams.num_m_blocks``), so no separate memset runs; with
``dq_slices`` every slice of it (the deterministic mode's sliced dQ, where the main
kernel does not write its slices whole: ``BwdParams.dq_slice_stores``).
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.kernels.sm80 import tiles
from frost.kernels.sm80.grid import BLOCKS_FASTEST, grid_coords, launch_extents, launch_grid
from frost.kernels.sm80.seqlen import SeqlenInfo, SeqlenTensors, accum_slices, heads_of
from frost.kernels.sm80.softmax import LOG2_E

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
TILE_M, NUM_THREADS = P.tile_m, P.num_threads
TILE_HDIM_V = P.tile_hdim_v    # O and dO
TILE_HDIM_QK = P.tile_hdim_qk  # the dQ accumulator's chunks
PACKED = P.layout == "thd"
ACCUM_TILE_M = P.accum_tile_m
THREADS_PER_ROW = 8  # 64-column slab / 8 elements per 16-byte vector


class BwdPreTensors(NamedTuple):
    """The kernel's global tensors: the query side's lengths (None where the call has
    none; the sink pair None without sinks)."""

    o: cute.Tensor
    do: cute.Tensor
    lse: cute.Tensor
    d: cute.Tensor
    lse2: cute.Tensor
    cu_seqlens_q: cute.Tensor | None
    seqlens_q: cute.Tensor | None
    sinks: cute.Tensor | None
    dsink_partial: cute.Tensor | None
    dq_accum: cute.Tensor | None


@cute.jit
def sdpa_bwd_pre(
    mO: cute.Tensor,
    mdO: cute.Tensor,
    mLSE: cute.Tensor,
    mD: cute.Tensor,
    mLSE2: cute.Tensor,
    mCuSeqlensQ: cute.Tensor | None,
    mSeqlensQ: cute.Tensor | None,
    mSinks: cute.Tensor | None,
    mDsinkPartial: cute.Tensor | None,
    mdQaccum: cute.Tensor | None,
    max_seqlen_q: Int32,
    stream,
):
    extent_tile = ACCUM_TILE_M if const_expr(ACCUM_TILE_M > 0) else TILE_M
    num_chunks, num_heads, num_batch = launch_extents(mO, mCuSeqlensQ, max_seqlen_q, extent_tile, PACKED)
    num_m_blocks = num_chunks * (extent_tile // TILE_M)
    bwd_pre_kernel(
        BwdPreTensors(mO, mdO, mLSE, mD, mLSE2, mCuSeqlensQ, mSeqlensQ, mSinks, mDsinkPartial, mdQaccum),
        tiles.gmem_store_copy(DTYPE, TILE_HDIM_V, NUM_THREADS),
    ).launch(grid=launch_grid(BLOCKS_FASTEST, num_m_blocks, num_heads, num_batch), block=[NUM_THREADS, 1, 1],
             smem=128, stream=stream)


@cute.kernel
def bwd_pre_kernel(tensors: BwdPreTensors, gmem_tiled_copy: cute.TiledCopy):
    mO, mdO, mLSE, mD, mLSE2, mCuSeqlensQ, mSeqlensQ, mSinks, mDsinkPartial, mdQaccum = tensors
    tidx, _, _ = cute.arch.thread_idx()
    m_block, head, batch = grid_coords(BLOCKS_FASTEST)
    # keys are not read here: the query side's lengths stand in for them
    seqlen = SeqlenInfo.create(batch, mO, mO, SeqlenTensors(mCuSeqlensQ, mCuSeqlensQ, mSeqlensQ, mSeqlensQ))
    if const_expr(P.dq_slices):
        heads = heads_of(mO, PACKED)
        for s in cutlass.range(accum_slices(mdQaccum, heads, PACKED), unroll=1):
            zero_accum_rows(mdQaccum, seqlen, batch, head + s * heads, m_block, tidx)
    elif const_expr(ACCUM_TILE_M > 0):
        zero_accum_rows(mdQaccum, seqlen, batch, head, m_block, tidx)

    # (TILE_M, TILE_HDIM_V) tiles of O and dO; read straight into registers
    gO = cute.local_tile(seqlen.q_rows(mO, batch, head), (TILE_M, TILE_HDIM_V), (m_block, 0))
    gdO = cute.local_tile(seqlen.q_rows(mdO, batch, head), (TILE_M, TILE_HDIM_V), (m_block, 0))
    thr_copy = gmem_tiled_copy.get_slice(tidx)
    tOgO = thr_copy.partition_S(gO)    # (CPY, CPY_M, CPY_K)
    tOgdO = thr_copy.partition_S(gdO)
    tOcO = thr_copy.partition_S(cute.make_identity_tensor((TILE_M, TILE_HDIM_V)))
    tOpO = tiles.hdim_predicate(tOcO, mO.shape[-1])
    tOrO = cute.make_fragment_like(tOgO, DTYPE)
    tOrdO = cute.make_fragment_like(tOgdO, DTYPE)
    tOrO.fill(0.0)
    tOrdO.fill(0.0)
    valid_rows = seqlen.seqlen_q - m_block * TILE_M
    for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
        if tOcO[0, m, 0][0] < valid_rows:
            if const_expr(P.partial_hdim_v):
                cute.copy(gmem_tiled_copy, tOgO[None, m, None], tOrO[None, m, None], pred=tOpO[None, m, None])
                cute.copy(gmem_tiled_copy, tOgdO[None, m, None], tOrdO[None, m, None], pred=tOpO[None, m, None])
            else:
                cute.copy(gmem_tiled_copy, tOgO[None, m, None], tOrO[None, m, None])
                cute.copy(gmem_tiled_copy, tOgdO[None, m, None], tOrdO[None, m, None])

    gLSE = cute.local_tile(seqlen.lse_row(mLSE, batch, head), (TILE_M,), (m_block,))
    gD = cute.local_tile(seqlen.lse_row(mD, batch, head), (TILE_M,), (m_block,))
    gLSE2 = cute.local_tile(seqlen.lse_row(mLSE2, batch, head), (TILE_M,), (m_block,))
    written_rows = seqlen.rows_q - m_block * TILE_M
    sink_share = Float32(0.0)
    for m in cutlass.range_constexpr(cute.size(tOrO.shape[1])):
        products = tOrO[None, m, None].load().to(Float32) * tOrdO[None, m, None].load().to(Float32)
        d_row = products.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
        for offset in (4, 2, 1):  # the eight threads of a row are adjacent lanes
            d_row = d_row + cute.arch.shuffle_sync_bfly(d_row, offset=offset, mask=-1, mask_and_clamp=31)
        row = tOcO[0, m, 0][0]
        if tidx % THREADS_PER_ROW == 0 and row < written_rows:
            valid = row < valid_rows
            lse = gLSE[row] if valid else -Float32.inf
            gD[row] = d_row if valid else Float32(0.0)
            gLSE2[row] = Float32.inf if lse == -Float32.inf else lse * LOG2_E
            if const_expr(P.has_sinks):
                if valid:
                    sink_share = sink_share - cute.math.exp(mSinks[head] - lse) * d_row

    if const_expr(P.has_sinks):
        # fixed-order block reduction: lanes by butterfly, then warps in index order
        sink_share = cute.arch.warp_reduction_sum(sink_share)
        smem = cutlass.memory.SmemAllocator()
        s_warp = smem.allocate_tensor(Float32, cute.make_layout(P.num_warps), byte_alignment=16)
        warp = tidx // 32
        if tidx % 32 == 0:
            s_warp[warp] = sink_share
        cute.arch.barrier()
        if tidx == 0:
            total = Float32(0.0)
            for w in cutlass.range_constexpr(P.num_warps):
                total = total + s_warp[w]
            mDsinkPartial[head, batch * cute.arch.grid_dim()[0] + m_block] = total


@cute.jit
def zero_accum_rows(mdQaccum: cute.Tensor, seqlen: SeqlenInfo, batch, head, m_block, tidx):
    """Zero rows [m_block, m_block + 1) * TILE_M of the (sequence, head) slab of the dQ accumulator,
    as far as its chunks reach: a warp's stores cover 32 consecutive floats."""
    slab = seqlen.dq_accum_slab(mdQaccum, batch, head, ACCUM_TILE_M, TILE_HDIM_QK)
    slab_rows = cute.ceil_div(seqlen.rows_q, ACCUM_TILE_M) * ACCUM_TILE_M
    if m_block * TILE_M < slab_rows:
        part = cute.local_tile(slab, (TILE_M * TILE_HDIM_QK,), (m_block,))
        for i in cutlass.range_constexpr(TILE_M * TILE_HDIM_QK // NUM_THREADS):
            part[i * NUM_THREADS + tidx] = Float32(0.0)
