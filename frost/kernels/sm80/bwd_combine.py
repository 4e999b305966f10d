"""SM80 backward of a split GQA group, last step: dk and dv from their fp32 split partials.

Specialized by ``PARAMS`` (a ``config.BwdCombineParams``). When the main kernel
spreads a group's query heads over ``splits`` CTAs (``sm80/bwd``, ``split_group``),
each split writes its own fp32 partial of dK and dV into the workspace,
``[splits, B, Sk, Hkv, tile]`` dense or ``[splits, T, Hkv, tile]`` packed. This
kernel adds them up in split order (a fixed order: deterministic either way),
rounds to the io dtype and writes dk and dv in one launch, so the host issues
no reduction, slice or copy passes of its own.

One CTA per (block of ``ROWS`` key rows, kv head, dk or dv); a thread owns
``VEC`` consecutive columns of a row: for each split it reads them (32 bytes,
a warp covers whole rows; ``SPLIT_UNROLL`` splits' loads are issued before
their in-order adds) and it stores one 16-byte vector. Column vectors at or
past the head dim are not touched (head dims are multiples of 8). Dense
rows are (sequence, key) pairs of the padded extent, all written (the main
kernel wrote zeros into padded key rows of every partial); packed rows past
``cu_seqlens_k[-1]`` are not the contract's and are not written.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
PACKED = P.layout == "thd"
TILE_HDIM_QK, TILE_HDIM_V = P.tile_hdim_qk, P.tile_hdim_v
NUM_THREADS = 128
# 16 key rows per CTA and 4 splits' loads in flight: with 64 rows and one split at a time the
# combine was latency-bound where its grid is small (docs/DECISIONS.md, "Backward: the split
# group's combine, 16 key rows per CTA")
ROWS = 16
SPLIT_UNROLL = 4
VEC = 8  # one 16-byte store of fp16/bf16


@cute.jit
def sdpa_bwd_combine(
    mdKpart: cute.Tensor, mdVpart: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
    mCuSeqlensK: cute.Tensor | None, stream,
):
    rows = mdK.shape[0] if const_expr(PACKED) else mdK.shape[0] * mdK.shape[1]
    combine_kernel(mdKpart, mdVpart, mdK, mdV, mCuSeqlensK).launch(
        grid=[(rows + ROWS - 1) // ROWS, mdK.shape[-2], 2], block=[NUM_THREADS, 1, 1], stream=stream,
    )


@cute.kernel
def combine_kernel(mdKpart: cute.Tensor, mdVpart: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor,
                   mCuSeqlensK: cute.Tensor | None):
    tidx, _, _ = cute.arch.thread_idx()
    row_block, head, which = cute.arch.block_idx()
    if which == 0:
        combine_rows(mdKpart, mdK, mCuSeqlensK, row_block, head, tidx, TILE_HDIM_QK)
    else:
        combine_rows(mdVpart, mdV, mCuSeqlensK, row_block, head, tidx, TILE_HDIM_V)


@cute.jit
def combine_rows(mPart: cute.Tensor, mOut: cute.Tensor, mCuSeqlensK: cute.Tensor | None, row_block, head, tidx,
                 width: cutlass.Constexpr[int]):
    """Rows [row_block * ROWS, +ROWS) of one kv head of one output: the sum over splits, rounded."""
    # a width of 192 gives 24 threads per row: 5 rows per pass, the last 8 threads idle
    threads_per_row = width // VEC
    rows_per_pass = NUM_THREADS // threads_per_row
    column_vector = tidx % threads_per_row
    lane_row = tidx // threads_per_row
    if const_expr(PACKED):
        limit = mCuSeqlensK[mCuSeqlensK.shape[0] - 1]
    else:
        limit = mOut.shape[0] * mOut.shape[1]
    if lane_row < rows_per_pass and column_vector * VEC < mOut.shape[-1]:
        for step in cutlass.range_constexpr((ROWS + rows_per_pass - 1) // rows_per_pass):
            in_block = step * rows_per_pass + lane_row
            row = row_block * ROWS + in_block
            if in_block < ROWS and row < limit:
                # (VEC,): this thread's columns of the row, summed over the splits in order
                acc = cute.make_rmem_tensor((VEC,), Float32)
                acc.fill(0.0)
                sum_splits_staged(acc, mPart, row, head, column_vector)
                _columns(mOut, row, head, None, column_vector).store(acc.load().to(DTYPE))


@cute.jit
def sum_splits_staged(acc: cute.Tensor, mPart: cute.Tensor, row, head, column_vector):
    """acc += the splits' columns in split order, ``SPLIT_UNROLL`` splits at a time, each group's
    loads issued before its first add, so that they are in flight together."""
    num_splits = mPart.shape[0]
    for first in cutlass.range(0, num_splits, SPLIT_UNROLL, unroll=1):
        # SPLIT_UNROLL x (VEC,): the group's columns, loaded first
        staged = [cute.make_rmem_tensor((VEC,), Float32) for _ in range(SPLIT_UNROLL)]
        for i in cutlass.range_constexpr(SPLIT_UNROLL):
            if first + i < num_splits:
                staged[i].store(_columns(mPart, row, head, first + i, column_vector).load())
        for i in cutlass.range_constexpr(SPLIT_UNROLL):
            if first + i < num_splits:
                acc.store(acc.load() + staged[i].load())


@cute.jit
def _columns(mT: cute.Tensor, row, head, split, column_vector) -> cute.Tensor:
    """(VEC,): this thread's columns of ``_row(mT, row, head, split)``."""
    return cute.local_tile(_row(mT, row, head, split), (VEC,), (column_vector,))


@cute.jit
def _row(mT: cute.Tensor, row, head, split):
    """The 1-D row ``row`` (flat over (sequence, key) when dense) of kv head ``head``; of split
    ``split`` for a partial (leading split mode), else of the output itself."""
    if const_expr(PACKED):
        if const_expr(split is None):
            return mT[row, head, None]
        return mT[split, row, head, None]
    seqlen = mT.shape[-3]
    batch = row // seqlen
    key = row - batch * seqlen
    if const_expr(split is None):
        return mT[batch, key, head, None]
    return mT[split, batch, key, head, None]
