"""SM80 attention backward, step 3 of the default mode: the flat fp32 dQ accumulator -> dq.

Specialized by ``PARAMS`` (a ``config.BwdConvertParams``). One CTA per (query
block, head, sequence), launched highest query block first across the whole grid
(``BLOCKS_SLOWEST``, blocks reversed): the main kernel's last reductions went into
the high blocks (a key block reduces into the query blocks from its own on, and the
sliced dQ's last round holds the high key blocks), so their lines are read back
while still in L2. The CTA has the main kernel's threads and dQ MMA: thread t
reads its fragment values back from the block's chunk in the order
``sm80/bwd`` reduced them (``[w*j, w*j + w)`` at ``(j * threads + t) * w``;
coalesced; one vector of ``w`` floats per run), scales them by the softmax
scale, rounds them to the io dtype and sends them through shared memory to
128-bit stores of rows ``[0, rows_q)``. With ``dq_slices`` (deterministic
mode) the block is the sum of the accumulator's slices, in slice order
(``slice_unroll`` slices' loads issued before their adds); with
``dq_slice_stores`` the chunks a slice's walk never reached were not written
and are skipped (``sum_slices``). Dense padded rows come out as zeros: nothing
but +-0 was reduced or stored into them, and a chunk no key block reached was
zeroed by ``sm80/bwd_pre`` or is skipped. Packed rows past a sequence are not
written.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.kernels.sm80 import tiles
from frost.kernels.sm80.grid import BLOCKS_SLOWEST, grid_coords, launch_extents, launch_grid
from frost.kernels.sm80.mask import AttentionMask
from frost.kernels.sm80.seqlen import SeqlenInfo, SeqlenTensors, accum_slices, dq_accum_slice, heads_of

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
TILE_M, NUM_THREADS = P.tile_m, P.num_threads
TILE_HDIM_QK = P.tile_hdim_qk  # dQ's columns
PACKED = P.layout == "thd"
WIDTH = P.dq_reduce_width
SLICED = P.dq_slices  # the accumulator holds slices, summed here in order (sm80/bwd.py, "Sliced dQ")


class ConvertSetup(NamedTuple):
    sdQ_layout: cute.ComposedLayout
    gmem_tiled_copy_store: cute.TiledCopy
    tiled_mma_dq: cute.TiledMma


@cute.jit
def sdpa_bwd_convert(
    mdQaccum: cute.Tensor, mdQ: cute.Tensor, mCuSeqlensQ: cute.Tensor | None, mK: cute.Tensor | None,
    mCuSeqlensK: cute.Tensor | None, mSeqlensQ: cute.Tensor | None, mSeqlensK: cute.Tensor | None, scale: Float32,
    window_right: Int32, max_seqlen_q: Int32, stream,
):
    """``mK`` and the key lengths (and ``window_right``) are read with ``dq_slice_stores`` only, for
    the main kernel's mask; otherwise they are None (unread)."""
    setup = ConvertSetup(
        tiles.smem_layout(DTYPE, TILE_M, TILE_HDIM_QK),
        tiles.gmem_store_copy(DTYPE, TILE_HDIM_QK, NUM_THREADS),
        tiles.tiled_mma(DTYPE, P.num_warps, P.warps_m_dq),
    )

    @cute.struct
    class SharedStorage:
        sdQ: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sdQ_layout)], 1024]

    num_m_blocks, num_heads, num_batch = launch_extents(mdQ, mCuSeqlensQ, max_seqlen_q, TILE_M, PACKED)
    lengths = SeqlenTensors(mCuSeqlensQ, mCuSeqlensK, mSeqlensQ, mSeqlensK)
    if const_expr(not P.dq_slice_stores):
        # no mask to evaluate, and dense padding needs no lengths: every row of the padded extent is written
        mK, lengths = mdQ, SeqlenTensors(mCuSeqlensQ, mCuSeqlensQ, None, None)
    convert_kernel(
        mdQaccum, mdQ, mK, lengths, scale, window_right, setup, SharedStorage,
    ).launch(grid=launch_grid(BLOCKS_SLOWEST, num_m_blocks, num_heads, num_batch), block=[NUM_THREADS, 1, 1],
             smem=SharedStorage.size_in_bytes(), stream=stream)


@cute.kernel
def convert_kernel(mdQaccum: cute.Tensor, mdQ: cute.Tensor, mK: cute.Tensor, lengths: SeqlenTensors, scale: Float32,
                   window_right: Int32, setup: ConvertSetup, SharedStorage: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    m_block, head, batch = grid_coords(BLOCKS_SLOWEST, reverse_blocks=True)
    seqlen = SeqlenInfo.create(batch, mdQ, mK, lengths)
    written_rows = seqlen.rows_q - m_block * TILE_M
    if written_rows > 0:  # packed: blocks past this sequence's end have nothing to write
        chunk = seqlen.dq_accum_chunk(mdQaccum, batch, head, m_block, TILE_M, TILE_HDIM_QK)
        thr_mma = setup.tiled_mma_dq.get_slice(tidx)
        # (frag): this thread's dQ MMA fragment of the (TILE_M, TILE_HDIM_QK) block
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, TILE_HDIM_QK)), Float32)
        if const_expr(SLICED):
            mask = None
            if const_expr(P.dq_slice_stores):
                mask = AttentionMask.for_sequence(TILE_M, P.tile_n, P, seqlen, Int32(0), window_right, True)
            sum_slices(acc, mdQaccum, seqlen, mask, batch, head, heads_of(mdQ, PACKED), m_block, tidx)
            acc.store(acc.load() * scale)
        else:
            for j in cutlass.range_constexpr(cute.size(acc) // WIDTH):
                target = cute.make_tensor(acc.iterator + WIDTH * j, cute.make_layout(WIDTH))
                target.store(accum_run(chunk, j, tidx).load() * scale)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sdQ = storage.sdQ.get_tensor(setup.sdQ_layout)
        tiles.stash_acc(setup.tiled_mma_dq, tidx, acc, sdQ, DTYPE)
        cute.arch.barrier()
        g_tile = cute.local_tile(seqlen.q_rows(mdQ, batch, head), (TILE_M, TILE_HDIM_QK), (m_block, 0))
        tiles.store_rows(setup.gmem_tiled_copy_store, tidx, sdQ, g_tile, written_rows, mdQ.shape[-1],
                         P.partial_hdim_qk)


@cute.jit
def sum_slices(acc: cute.Tensor, mdQaccum: cute.Tensor, seqlen: SeqlenInfo, mask: AttentionMask | None, batch, head,
               heads, m_block, tidx):
    """This thread's fragment of the block, summed over the accumulator's slices in slice order
    (fixed fp32 sums: deterministic), unscaled. With ``mask`` (``dq_slice_stores``) a slice whose
    walk never reached this block is skipped: the main kernel left its chunk unwritten. Slice s's
    walk starts on key block s, which sees every query block its later blocks do (sm80/bwd.py,
    "Sliced dQ"), so its chunk holds values iff the block is in that key block's range."""
    acc.fill(0.0)
    num_slices = accum_slices(mdQaccum, heads, PACKED)
    for first in cutlass.range(0, num_slices, P.slice_unroll, unroll=1):
        # slice_unroll x (frag): the group's values, all loaded before the first add
        staged = [cute.make_rmem_tensor(acc.shape, Float32) for _ in range(P.slice_unroll)]
        for i in cutlass.range_constexpr(P.slice_unroll):
            if first + i < num_slices and slice_written(mask, first + i, m_block):
                chunk = seqlen.dq_accum_chunk(mdQaccum, batch, head + (first + i) * heads, m_block, TILE_M,
                                              TILE_HDIM_QK)
                for j in cutlass.range_constexpr(cute.size(acc) // WIDTH):
                    target = cute.make_tensor(staged[i].iterator + WIDTH * j, cute.make_layout(WIDTH))
                    target.store(accum_run(chunk, j, tidx).load())
        for i in cutlass.range_constexpr(P.slice_unroll):
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
def accum_run(chunk: cute.Tensor, j, tidx) -> cute.Tensor:
    """Thread ``tidx``'s ``j``-th run of ``WIDTH`` floats in ``chunk``, as one aligned vector: the
    run starts at a multiple of ``WIDTH`` floats of a 256-byte aligned chunk (``sm80/bwd``'s
    ``write_dq`` stores it the same way), which the pointer must say for a 128-bit load."""
    start = dq_accum_slice(chunk, j, tidx, NUM_THREADS, WIDTH)
    return cute.make_tensor(cute.make_ptr(Float32, start.toint(), cute.AddressSpace.gmem, assumed_align=4 * WIDTH),
                            cute.make_layout(WIDTH))
