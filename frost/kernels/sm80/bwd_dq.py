"""SM80 attention backward, deterministic dQ: one CTA per (query block, head, sequence).

Specialized by ``PARAMS`` (a ``config.BwdDqParams``). The deterministic mode
cannot accumulate dQ with atomics across key blocks (the order of fp32
additions would vary), so this pass recomputes, per query block, what the
main kernel (``sm80/bwd`` compiled with ``deterministic=True``) computes per
key block, and sums dQ in registers in a fixed order:

    prologue: Q, dO -> shared (resident); lse2, D -> registers
    for key block n = n_min .. n_max-1:
        wait K[n], V[n]; barrier
        S  = Q.K^T (+ bias); mask; P = exp2(S*scale_log2 - lse2)
        dP = dO.V^T; dS = P * (dP - D)
        barrier; issue V[n+1]              (overlaps dS.K)
        dQ += dS.K                         (dS from registers, K via ldmatrix.trans)
        barrier; issue K[n+1]
    dQ *= scale -> global (io dtype); padded rows are written as zeros

Cost: three of the main kernel's five products again, so the deterministic
backward does about 1.6x the arithmetic of the default one.
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.kernels.sm80 import recompute, tiles
from frost.kernels.sm80.bias import ScoreBias
from frost.kernels.sm80.mask import AttentionMask
from frost.kernels.sm80.grid import BLOCKS_FASTEST, grid_coords, launch_extents, launch_grid
from frost.kernels.sm80.seqlen import SeqlenInfo, SeqlenTensors, heads_of

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
TILE_M, TILE_N = P.tile_m, P.tile_n
TILE_HDIM_QK, TILE_HDIM_V = P.tile_hdim_qk, P.tile_hdim_v  # Q, K, dQ; dO, V
NUM_THREADS = P.num_threads
CHECK_HDIM_QK, CHECK_HDIM_V = P.partial_hdim_qk, P.partial_hdim_v
PACKED = P.layout == "thd"


class BwdDqTensors(NamedTuple):
    """The kernel's global tensors (bias None without a bias: it enters P, its gradient is sm80/bwd's)."""

    q: cute.Tensor
    k: cute.Tensor
    v: cute.Tensor
    do: cute.Tensor
    lse2: cute.Tensor
    d: cute.Tensor
    dq: cute.Tensor
    bias: cute.Tensor | None


@cute.jit
def sdpa_bwd_dq(
    mQ: cute.Tensor,
    mK: cute.Tensor,
    mV: cute.Tensor,
    mdO: cute.Tensor,
    mLSE2: cute.Tensor,
    mD: cute.Tensor,
    mdQ: cute.Tensor,
    mBias: cute.Tensor | None,
    mCuSeqlensQ: cute.Tensor | None,
    mCuSeqlensK: cute.Tensor | None,
    mSeqlensQ: cute.Tensor | None,
    mSeqlensK: cute.Tensor | None,
    scale: Float32,
    scale_log2: Float32,
    window_left: Int32,
    window_right: Int32,
    max_seqlen_q: Int32,
    stream,
):
    setup = tiles.single_mma_setup(DTYPE, TILE_M, TILE_N, TILE_HDIM_QK, TILE_HDIM_V, NUM_THREADS, P.num_warps)

    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sQ_layout)], 1024]
        sdO: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sO_layout)], 1024]
        sK: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sK_layout)], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sV_layout)], 1024]

    num_m_blocks, num_heads, num_batch = launch_extents(mQ, mCuSeqlensQ, max_seqlen_q, TILE_M, PACKED)
    bwd_dq_kernel(
        BwdDqTensors(mQ, mK, mV, mdO, mLSE2, mD, mdQ, mBias),
        SeqlenTensors(mCuSeqlensQ, mCuSeqlensK, mSeqlensQ, mSeqlensK),
        scale, scale_log2, window_left, window_right, setup, SharedStorage,
    ).launch(
        grid=launch_grid(BLOCKS_FASTEST, num_m_blocks, num_heads, num_batch),
        block=[NUM_THREADS, 1, 1],
        smem=SharedStorage.size_in_bytes(),
        stream=stream,
    )


@cute.kernel
def bwd_dq_kernel(
    tensors: BwdDqTensors,
    lengths: SeqlenTensors,
    scale: Float32,
    scale_log2: Float32,
    window_left: Int32,
    window_right: Int32,
    setup: tiles.SingleMmaSetup,
    SharedStorage: cutlass.Constexpr,
):
    mQ, mK, mV, mdO, mLSE2, mD, mdQ, mBias = tensors
    sQ_layout, sK_layout, sV_layout, sdO_layout, gmem_tiled_copy_load, gmem_tiled_copy_store, tiled_mma = setup
    tidx, _, _ = cute.arch.thread_idx()
    m_block, head, batch = grid_coords(BLOCKS_FASTEST)
    seqlen = SeqlenInfo.create(batch, mQ, mK, lengths)
    head_kv = head // (heads_of(mQ, PACKED) // heads_of(mK, PACKED))
    mask = AttentionMask.for_sequence(TILE_M, TILE_N, P, seqlen, window_left, window_right, True)
    n_block_min, n_block_max = mask.n_block_range(m_block)
    bias = None
    if const_expr(P.bias_dtype is not None):
        bias = ScoreBias.create(mBias, batch, head, seqlen, scale_log2, TILE_M, TILE_N)

    storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
    sQ = storage.sQ.get_tensor(sQ_layout)
    sdO = storage.sdO.get_tensor(sdO_layout)
    sK = storage.sK.get_tensor(sK_layout)
    sV = storage.sV.get_tensor(sV_layout)
    sKt = tiles.transpose_view(sK, TILE_N, TILE_HDIM_QK)  # (TILE_HDIM_QK, TILE_N): K as the B operand of dS.K

    gmem_thr_copy = gmem_tiled_copy_load.get_slice(tidx)
    # (TILE_M, TILE_HDIM_QK), (TILE_M, TILE_HDIM_V); K, V: (TILE_N, width, n_blocks)
    gQ = cute.local_tile(seqlen.q_rows(mQ, batch, head), (TILE_M, TILE_HDIM_QK), (m_block, 0))
    gdO = cute.local_tile(seqlen.q_rows(mdO, batch, head), (TILE_M, TILE_HDIM_V), (m_block, 0))
    gK = cute.local_tile(seqlen.k_rows(mK, batch, head_kv), (TILE_N, TILE_HDIM_QK), (None, 0))
    gV = cute.local_tile(seqlen.k_rows(mV, batch, head_kv), (TILE_N, TILE_HDIM_V), (None, 0))
    tQsQ = gmem_thr_copy.partition_D(sQ)
    tQsdO = gmem_thr_copy.partition_D(sdO)
    tKgK = gmem_thr_copy.partition_S(gK)
    tKsK = gmem_thr_copy.partition_D(sK)
    tVgV = gmem_thr_copy.partition_S(gV)
    tVsV = gmem_thr_copy.partition_D(sV)
    # (CPY, CPY_M, CPY_K) copy coordinates: rows (Q's serve dO's, K's serve V's) and columns
    tQcQ = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_M, TILE_HDIM_QK)))
    tdOcdO = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_M, TILE_HDIM_V)))
    tKcK = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_N, TILE_HDIM_QK)))
    tVcV = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_N, TILE_HDIM_V)))
    head_dim_qk, head_dim_v = mQ.shape[-1], mV.shape[-1]
    tQpQ = tiles.hdim_predicate(tQcQ, head_dim_qk)
    tQpdO = tiles.hdim_predicate(tdOcdO, head_dim_v)
    tKpK = tiles.hdim_predicate(tKcK, head_dim_qk)
    tVpV = tiles.hdim_predicate(tVcV, head_dim_v)

    thr_mma = tiled_mma.get_slice(tidx)
    tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
    tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK))
    tdPrdO = thr_mma.make_fragment_A(thr_mma.partition_A(sdO))
    tdPrV = thr_mma.make_fragment_B(thr_mma.partition_B(sV))
    tdQrKt = thr_mma.make_fragment_B(thr_mma.partition_B(sKt))
    copy_A = cute.make_tiled_copy_A(tiles.ldmatrix_atom(DTYPE), tiled_mma).get_slice(tidx)
    copy_B = cute.make_tiled_copy_B(tiles.ldmatrix_atom(DTYPE), tiled_mma).get_slice(tidx)
    copy_Bt = cute.make_tiled_copy_B(tiles.ldmatrix_atom(DTYPE, transpose=True), tiled_mma).get_slice(tidx)
    tSsQ = copy_A.partition_S(sQ)
    tdPsdO = copy_A.partition_S(sdO)
    tSsK = copy_B.partition_S(sK)
    tdPsV = copy_B.partition_S(sV)
    tdQsKt = copy_Bt.partition_S(sKt)
    acc_dQ = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, TILE_HDIM_QK)), Float32)
    acc_dQ.fill(0.0)

    cS = cute.make_identity_tensor((TILE_M, TILE_N))
    tScS = thr_mma.partition_C(cS)
    t0ScS = tiled_mma.get_slice(0).partition_C(cS)
    tScS_mn = tiles.acc_mn_view(tScS)
    acc_shape_S = thr_mma.partition_shape_C((TILE_M, TILE_N))

    # ---- prologue ------------------------------------------------------------------
    if const_expr(CHECK_HDIM_QK):
        tiles.zero_unpredicated(tQsQ, tQpQ)
        tiles.zero_unpredicated(tKsK, tKpK)
    if const_expr(CHECK_HDIM_V):
        tiles.zero_unpredicated(tQsdO, tQpdO)
        tiles.zero_unpredicated(tVsV, tVpV)
    rows_left = seqlen.seqlen_q - m_block * TILE_M
    tiles.load_rows(gmem_tiled_copy_load, gmem_thr_copy.partition_S(gQ), tQsQ, tQcQ, tQpQ, rows_left)
    tiles.load_rows(gmem_tiled_copy_load, gmem_thr_copy.partition_S(gdO), tQsdO, tQcQ, tQpdO, rows_left)
    if n_block_max > n_block_min:
        load_kv(gmem_tiled_copy_load, tKgK, tKsK, tKcK, tKpK, n_block_min, seqlen.seqlen_k)
        load_kv(gmem_tiled_copy_load, tVgV, tVsV, tKcK, tVpV, n_block_min, seqlen.seqlen_k)
    cute.arch.cp_async_commit_group()

    gLSE2 = cute.local_tile(seqlen.lse_row(mLSE2, batch, head), (TILE_M,), (m_block,))
    gD = cute.local_tile(seqlen.lse_row(mD, batch, head), (TILE_M,), (m_block,))
    row_lse2, row_d = recompute.row_stats(gLSE2, gD, tScS_mn, rows_left)
    score_operands = recompute.ScoreOperands(tiled_mma, tSrQ, tSrK, tSsQ, tSsK, tdPrdO, tdPrV, tdPsdO, tdPsV,
                                             copy_A, copy_B)

    # ---- key blocks in increasing order: the fixed summation order of dQ -------------
    for n_block in cutlass.range(n_block_min, n_block_max, unroll=1):
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()
        _, acc_dS = recompute.probabilities_and_ds(score_operands, acc_shape_S, mask, m_block, n_block, tScS, t0ScS,
                                                   row_lse2, row_d, scale_log2, bias)
        rdS = cute.make_fragment_like(acc_dS, DTYPE)
        rdS.store(acc_dS.load().to(DTYPE))

        cute.arch.barrier()  # sV is free
        if n_block + 1 < n_block_max:
            load_kv(gmem_tiled_copy_load, tVgV, tVsV, tKcK, tVpV, n_block + 1, seqlen.seqlen_k)
        cute.arch.cp_async_commit_group()
        tiles.gemm_rs(tiled_mma, acc_dQ, tiles.acc_as_operand_a(rdS), tdQrKt, tdQsKt, copy_Bt)
        cute.arch.barrier()  # sK is free
        if n_block + 1 < n_block_max:
            load_kv(gmem_tiled_copy_load, tKgK, tKsK, tKcK, tKpK, n_block + 1, seqlen.seqlen_k)
        cute.arch.cp_async_commit_group()

    # ---- epilogue: dQ through shared memory (sQ reused) to global --------------------
    acc_dQ.store(acc_dQ.load() * scale)
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()
    tiles.stash_acc(tiled_mma, tidx, acc_dQ, sQ, DTYPE)
    cute.arch.barrier()
    gdQ = cute.local_tile(seqlen.q_rows(mdQ, batch, head), (TILE_M, TILE_HDIM_QK), (m_block, 0))
    tiles.store_rows(gmem_tiled_copy_store, tidx, sQ, gdQ, seqlen.rows_q - m_block * TILE_M, head_dim_qk,
                     CHECK_HDIM_QK)


@cute.jit
def load_kv(gmem_tiled_copy, tXgX, tXsX, tXcX, col_pred, n_block, seqlen_k):
    """One key block of K or V; rows past the sequence zero-filled (P there is 0, 0 * NaN is not)."""
    tiles.load_rows(gmem_tiled_copy, tXgX[None, None, None, n_block], tXsX, tXcX, col_pred,
                    seqlen_k - n_block * TILE_N)
