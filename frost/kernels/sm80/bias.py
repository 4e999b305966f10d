"""The additive bias of the scores and its gradient, for ``sm80/fwd``, ``sm80/bwd`` and ``sm80/bwd_dq``.

SEMANTICS.md: ``s_ij = scale * <q_i, k_j> + bias[b, h, i, j]``, bias ``[B|1, Hq|1, Sq, Sk]``
(float32 or the io dtype, any strides but a unit last one; packed input indexes it by
in-sequence positions), and ``dbias = dS`` summed over the broadcast dimensions.

Reading. A (batch, head) view clamps each index to the bias's extent (``min(b, B_bias - 1)``),
so a size-1 dimension broadcasts without a zero-stride tensor and one artifact serves every
broadcast shape. Each thread takes the elements of its score accumulator at the coordinates of
the identity tensor partitioned like the accumulator, as the mask does, and only inside the
valid region (i < Sq_b, j < Sk_b): padded positions are never read, so NaN there changes nothing.
The forward and ``bwd_dq`` read them straight from global memory (scalar loads: a row's stride
has no alignment to build vectors on). The main backward kernel, for a float32 bias where the
device has the shared memory (``BwdParams.bias_staged``), copies the tile by 4-byte cp.async into
shared memory (``BiasTileCopy``), step i+1's as soon as every warp has read step i's, so the
loads run under four of the step's five products; read where the scores need them they were
synchronous and cost half the step (H200: [1, H, S, S] bias, d64, 8.2 ms against 4.2 without
the loads). A 16-bit bias keeps the direct loads (cp.async moves 4 bytes at least, and pairs of
keys are not 4-byte aligned in general).

Units. The softmax works in log2 units with the scale folded into its exp2 argument
(softmax.py, recompute.py). With a bias the scores are brought into those units here,
``s2 = S * scale*log2(e) + bias * log2(e)``, one multiply-add per element, and the softmax and
the recompute then run with a scale of 1. Rejected: adding ``bias / scale`` to the unscaled
scores (no cheaper, and it overflows for a tiny scale). Positions outside the valid region get
``S * scale*log2(e)``: they are masked to -inf afterwards, or are rows nobody stores. A -inf
bias is a masked key: ``exp2(-inf - max) = 0``, and a row that is -inf everywhere keeps a row
max of -inf, which the softmax already treats as an empty row (o = 0, lse = -inf or the sink;
the backward's lse2 is then +inf and P = 0), so holes never make NaN.

dbias (the main backward kernel; ``bwd_dq`` reads the bias but writes no dbias). The recompute
leaves dS of a (batch, head, query block, key block) tile in fp32 registers, and exactly one
CTA visits each such tile (a CTA walks the query heads of its GQA share one after another), so:

- no broadcast: dS is dbias, stored once per element in the bias's dtype straight into the
  output (bitwise reproducible in either mode);
- broadcast, default mode: ``red.global.add.f32`` into a float32 accumulator shaped like the
  bias (the dbias output itself for a float32 bias, else the plan's workspace, converted to
  the bias dtype afterwards); one reduction per valid score element, or per pair of adjacent
  keys (``red.global.add.v2.f32``, SM90, ``BwdParams.dbias_reduce_width``: the plan gives it
  an accumulator with 8-byte aligned rows). Over the batch the sequences that add into one tile
  are launched side by side (``BwdParams.batch_inner``), so the tile is in L2 for all of them;
  launched key blocks first they were a batch of CTAs apart, and each reduction went to DRAM;
- broadcast, deterministic mode: float32 partials ``[B, Hq, Sq, Sk]`` in the workspace, each
  element stored once, then summed over the broadcast dimensions by torch in a fixed order
  (bitwise reproducible, no float atomics). Workspace: ``4 * B * Hq * Sq * Sk`` bytes (for a
  [1, Hq, Sq, Sk] bias, B times a float32 copy of it). Rejected for now: an ordered
  accumulation with per-tile turn counters (memory of the bias alone), because every (batch, head) would have to pass its turn on the tiles it never visits
  (padding, windows, causal blocks), which the key-block grid does not enumerate.

Only the valid region is written. The plan zero-fills a target the stores do not cover in
full (masks, padding, packed sequences, reductions), so dbias is 0 at padded positions and
wherever no key is visible.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from cutlass.cute.nvgpu import cpasync

from frost.kernels.sm80 import tiles
from frost.kernels.sm80.softmax import LOG2_E

DTYPES = {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


def bias_view(mBias: cute.Tensor, batch, head) -> cute.Tensor:
    """(Sq, Sk) view of a bias-shaped tensor for (batch, head): a size-1 dimension broadcasts."""
    return mBias[cutlass.min(batch, mBias.shape[0] - 1), cutlass.min(head, mBias.shape[1] - 1), None, None]


def staged_layout(tile_m: int, tile_n: int):
    """(tile_m, tile_n) float32 shared-memory layout of a staged bias tile: rows of ``tile_n``
    with their 8-column groups XOR-ed by ``row % 4``. A score fragment's quad reads two adjacent
    columns of rows ``g`` and ``g + 4`` alike, so without the XOR the 8 rows of a warp's read
    share 4 banks' pairs; with it a half warp's 8-byte reads cover all 32 banks."""
    return cute.make_composed_layout(cute.make_swizzle(2, 3, tile_n.bit_length() - 4), 0,
                                     cute.make_layout((tile_m, tile_n), stride=(tile_n, 1)))


@dataclass(frozen=True)
class BiasTileCopy:
    """cp.async of a (batch, head)'s float32 bias tile into shared memory, one element per
    copy (a bias row's stride has no alignment to build vectors on), only inside the valid
    region: padded positions are never read. Thread ``t`` copies column ``t % tile_n`` of
    every ``threads / tile_n``-th row."""

    tile_m: cutlass.Constexpr[int]
    tile_n: cutlass.Constexpr[int]
    tiled_copy: cute.TiledCopy
    thr_copy: object
    tXsX: cute.Tensor   # (CPY, CPY_M, CPY_N) of the shared tile
    tXcX: cute.Tensor   # the same coordinates

    @staticmethod
    def create(tidx, sBias: cute.Tensor, tile_m: int, tile_n: int, num_threads: int) -> "BiasTileCopy":
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), Float32, num_bits_per_copy=32)
        threads = cute.make_layout((num_threads // tile_n, tile_n), stride=(tile_n, 1))
        tiled_copy = cute.make_tiled_copy_tv(atom, threads, cute.make_layout((1, 1)))
        thr = tiled_copy.get_slice(tidx)
        return BiasTileCopy(tile_m, tile_n, tiled_copy, thr, thr.partition_D(sBias),
                            thr.partition_D(cute.make_identity_tensor((tile_m, tile_n))))

    @cute.jit
    def issue(self, mBias: cute.Tensor, batch, head, seqlen, m_block, n_block):
        """Start the copy of tile (m_block, n_block); the caller commits and later waits."""
        g = cute.local_tile(bias_view(mBias, batch, head), (self.tile_m, self.tile_n), (m_block, n_block))
        tXgX = self.thr_copy.partition_S(g)
        rows_left = seqlen.seqlen_q - m_block * self.tile_m
        if self.tXcX[0, 0, 0][1] < seqlen.seqlen_k - n_block * self.tile_n:
            for m in cutlass.range_constexpr(cute.size(tXgX.shape[1])):
                if self.tXcX[0, m, 0][0] < rows_left:
                    cute.copy(self.tiled_copy, tXgX[None, m, None], self.tXsX[None, m, None])


@dataclass(frozen=True)
class ScoreBias:
    """One (batch, head)'s bias and the valid region of its sequence, for a kernel's score tiles."""

    tile_m: cutlass.Constexpr[int]
    tile_n: cutlass.Constexpr[int]
    gBias: cute.Tensor      # (Sq, Sk) of this (batch, head)
    seqlen_q: Int32         # valid rows and keys of the sequence (SeqlenInfo)
    seqlen_k: Int32
    scale_log2: Float32     # scale * log2(e): the unscaled scores' factor into log2 units
    sBias: cute.Tensor | None = None  # the tile staged in shared memory (BiasTileCopy), or read from gBias

    @staticmethod
    def create(mBias: cute.Tensor, batch, head, seqlen, scale_log2: Float32, tile_m: int,
               tile_n: int, sBias: cute.Tensor | None = None) -> "ScoreBias":
        return ScoreBias(tile_m, tile_n, bias_view(mBias, batch, head), seqlen.seqlen_q, seqlen.seqlen_k,
                         scale_log2, sBias)

    @cute.jit
    def to_log2_scores(self, acc_S: cute.Tensor, tScS: cute.Tensor, t0ScS: cute.Tensor, m_block: Int32,
                       n_block: Int32, check_cols: cutlass.Constexpr[bool] = True):
        """``acc_S = acc_S * scale_log2 + bias * log2(e)`` over the tile's valid region, ``acc_S *
        scale_log2`` elsewhere (``tScS`` / ``t0ScS``: this thread's and thread 0's coordinates,
        as ``AttentionMask.apply`` takes them; columns compare against compile-time constants).
        ``check_cols=False``: the caller knows every key of the tile is inside the sequence."""
        acc_S_mn = tiles.acc_mn_view(acc_S)
        at = tiles.ScoreCoords.of(tScS, t0ScS, m_block, n_block, self.tile_m, self.tile_n)
        col_base = at.col_base
        cols_left = self.seqlen_k - col_base
        for r in cutlass.range_constexpr(cute.size(acc_S_mn.shape[0])):
            row = at.row(r)
            # one branch per row: it also bounds how many loads the scheduler hoists at once (a
            # whole tile's, about 128 per thread, made ptxas spill nearly everything)
            if row < self.seqlen_q:
                for c in cutlass.range_constexpr(cute.size(acc_S_mn.shape[1])):
                    col = at.col(c)
                    value = Float32(0.0)
                    if const_expr(check_cols):
                        if col < cols_left:
                            value = self._read(at, r, c, row, col_base + col)
                    else:
                        value = self._read(at, r, c, row, col_base + col)
                    acc_S_mn[r, c] = acc_S_mn[r, c] * self.scale_log2 + value * LOG2_E
            else:
                acc_S_mn[r, None].store(acc_S_mn[r, None].load() * self.scale_log2)

    @cute.jit
    def _read(self, at: tiles.ScoreCoords, r: cutlass.Constexpr[int], c: cutlass.Constexpr[int], row, col) -> Float32:
        """This thread's element (r, c) of the tile, at (row, col) of the sequence."""
        if const_expr(self.sBias is not None):
            return self.sBias[at.tScS_mn[r, 0][0], at.tScS_mn[0, c][1]]
        return self.gBias[row, col].to(Float32)

    @cute.jit
    def write_grad(self, gdBias: cute.Tensor, acc_dS: cute.Tensor, tScS: cute.Tensor, t0ScS: cute.Tensor,
                   m_block: Int32, n_block: Int32, reduce: cutlass.Constexpr[bool],
                   reduce_width: cutlass.Constexpr[int] = 1):
        """dS of the tile's valid region into ``gdBias`` ((Sq, Sk) of this (batch, head), from
        ``bias_view``): stored in its dtype, or with ``reduce`` added by red.global.add.f32;
        ``reduce_width`` 2 adds a thread's two adjacent columns by one red.global.add.v2.f32
        (SM90; the plan gives it an accumulator whose rows are 8-byte aligned, and the pair's
        first column is even)."""
        rdS = cute.make_fragment_like(acc_dS, gdBias.element_type)
        rdS.store(acc_dS.load().to(gdBias.element_type))
        rdS_mn = tiles.acc_mn_view(rdS)
        at = tiles.ScoreCoords.of(tScS, t0ScS, m_block, n_block, self.tile_m, self.tile_n)
        col_base = at.col_base
        cols_left = self.seqlen_k - col_base
        width = reduce_width if const_expr(reduce) else 1
        for r in cutlass.range_constexpr(cute.size(rdS_mn.shape[0])):
            row = at.row(r)
            row_valid = row < self.seqlen_q
            for c in cutlass.range_constexpr(0, cute.size(rdS_mn.shape[1]), width):
                col = at.col(c)
                if row_valid and col < cols_left:
                    if const_expr(not reduce):
                        gdBias[row, col_base + col] = rdS_mn[r, c]
                    else:
                        target = gdBias.iterator + cute.crd2idx((row, col_base + col), gdBias.layout)
                        if const_expr(width == 1):
                            cute.arch.atomic_add(target, rdS_mn[r, c])
                        else:  # columns c, c + 1 are adjacent (tiles.acc_mn_view)
                            if col + 1 < cols_left:
                                pair = cute.make_rmem_tensor(2, Float32)
                                pair[0] = rdS_mn[r, c]
                                pair[1] = rdS_mn[r, c + 1]
                                cute.arch.atomic_add(target, pair.load())
                            else:  # the sequence's last key is the pair's first
                                cute.arch.atomic_add(target, rdS_mn[r, c])
