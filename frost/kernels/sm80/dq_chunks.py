"""The flat fp32 dQ accumulator's chunks read back into dq rows: what ``sm80/bwd_convert`` does
for every query block.

A chunk holds a (tile_m, tile_hdim) block in the dQ MMA fragment's register order (layout:
``seqlen.py``): thread t's ``j``-th run of ``width`` floats sits at ``(j * threads + t) *
width``, so a warp's runs are whole lines. A block is read into the fragment (one run per
vector load), summed over the accumulator's slices in slice order from 0.0 with a sliced
accumulator, scaled by the softmax scale, rounded to the io dtype and sent through a shared
(tile_m, tile_hdim) tile to 128-bit stores of its rows ``[0, rows_q)``.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from frost.kernels.sm80 import tiles
from frost.kernels.sm80.mask import AttentionMask
from frost.kernels.sm80.seqlen import SeqlenInfo, dq_accum_slice


# the slices whose loads are issued before their adds (``sum_slices``): the same bits, more
# loads in flight (docs/DECISIONS.md, "bwd_convert: two slices' loads in flight")
SLICE_UNROLL = 2


class DqChunks(NamedTuple):
    """The compile-time facts of a chunk and of its readers (plain ints: one per kernel)."""

    tile_m: int
    tile_hdim: int     # the flavor's Q/K tile: dQ's columns
    num_threads: int
    width: int         # floats per run (BwdParams.dq_reduce_width)


@cute.jit
def accum_run(chunks: cutlass.Constexpr, chunk: cute.Tensor, j, tidx) -> cute.Tensor:
    """Thread ``tidx``'s ``j``-th run of ``width`` floats in ``chunk``, as one aligned vector: the
    run starts at a multiple of ``width`` floats of a 256-byte aligned chunk (``sm80/bwd``'s
    ``write_dq`` stores it the same way), which the pointer must say for a 128-bit load."""
    start = dq_accum_slice(chunk, j, tidx, chunks.num_threads, chunks.width)
    return cute.make_tensor(cute.make_ptr(Float32, start.toint(), cute.AddressSpace.gmem,
                                          assumed_align=4 * chunks.width),
                            cute.make_layout(chunks.width))


@cute.jit
def read_chunk(chunks: cutlass.Constexpr, acc: cute.Tensor, chunk: cute.Tensor, tidx):
    """``acc`` (this thread's dQ fragment) = its values in ``chunk``."""
    for j in cutlass.range_constexpr(cute.size(acc) // chunks.width):
        target = cute.make_tensor(acc.iterator + chunks.width * j, cute.make_layout(chunks.width))
        target.store(accum_run(chunks, chunk, j, tidx).load())


@cute.jit
def sum_slices(chunks: cutlass.Constexpr, acc: cute.Tensor, mdQaccum: cute.Tensor, seqlen: SeqlenInfo,
               mask: AttentionMask | None, num_slices, batch, head, heads, m_block, tidx):
    """This thread's fragment of the block, summed over the accumulator's ``num_slices`` slices in
    slice order (fixed fp32 sums: deterministic), unscaled. With ``mask`` (``dq_slice_stores``) a
    slice whose walk never reached this block is skipped: the main kernel left its chunk
    unwritten. Slice s's walk starts on key block s, which sees every query block its later
    blocks do (sm80/bwd.py, "Sliced dQ"), so its chunk holds values iff the block is in that key
    block's range."""
    acc.fill(0.0)
    for first in cutlass.range(0, num_slices, SLICE_UNROLL, unroll=1):
        # SLICE_UNROLL x (frag): the group's values, all loaded before the first add
        staged = [cute.make_rmem_tensor(acc.shape, Float32) for _ in range(SLICE_UNROLL)]
        for i in cutlass.range_constexpr(SLICE_UNROLL):
            if first + i < num_slices and slice_written(mask, first + i, m_block):
                chunk = seqlen.dq_accum_chunk(mdQaccum, batch, head + (first + i) * heads, m_block, chunks.tile_m,
                                              chunks.tile_hdim)
                read_chunk(chunks, staged[i], chunk, tidx)
        for i in cutlass.range_constexpr(SLICE_UNROLL):
            if first + i < num_slices and slice_written(mask, first + i, m_block):
                acc.store(acc.load() + staged[i].load())


@cute.jit
def slice_written(mask: AttentionMask | None, s, m_block):
    """Whether slice ``s`` holds values for query block ``m_block``: always without ``mask``;
    with it, iff the block is in the range of the slice's first key block (``sum_slices``)."""
    if const_expr(mask is None):
        return True
    seen_min, seen_max = mask.m_block_range(s)
    return m_block >= seen_min and m_block < seen_max


@cute.jit
def store_block(chunks: cutlass.Constexpr, acc: cute.Tensor, scale, tiled_mma_dq, gmem_tiled_copy_store, tidx,
                sdQ: cute.Tensor, mdQ: cute.Tensor, seqlen: SeqlenInfo, batch, head, m_block,
                check_hdim: cutlass.Constexpr[bool]):
    """Query block ``m_block`` of dq (``acc``: this thread's unscaled fp32 fragment) through the
    shared tile ``sdQ``; the caller's barrier must precede it when ``sdQ`` was in use, and
    follow it before ``sdQ`` is written again. Packed rows past the sequence are not written."""
    acc.store(acc.load() * scale)
    tiles.stash_acc(tiled_mma_dq, tidx, acc, sdQ, mdQ.element_type)
    cute.arch.barrier()
    g_tile = cute.local_tile(seqlen.q_rows(mdQ, batch, head), (chunks.tile_m, chunks.tile_hdim), (m_block, 0))
    tiles.store_rows(gmem_tiled_copy_store, tidx, sdQ, g_tile, seqlen.rows_q - m_block * chunks.tile_m,
                     mdQ.shape[-1], check_hdim)
