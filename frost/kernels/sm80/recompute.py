"""The backward's recompute of one (query block, key block) tile, shared by ``sm80/bwd``
(per key block, walking query blocks) and ``sm80/bwd_dq`` (per query block, walking key
blocks): a thread's rows of lse2 and D, then

    S  = Q.K^T                      (plus the bias, in log2 units: bias.py; masked where needed)
    P  = exp2(S * scale_log2 - lse2)  rows of padded / empty queries give 0 (lse2 = +inf)
    dP = dO.V^T
    dS = P * (dP - D)

P and dS stay in the fp32 accumulators of S and dP; each kernel then moves
them where its next products want them.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from frost.kernels.sm80 import tiles
from frost.kernels.sm80.bias import ScoreBias


class ScoreOperands(NamedTuple):
    """The S = Q.K^T and dP = dO.V^T products of one tile: the MMA, register fragments,
    their shared-memory sources partitioned for ldmatrix, and the ldmatrix thread copies."""

    tiled_mma: cute.TiledMma
    tSrQ: cute.Tensor
    tSrK: cute.Tensor
    tSsQ: cute.Tensor
    tSsK: cute.Tensor
    tdPrdO: cute.Tensor
    tdPrV: cute.Tensor
    tdPsdO: cute.Tensor
    tdPsV: cute.Tensor
    copy_A: object
    copy_B: object


@cute.jit
def row_stats(gLSE2: cute.Tensor, gD: cute.Tensor, tScS_mn: cute.Tensor, rows_left):
    """This thread's rows of lse2 and D for a query block (``g*``: the block's (tile_m,) views);
    rows at or past ``rows_left`` get lse2 = +inf and D = 0, so their P and dS are 0."""
    row_lse2 = cute.make_rmem_tensor(cute.size(tScS_mn, mode=[0]), Float32)
    row_d = cute.make_rmem_tensor(cute.size(tScS_mn, mode=[0]), Float32)
    for r in cutlass.range_constexpr(cute.size(row_lse2)):
        row = tScS_mn[r, 0][0]
        row_lse2[r] = Float32.inf
        row_d[r] = 0.0
        if row < rows_left:
            row_lse2[r] = gLSE2[row]
            row_d[r] = gD[row]
    return row_lse2, row_d


@cute.jit
def probabilities_and_ds(ops: ScoreOperands, acc_shape, mask, m_block, n_block, tScS: cute.Tensor,
                         t0ScS: cute.Tensor, row_lse2: cute.Tensor, row_d: cute.Tensor, scale_log2: Float32,
                         bias: ScoreBias | None = None):
    """(P, dS) of the tile, in fp32 accumulators of ``acc_shape`` (module docstring). With a
    ``bias`` the scores are in log2 units before the exp2, whose scale is then 1."""
    acc_S = cute.make_rmem_tensor(acc_shape, Float32)
    acc_S.fill(0.0)
    tiles.gemm_ss(ops.tiled_mma, acc_S, ops.tSrQ, ops.tSrK, ops.tSsQ, ops.tSsK, ops.copy_A, ops.copy_B)
    exp_scale = scale_log2
    if const_expr(bias is not None):  # before the mask: a masked position's bias never enters a score
        bias.to_log2_scores(acc_S, tScS, t0ScS, m_block, n_block)
        exp_scale = 1.0
    if mask.needs_mask(m_block, n_block):
        mask.apply(acc_S, tScS, t0ScS, m_block, n_block)
    acc_S_mn = tiles.acc_mn_view(acc_S)
    for r in cutlass.range_constexpr(cute.size(row_lse2)):
        acc_S_mn[r, None].store(cute.math.exp2(acc_S_mn[r, None].load() * exp_scale - row_lse2[r], fastmath=True))

    acc_dP = cute.make_rmem_tensor(acc_shape, Float32)
    acc_dP.fill(0.0)
    tiles.gemm_ss(ops.tiled_mma, acc_dP, ops.tdPrdO, ops.tdPrV, ops.tdPsdO, ops.tdPsV, ops.copy_A, ops.copy_B)
    acc_dP_mn = tiles.acc_mn_view(acc_dP)
    for r in cutlass.range_constexpr(cute.size(row_d)):
        acc_dP_mn[r, None].store(acc_S_mn[r, None].load() * (acc_dP_mn[r, None].load() - row_d[r]))
    return acc_S, acc_dP
