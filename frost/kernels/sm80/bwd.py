"""SM80 attention backward, step 2: dK and dV (and dQ by reductions into a flat accumulator).

Specialized by ``PARAMS`` (a ``config.BwdParams``). One CTA per (key block,
kv head, split of its GQA group, sequence): the CTA's ``tile_n`` rows of K
and V stay in shared memory while it walks every (query head of its share of
the group, query block) pair that can see them, so dK and dV accumulate in
registers and are written once. Unsplit (``split_group`` off) they are the
outputs themselves: no GQA reduction, no dK/dV atomics. Split, each CTA writes
fp32 partials that the host sums in split order (deterministic either way);
the engine splits when the unsplit grid would be under two waves.

Per step (query head h, query block m), with lse2 = lse*log2(e) and D from
``sm80/bwd_pre`` (P, dS: ``recompute.py``):

    wait Q[h,m], dO[h,m]; barrier
    issue Q, dO of the next step    into the other stage buffer
    S, P, dP, dS                    mma (sdp layout); masked only where needed; bias added
    dS -> dbias                     a bias's gradient: stored or reduced per element (bias.py)
    P, dS -> shared (io dtype); barrier
    bias of the next step -> shared  cp.async (a float32 bias, bias_staged: bias.py)
    dV += P^T.dO                    mma (dkv layout, operands via ldmatrix.trans)
    dQ = dS.K -> reductions         (deterministic mode: only sliced, below)
    dK += dS^T.Q                    issued after the dQ reductions, which drain under it

(``dq_first``: the dQ product and its reductions before the dV product, so that they drain
under both products; config.bwd_params_for says when.)

dQ goes to a flat fp32 accumulator (``seqlen.py``): each query block owns a
chunk of ``tile_m * tile_hdim_qk`` floats in the order of the dQ MMA's register
fragment, thread ``t``'s values ``[w*j, w*j + w)`` at ``(j * threads + t) * w``
for reduce width ``w``. A warp's reduction covers 32 * w consecutive floats
(whole 128-byte lines), no row guard is needed (a sequence's last chunk has
room past its end), and ``sm80/bwd_convert`` reads the chunk back in the same
order, scales it and stores dq. ``dq_reduce_width`` 2 or 4 use
red.global.add.v2/v4.f32 (SM90).

Sliced dQ (``dq_slices``, deterministic mode, FlashAttention-2's way): the grid's x holds
slices, and CTA x walks one key block of each round of ``slices`` of its (sequence, kv head,
split part), x in even rounds and slices - 1 - x in odd ones (a zigzag that evens out causal
work), one after another (``key_block_pass``), reducing dQ into slice x of the accumulator, which no
other CTA touches. A thread reduces into the same addresses in every step, so its adds land in
program order: fixed fp32 sums with no turns, counters or fences. ``sm80/bwd_convert`` sums the
slices in slice order. The price is the slices' memory (the engine keeps them few,
``engines/sm80.dq_slice_count``) and a CTA barrier between key blocks. Without a left window
(``dq_slice_stores``) the CTA writes its slice whole: its first key block, the lowest of its
walk, sees every query block a later one does (both ends of ``m_block_range`` grow with the key
block, and only a left window moves the upper end), so that block *stores* its dQ, the later ones
add to it, and the chunks its walk never reaches stay unwritten (``sm80/bwd_convert`` skips
them by that first block's range); no pass zeroes the slices, and no first reduction reads
zeros back from memory. With a left window ``sm80/bwd_pre``
zeroes every slice and every block reduces.

Epilogue: dK *= scale; dK and dV through shared memory to 128-bit stores (or
fp32 partials when split). Key rows past Sk_b inside the padded extent are
written as zeros.

Cluster sum (``split_cluster``, SM90): the split CTAs of one key block run as one cluster (rank
= split) and, after each pass, stash their fp32 dK and dV over their own shared tiles; past a
cluster barrier CTA s sums rows [s, s + 1) * tile_n / splits of every stash in split order
(``cluster_sum``: bwd_combine's adds, so the same bits) and writes dk and dv itself. A second
barrier keeps each stash until every CTA has read it. The CTAs of a cluster walk the same key
blocks, so they meet at each barrier about together.

Head dims: Q, K, dQ, dK are tiled to ``tile_hdim_qk`` columns, V, dO, dV to
``tile_hdim_v`` (they differ for ``d192x128``); S = Q.K^T and dQ = dS.K, dK =
dS^T.Q run over the first, dP = dO.V^T and dV = P^T.dO over the second.

The MMA warp layouts and tiles follow FlashAttention-2's SM80 backward
(``config.BWD_TILES``: d64 128x128, d128 64x128, wider flavors 64x64, 8 warps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, const_expr
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm, nvvm

from frost.kernels.sm80 import recompute, tiles
from frost.kernels.sm80.bias import BiasTileCopy, ScoreBias, bias_view, staged_layout
from frost.kernels.sm80.config import CLUSTER_STASH_PAD
from frost.kernels.sm80.mask import AttentionMask
from frost.kernels.sm80.grid import grid_coords, grid_order, launch_extents, launch_grid
from frost.kernels.sm80.seqlen import SeqlenInfo, SeqlenTensors, accum_slices, dq_accum_slice, heads_of

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
TILE_M, TILE_N = P.tile_m, P.tile_n
TILE_HDIM_QK, TILE_HDIM_V = P.tile_hdim_qk, P.tile_hdim_v
NUM_THREADS = P.num_threads
CHECK_HDIM_QK, CHECK_HDIM_V = P.partial_hdim_qk, P.partial_hdim_v
PACKED = P.layout == "thd"
# Q and dO buffers: with 2, step i+1 loads while step i computes; with 1 (``qdo_stages``, where
# shared memory is short) step i+1's loads start once every warp is done with step i's tiles
STAGES = P.qdo_stages
DQ_WIDTH = P.dq_reduce_width
HAS_BIAS = P.bias_dtype is not None
HAS_DBIAS = P.dbias_dtype is not None  # a bias whose gradient is wanted
BIAS_STAGED = P.bias_staged  # the bias tile comes through shared memory by cp.async (bias.py)
SLICED = P.dq_slices  # deterministic: each CTA reduces dQ into a slice of its own
SPLIT_CLUSTER = P.split_cluster  # a split group's CTAs of a key block sum dK, dV as a cluster (0: partials)
GRID_ORDER = grid_order(P.heavy_first, P.batch_inner)  # blocks fastest with slices


class BwdTensors(NamedTuple):
    """The kernel's global tensors: dq_accum None in deterministic mode unless ``dq_slices``; dk, dv fp32
    partials with a leading split index when ``split_group``; bias and dbias (its target: bias.py)
    None without a bias."""

    q: cute.Tensor
    k: cute.Tensor
    v: cute.Tensor
    do: cute.Tensor
    lse2: cute.Tensor
    d: cute.Tensor
    dq_accum: cute.Tensor | None
    dk: cute.Tensor
    dv: cute.Tensor
    bias: cute.Tensor | None
    dbias: cute.Tensor | None


class BwdSetup(NamedTuple):
    """What the host builds once for every CTA: shared layouts, global copies, the three MMAs."""

    sQ_layout: cute.ComposedLayout    # (TILE_M, TILE_HDIM_QK, STAGES)
    sdO_layout: cute.ComposedLayout   # (TILE_M, TILE_HDIM_V, STAGES)
    sK_layout: cute.ComposedLayout    # (TILE_N, TILE_HDIM_QK)
    sV_layout: cute.ComposedLayout    # (TILE_N, TILE_HDIM_V)
    sPdS_layout: cute.ComposedLayout  # (TILE_M, TILE_N)
    gmem_tiled_copy_load: cute.TiledCopy
    gmem_tiled_copy_store: cute.TiledCopy
    tiled_mma_sdp: cute.TiledMma
    tiled_mma_dkv: cute.TiledMma
    tiled_mma_dq: cute.TiledMma


@cute.jit
def sdpa_bwd(
    mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mLSE2: cute.Tensor, mD: cute.Tensor,
    mdQaccum: cute.Tensor | None, mdK: cute.Tensor, mdV: cute.Tensor,
    mBias: cute.Tensor | None, mdBias: cute.Tensor | None, mCuSeqlensQ: cute.Tensor | None,
    mCuSeqlensK: cute.Tensor | None, mSeqlensQ: cute.Tensor | None, mSeqlensK: cute.Tensor | None,
    scale: Float32, scale_log2: Float32, window_left: Int32, window_right: Int32, max_seqlen_k: Int32,
    num_splits: Int32, stream,
):
    setup = BwdSetup(
        tiles.smem_layout(DTYPE, TILE_M, TILE_HDIM_QK, STAGES),
        tiles.smem_layout(DTYPE, TILE_M, TILE_HDIM_V, STAGES),
        tiles.smem_layout(DTYPE, TILE_N, TILE_HDIM_QK),
        tiles.smem_layout(DTYPE, TILE_N, TILE_HDIM_V),
        tiles.smem_layout(DTYPE, TILE_M, TILE_N),
        # 64-column slabs whatever the width: one pair of copies serves every tile (tiles.single_mma_setup)
        tiles.gmem_load_copy(DTYPE, TILE_HDIM_QK, NUM_THREADS),
        tiles.gmem_store_copy(DTYPE, TILE_HDIM_QK, NUM_THREADS),
        tiles.tiled_mma(DTYPE, P.num_warps, P.warps_m_sdp),
        tiles.tiled_mma(DTYPE, P.num_warps, P.warps_n_dkv),
        tiles.tiled_mma(DTYPE, P.num_warps, P.warps_m_dq),
    )

    @cute.struct
    class SharedStorage:
        sK: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sK_layout)], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sV_layout)], 1024]
        sQ: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sQ_layout)], 1024]
        sdO: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sdO_layout)], 1024]
        sP: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sPdS_layout)], 1024]
        sdS: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sPdS_layout)], 1024]
        if const_expr(BIAS_STAGED):
            sBias: cute.struct.Align[cute.struct.MemRange[Float32, TILE_M * TILE_N], 1024]

    num_n_blocks, heads_kv, num_batch = launch_extents(mK, mCuSeqlensK, max_seqlen_k, TILE_N, PACKED)
    if const_expr(SLICED):  # grid x holds the slices, which the accumulator's head axis counts (seqlen.py)
        num_n_blocks = accum_slices(mdQaccum, heads_of(mQ, PACKED), PACKED)
    grid = launch_grid(GRID_ORDER, num_n_blocks, heads_kv * num_splits, num_batch)
    # a cluster holds one key block's SPLIT_CLUSTER split CTAs: consecutive on the head axis
    # (head slot = kv head * splits + split), so the rank in the cluster is the split
    cluster = launch_grid(GRID_ORDER, 1, SPLIT_CLUSTER, 1) if const_expr(SPLIT_CLUSTER) else None
    bwd_kernel(
        BwdTensors(mQ, mK, mV, mdO, mLSE2, mD, mdQaccum, mdK, mdV, mBias, mdBias),
        SeqlenTensors(mCuSeqlensQ, mCuSeqlensK, mSeqlensQ, mSeqlensK),
        scale, scale_log2, window_left, window_right, num_splits, setup, SharedStorage,
    ).launch(grid=grid, block=[NUM_THREADS, 1, 1], smem=SharedStorage.size_in_bytes(), stream=stream,
             cluster=cluster)


@cute.kernel
def bwd_kernel(
    tensors: BwdTensors, lengths: SeqlenTensors, scale: Float32, scale_log2: Float32,
    window_left: Int32, window_right: Int32, num_splits: Int32, setup: BwdSetup,
    SharedStorage: cutlass.Constexpr,
):
    mQ, mK, mV, mdO, mLSE2, mD, mdQaccum, mdK, mdV, mBias, mdBias = tensors
    tidx, _, _ = cute.arch.thread_idx()
    n_block, head_slot, batch = grid_coords(GRID_ORDER)
    head_kv = head_slot // num_splits
    split = head_slot % num_splits
    seqlen = SeqlenInfo.create(batch, mQ, mK, lengths)
    group = heads_of(mQ, PACKED) // heads_of(mK, PACKED)
    heads_per_cta = group // num_splits
    first_head = head_kv * group + split * heads_per_cta
    mask = AttentionMask.for_sequence(TILE_M, TILE_N, P, seqlen, window_left, window_right, True)

    storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
    sK = storage.sK.get_tensor(setup.sK_layout)
    sV = storage.sV.get_tensor(setup.sV_layout)
    sQ = storage.sQ.get_tensor(setup.sQ_layout)
    sdO = storage.sdO.get_tensor(setup.sdO_layout)
    step = QueryBlockStep.create(
        tidx, setup, sQ, sdO, sK, sV,
        storage.sP.get_tensor(setup.sPdS_layout), storage.sdS.get_tensor(setup.sPdS_layout),
    )
    loads = QdoLoads.create(tidx, setup, mQ, mdO, sQ, sdO, seqlen, batch)
    sBias, bias_copy = None, None
    if const_expr(BIAS_STAGED):
        # (TILE_M, TILE_N) float32: step i+1's tile is copied once every warp has read step i's
        sBias = storage.sBias.get_tensor(staged_layout(TILE_M, TILE_N))
        bias_copy = BiasTileCopy.create(tidx, sBias, TILE_M, TILE_N, NUM_THREADS)
    stash = None
    if const_expr(SPLIT_CLUSTER):
        # (TILE_N, TILE_HDIM_QK + TILE_HDIM_V + pad) fp32 over the tiles from sK on: dK's columns, then dV's
        width = TILE_HDIM_QK + TILE_HDIM_V + CLUSTER_STASH_PAD
        stash = cute.make_tensor(cute.recast_ptr(storage.sK.data_ptr(), dtype=Float32),
                                 cute.make_layout((TILE_N, width), stride=(width, 1)))
    cta = KeyBlockCta(tensors, setup, tidx, step, loads, sBias, bias_copy, mask, seqlen, batch, head_kv, split,
                      first_head, heads_per_cta, sK, sV, scale, scale_log2, stash)
    if const_expr(SLICED):
        # grid x holds the slices: this CTA takes one key block of each round of ``slices`` blocks,
        # block n_block of the even rounds and slices - 1 - n_block of the odd ones (a zigzag: under
        # a causal mask block n sees query blocks from n on, so each CTA's rounds pair heavy blocks
        # with light ones), and its dQ goes to slice n_block of the accumulator (query heads
        # n_block * H.. of its head axis)
        num_slices = cute.arch.grid_dim()[0]
        num_key_blocks = (seqlen.rows_k + TILE_N - 1) // TILE_N
        slice_head = n_block * heads_of(mQ, PACKED)
        first_round = 0
        if const_expr(P.dq_slice_stores):  # round 0 (block n_block) stores: a copy of the pass of its own
            if n_block < num_key_blocks:
                key_block_pass(cta, n_block, slice_head, True)
                cute.arch.barrier()  # every warp is done with sK, sV and the stages before the next loads
            first_round = 1
        for round_ in cutlass.range(first_round, (num_key_blocks + num_slices - 1) // num_slices, unroll=1):
            key_block = round_ * num_slices + n_block + (round_ % 2) * (num_slices - 1 - 2 * n_block)
            if key_block < num_key_blocks:
                key_block_pass(cta, key_block, slice_head, False)
                cute.arch.barrier()
    else:
        key_block_pass(cta, n_block, 0, False)


class KeyBlockCta(NamedTuple):
    """What a CTA builds once and each of its key blocks uses (``key_block_pass``)."""

    tensors: BwdTensors
    setup: BwdSetup
    tidx: Int32
    step: "QueryBlockStep"
    loads: "QdoLoads"
    sBias: cute.Tensor | None
    bias_copy: BiasTileCopy | None
    mask: AttentionMask
    seqlen: SeqlenInfo
    batch: Int32
    head_kv: Int32
    split: Int32
    first_head: Int32
    heads_per_cta: Int32
    sK: cute.Tensor
    sV: cute.Tensor
    scale: Float32
    scale_log2: Float32
    stash: cute.Tensor | None  # the cluster sum's fp32 dK / dV rows (SPLIT_CLUSTER), else None


@cute.jit
def key_block_pass(cta: KeyBlockCta, n_block, slice_head, first_of_walk: cutlass.Constexpr[bool]):
    """Key block ``n_block``: K, V resident, every step that sees it (module docstring), then dK
    and dV stored. ``slice_head``: where this CTA's dQ slice starts on the accumulator's head axis
    (sliced dQ; 0 otherwise); ``first_of_walk``: the sliced dQ's first key block, which stores
    its dQ with ``dq_slice_stores`` (a copy of the pass of its own: a branch per step spilled)."""
    mQ, mK, mV, mdO, mLSE2, mD, mdQaccum, mdK, mdV, mBias, mdBias = cta.tensors
    setup, tidx, step, loads, seqlen, batch = cta.setup, cta.tidx, cta.step, cta.loads, cta.seqlen, cta.batch
    sBias, bias_copy, mask, sK, sV = cta.sBias, cta.bias_copy, cta.mask, cta.sK, cta.sV
    head_kv, split, first_head, heads_per_cta = cta.head_kv, cta.split, cta.first_head, cta.heads_per_cta
    scale, scale_log2 = cta.scale, cta.scale_log2
    m_block_min, m_block_max = mask.m_block_range(n_block)
    num_m_blocks = cutlass.max(m_block_max - m_block_min, 0)
    acc_dK = cute.make_rmem_tensor(step.acc_shape_dK, Float32)
    acc_dV = cute.make_rmem_tensor(step.acc_shape_dV, Float32)
    acc_dK.fill(0.0)
    acc_dV.fill(0.0)

    # ---- prologue: K, V resident; Q, dO of the first step ---------------------
    load_kv(setup.gmem_tiled_copy_load, tidx, mK, mV, sK, sV, seqlen, batch, head_kv, n_block)
    num_steps = num_m_blocks * heads_per_cta
    if num_steps > 0:
        first_step = step_coords(0, first_head, m_block_min, num_m_blocks)
        loads.issue(*first_step, 0)
        if const_expr(BIAS_STAGED):
            bias_copy.issue(mBias, batch, first_step[0], seqlen, first_step[1], n_block)
    cute.arch.cp_async_commit_group()

    for i in cutlass.range(num_steps, unroll=1):
        head, m_block = step_coords(i, first_head, m_block_min, num_m_blocks)
        stage = i % STAGES
        gLSE2 = cute.local_tile(seqlen.lse_row(mLSE2, batch, head), (TILE_M,), (m_block,))
        gD = cute.local_tile(seqlen.lse_row(mD, batch, head), (TILE_M,), (m_block,))
        row_lse2, row_d = recompute.row_stats(gLSE2, gD, step.tScS_mn, seqlen.seqlen_q - m_block * TILE_M)

        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()  # this step's Q, dO landed; every warp is done with the previous step
        if const_expr(STAGES == 2):
            if i + 1 < num_steps:
                next_head, next_m_block = step_coords(i + 1, first_head, m_block_min, num_m_blocks)
                loads.issue(next_head, next_m_block, 1 - stage)
            cute.arch.cp_async_commit_group()

        bias = None
        if const_expr(HAS_BIAS):
            bias = ScoreBias.create(mBias, batch, head, seqlen, scale_log2, TILE_M, TILE_N, sBias)
        acc_P, acc_dS = recompute.probabilities_and_ds(
            step.score_operands(stage), step.acc_shape_S, mask, m_block, n_block, step.tScS, step.t0ScS,
            row_lse2, row_d, scale_log2, bias,
        )
        if const_expr(HAS_DBIAS):  # dS is dbias of (batch, head): stored, or reduced over broadcast dims
            bias.write_grad(bias_view(mdBias, batch, head), acc_dS, step.tScS, step.t0ScS, m_block, n_block,
                            P.dbias_reduce, P.dbias_reduce_width)
        step.stash_p_ds(acc_P, acc_dS)
        cute.arch.barrier()  # P, dS complete in shared memory
        if const_expr(BIAS_STAGED):  # every warp has read this step's bias tile: the next one's goes there
            if i + 1 < num_steps:
                next_head, next_m_block = step_coords(i + 1, first_head, m_block_min, num_m_blocks)
                bias_copy.issue(mBias, batch, next_head, seqlen, next_m_block, n_block)
            cute.arch.cp_async_commit_group()
        if const_expr(not P.dq_first):
            step.accumulate_dv(acc_dV, stage)
        if const_expr(P.reduces_dq):
            acc_dQ = step.dq_product()
            accum_head = head + slice_head if const_expr(SLICED) else head
            chunk = seqlen.dq_accum_chunk(mdQaccum, batch, accum_head, m_block, TILE_M, TILE_HDIM_QK)
            if const_expr(P.dq_slice_stores and first_of_walk):
                write_dq(acc_dQ, chunk, tidx)
            else:
                reduce_dq(acc_dQ, chunk, tidx)
        if const_expr(P.dq_first):  # the reductions drain under both products
            step.accumulate_dv(acc_dV, stage)
        step.accumulate_dk(acc_dK, stage)
        if const_expr(STAGES == 1):  # the one buffer is free once every warp's dK and dV products read it
            cute.arch.barrier()
            if i + 1 < num_steps:
                next_head, next_m_block = step_coords(i + 1, first_head, m_block_min, num_m_blocks)
                loads.issue(next_head, next_m_block, 0)
            cute.arch.cp_async_commit_group()

    # ---- epilogue ------------------------------------------------------------------
    acc_dK.store(acc_dK.load() * scale)
    written_rows = seqlen.rows_k - n_block * TILE_N
    if const_expr(SPLIT_CLUSTER):
        cute.arch.cp_async_wait_group(0)
        cluster_sum(cta, acc_dK, acc_dV, n_block, written_rows)
    elif const_expr(P.split_group):
        # a pass without steps waited for none of its loads: none may still be landing when the
        # sliced dQ's next pass loads into the same buffers (the unsplit epilogue below waits too)
        cute.arch.cp_async_wait_group(0)
        thr_dkv = setup.tiled_mma_dkv.get_slice(tidx)
        store_partial(thr_dkv, acc_dK, mdK, TILE_HDIM_QK, split, seqlen, batch, head_kv, n_block, written_rows)
        store_partial(thr_dkv, acc_dV, mdV, TILE_HDIM_V, split, seqlen, batch, head_kv, n_block, written_rows)
    else:
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()  # every warp is done with sK / sV (the dQ product reads sK)
        tiles.stash_acc(setup.tiled_mma_dkv, tidx, acc_dK, sK, DTYPE)
        tiles.stash_acc(setup.tiled_mma_dkv, tidx, acc_dV, sV, DTYPE)
        cute.arch.barrier()
        for s_tile, m_out, width, head_dim, check in ((sK, mdK, TILE_HDIM_QK, mQ.shape[-1], CHECK_HDIM_QK),
                                                      (sV, mdV, TILE_HDIM_V, mV.shape[-1], CHECK_HDIM_V)):
            # (TILE_N, width): this CTA's rows of dK or dV
            g_tile = cute.local_tile(seqlen.k_rows(m_out, batch, head_kv), (TILE_N, width), (n_block, 0))
            tiles.store_rows(setup.gmem_tiled_copy_store, tidx, s_tile, g_tile, written_rows, head_dim, check)


@dataclass(frozen=True)
class QueryBlockStep:
    """The MMA partitions and copies of the main loop, built once per CTA.

    Shapes: score tiles (TILE_M, TILE_N) in the sdp MMA; dK (TILE_N, TILE_HDIM_QK)
    and dV (TILE_N, TILE_HDIM_V) in the dkv MMA (operands P^T, dS^T, dO^T, Q^T
    through ldmatrix.trans); dQ (TILE_M, TILE_HDIM_QK) in the dq MMA. Staged
    partitions carry a last STAGES mode.
    """

    tiled_mma_sdp: cute.TiledMma
    tiled_mma_dkv: cute.TiledMma
    tiled_mma_dq: cute.TiledMma
    acc_shape_S: object
    acc_shape_dK: object
    acc_shape_dV: object
    acc_shape_dQ: object
    tScS: cute.Tensor        # this thread's coordinates in the score tile
    t0ScS: cute.Tensor       # thread 0's (compile-time) coordinates
    tScS_mn: cute.Tensor
    tSrQ: cute.Tensor        # S = Q.K^T and dP = dO.V^T: fragments, ldmatrix sources, copies
    tSrK: cute.Tensor
    tdPrdO: cute.Tensor
    tdPrV: cute.Tensor
    tSsQ: cute.Tensor
    tSsK: cute.Tensor
    tdPsdO: cute.Tensor
    tdPsV: cute.Tensor
    copy_A_sdp: object
    copy_B_sdp: object
    tdVrPt: cute.Tensor      # dV = P^T.dO and dK = dS^T.Q
    tdVrdOt: cute.Tensor
    tdKrdSt: cute.Tensor
    tdKrQt: cute.Tensor
    tdVsPt: cute.Tensor
    tdVsdOt: cute.Tensor
    tdKsdSt: cute.Tensor
    tdKsQt: cute.Tensor
    copy_At_dkv: object
    copy_Bt_dkv: object
    tdQrdS: cute.Tensor      # dQ = dS.K
    tdQrKt: cute.Tensor
    tdQsdS: cute.Tensor
    tdQsKt: cute.Tensor
    copy_A_dq: object
    copy_Bt_dq: object
    r2s_PdS: object          # register -> shared copy of P and dS (adjacent column pairs)
    tPsP: cute.Tensor
    tdSsdS: cute.Tensor

    @staticmethod
    def create(tidx, setup: BwdSetup, sQ, sdO, sK, sV, sP, sdS) -> "QueryBlockStep":
        # transposed views: the operands of dV = P^T.dO, dK = dS^T.Q, dQ = dS.K
        sPt = tiles.transpose_view(sP, TILE_M, TILE_N)
        sdSt = tiles.transpose_view(sdS, TILE_M, TILE_N)
        sQt = tiles.transpose_view(sQ, TILE_M, TILE_HDIM_QK, STAGES)   # (TILE_HDIM_QK, TILE_M, STAGES)
        sdOt = tiles.transpose_view(sdO, TILE_M, TILE_HDIM_V, STAGES)  # (TILE_HDIM_V, TILE_M, STAGES)
        sKt = tiles.transpose_view(sK, TILE_N, TILE_HDIM_QK)           # (TILE_HDIM_QK, TILE_N)
        sdp, dkv, dq = setup.tiled_mma_sdp, setup.tiled_mma_dkv, setup.tiled_mma_dq
        thr_sdp, thr_dkv, thr_dq = sdp.get_slice(tidx), dkv.get_slice(tidx), dq.get_slice(tidx)
        ld, ldt = tiles.ldmatrix_atom(DTYPE), tiles.ldmatrix_atom(DTYPE, transpose=True)
        copy_A_sdp = cute.make_tiled_copy_A(ld, sdp).get_slice(tidx)
        copy_B_sdp = cute.make_tiled_copy_B(ld, sdp).get_slice(tidx)
        copy_At_dkv = cute.make_tiled_copy_A(ldt, dkv).get_slice(tidx)
        copy_Bt_dkv = cute.make_tiled_copy_B(ldt, dkv).get_slice(tidx)
        copy_A_dq = cute.make_tiled_copy_A(ld, dq).get_slice(tidx)
        copy_Bt_dq = cute.make_tiled_copy_B(ldt, dq).get_slice(tidx)
        r2s_PdS = cute.make_tiled_copy_C(
            cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), DTYPE, num_bits_per_copy=2 * DTYPE.width), sdp
        ).get_slice(tidx)
        cS = cute.make_identity_tensor((TILE_M, TILE_N))
        tScS = thr_sdp.partition_C(cS)
        return QueryBlockStep(
            tiled_mma_sdp=sdp, tiled_mma_dkv=dkv, tiled_mma_dq=dq,
            acc_shape_S=thr_sdp.partition_shape_C((TILE_M, TILE_N)),
            acc_shape_dK=thr_dkv.partition_shape_C((TILE_N, TILE_HDIM_QK)),
            acc_shape_dV=thr_dkv.partition_shape_C((TILE_N, TILE_HDIM_V)),
            acc_shape_dQ=thr_dq.partition_shape_C((TILE_M, TILE_HDIM_QK)),
            tScS=tScS, t0ScS=sdp.get_slice(0).partition_C(cS), tScS_mn=tiles.acc_mn_view(tScS),
            # fragments are shaped by one stage; the staged partitions are indexed by stage
            tSrQ=thr_sdp.make_fragment_A(thr_sdp.partition_A(sQ[None, None, 0])),
            tSrK=thr_sdp.make_fragment_B(thr_sdp.partition_B(sK)),
            tdPrdO=thr_sdp.make_fragment_A(thr_sdp.partition_A(sdO[None, None, 0])),
            tdPrV=thr_sdp.make_fragment_B(thr_sdp.partition_B(sV)),
            tSsQ=copy_A_sdp.partition_S(sQ), tSsK=copy_B_sdp.partition_S(sK),
            tdPsdO=copy_A_sdp.partition_S(sdO), tdPsV=copy_B_sdp.partition_S(sV),
            copy_A_sdp=copy_A_sdp, copy_B_sdp=copy_B_sdp,
            tdVrPt=thr_dkv.make_fragment_A(thr_dkv.partition_A(sPt)),
            tdVrdOt=thr_dkv.make_fragment_B(thr_dkv.partition_B(sdOt[None, None, 0])),
            tdKrdSt=thr_dkv.make_fragment_A(thr_dkv.partition_A(sdSt)),
            tdKrQt=thr_dkv.make_fragment_B(thr_dkv.partition_B(sQt[None, None, 0])),
            tdVsPt=copy_At_dkv.partition_S(sPt), tdVsdOt=copy_Bt_dkv.partition_S(sdOt),
            tdKsdSt=copy_At_dkv.partition_S(sdSt), tdKsQt=copy_Bt_dkv.partition_S(sQt),
            copy_At_dkv=copy_At_dkv, copy_Bt_dkv=copy_Bt_dkv,
            tdQrdS=thr_dq.make_fragment_A(thr_dq.partition_A(sdS)),
            tdQrKt=thr_dq.make_fragment_B(thr_dq.partition_B(sKt)),
            tdQsdS=copy_A_dq.partition_S(sdS), tdQsKt=copy_Bt_dq.partition_S(sKt),
            copy_A_dq=copy_A_dq, copy_Bt_dq=copy_Bt_dq,
            r2s_PdS=r2s_PdS, tPsP=r2s_PdS.partition_D(sP), tdSsdS=r2s_PdS.partition_D(sdS),
        )

    def score_operands(self, stage) -> recompute.ScoreOperands:
        return recompute.ScoreOperands(
            self.tiled_mma_sdp, self.tSrQ, self.tSrK, self.tSsQ[None, None, None, stage], self.tSsK,
            self.tdPrdO, self.tdPrV, self.tdPsdO[None, None, None, stage], self.tdPsV,
            self.copy_A_sdp, self.copy_B_sdp,
        )

    @cute.jit
    def stash_p_ds(self, acc_P: cute.Tensor, acc_dS: cute.Tensor):
        """P and dS, rounded to the io dtype, into shared memory (the operands of the next products)."""
        rP = cute.make_fragment_like(acc_P, DTYPE)
        rP.store(acc_P.load().to(DTYPE))
        rdS = cute.make_fragment_like(acc_dS, DTYPE)
        rdS.store(acc_dS.load().to(DTYPE))
        cute.copy(self.r2s_PdS, self.r2s_PdS.retile(rP), self.tPsP)
        cute.copy(self.r2s_PdS, self.r2s_PdS.retile(rdS), self.tdSsdS)

    @cute.jit
    def accumulate_dv(self, acc_dV: cute.Tensor, stage):
        tiles.gemm_ss(self.tiled_mma_dkv, acc_dV, self.tdVrPt, self.tdVrdOt, self.tdVsPt,
                      self.tdVsdOt[None, None, None, stage], self.copy_At_dkv, self.copy_Bt_dkv)

    @cute.jit
    def accumulate_dk(self, acc_dK: cute.Tensor, stage):
        tiles.gemm_ss(self.tiled_mma_dkv, acc_dK, self.tdKrdSt, self.tdKrQt, self.tdKsdSt,
                      self.tdKsQt[None, None, None, stage], self.copy_At_dkv, self.copy_Bt_dkv)

    @cute.jit
    def dq_product(self) -> cute.Tensor:
        """dQ = dS.K of this step, unscaled (sm80/bwd_convert scales), in the dq MMA's fragment."""
        acc_dQ = cute.make_rmem_tensor(self.acc_shape_dQ, Float32)
        acc_dQ.fill(0.0)
        tiles.gemm_ss(self.tiled_mma_dq, acc_dQ, self.tdQrdS, self.tdQrKt, self.tdQsdS, self.tdQsKt,
                      self.copy_A_dq, self.copy_Bt_dq)
        return acc_dQ


@cute.jit
def reduce_dq(acc_dQ: cute.Tensor, g_chunk: cute.Tensor, tidx):
    """Reduce a dQ fragment into its query block's chunk of the flat accumulator, in fragment
    order (module docstring): a warp's reductions cover whole 128-byte lines."""
    for j in cutlass.range_constexpr(cute.size(acc_dQ) // DQ_WIDTH):
        target = dq_accum_slice(g_chunk, j, tidx, NUM_THREADS, DQ_WIDTH)
        if const_expr(DQ_WIDTH == 1):
            cute.arch.atomic_add(target, acc_dQ[j])
        else:
            values = cute.make_tensor(acc_dQ.iterator + DQ_WIDTH * j, cute.make_layout(DQ_WIDTH)).load()
            cute.arch.atomic_add(target, values)


@cute.jit
def write_dq(acc_dQ: cute.Tensor, g_chunk: cute.Tensor, tidx):
    """Store a dQ fragment where ``reduce_dq`` would reduce it: the sliced dQ's first values of a
    chunk (``dq_slice_stores``); whole lines per warp, vectors of ``DQ_WIDTH`` floats."""
    for j in cutlass.range_constexpr(TILE_M * TILE_HDIM_QK // (NUM_THREADS * DQ_WIDTH)):
        # the run starts at a multiple of DQ_WIDTH floats of a 256-byte aligned slab: say so, for one vector store
        start = dq_accum_slice(g_chunk, j, tidx, NUM_THREADS, DQ_WIDTH)
        target = cute.make_tensor(
            cute.make_ptr(Float32, start.toint(), cute.AddressSpace.gmem, assumed_align=4 * DQ_WIDTH),
            cute.make_layout(DQ_WIDTH),
        )
        target.store(cute.make_tensor(acc_dQ.iterator + DQ_WIDTH * j, cute.make_layout(DQ_WIDTH)).load())


def step_coords(i, first_head, m_block_min, num_m_blocks):
    """The (query head, query block) of step ``i``: the CTA's heads one after another, each
    walking its query blocks ascending."""
    return first_head + i // num_m_blocks, m_block_min + i % num_m_blocks


@dataclass(frozen=True)
class QdoLoads:
    """cp.async loads of one step's Q and dO tiles into a stage buffer (rows past the
    sequence zero-filled, columns past the head dim zeroed once in ``create``)."""

    gmem_tiled_copy: cute.TiledCopy
    gmem_thr_copy: object
    mQ: cute.Tensor
    mdO: cute.Tensor
    tQsQ: cute.Tensor        # (CPY, CPY_M, CPY_K, STAGES)
    tQsdO: cute.Tensor
    tQcQ: cute.Tensor        # (CPY, CPY_M, CPY_K) coordinates: rows (of Q and dO alike) and Q's columns
    tQpQ: cute.Tensor        # head-dim predicates of Q and dO
    tQpdO: cute.Tensor
    seqlen: SeqlenInfo
    batch: Int32

    @staticmethod
    def create(tidx, setup: BwdSetup, mQ, mdO, sQ, sdO, seqlen: SeqlenInfo, batch) -> "QdoLoads":
        thr = setup.gmem_tiled_copy_load.get_slice(tidx)
        # (CPY, CPY_M, CPY_K) copy coordinates of the (TILE_M, TILE_HDIM_QK) Q and (TILE_M, TILE_HDIM_V) dO tiles
        tQcQ = thr.partition_S(cute.make_identity_tensor((TILE_M, TILE_HDIM_QK)))
        tdOcdO = thr.partition_S(cute.make_identity_tensor((TILE_M, TILE_HDIM_V)))
        loads = QdoLoads(
            setup.gmem_tiled_copy_load, thr, mQ, mdO, thr.partition_D(sQ), thr.partition_D(sdO), tQcQ,
            tiles.hdim_predicate(tQcQ, mQ.shape[-1]), tiles.hdim_predicate(tdOcdO, mdO.shape[-1]), seqlen, batch,
        )
        for stage in range(STAGES):  # plain Python: create() is traced inline, not preprocessed
            if const_expr(CHECK_HDIM_QK):
                tiles.zero_unpredicated(loads.tQsQ[None, None, None, stage], loads.tQpQ)
            if const_expr(CHECK_HDIM_V):
                tiles.zero_unpredicated(loads.tQsdO[None, None, None, stage], loads.tQpdO)
        return loads

    @cute.jit
    def issue(self, head, m_block, stage):
        rows_left = self.seqlen.seqlen_q - m_block * TILE_M
        for m_src, t_dst, pred, width in ((self.mQ, self.tQsQ, self.tQpQ, TILE_HDIM_QK),
                                          (self.mdO, self.tQsdO, self.tQpdO, TILE_HDIM_V)):
            g = cute.local_tile(self.seqlen.q_rows(m_src, self.batch, head), (TILE_M, width), (m_block, 0))
            tiles.load_rows(self.gmem_tiled_copy, self.gmem_thr_copy.partition_S(g),
                            t_dst[None, None, None, stage], self.tQcQ, pred, rows_left)


@cute.jit
def load_kv(gmem_tiled_copy, tidx, mK, mV, sK, sV, seqlen: SeqlenInfo, batch, head_kv, n_block):
    """The CTA's resident K and V tiles (rows past the sequence and columns past the head
    dim zero-filled, so padded keys give P = 0 and finite products)."""
    thr = gmem_tiled_copy.get_slice(tidx)
    keys_left = seqlen.seqlen_k - n_block * TILE_N
    for m_src, s_dst, width, check in ((mK, sK, TILE_HDIM_QK, CHECK_HDIM_QK), (mV, sV, TILE_HDIM_V, CHECK_HDIM_V)):
        # (CPY, CPY_N, CPY_K): copy coordinates of the (TILE_N, width) tile
        tXcX = thr.partition_S(cute.make_identity_tensor((TILE_N, width)))
        pred = tiles.hdim_predicate(tXcX, m_src.shape[-1])
        t_dst = thr.partition_D(s_dst)
        if const_expr(check):
            tiles.zero_unpredicated(t_dst, pred)
        g = cute.local_tile(seqlen.k_rows(m_src, batch, head_kv), (TILE_N, width), (n_block, 0))
        tiles.load_rows(gmem_tiled_copy, thr.partition_S(g), t_dst, tXcX, pred, keys_left)


CLUSTER_VEC = 8  # fp32 columns a thread sums per row visit: two 16-byte loads per split, one 16-byte store


@cute.jit
def cluster_sum(cta: KeyBlockCta, acc_dK: cute.Tensor, acc_dV: cute.Tensor, n_block, written_rows):
    """dK and dV of key block ``n_block`` summed over the cluster's splits (SPLIT_CLUSTER): each CTA
    stashes its fp32 fragments in its own shared memory; after the cluster barrier, CTA ``split``
    adds rows [split, split + 1) * TILE_N / SPLIT_CLUSTER of every CTA's stash in split order from
    0.0 (bwd_combine's order, so the same bits), rounds and stores them, rows [0, written_rows)
    of the block. The second barrier keeps every stash whole until the last CTA has read it."""
    tidx, stash = cta.tidx, cta.stash
    cute.arch.barrier()  # every warp is done with the tiles the stash overwrites
    thr_dkv = cta.setup.tiled_mma_dkv.get_slice(tidx)
    for acc, first, width in ((acc_dK, 0, TILE_HDIM_QK), (acc_dV, TILE_HDIM_QK, TILE_HDIM_V)):
        # (frag): this thread's dK or dV fragment's places in the stash's columns [first, first + width)
        t_stash = thr_dkv.partition_C(cute.local_tile(cute.domain_offset((0, first), stash), (TILE_N, width), (0, 0)))
        for i in cutlass.range_constexpr(cute.size(acc)):
            t_stash[i] = acc[i]
    cute.arch.cluster_arrive()  # release: the stash is written
    cute.arch.cluster_wait()    # acquire: so are the other CTAs'
    rows = TILE_N // SPLIT_CLUSTER
    for m_out, first, width, head_dim in ((cta.tensors.dk, 0, TILE_HDIM_QK, cta.tensors.q.shape[-1]),
                                          (cta.tensors.dv, TILE_HDIM_QK, TILE_HDIM_V, cta.tensors.v.shape[-1])):
        per_row = width // CLUSTER_VEC
        # (TILE_N, width): this CTA's rows of dk or dv
        g_tile = cute.local_tile(cta.seqlen.k_rows(m_out, cta.batch, cta.head_kv), (TILE_N, width), (n_block, 0))
        for visit in cutlass.range_constexpr((rows * per_row + NUM_THREADS - 1) // NUM_THREADS):
            index = visit * NUM_THREADS + tidx
            row = cta.split * rows + index // per_row
            column = first + (index % per_row) * CLUSTER_VEC
            if index < rows * per_row and row < written_rows and column - first < head_dim:
                # (CLUSTER_VEC,): the splits' fp32 columns, summed in split order
                acc = cute.make_rmem_tensor((CLUSTER_VEC,), Float32)
                acc.fill(0.0)
                local = stash.iterator + cute.crd2idx((row, column), stash.layout)
                for rank in cutlass.range_constexpr(SPLIT_CLUSTER):
                    # (CLUSTER_VEC,): CTA ``rank``'s stash there, through the generic window
                    remote = cute.make_tensor(cute.make_ptr(Float32, peer_address(local, rank), cute.AddressSpace.generic,
                                                            assumed_align=32), cute.make_layout(CLUSTER_VEC))
                    acc.store(acc.load() + remote.load())
                g_row = g_tile[row, None]
                cute.local_tile(g_row, (CLUSTER_VEC,), ((column - first) // CLUSTER_VEC,)).store(
                    acc.load().to(g_row.element_type))
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()


def peer_address(ptr: cute.Pointer, rank) -> Int64:
    """The generic address of shared-memory ``ptr``'s place in cluster CTA ``rank`` (``mapa``):
    plain loads from it read that CTA's shared memory."""
    mapped = nvvm.mapa(llvm.PointerType.get(7), ptr.to_llvm_ptr(), Int32(rank).ir_value())  # shared::cluster
    generic = llvm.addrspacecast(llvm.PointerType.get(0), mapped)
    return Int64(llvm.ptrtoint(ir.IntegerType.get_signless(64), generic))


@cute.jit
def store_partial(thr_dkv, acc: cute.Tensor, mPart: cute.Tensor, width: cutlass.Constexpr[int], split,
                  seqlen: SeqlenInfo, batch, head_kv, n_block, written_rows):
    """This split's fp32 dK or dV partial: rows [0, written_rows) of the block, every column of the
    (TILE_N, width) tile."""
    if const_expr(PACKED):
        m_rows = seqlen.k_rows(mPart[split, None, None, None], batch, head_kv)
    else:
        m_rows = seqlen.k_rows(mPart[split, None, None, None, None], batch, head_kv)
    g_tile = cute.local_tile(m_rows, (TILE_N, width), (n_block, 0))
    tg = thr_dkv.partition_C(g_tile)
    tc = thr_dkv.partition_C(cute.make_identity_tensor((TILE_N, width)))
    for i in cutlass.range_constexpr(cute.size(acc)):
        if tc[i][0] < written_rows:
            tg[i] = acc[i]
