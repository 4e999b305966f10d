"""SM80 attention backward, step 3 of the default mode: the flat fp32 dQ accumulator -> dq.

Specialized by ``PARAMS`` (a ``config.BwdConvertParams``). One CTA per (query
block, head, sequence), launched highest query block first across the whole grid
(``BLOCKS_SLOWEST``, blocks reversed): the main kernel's last reductions went into
the high blocks (a key block reduces into the query blocks from its own on, and the
sliced dQ's last round holds the high key blocks), so their lines are read back
while still in L2. The CTA has the main kernel's threads and dQ MMA, and reads,
scales and stores the block as ``sm80/dq_chunks`` says. With ``dq_slices`` (deterministic
mode) the block is the sum of the accumulator's slices, in slice order
(``dq_chunks.SLICE_UNROLL`` slices' loads issued before their adds); with
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

from frost.kernels.sm80 import dq_chunks, tiles
from frost.kernels.sm80.grid import BLOCKS_SLOWEST, grid_coords, launch_extents, launch_grid
from frost.kernels.sm80.mask import AttentionMask
from frost.kernels.sm80.seqlen import SeqlenInfo, SeqlenTensors, accum_slices, heads_of

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
TILE_M, NUM_THREADS = P.tile_m, P.num_threads
TILE_HDIM_QK = P.tile_hdim_qk  # dQ's columns
PACKED = P.layout == "thd"
SLICED = P.dq_slices  # the accumulator holds slices, summed here in order (sm80/bwd.py, "Sliced dQ")
CHUNKS = dq_chunks.DqChunks(TILE_M, TILE_HDIM_QK, NUM_THREADS, P.dq_reduce_width)


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
    if seqlen.rows_q - m_block * TILE_M > 0:  # packed: blocks past this sequence's end have nothing to write
        thr_mma = setup.tiled_mma_dq.get_slice(tidx)
        # (frag): this thread's dQ MMA fragment of the (TILE_M, TILE_HDIM_QK) block
        acc = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, TILE_HDIM_QK)), Float32)
        if const_expr(SLICED):
            mask = None
            if const_expr(P.dq_slice_stores):
                mask = AttentionMask.for_sequence(TILE_M, P.tile_n, P, seqlen, Int32(0), window_right, True)
            heads = heads_of(mdQ, PACKED)
            dq_chunks.sum_slices(CHUNKS, acc, mdQaccum, seqlen, mask, accum_slices(mdQaccum, heads, PACKED), batch,
                                 head, heads, m_block, tidx)
        else:
            dq_chunks.read_chunk(CHUNKS, acc, seqlen.dq_accum_chunk(mdQaccum, batch, head, m_block, TILE_M,
                                                                    TILE_HDIM_QK), tidx)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        dq_chunks.store_block(CHUNKS, acc, scale, setup.tiled_mma_dq, setup.gmem_tiled_copy_store, tidx,
                              storage.sdQ.get_tensor(setup.sdQ_layout), mdQ, seqlen, batch, head, m_block,
                              P.partial_hdim_qk)
