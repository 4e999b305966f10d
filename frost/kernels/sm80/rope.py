"""SM80 RoPE pass: rotate the rows of q and k (or back the rows of dq and dk) in one launch.

Specialized by ``PARAMS`` (a ``rope_params.RopeParams``). SEMANTICS.md step 1:
``rot(x, p) = concat(x1*cos[p] - x2*sin[p], x2*cos[p] + x1*sin[p])`` with x1, x2 the two
halves of the head dim and p the row's position in its sequence; with ``inverse`` the
transpose, ``concat(g1*cos + g2*sin, g2*cos - g1*sin)`` (sin negated), which takes dq and
dk back to the unrotated q and k for any table (not only where cos^2 + sin^2 = 1).

Why a pass and not a rotation inside the attention kernels: the forward and the backward
would rotate each K tile once per query block that visits it (and each Q tile once per key
block in the backward); here every row is rotated once, at the cost of one read and one
write of q and k, and the attention kernels and their compile keys stay as they are. The
engine (frost/engines/sm80_rope.py) runs it: forward, q and k -> rotated copies in the
plan's workspace -> the forward on them; backward, the same rotation again (recomputed: one
more read and write of q and k, where keeping the forward's copies would hold two more
q- and k-sized tensors from the forward to the backward and change the autograd contract,
which saves the unrotated q and k), the backward chain on the rotated copies,
then this kernel with ``inverse`` on dq and dk in place. dq is rotated back here too, not in
``bwd_convert``: the deterministic recompute mode makes dq in ``bwd_dq`` without the
conversion, so only this pass sees dq in every mode.

Grid: x walks token blocks of q (the first ``blocks_q``) then of k, y groups of
``HEADS_PER_CTA`` heads, z the sequences; a CTA owns ``tokens_per_cta`` consecutive positions
of one sequence and one group of heads of them (k's CTAs past its heads, under GQA, exit at
once). A thread owns one position and one ``vector`` of columns of x1 (and the matching
vector of x2, ``D/2`` further): it reads its cos and sin values once per CTA (fp32), then
walks its heads, two per step so that four vector loads are in flight before the first store
(a store may alias a later load: the backward rotates in place, so the compiler may not hoist
loads above stores itself). Splitting the heads over y keeps short problems from running a
few long CTAs (B1 S128 H32 would otherwise be 16 CTAs walking 32 heads each); the tables are
read once per CTA instead of once per row, from L2. Global accesses are 16-byte vectors
(8 bytes when D is not a multiple of 16); the threads of one row read it whole. Math in
fp32, rounded once to the io dtype. Resources (sm_80, the L0 records, ``python3 -m
frost.kernels.resources --template sm80/rope``): 36-64 registers, no local memory, a stack
of 0-16 bytes. Not timed on a GPU yet: ``bench_sdpa.py --rope``.

Positions: dense rows are their index (every row is rotated; rows past ``seqlens`` are never
read by the attention kernels, and validation has checked that the tables cover the padded
extent, so they cost a little bandwidth and never fault); packed rows count from
``cu_seqlens[b]``, and rows past ``cu_seqlens[-1]`` are neither read nor written.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.kernels.sm80.grid import BLOCKS_FASTEST, grid_coords, launch_extents, launch_grid
from frost.kernels.sm80.seqlen import SeqlenInfo, SeqlenTensors, heads_of

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
VECTOR = P.vector                  # elements per global access
ROW_THREADS = P.threads_per_row    # threads per (token, head) row
TOKENS = P.tokens_per_cta
NUM_THREADS = P.num_threads
PACKED = P.layout == "thd"
HEADS_PER_STEP = 2
HEADS_PER_CTA = 8


class RopeTensors(NamedTuple):
    """The kernel's global tensors: sources and destinations (the same tensors when rotating in
    place), the fp32 tables [max_pos, D/2], the packed layout's cu_seqlens (None when dense)."""

    q: cute.Tensor
    k: cute.Tensor
    q_out: cute.Tensor
    k_out: cute.Tensor
    cos: cute.Tensor
    sin: cute.Tensor
    cu_seqlens_q: cute.Tensor | None
    cu_seqlens_k: cute.Tensor | None


@cute.jit
def sdpa_rope(
    mQ: cute.Tensor,
    mK: cute.Tensor,
    mQout: cute.Tensor,
    mKout: cute.Tensor,
    mCos: cute.Tensor,
    mSin: cute.Tensor,
    mCuSeqlensQ: cute.Tensor | None,
    mCuSeqlensK: cute.Tensor | None,
    max_seqlen_q: Int32,
    max_seqlen_k: Int32,
    stream,
):
    blocks_q, heads_q, num_batch = launch_extents(mQ, mCuSeqlensQ, max_seqlen_q, TOKENS, PACKED)
    blocks_k, _, _ = launch_extents(mK, mCuSeqlensK, max_seqlen_k, TOKENS, PACKED)
    head_groups = cute.ceil_div(heads_q, HEADS_PER_CTA)  # q has at least as many heads as k
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), DTYPE, num_bits_per_copy=VECTOR * DTYPE.width)
    rope_kernel(
        RopeTensors(mQ, mK, mQout, mKout, mCos, mSin, mCuSeqlensQ, mCuSeqlensK), blocks_q, atom,
    ).launch(grid=launch_grid(BLOCKS_FASTEST, blocks_q + blocks_k, head_groups, num_batch),
             block=[NUM_THREADS, 1, 1], stream=stream)


@cute.kernel
def rope_kernel(tensors: RopeTensors, blocks_q: Int32, atom: cute.CopyAtom):
    mQ, mK, mQout, mKout, mCos, mSin, mCuSeqlensQ, mCuSeqlensK = tensors
    tidx, _, _ = cute.arch.thread_idx()
    block, head_group, batch = grid_coords(BLOCKS_FASTEST)
    seqlen = SeqlenInfo.create(batch, mQ, mK, SeqlenTensors(mCuSeqlensQ, mCuSeqlensK, None, None))
    token, column = tidx // ROW_THREADS, tidx % ROW_THREADS
    if block < blocks_q:
        position = block * TOKENS + token
        if position < seqlen.seqlen_q:
            rotate_row(mQ, mQout, mCos, mSin, seqlen, batch, seqlen.offset_q, position, column, head_group, atom)
    else:
        position = (block - blocks_q) * TOKENS + token
        if position < seqlen.seqlen_k:
            rotate_row(mK, mKout, mCos, mSin, seqlen, batch, seqlen.offset_k, position, column, head_group, atom)


@cute.jit
def rotate_row(mX: cute.Tensor, mY: cute.Tensor, mCos: cute.Tensor, mSin: cute.Tensor, seqlen: SeqlenInfo,
               batch, offset, position, column, head_group, atom: cute.CopyAtom):
    """This thread's columns of row ``position`` of sequence ``batch``, the heads of ``head_group``
    (none past mX's heads: k's groups end before q's under GQA): mX -> mY."""
    first = head_group * HEADS_PER_CTA
    heads = cutlass.min(heads_of(mX, PACKED) - first, HEADS_PER_CTA)
    if heads > 0:
        # (VECTOR,) fp32: the table entries of this thread's columns at this position, read once
        cos = cute.local_tile(mCos[position, None], (VECTOR,), (column,)).load()
        sin = cute.local_tile(mSin[position, None], (VECTOR,), (column,)).load()
        if const_expr(P.inverse):
            sin = -sin
        for step in cutlass.range(heads // HEADS_PER_STEP, unroll=1):
            rotate_heads(mX, mY, cos, sin, seqlen, batch, offset, position, column, first + step * HEADS_PER_STEP,
                         HEADS_PER_STEP, atom)
        if heads % HEADS_PER_STEP:
            rotate_heads(mX, mY, cos, sin, seqlen, batch, offset, position, column, first + heads - 1, 1, atom)


@cute.jit
def rotate_heads(mX: cute.Tensor, mY: cute.Tensor, cos, sin, seqlen: SeqlenInfo, batch, offset, position, column,
                 first_head, count: cutlass.Constexpr[int], atom: cute.CopyAtom):
    """Heads ``[first_head, first_head + count)``: every load first, then the math and the stores."""
    # (VECTOR, 2, count) registers: x1 and x2 of each head
    rX = cute.make_rmem_tensor((VECTOR, 2, count), DTYPE)
    for h in cutlass.range_constexpr(count):
        for half in cutlass.range_constexpr(2):
            cute.copy(atom, _vector(mX, seqlen, batch, first_head + h, offset, position, column, half),
                      rX[None, half, h])
    rY = cute.make_rmem_tensor((VECTOR, 2, count), DTYPE)
    for h in cutlass.range_constexpr(count):
        x1 = rX[None, 0, h].load().to(Float32)
        x2 = rX[None, 1, h].load().to(Float32)
        rY[None, 0, h].store((x1 * cos - x2 * sin).to(DTYPE))
        rY[None, 1, h].store((x2 * cos + x1 * sin).to(DTYPE))
    for h in cutlass.range_constexpr(count):
        for half in cutlass.range_constexpr(2):
            cute.copy(atom, rY[None, half, h],
                      _vector(mY, seqlen, batch, first_head + h, offset, position, column, half))


@cute.jit
def _vector(mX: cute.Tensor, seqlen: SeqlenInfo, batch, head, offset, position, column,
            half: cutlass.Constexpr[int]) -> cute.Tensor:
    """(VECTOR,) view of the thread's columns in half ``half`` (0: x1, 1: x2) of one row of mX."""
    row = seqlen.rows_of(mX, batch, head, offset)[position, None]  # (D,)
    return cute.local_tile(row, (VECTOR,), (column + half * ROW_THREADS,))
