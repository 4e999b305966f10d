"""Tile plumbing both SM80 passes share: shared-memory layouts, copies, MMAs, fragment views.

Naming follows the kernels: ``m*`` global tensors, ``g*`` a CTA's tile, ``s*``
shared memory, ``r*`` registers, ``c*`` identity (coordinate) tensors, ``p*``
predicates; partitions ``t<op><space><tensor>``.

- Shared memory rows of 64 elements (128 B) are stored in 8x64 atoms with a
  Swizzle<3,3,3>, so both the 16-byte cp.async writes and the ldmatrix reads of
  eight consecutive rows hit eight distinct bank groups.
- Global loads are 128-bit cp.async (8 fp16/bf16 elements per thread and copy);
  global stores are 128-bit plain stores staged through shared memory.
- The MMA is mma.sync m16n8k16 with fp32 accumulation; warps are stacked along
  M, so each warp owns 16-row slabs of the query tile and no cross-warp
  reduction is needed for softmax rows.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr
from cutlass.cute.nvgpu import cpasync, warp

COPY_BITS = 128


class SingleMmaSetup(NamedTuple):
    """What a host launcher builds once for every CTA of a kernel with one query tile,
    streamed key/value tiles and one MMA (the forward, the deterministic dQ pass)."""

    sQ_layout: cute.ComposedLayout   # (tile_m, hdim_qk)
    sK_layout: cute.ComposedLayout   # (tile_n, hdim_qk)
    sV_layout: cute.ComposedLayout   # (tile_n, hdim_v)
    sO_layout: cute.ComposedLayout   # (tile_m, hdim_v): O, dO
    gmem_tiled_copy_load: cute.TiledCopy
    gmem_tiled_copy_store: cute.TiledCopy
    tiled_mma: cute.TiledMma


def single_mma_setup(dtype, tile_m: int, tile_n: int, hdim_qk: int, hdim_v: int, num_threads: int,
                     num_warps: int) -> SingleMmaSetup:
    """The global copies move 64-column slabs whatever the tile's width (every flavor's tiles are
    multiples of 64), so one pair serves the Q/K and the V/O tiles."""
    return SingleMmaSetup(
        smem_layout(dtype, tile_m, hdim_qk), smem_layout(dtype, tile_n, hdim_qk),
        smem_layout(dtype, tile_n, hdim_v), smem_layout(dtype, tile_m, hdim_v),
        gmem_load_copy(dtype, hdim_qk, num_threads), gmem_store_copy(dtype, hdim_qk, num_threads),
        tiled_mma(dtype, num_warps),
    )


def smem_layout(dtype, rows: int, hdim: int, stages: int | None = None):
    """(rows, hdim) swizzled shared-memory layout for a row-major tile of ``dtype``;
    with ``stages``, (rows, hdim, stages): that many such tiles one after another."""
    atom_cols = 64 if hdim % 64 == 0 else 32
    swizzle_bits = 3 if atom_cols == 64 else 2
    atom = cute.make_composed_layout(
        cute.make_swizzle(swizzle_bits, 3, 3),
        0,
        cute.make_layout((8, atom_cols), stride=(atom_cols, 1)),
    )
    if stages is None:
        return cute.tile_to_shape(atom, (rows, hdim), (0, 1))
    return cute.tile_to_shape(atom, (rows, hdim, stages), (0, 1, 2))


def _copy_thread_layout(dtype, hdim: int, num_threads: int):
    atom_cols = 64 if hdim % 64 == 0 else 32
    vectors_per_row = atom_cols // (COPY_BITS // dtype.width)
    return cute.make_layout(
        (num_threads // vectors_per_row, vectors_per_row), stride=(vectors_per_row, 1)
    )


def gmem_load_copy(dtype, hdim: int, num_threads: int):
    """128-bit cp.async global->shared tiled copy for (rows, hdim) tiles."""
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype, num_bits_per_copy=COPY_BITS
    )
    values = cute.make_layout((1, COPY_BITS // dtype.width))
    return cute.make_tiled_copy_tv(atom, _copy_thread_layout(dtype, hdim, num_threads), values)


def gmem_store_copy(dtype, hdim: int, num_threads: int):
    """128-bit register->global tiled copy for (rows, hdim) tiles."""
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=COPY_BITS)
    values = cute.make_layout((1, COPY_BITS // dtype.width))
    return cute.make_tiled_copy_tv(atom, _copy_thread_layout(dtype, hdim, num_threads), values)


def tiled_mma(dtype, num_warps: int, warps_m: int | None = None):
    """m16n8k16 fp32-accumulating MMA; ``warps_m`` warps along M (all by default), the rest along N.

    Each warp covers 16 columns of N per step (two n8 atoms), which keeps the
    accumulator of a row's two adjacent columns in one thread (see acc_mn_view).
    """
    warps_m = num_warps if warps_m is None else warps_m
    warps_n = num_warps // warps_m
    return cute.make_tiled_mma(
        warp.MmaF16BF16Op(dtype, Float32, (16, 8, 16)),
        (warps_m, warps_n, 1),
        permutation_mnk=(warps_m * 16, warps_n * 16, 16),
    )


def ldmatrix_atom(dtype, transpose: bool = False):
    return cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=transpose, num_matrices=4), dtype)


def transpose_view(s_tile: cute.Tensor, rows: int, cols: int, stages: int | None = None) -> cute.Tensor:
    """(cols, rows) view of a (rows, cols) shared-memory tile (no data movement);
    (cols, rows, stages) of a staged (rows, cols, stages) one."""
    if stages is None:
        return cute.composition(s_tile, cute.make_layout((cols, rows), stride=(rows, 1)))
    return cute.composition(s_tile, cute.make_layout((cols, rows, stages), stride=(rows, 1, rows * cols)))


def acc_mn_view(acc: cute.Tensor) -> cute.Tensor:
    """View an mma accumulator ((2,2), MMA_M, MMA_N) as (rows, cols) of this thread.

    Per m16n8 atom a thread holds 2 rows x 2 adjacent columns; rows are
    (atom row half, MMA_M), columns (atom column pair, MMA_N).
    """
    col_major = cute.make_layout(acc.layout.shape)
    mn = cute.make_layout(
        ((col_major.shape[0][1], col_major.shape[1]), (col_major.shape[0][0], col_major.shape[2])),
        stride=((col_major.stride[0][1], col_major.stride[1]), (col_major.stride[0][0], col_major.stride[2])),
    )
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


class ScoreCoords(NamedTuple):
    """Where this thread's elements of one (tile_m, tile_n) score tile sit in the sequence: what
    the element mask and the bias read per tile. Thread 0's columns (``t0ScS_mn``) are
    compile-time constants, so a column test against a limit less ``col_base`` folds into an
    immediate compare."""

    tScS_mn: cute.Tensor   # (rows, cols) of this thread's tile coordinates
    t0ScS_mn: cute.Tensor  # the same of thread 0
    row_base: object       # the tile's first row in the sequence
    col_base: object       # this thread's first key in the sequence

    @staticmethod
    def of(tScS: cute.Tensor, t0ScS: cute.Tensor, m_block, n_block, tile_m: int, tile_n: int) -> "ScoreCoords":
        tScS_mn = acc_mn_view(tScS)
        return ScoreCoords(tScS_mn, acc_mn_view(t0ScS), m_block * tile_m, n_block * tile_n + tScS_mn[0, 0][1])

    def row(self, r):
        """The sequence row of this thread's r-th row."""
        return self.row_base + self.tScS_mn[r, 0][0]

    def col(self, c):
        """The c-th column's offset from ``col_base`` (a constant)."""
        return self.t0ScS_mn[0, c][1]


def acc_as_operand_a(r_acc: cute.Tensor) -> cute.Tensor:
    """Reinterpret an accumulator-shaped fragment (4, MMA_M, MMA_N) as an A operand
    ((4, 2), MMA_M, MMA_N / 2): the C fragment of two n8 atoms is exactly the A
    fragment of one k16 atom, so P feeds the P.V product without leaving registers."""
    divided = cute.logical_divide(r_acc.layout, (None, None, 2))
    layout = cute.make_layout(
        ((divided.shape[0], divided.shape[2][0]), divided.shape[1], divided.shape[2][1]),
        stride=((divided.stride[0], divided.stride[2][0]), divided.stride[1], divided.stride[2][1]),
    )
    return cute.make_tensor(r_acc.iterator, layout)


@cute.jit
def gemm_ss(tiled_mma, acc, tCrA, tCrB, tCsA, tCsB, thr_copy_A, thr_copy_B):
    """acc += A.B^T with both operands in shared memory.

    Shared->register loads run one k-slice ahead of the MMAs (register double
    buffering), so ldmatrix latency hides behind the previous slice's mma.sync.
    """
    tCrA_view = thr_copy_A.retile(tCrA)
    tCrB_view = thr_copy_B.retile(tCrB)
    cute.copy(thr_copy_A, tCsA[None, None, 0], tCrA_view[None, None, 0])
    cute.copy(thr_copy_B, tCsB[None, None, 0], tCrB_view[None, None, 0])
    num_k = cute.size(tCsA.shape[2])
    for k in cutlass.range_constexpr(num_k):
        if const_expr(k + 1 < num_k):
            cute.copy(thr_copy_A, tCsA[None, None, k + 1], tCrA_view[None, None, k + 1])
            cute.copy(thr_copy_B, tCsB[None, None, k + 1], tCrB_view[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


@cute.jit
def gemm_rs(tiled_mma, acc, tCrA, tCrB, tCsB, thr_copy_B):
    """acc += A.B^T with A already in registers (e.g. probabilities) and B in shared memory."""
    tCrB_view = thr_copy_B.retile(tCrB)
    cute.copy(thr_copy_B, tCsB[None, None, 0], tCrB_view[None, None, 0])
    num_k = cute.size(tCrA.shape[2])
    for k in cutlass.range_constexpr(num_k):
        if const_expr(k + 1 < num_k):
            cute.copy(thr_copy_B, tCsB[None, None, k + 1], tCrB_view[None, None, k + 1])
        cute.gemm(tiled_mma, acc, tCrA[None, None, k], tCrB[None, None, k], acc)


def quad_allreduce(value, op):
    """Reduce over the 4 threads of a quad (the threads sharing an accumulator row)."""
    value = op(value, cute.arch.shuffle_sync_bfly(value, offset=2, mask=-1, mask_and_clamp=31))
    value = op(value, cute.arch.shuffle_sync_bfly(value, offset=1, mask=-1, mask_and_clamp=31))
    return value


def fmax(a, b):
    return cute.arch.fmax(a, b)


def fadd(a, b):
    return a + b


@cute.jit
def hdim_predicate(tXcX: cute.Tensor, limit) -> cute.Tensor:
    """Per (vector, k-chunk) predicate of a copy partition: column < limit.

    Rows are handled by ``if`` on the row index instead of a full predicate
    tensor, which keeps the predicate to a few registers.
    """
    pred = cute.make_rmem_tensor(
        cute.make_layout(
            (tXcX.shape[0][1], cute.size(tXcX, mode=[1]), cute.size(tXcX, mode=[2])),
            stride=(cute.size(tXcX, mode=[2]), 0, 1),
        ),
        cutlass.Boolean,
    )
    for v in cutlass.range_constexpr(pred.shape[0]):
        for k in cutlass.range_constexpr(pred.shape[2]):
            pred[v, 0, k] = cute.elem_less(tXcX[(0, v), 0, k][1], limit)
    return pred


@cute.jit
def copy_block(gmem_tiled_copy, src, dst, col_pred, check_hdim: cutlass.Constexpr[bool]):
    """A whole tile whose rows are all inside the sequence."""
    if const_expr(check_hdim):
        cute.copy(gmem_tiled_copy, src, dst, pred=col_pred)
    else:
        cute.copy(gmem_tiled_copy, src, dst)


@cute.jit
def load_rows(gmem_tiled_copy, src, dst, coords, col_pred, rows_left):
    """Copy the rows of a tile below ``rows_left``; zero-fill the rest in shared memory."""
    for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
        if coords[0, m, 0][0] < rows_left:
            cute.copy(gmem_tiled_copy, src[None, m, None], dst[None, m, None], pred=col_pred[None, m, None])
        else:
            dst[None, m, None].fill(0)


@cute.jit
def zero_unpredicated(dst, col_pred):
    """Zero the (vector, row, k) slots of a copy partition whose column predicate is off."""
    for m in cutlass.range_constexpr(cute.size(dst.shape[1])):
        for k in cutlass.range_constexpr(cute.size(dst.shape[2])):
            if not col_pred[0, 0, k]:
                dst[None, m, k].fill(0)


@cute.jit
def store_rows(gmem_tiled_copy, tidx, s_tile: cute.Tensor, g_tile: cute.Tensor, written_rows, head_dim,
               check_hdim: cutlass.Constexpr[bool]):
    """A shared (rows, hdim) tile -> rows [0, written_rows) of the global tile ``g_tile``, in
    128-bit stores; columns past ``head_dim`` are not written when ``check_hdim``."""
    thr_copy = gmem_tiled_copy.get_slice(tidx)
    tXsX = thr_copy.partition_S(s_tile)
    tXgX = thr_copy.partition_D(g_tile)
    tXcX = thr_copy.partition_D(cute.make_identity_tensor(cute.product_each(s_tile.shape)))
    tXpX = hdim_predicate(tXcX, head_dim)
    tXrX = cute.make_fragment_like(tXgX, s_tile.element_type)
    cute.autovec_copy(tXsX, tXrX)
    for m in cutlass.range_constexpr(cute.size(tXrX.shape[1])):
        if tXcX[0, m, 0][0] < written_rows:
            if const_expr(check_hdim):
                cute.copy(gmem_tiled_copy, tXrX[None, m, None], tXgX[None, m, None], pred=tXpX[None, m, None])
            else:
                cute.copy(gmem_tiled_copy, tXrX[None, m, None], tXgX[None, m, None])


@cute.jit
def stash_acc(tiled_mma, tidx, acc: cute.Tensor, s_tile: cute.Tensor, dtype: cutlass.Constexpr):
    """An fp32 accumulator of ``tiled_mma``, rounded to ``dtype``, into a shared (rows, hdim)
    tile (adjacent column pairs per store), e.g. before ``store_rows``."""
    r = cute.make_fragment_like(acc, dtype)
    r.store(acc.load().to(dtype))
    r2s = cute.make_tiled_copy_C(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=2 * dtype.width), tiled_mma
    ).get_slice(tidx)
    cute.copy(r2s, r2s.retile(r), r2s.partition_D(s_tile))
