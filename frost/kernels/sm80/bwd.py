"""SM80 attention backward, step 2: dK and dV (and dQ by atomic accumulation).

Specialized by ``PARAMS`` (a ``config.BwdParams``). One CTA per (key block,
kv head, sequence): the CTA's ``tile_n`` rows of K and V stay in shared memory
while it walks every (query head of its GQA group, query block) pair that can
see them, so dK and dV accumulate in registers over the whole group and are
written once: no GQA reduction pass and no dK/dV atomics, which also makes
them deterministic.

Per step (query head h, query block m), with lse2 = lse*log2(e) and D from
``sm80/bwd_pre``:

    wait Q[h,m], dO[h,m]; barrier
    issue Q, dO of the next step    into the other stage buffer (stages_q = 2)
    S  = Q.K^T                      mma (sdp layout)
    mask S                          only tiles that need it (mask.py)
    P  = exp2(S*scale_log2 - lse2)  rows of padded / empty queries give 0
    dP = dO.V^T                     mma (sdp layout)
    dS = P * (dP - D)
    P, dS -> shared (io dtype); barrier
    dV += P^T.dO ;  dK += dS^T.Q    mma (dkv layout, operands via ldmatrix.trans)
    (stages_q = 1: barrier; issue Q, dO of the next step, overlapping only dS.K)
    dQ = scale * dS.K -> fp32 atomics into the dQ accumulator   (not in deterministic mode;
                                    vector_dq_atomics: red.global.add.v2.f32, SM90 only)

Epilogue: dK *= scale; dK and dV go through shared memory to 128-bit stores.
Key rows past Sk_b inside the padded extent are written as zeros.

The MMA warp layouts and tiles follow FlashAttention-2's SM80 backward
(d64: 128x128, d128: 64x128, 8 warps). Rejected: splitting each query head
into its own CTA with fp32 dK/dV atomics (more parallelism for MQA with
short sequences, but a reduction pass and no determinism).
"""
from __future__ import annotations

from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.kernels.sm80 import tiles
from frost.kernels.sm80.mask import AttentionMask
from frost.kernels.sm80.seqlen import SeqlenInfo, SeqlenTensors

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
TILE_M, TILE_N, TILE_HDIM = P.tile_m, P.tile_n, P.tile_hdim
NUM_THREADS = P.num_threads
CHECK_HDIM_QK, CHECK_HDIM_V = P.partial_hdim_qk, P.partial_hdim_v
PACKED = P.layout == "thd"
STAGES = P.stages_q


class BwdTensors(NamedTuple):
    """The kernel's global tensors (dq_accum None in deterministic mode)."""

    q: cute.Tensor
    k: cute.Tensor
    v: cute.Tensor
    do: cute.Tensor
    lse2: cute.Tensor
    d: cute.Tensor
    dq_accum: cute.Tensor | None
    dk: cute.Tensor
    dv: cute.Tensor


class BwdSetup(NamedTuple):
    """What the host builds once for every CTA: shared layouts, global copies, the three MMAs."""

    sQ_layout: cute.ComposedLayout
    sKV_layout: cute.ComposedLayout
    sPdS_layout: cute.ComposedLayout
    gmem_tiled_copy_load: cute.TiledCopy
    gmem_tiled_copy_store: cute.TiledCopy
    tiled_mma_sdp: cute.TiledMma
    tiled_mma_dkv: cute.TiledMma
    tiled_mma_dq: cute.TiledMma


@cute.jit
def sdpa_bwd(
    mQ: cute.Tensor,
    mK: cute.Tensor,
    mV: cute.Tensor,
    mdO: cute.Tensor,
    mLSE2: cute.Tensor,
    mD: cute.Tensor,
    mdQaccum: cute.Tensor | None,
    mdK: cute.Tensor,
    mdV: cute.Tensor,
    mCuSeqlensQ: cute.Tensor | None,
    mCuSeqlensK: cute.Tensor | None,
    mSeqlensQ: cute.Tensor | None,
    mSeqlensK: cute.Tensor | None,
    scale: Float32,
    scale_log2: Float32,
    window_left: Int32,
    window_right: Int32,
    max_seqlen_k: Int32,
    stream,
):
    sQ_layout = tiles.smem_layout(DTYPE, TILE_M, TILE_HDIM, STAGES)  # (TILE_M, TILE_HDIM, STAGES): Q and dO
    sKV_layout = tiles.smem_layout(DTYPE, TILE_N, TILE_HDIM)
    sPdS_layout = tiles.smem_layout(DTYPE, TILE_M, TILE_N)

    @cute.struct
    class SharedStorage:
        sK: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(sKV_layout)], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(sKV_layout)], 1024]
        sQ: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(sQ_layout)], 1024]
        sdO: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(sQ_layout)], 1024]
        sP: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(sPdS_layout)], 1024]
        sdS: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(sPdS_layout)], 1024]

    if const_expr(PACKED):
        num_batch = mCuSeqlensK.shape[0] - 1
        num_n_blocks = cute.ceil_div(max_seqlen_k, TILE_N)
        heads_kv = mK.shape[1]
    else:
        num_batch = mK.shape[0]
        num_n_blocks = cute.ceil_div(mK.shape[1], TILE_N)
        heads_kv = mK.shape[2]
    setup = BwdSetup(
        sQ_layout, sKV_layout, sPdS_layout,
        tiles.gmem_load_copy(DTYPE, TILE_HDIM, NUM_THREADS),
        tiles.gmem_store_copy(DTYPE, TILE_HDIM, NUM_THREADS),
        tiles.tiled_mma(DTYPE, P.num_warps, P.warps_m_sdp),
        tiles.tiled_mma(DTYPE, P.num_warps, P.warps_n_dkv),
        tiles.tiled_mma(DTYPE, P.num_warps, P.warps_m_dq),
    )
    bwd_kernel(
        BwdTensors(mQ, mK, mV, mdO, mLSE2, mD, mdQaccum, mdK, mdV),
        SeqlenTensors(mCuSeqlensQ, mCuSeqlensK, mSeqlensQ, mSeqlensK),
        scale, scale_log2, window_left, window_right, setup, SharedStorage,
    ).launch(
        grid=[num_n_blocks, heads_kv, num_batch],
        block=[NUM_THREADS, 1, 1],
        smem=SharedStorage.size_in_bytes(),
        stream=stream,
    )


@cute.kernel
def bwd_kernel(
    tensors: BwdTensors,
    lengths: SeqlenTensors,
    scale: Float32,
    scale_log2: Float32,
    window_left: Int32,
    window_right: Int32,
    setup: BwdSetup,
    SharedStorage: cutlass.Constexpr,
):
    mQ, mK, mV, mdO, mLSE2, mD, mdQaccum, mdK, mdV = tensors
    (sQ_layout, sKV_layout, sPdS_layout, gmem_tiled_copy_load, gmem_tiled_copy_store,
     tiled_mma_sdp, tiled_mma_dkv, tiled_mma_dq) = setup
    tidx, _, _ = cute.arch.thread_idx()
    n_block, head_kv, batch = cute.arch.block_idx()
    seqlen = SeqlenInfo.create(batch, mQ, mK, lengths)
    heads_q = mQ.shape[1] if const_expr(PACKED) else mQ.shape[2]
    heads_kv = mK.shape[1] if const_expr(PACKED) else mK.shape[2]
    group = heads_q // heads_kv
    mask = AttentionMask(
        TILE_M, TILE_N, P.has_window_left, P.has_window_right, True,
        seqlen.seqlen_q, seqlen.seqlen_k,
        seqlen.seqlen_k - seqlen.seqlen_q if const_expr(P.bottom_right) else Int32(0),
        window_left, window_right,
    )
    m_block_min, m_block_max = mask.m_block_range(n_block)
    num_m_blocks = cutlass.max(m_block_max - m_block_min, 0)

    storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
    sK = storage.sK.get_tensor(sKV_layout)
    sV = storage.sV.get_tensor(sKV_layout)
    sQ = storage.sQ.get_tensor(sQ_layout)
    sdO = storage.sdO.get_tensor(sQ_layout)
    sP = storage.sP.get_tensor(sPdS_layout)
    sdS = storage.sdS.get_tensor(sPdS_layout)
    # transposed views: the operands of dV = P^T.dO, dK = dS^T.Q, dQ = dS.K
    sPt = tiles.transpose_view(sP, TILE_M, TILE_N)
    sdSt = tiles.transpose_view(sdS, TILE_M, TILE_N)
    sQt = tiles.transpose_view(sQ, TILE_M, TILE_HDIM, STAGES)
    sdOt = tiles.transpose_view(sdO, TILE_M, TILE_HDIM, STAGES)
    sKt = tiles.transpose_view(sK, TILE_N, TILE_HDIM)

    # ---- global -> shared copies ---------------------------------------------
    gmem_thr_copy = gmem_tiled_copy_load.get_slice(tidx)
    gK = cute.local_tile(seqlen.k_rows(mK, batch, head_kv), (TILE_N, TILE_HDIM), (n_block, 0))
    gV = cute.local_tile(seqlen.k_rows(mV, batch, head_kv), (TILE_N, TILE_HDIM), (n_block, 0))
    tKgK = gmem_thr_copy.partition_S(gK)
    tKsK = gmem_thr_copy.partition_D(sK)
    tVgV = gmem_thr_copy.partition_S(gV)
    tVsV = gmem_thr_copy.partition_D(sV)
    tQsQ = gmem_thr_copy.partition_D(sQ)
    tQsdO = gmem_thr_copy.partition_D(sdO)
    tKVcKV = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_N, TILE_HDIM)))
    tQcQ = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_M, TILE_HDIM)))
    head_dim_qk, head_dim_v = mQ.shape[-1], mV.shape[-1]
    tKpK = tiles.hdim_predicate(tKVcKV, head_dim_qk)
    tVpV = tiles.hdim_predicate(tKVcKV, head_dim_v)
    tQpQ = tiles.hdim_predicate(tQcQ, head_dim_qk)
    tQpdO = tiles.hdim_predicate(tQcQ, head_dim_v)

    # ---- MMA partitions --------------------------------------------------------
    thr_sdp = tiled_mma_sdp.get_slice(tidx)
    thr_dkv = tiled_mma_dkv.get_slice(tidx)
    thr_dq = tiled_mma_dq.get_slice(tidx)
    # fragments are shaped by one stage; the staged partitions below are indexed by stage
    tSrQ = thr_sdp.make_fragment_A(thr_sdp.partition_A(sQ[None, None, 0]))
    tSrK = thr_sdp.make_fragment_B(thr_sdp.partition_B(sK))
    tdPrdO = thr_sdp.make_fragment_A(thr_sdp.partition_A(sdO[None, None, 0]))
    tdPrV = thr_sdp.make_fragment_B(thr_sdp.partition_B(sV))
    tdVrPt = thr_dkv.make_fragment_A(thr_dkv.partition_A(sPt))
    tdVrdOt = thr_dkv.make_fragment_B(thr_dkv.partition_B(sdOt[None, None, 0]))
    tdKrdSt = thr_dkv.make_fragment_A(thr_dkv.partition_A(sdSt))
    tdKrQt = thr_dkv.make_fragment_B(thr_dkv.partition_B(sQt[None, None, 0]))
    tdQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS))
    tdQrKt = thr_dq.make_fragment_B(thr_dq.partition_B(sKt))
    acc_dK = cute.make_rmem_tensor(thr_dkv.partition_shape_C((TILE_N, TILE_HDIM)), Float32)
    acc_dV = cute.make_rmem_tensor(thr_dkv.partition_shape_C((TILE_N, TILE_HDIM)), Float32)
    acc_dK.fill(0.0)
    acc_dV.fill(0.0)

    # shared -> register copies (ldmatrix; transposed for the transposed views)
    copy_A_sdp = cute.make_tiled_copy_A(tiles.ldmatrix_atom(DTYPE), tiled_mma_sdp).get_slice(tidx)
    copy_B_sdp = cute.make_tiled_copy_B(tiles.ldmatrix_atom(DTYPE), tiled_mma_sdp).get_slice(tidx)
    copy_At_dkv = cute.make_tiled_copy_A(tiles.ldmatrix_atom(DTYPE, transpose=True), tiled_mma_dkv).get_slice(tidx)
    copy_Bt_dkv = cute.make_tiled_copy_B(tiles.ldmatrix_atom(DTYPE, transpose=True), tiled_mma_dkv).get_slice(tidx)
    copy_A_dq = cute.make_tiled_copy_A(tiles.ldmatrix_atom(DTYPE), tiled_mma_dq).get_slice(tidx)
    copy_Bt_dq = cute.make_tiled_copy_B(tiles.ldmatrix_atom(DTYPE, transpose=True), tiled_mma_dq).get_slice(tidx)
    tSsQ = copy_A_sdp.partition_S(sQ)
    tSsK = copy_B_sdp.partition_S(sK)
    tdPsdO = copy_A_sdp.partition_S(sdO)
    tdPsV = copy_B_sdp.partition_S(sV)
    tdVsPt = copy_At_dkv.partition_S(sPt)
    tdVsdOt = copy_Bt_dkv.partition_S(sdOt)
    tdKsdSt = copy_At_dkv.partition_S(sdSt)
    tdKsQt = copy_Bt_dkv.partition_S(sQt)
    tdQsdS = copy_A_dq.partition_S(sdS)
    tdQsKt = copy_Bt_dq.partition_S(sKt)
    # register -> shared for P and dS (pairs of adjacent columns)
    r2s_copy_PdS = cute.make_tiled_copy_C(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), DTYPE, num_bits_per_copy=2 * DTYPE.width), tiled_mma_sdp
    ).get_slice(tidx)
    tPsP = r2s_copy_PdS.partition_D(sP)
    tdSsdS = r2s_copy_PdS.partition_D(sdS)

    # score-tile coordinates: this thread's rows (for lse2 / D) and the mask's inputs
    cS = cute.make_identity_tensor((TILE_M, TILE_N))
    tScS = thr_sdp.partition_C(cS)
    t0ScS = tiled_mma_sdp.get_slice(0).partition_C(cS)
    tScS_mn = tiles.acc_mn_view(tScS)
    acc_shape_S = thr_sdp.partition_shape_C((TILE_M, TILE_N))

    # ---- prologue: K, V resident; Q, dO of the first step ------------------------
    if const_expr(CHECK_HDIM_QK):
        tiles.zero_unpredicated(tKsK, tKpK)
        for stage in cutlass.range_constexpr(STAGES):
            tiles.zero_unpredicated(tQsQ[None, None, None, stage], tQpQ)
    if const_expr(CHECK_HDIM_V):
        tiles.zero_unpredicated(tVsV, tVpV)
        for stage in cutlass.range_constexpr(STAGES):
            tiles.zero_unpredicated(tQsdO[None, None, None, stage], tQpdO)
    keys_left = seqlen.seqlen_k - n_block * TILE_N
    tiles.load_rows(gmem_tiled_copy_load, tKgK, tKsK, tKVcKV, tKpK, keys_left)
    tiles.load_rows(gmem_tiled_copy_load, tVgV, tVsV, tKVcKV, tVpV, keys_left)
    num_steps = num_m_blocks * group
    if num_steps > 0:
        load_q_do(gmem_tiled_copy_load, gmem_thr_copy, mQ, mdO, seqlen, batch, head_kv * group, m_block_min,
                  tQsQ[None, None, None, 0], tQsdO[None, None, None, 0], tQcQ, tQpQ, tQpdO)
    cute.arch.cp_async_commit_group()

    for step in cutlass.range(num_steps, unroll=1):
        head = head_kv * group + step // num_m_blocks
        m_block = m_block_min + step % num_m_blocks
        rows_left = seqlen.seqlen_q - m_block * TILE_M
        stage = step % STAGES if const_expr(STAGES > 1) else 0

        # this thread's rows of lse2 and D (padded / out-of-sequence rows: P = 0, D = 0)
        gLSE2 = cute.local_tile(seqlen.lse_row(mLSE2, batch, head), (TILE_M,), (m_block,))
        gD = cute.local_tile(seqlen.lse_row(mD, batch, head), (TILE_M,), (m_block,))
        row_lse2 = cute.make_rmem_tensor(cute.size(tScS_mn, mode=[0]), Float32)
        row_d = cute.make_rmem_tensor(cute.size(tScS_mn, mode=[0]), Float32)
        for r in cutlass.range_constexpr(cute.size(row_lse2)):
            row = tScS_mn[r, 0][0]
            row_lse2[r] = Float32.inf
            row_d[r] = 0.0
            if row < rows_left:
                row_lse2[r] = gLSE2[row]
                row_d[r] = gD[row]

        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()  # this step's Q, dO landed; every warp is done with the previous step
        if const_expr(STAGES > 1):
            load_next_q_do(step, num_steps, num_m_blocks, m_block_min, head_kv * group, 1 - stage,
                           gmem_tiled_copy_load, gmem_thr_copy, mQ, mdO, seqlen, batch,
                           tQsQ, tQsdO, tQcQ, tQpQ, tQpdO)

        # S = Q.K^T, masked, to probabilities
        acc_S = cute.make_rmem_tensor(acc_shape_S, Float32)
        acc_S.fill(0.0)
        tiles.gemm_ss(tiled_mma_sdp, acc_S, tSrQ, tSrK, tSsQ[None, None, None, stage], tSsK, copy_A_sdp, copy_B_sdp)
        if mask.needs_mask(m_block, n_block):
            mask.apply(acc_S, tScS, t0ScS, m_block, n_block)
        acc_S_mn = tiles.acc_mn_view(acc_S)
        for r in cutlass.range_constexpr(cute.size(row_lse2)):
            acc_S_mn[r, None].store(
                cute.math.exp2(acc_S_mn[r, None].load() * scale_log2 - row_lse2[r], fastmath=True)
            )

        # dP = dO.V^T; dS = P * (dP - D)
        acc_dP = cute.make_rmem_tensor(acc_shape_S, Float32)
        acc_dP.fill(0.0)
        tiles.gemm_ss(tiled_mma_sdp, acc_dP, tdPrdO, tdPrV, tdPsdO[None, None, None, stage], tdPsV,
                      copy_A_sdp, copy_B_sdp)
        acc_dP_mn = tiles.acc_mn_view(acc_dP)
        for r in cutlass.range_constexpr(cute.size(row_d)):
            acc_dP_mn[r, None].store(acc_S_mn[r, None].load() * (acc_dP_mn[r, None].load() - row_d[r]))

        rP = cute.make_fragment_like(acc_S, DTYPE)
        rP.store(acc_S.load().to(DTYPE))
        rdS = cute.make_fragment_like(acc_dP, DTYPE)
        rdS.store(acc_dP.load().to(DTYPE))
        cute.copy(r2s_copy_PdS, r2s_copy_PdS.retile(rP), tPsP)
        cute.copy(r2s_copy_PdS, r2s_copy_PdS.retile(rdS), tdSsdS)
        cute.arch.barrier()

        # dV += P^T.dO ; dK += dS^T.Q
        tiles.gemm_ss(tiled_mma_dkv, acc_dV, tdVrPt, tdVrdOt, tdVsPt, tdVsdOt[None, None, None, stage],
                      copy_At_dkv, copy_Bt_dkv)
        tiles.gemm_ss(tiled_mma_dkv, acc_dK, tdKrdSt, tdKrQt, tdKsdSt, tdKsQt[None, None, None, stage],
                      copy_At_dkv, copy_Bt_dkv)
        if const_expr(STAGES == 1):
            cute.arch.barrier()  # sQ and sdO are free: the next step's loads overlap the dQ product
            load_next_q_do(step, num_steps, num_m_blocks, m_block_min, head_kv * group, 0,
                           gmem_tiled_copy_load, gmem_thr_copy, mQ, mdO, seqlen, batch,
                           tQsQ, tQsdO, tQcQ, tQpQ, tQpdO)

        if const_expr(not P.deterministic):
            acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C((TILE_M, TILE_HDIM)), Float32)
            acc_dQ.fill(0.0)
            tiles.gemm_ss(tiled_mma_dq, acc_dQ, tdQrdS, tdQrKt, tdQsdS, tdQsKt, copy_A_dq, copy_Bt_dq)
            acc_dQ.store(acc_dQ.load() * scale)
            gdQ = cute.local_tile(seqlen.q_rows_accum(mdQaccum, batch, head), (TILE_M, TILE_HDIM), (m_block, 0))
            tdQcdQ = thr_dq.partition_C(cute.make_identity_tensor((TILE_M, TILE_HDIM)))
            if const_expr(P.vector_dq_atomics):
                # the C fragment holds adjacent column pairs (values 2j, 2j+1): one 8-byte red each
                for j in cutlass.range_constexpr(cute.size(acc_dQ) // 2):
                    coord = tdQcdQ[2 * j]
                    if coord[0] < rows_left:
                        pair = cute.make_tensor(acc_dQ.iterator + 2 * j, cute.make_layout(2)).load()
                        cute.arch.atomic_add(gdQ.iterator + cute.crd2idx(coord, gdQ.layout), pair)
            else:
                for i in cutlass.range_constexpr(cute.size(acc_dQ)):
                    coord = tdQcdQ[i]
                    if coord[0] < rows_left:
                        cute.arch.atomic_add(gdQ.iterator + cute.crd2idx(coord, gdQ.layout), acc_dQ[i])

    # ---- epilogue: dK, dV through shared memory to global ------------------------
    acc_dK.store(acc_dK.load() * scale)
    rdK = cute.make_fragment_like(acc_dK, DTYPE)
    rdK.store(acc_dK.load().to(DTYPE))
    rdV = cute.make_fragment_like(acc_dV, DTYPE)
    rdV.store(acc_dV.load().to(DTYPE))
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()  # every warp is done with sK / sV (the dQ product reads sK)
    r2s_copy_dKV = cute.make_tiled_copy_C(
        cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), DTYPE, num_bits_per_copy=2 * DTYPE.width), tiled_mma_dkv
    ).get_slice(tidx)
    cute.copy(r2s_copy_dKV, r2s_copy_dKV.retile(rdK), r2s_copy_dKV.partition_D(sK))
    cute.copy(r2s_copy_dKV, r2s_copy_dKV.retile(rdV), r2s_copy_dKV.partition_D(sV))
    cute.arch.barrier()
    written_rows = seqlen.rows_k - n_block * TILE_N
    store_rows(gmem_tiled_copy_store, tidx, sK, seqlen.k_rows(mdK, batch, head_kv), n_block, written_rows,
               mdK.shape[-1], CHECK_HDIM_QK)
    store_rows(gmem_tiled_copy_store, tidx, sV, seqlen.k_rows(mdV, batch, head_kv), n_block, written_rows,
               mdV.shape[-1], CHECK_HDIM_V)


@cute.jit
def load_q_do(gmem_tiled_copy, gmem_thr_copy, mQ, mdO, seqlen: SeqlenInfo, batch, head, m_block,
              tQsQ, tQsdO, tQcQ, tQpQ, tQpdO):
    """Issue the cp.async loads of one step's Q and dO tiles (rows past the sequence zero-filled)."""
    gQ = cute.local_tile(seqlen.q_rows(mQ, batch, head), (TILE_M, TILE_HDIM), (m_block, 0))
    gdO = cute.local_tile(seqlen.q_rows(mdO, batch, head), (TILE_M, TILE_HDIM), (m_block, 0))
    rows_left = seqlen.seqlen_q - m_block * TILE_M
    tiles.load_rows(gmem_tiled_copy, gmem_thr_copy.partition_S(gQ), tQsQ, tQcQ, tQpQ, rows_left)
    tiles.load_rows(gmem_tiled_copy, gmem_thr_copy.partition_S(gdO), tQsdO, tQcQ, tQpdO, rows_left)


@cute.jit
def load_next_q_do(step, num_steps, num_m_blocks, m_block_min, first_head, stage, gmem_tiled_copy, gmem_thr_copy,
                   mQ, mdO, seqlen: SeqlenInfo, batch, tQsQ, tQsdO, tQcQ, tQpQ, tQpdO):
    """Issue the loads of step + 1 (if any) into ``stage``, and commit them as one group."""
    if step + 1 < num_steps:
        head = first_head + (step + 1) // num_m_blocks
        m_block = m_block_min + (step + 1) % num_m_blocks
        load_q_do(gmem_tiled_copy, gmem_thr_copy, mQ, mdO, seqlen, batch, head, m_block,
                  tQsQ[None, None, None, stage], tQsdO[None, None, None, stage], tQcQ, tQpQ, tQpdO)
    cute.arch.cp_async_commit_group()


@cute.jit
def store_rows(gmem_tiled_copy, tidx, s_tile, m_rows, n_block, written_rows, head_dim,
               check_hdim: cutlass.Constexpr[bool]):
    """Shared (TILE_N, TILE_HDIM) tile -> rows [0, written_rows) of block n_block of m_rows."""
    thr_copy = gmem_tiled_copy.get_slice(tidx)
    g_tile = cute.local_tile(m_rows, (TILE_N, TILE_HDIM), (n_block, 0))
    tXsX = thr_copy.partition_S(s_tile)
    tXgX = thr_copy.partition_D(g_tile)
    tXcX = thr_copy.partition_D(cute.make_identity_tensor((TILE_N, TILE_HDIM)))
    tXpX = tiles.hdim_predicate(tXcX, head_dim)
    tXrX = cute.make_fragment_like(tXgX, DTYPE)
    cute.autovec_copy(tXsX, tXrX)
    for m in cutlass.range_constexpr(cute.size(tXrX.shape[1])):
        if tXcX[0, m, 0][0] < written_rows:
            if const_expr(check_hdim):
                cute.copy(gmem_tiled_copy, tXrX[None, m, None], tXgX[None, m, None], pred=tXpX[None, m, None])
            else:
                cute.copy(gmem_tiled_copy, tXrX[None, m, None], tXgX[None, m, None])
