"""SM80 attention backward, step 3 of the default mode: the flat fp32 dQ accumulator -> dq.

Specialized by ``PARAMS`` (a ``config.BwdConvertParams``). One CTA per (query
block, head, sequence), with the main kernel's threads and dQ MMA: thread t
reads its fragment values back from the block's chunk in the order
``sm80/bwd`` reduced them (``[w*j, w*j + w)`` at ``(j * threads + t) * w``;
coalesced), scales them by the softmax scale, rounds them to the io dtype
and sends them through shared memory to 128-bit stores of rows
``[0, rows_q)``. With ``dq_slices`` (deterministic mode) the block is the
sum of the accumulator's slices, in slice order. Dense padded rows come out
as zeros: nothing but +-0 was reduced into them, and ``sm80/bwd_pre`` zeroed
the chunk or the main kernel wrote it whole (``dq_slice_stores``). Packed rows past a sequence are not written.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.kernels.sm80 import tiles
from frost.kernels.sm80.grid import BLOCKS_FASTEST, grid_coords, launch_extents, launch_grid
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
    mdQaccum: cute.Tensor, mdQ: cute.Tensor, mCuSeqlensQ: cute.Tensor | None, scale: Float32,
    max_seqlen_q: Int32, stream,
):
    setup = ConvertSetup(
        tiles.smem_layout(DTYPE, TILE_M, TILE_HDIM_QK),
        tiles.gmem_store_copy(DTYPE, TILE_HDIM_QK, NUM_THREADS),
        tiles.tiled_mma(DTYPE, P.num_warps, P.warps_m_dq),
    )

    @cute.struct
    class SharedStorage:
        sdQ: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sdQ_layout)], 1024]

    num_m_blocks, num_heads, num_batch = launch_extents(mdQ, mCuSeqlensQ, max_seqlen_q, TILE_M, PACKED)
    convert_kernel(
        # dense padding needs no lengths here: every row of the padded extent is written
        mdQaccum, mdQ, SeqlenTensors(mCuSeqlensQ, mCuSeqlensQ, None, None), scale, setup, SharedStorage,
    ).launch(grid=launch_grid(BLOCKS_FASTEST, num_m_blocks, num_heads, num_batch), block=[NUM_THREADS, 1, 1],
             smem=SharedStorage.size_in_bytes(), stream=stream)


@cute.kernel
def convert_kernel(mdQaccum: cute.Tensor, mdQ: cute.Tensor, lengths: SeqlenTensors, scale: Float32,
                   setup: ConvertSetup, SharedStorage: cutlass.Constexpr):
    tidx, _, _ = cute.arch.thread_idx()
    m_block, head, batch = grid_coords(BLOCKS_FASTEST)
    seqlen = SeqlenInfo.create(batch, mdQ, mdQ, lengths)
    written_rows = seqlen.rows_q - m_block * TILE_M
    if written_rows > 0:  # packed: blocks past this sequence's end have nothing to write
        chunk = seqlen.dq_accum_chunk(mdQaccum, batch, head, m_block, TILE_M, TILE_HDIM_QK)
        thr_mma = setup.tiled_mma_dq.get_slice(tidx)
        # (frag): this thread's dQ MMA fragment of the (TILE_M, TILE_HDIM_QK) block
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, TILE_HDIM_QK)), Float32)
        if const_expr(SLICED):
            sum_slices(acc, mdQaccum, seqlen, batch, head, heads_of(mdQ, PACKED), m_block, tidx)
            acc.store(acc.load() * scale)
        else:
            for j in cutlass.range_constexpr(cute.size(acc) // WIDTH):
                source = cute.make_tensor(dq_accum_slice(chunk, j, tidx, NUM_THREADS, WIDTH), cute.make_layout(WIDTH))
                cute.make_tensor(acc.iterator + WIDTH * j, cute.make_layout(WIDTH)).store(source.load() * scale)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sdQ = storage.sdQ.get_tensor(setup.sdQ_layout)
        tiles.stash_acc(setup.tiled_mma_dq, tidx, acc, sdQ, DTYPE)
        cute.arch.barrier()
        g_tile = cute.local_tile(seqlen.q_rows(mdQ, batch, head), (TILE_M, TILE_HDIM_QK), (m_block, 0))
        tiles.store_rows(setup.gmem_tiled_copy_store, tidx, sdQ, g_tile, written_rows, mdQ.shape[-1],
                         P.partial_hdim_qk)


@cute.jit
def sum_slices(acc: cute.Tensor, mdQaccum: cute.Tensor, seqlen: SeqlenInfo, batch, head, heads, m_block, tidx):
    """This thread's fragment of the block, summed over the accumulator's slices in slice order
    (fixed fp32 sums: deterministic), unscaled."""
    acc.fill(0.0)
    for s in cutlass.range(accum_slices(mdQaccum, heads, PACKED), unroll=1):
        chunk = seqlen.dq_accum_chunk(mdQaccum, batch, head + s * heads, m_block, TILE_M, TILE_HDIM_QK)
        for j in cutlass.range_constexpr(cute.size(acc) // WIDTH):
            source = cute.make_tensor(dq_accum_slice(chunk, j, tidx, NUM_THREADS, WIDTH), cute.make_layout(WIDTH))
            target = cute.make_tensor(acc.iterator + WIDTH * j, cute.make_layout(WIDTH))
            target.store(target.load() + source.load())
