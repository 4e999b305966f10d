"""SM80 attention forward: FlashAttention-2 style, one CTA per (query tile, head, sequence).

Specialized by ``PARAMS`` (a ``config.FwdParams``, injected by
``frost.kernels.template.load_template``); every feature flag is read through
``const_expr`` so a feature that is off generates no code.

Tiles (``PARAMS``): a CTA owns ``tile_m`` query rows of one head of one
sequence; K and V stream through shared memory ``tile_n`` rows at a time;
head dims are padded to the flavor's tiles with predicated columns, Q and K
to ``tile_hdim_qk`` (the contraction of S = Q.K^T), V and O to
``tile_hdim_v`` (the columns of O = P.V). ``num_warps`` warps are stacked
along M, each owning 16-row slabs, so a softmax row never crosses a warp.

Pipeline (one K buffer, one V buffer, cp.async, two barriers per key block):

    prologue: Q -> sQ, K[n_max-1] -> sK
    for key block n = n_max-1 down to n_min:
        wait K[n]; barrier            (sV free again: last P.V finished)
        issue V[n] -> sV              (overlaps the Q.K^T below)
        S = Q.K^T                     (ldmatrix double-buffered per k-slice)
        S += bias                     (with a bias: read from global, S in log2 units, bias.py)
        mask S                        (only blocks that need it: see mask.py)
        wait V[n]; barrier            (sK free again)
        issue K[n-1] -> sK            (overlaps softmax and P.V)
        online softmax on S; P = bf16/fp16(S) in registers
        O += P.V
    epilogue: normalize O, O -> sQ (reused) -> global; lse -> global

Key blocks are visited from the highest down so the only block that can run
past the sequence end (and needs row predicates and zero fill) is the first.
Blocks outside the visible band of the whole query tile are never visited
(causal, windows, padding); blocks inside it take the unmasked path.
With ``heavy_first`` (the tile policy sets it for every flavor but d64 under a
right window),
CTAs are launched heaviest (last query tile) first across the whole grid,
which evens out its tail.

Layouts: dense q/k/v/o are (B, S, H, D) with any strides but a unit last
one; packed ones are (T, H, D) with cu_seqlens (B+1); lse is (B, H, S) or
(H, T); a bias is (B|1, H|1, Sq, Sk), any strides, unit last. All extents and strides are dynamic, so one artifact serves every
batch size, sequence length, head count, head dim within the flavor, number
of packed sequences and packed token total; only the params record (dtype,
flavor, whether head dims fill it, tiles, features) is static.

Not measured: a two-stage K/V pipeline (twice the K/V shared memory) and Q
held in registers. The forward runs at 1.06-1.57x FlashAttention-2 on the
H200 over the 18 benchmark shapes (benchmarks/RESULTS.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

from frost.kernels.sm80 import tiles
from frost.kernels.sm80.bias import ScoreBias
from frost.kernels.sm80.mask import AttentionMask
from frost.kernels.sm80.grid import grid_coords, grid_order, launch_extents, launch_grid
from frost.kernels.sm80.seqlen import SeqlenInfo, SeqlenTensors, heads_of
from frost.kernels.sm80.softmax import OnlineSoftmax

P = PARAMS  # noqa: F821  (injected by the template loader)
DTYPE = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}[P.dtype]
TILE_M, TILE_N = P.tile_m, P.tile_n
TILE_HDIM_QK, TILE_HDIM_V = P.tile_hdim_qk, P.tile_hdim_v
NUM_THREADS = P.num_threads
CHECK_HDIM_QK = P.partial_hdim_qk  # columns past head_dim_qk are predicated off and zeroed
CHECK_HDIM_V = P.partial_hdim_v
PACKED = P.layout == "thd"
HAS_BIAS = P.bias_dtype is not None
GRID_ORDER = grid_order(P.heavy_first)


class FwdTensors(NamedTuple):
    """The kernel's global tensors (sinks None without sinks, bias None without a bias)."""

    q: cute.Tensor
    k: cute.Tensor
    v: cute.Tensor
    o: cute.Tensor
    lse: cute.Tensor
    sinks: cute.Tensor | None
    bias: cute.Tensor | None


@cute.jit
def sdpa_fwd(
    mQ: cute.Tensor,
    mK: cute.Tensor,
    mV: cute.Tensor,
    mO: cute.Tensor,
    mLSE: cute.Tensor,
    mCuSeqlensQ: cute.Tensor | None,
    mCuSeqlensK: cute.Tensor | None,
    mSeqlensQ: cute.Tensor | None,
    mSeqlensK: cute.Tensor | None,
    mSinks: cute.Tensor | None,
    mBias: cute.Tensor | None,
    scale_log2: Float32,
    window_left: Int32,
    window_right: Int32,
    max_seqlen_q: Int32,
    stream,
):
    """Host side: build layouts and copies, size the grid, launch."""
    setup = tiles.single_mma_setup(DTYPE, TILE_M, TILE_N, TILE_HDIM_QK, TILE_HDIM_V, NUM_THREADS, P.num_warps)

    @cute.struct
    class SharedStorage:
        sQ: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sQ_layout)], 1024]  # O in the epilogue
        sK: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sK_layout)], 1024]
        sV: cute.struct.Align[cute.struct.MemRange[DTYPE, cute.cosize(setup.sV_layout)], 1024]

    num_m_blocks, num_heads, num_batch = launch_extents(mQ, mCuSeqlensQ, max_seqlen_q, TILE_M, PACKED)

    fwd_kernel(
        FwdTensors(mQ, mK, mV, mO, mLSE, mSinks, mBias),
        SeqlenTensors(mCuSeqlensQ, mCuSeqlensK, mSeqlensQ, mSeqlensK),
        scale_log2, window_left, window_right, setup, SharedStorage,
    ).launch(
        grid=launch_grid(GRID_ORDER, num_m_blocks, num_heads, num_batch),
        block=[NUM_THREADS, 1, 1],
        smem=SharedStorage.size_in_bytes(),
        stream=stream,
    )


@cute.kernel
def fwd_kernel(
    tensors: FwdTensors,
    lengths: SeqlenTensors,
    scale_log2: Float32,
    window_left: Int32,
    window_right: Int32,
    setup: tiles.SingleMmaSetup,
    SharedStorage: cutlass.Constexpr,
):
    mQ, mK, mV, mO, mLSE, mSinks, mBias = tensors
    sQ_layout, sK_layout, sV_layout, sO_layout, gmem_tiled_copy_load, gmem_tiled_copy_store, tiled_mma = setup
    tidx, _, _ = cute.arch.thread_idx()
    # heavy-first: query blocks from the last (most keys under a causal mask) to the first
    m_block, head, batch = grid_coords(GRID_ORDER, reverse_blocks=P.heavy_first)

    seqlen = SeqlenInfo.create(batch, mQ, mK, lengths)
    head_kv = head // (heads_of(mQ, PACKED) // heads_of(mK, PACKED))
    mask = AttentionMask.for_sequence(TILE_M, TILE_N, P, seqlen, window_left, window_right, False)
    n_block_min, n_block_max = mask.n_block_range(m_block)
    # with a bias the scores enter the softmax in log2 units already (bias.py): its scale is 1
    bias = ScoreBias.create(mBias, batch, head, seqlen, scale_log2, TILE_M, TILE_N) if const_expr(HAS_BIAS) else None
    softmax_scale_log2 = 1.0 if const_expr(HAS_BIAS) else scale_log2

    # ---- tiles of this CTA -------------------------------------------------
    # (TILE_M, TILE_HDIM_QK)
    gQ = cute.local_tile(seqlen.q_rows(mQ, batch, head), (TILE_M, TILE_HDIM_QK), (m_block, 0))
    # (TILE_N, TILE_HDIM_QK, n_blocks)
    gK = cute.local_tile(seqlen.k_rows(mK, batch, head_kv), (TILE_N, TILE_HDIM_QK), (None, 0))
    # (TILE_N, TILE_HDIM_V, n_blocks)
    gV = cute.local_tile(seqlen.k_rows(mV, batch, head_kv), (TILE_N, TILE_HDIM_V), (None, 0))

    storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
    sQ = storage.sQ.get_tensor(sQ_layout)
    sK = storage.sK.get_tensor(sK_layout)
    sV = storage.sV.get_tensor(sV_layout)
    sVt = tiles.transpose_view(sV, TILE_N, TILE_HDIM_V)  # (TILE_HDIM_V, TILE_N): V as the B operand of P.V

    # ---- global -> shared copies -------------------------------------------
    gmem_thr_copy = gmem_tiled_copy_load.get_slice(tidx)
    tQgQ = gmem_thr_copy.partition_S(gQ)   # (CPY, CPY_M, CPY_K)
    tQsQ = gmem_thr_copy.partition_D(sQ)
    tKgK = gmem_thr_copy.partition_S(gK)   # (CPY, CPY_N, CPY_K, n_blocks)
    tKsK = gmem_thr_copy.partition_D(sK)
    tVgV = gmem_thr_copy.partition_S(gV)
    tVsV = gmem_thr_copy.partition_D(sV)
    # (CPY, CPY_M, CPY_K) coordinates of the copies: rows for the sequence tail, columns for the
    # head-dim predicates (K and V rows are partitioned alike, so K's row coordinates serve V's)
    tQcQ = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_M, TILE_HDIM_QK)))
    tKcK = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_N, TILE_HDIM_QK)))
    tVcV = gmem_thr_copy.partition_S(cute.make_identity_tensor((TILE_N, TILE_HDIM_V)))
    head_dim_qk, head_dim_v = mQ.shape[-1], mV.shape[-1]
    tQpQ = tiles.hdim_predicate(tQcQ, head_dim_qk)
    tKpK = tiles.hdim_predicate(tKcK, head_dim_qk)
    tVpV = tiles.hdim_predicate(tVcV, head_dim_v)

    # ---- MMA partitions and shared -> register copies ----------------------
    thr_mma = tiled_mma.get_slice(tidx)
    acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((TILE_M, TILE_HDIM_V)), Float32)
    acc_O.fill(0.0)
    copy_Q = cute.make_tiled_copy_A(tiles.ldmatrix_atom(DTYPE), tiled_mma).get_slice(tidx)
    copy_K = cute.make_tiled_copy_B(tiles.ldmatrix_atom(DTYPE), tiled_mma).get_slice(tidx)
    copy_Vt = cute.make_tiled_copy_B(tiles.ldmatrix_atom(DTYPE, transpose=True), tiled_mma).get_slice(tidx)
    # score-tile coordinates for masking: this thread's and thread 0's (compile-time)
    cS = cute.make_identity_tensor((TILE_M, TILE_N))
    step = KeyBlockStep(
        tiled_mma=tiled_mma,
        acc_shape_S=thr_mma.partition_shape_C((TILE_M, TILE_N)),
        tScS=thr_mma.partition_C(cS),
        t0ScS=tiled_mma.get_slice(0).partition_C(cS),
        tSrQ=thr_mma.make_fragment_A(thr_mma.partition_A(sQ)),
        tSrK=thr_mma.make_fragment_B(thr_mma.partition_B(sK)),
        tOrVt=thr_mma.make_fragment_B(thr_mma.partition_B(sVt)),
        tSsQ=copy_Q.partition_S(sQ),
        tSsK=copy_K.partition_S(sK),
        tOsVt=copy_Vt.partition_S(sVt),
        copy_Q=copy_Q,
        copy_K=copy_K,
        copy_Vt=copy_Vt,
        gmem_tiled_copy=gmem_tiled_copy_load,
        tKgK=tKgK, tKsK=tKsK, tVgV=tVgV, tVsV=tVsV, tKcK=tKcK, tKpK=tKpK, tVpV=tVpV,
    )

    # ---- prologue -----------------------------------------------------------
    # Columns past the head dim are never written by a copy: zero them once so
    # they add nothing to Q.K^T (and keep padded V columns finite).
    if const_expr(CHECK_HDIM_QK):
        tiles.zero_unpredicated(tQsQ, tQpQ)
        tiles.zero_unpredicated(tKsK, tKpK)
    if const_expr(CHECK_HDIM_V):
        tiles.zero_unpredicated(tVsV, tVpV)
    # Query rows past the sequence are zero-filled so their (discarded) scores stay finite.
    tiles.load_rows(gmem_tiled_copy_load, tQgQ, tQsQ, tQcQ, tQpQ, seqlen.seqlen_q - m_block * TILE_M)
    if n_block_max > n_block_min:
        n_top = n_block_max - 1
        tiles.load_rows(gmem_tiled_copy_load, tKgK[None, None, None, n_top], tKsK, tKcK, tKpK,
                        seqlen.seqlen_k - n_top * TILE_N)
    cute.arch.cp_async_commit_group()

    softmax = OnlineSoftmax.create(softmax_scale_log2, cute.size(acc_O, mode=[0, 0]) * cute.size(acc_O, mode=[1]))

    # ---- main loop over key blocks, highest first ---------------------------
    # Two instantiations of one step: the masked one (band edges, the sequence
    # tail) and the unmasked bulk, chosen per block at run time.
    for i in cutlass.range(n_block_max - n_block_min, unroll=1):
        n_block = n_block_max - 1 - i
        if mask.needs_mask(m_block, n_block):
            step.run(n_block, n_block_min, m_block, seqlen.seqlen_k, mask, bias, softmax, acc_O, masked=True)
        else:
            step.run(n_block, n_block_min, m_block, seqlen.seqlen_k, mask, bias, softmax, acc_O, masked=False)

    # ---- epilogue ------------------------------------------------------------
    write_o_lse(tidx, acc_O, softmax, mSinks, mO, mLSE, sQ, sO_layout, tiled_mma, gmem_tiled_copy_store,
                seqlen, batch, head, m_block, head_dim_v)


@cute.jit
def write_o_lse(tidx, acc_O: cute.Tensor, softmax: OnlineSoftmax, mSinks, mO: cute.Tensor, mLSE: cute.Tensor,
                sQ: cute.Tensor, sO_layout, tiled_mma, gmem_tiled_copy_store, seqlen: SeqlenInfo, batch, head,
                m_block, head_dim_v):
    """Normalize O, write it through shared memory (sQ reused: TILE_HDIM_V <= TILE_HDIM_QK) to global,
    and write lse."""
    thr_mma = tiled_mma.get_slice(tidx)
    o_scale = cute.make_fragment_like(softmax.row_max, Float32)
    lse = cute.make_fragment_like(softmax.row_max, Float32)
    sink = mSinks[head] if const_expr(P.has_sinks) else None
    softmax.finalize(o_scale, lse, sink, P.has_sinks)

    # Rows past the valid length but inside the written range (dense padding) get o = 0, lse = -inf.
    cO = cute.make_identity_tensor((TILE_M, TILE_HDIM_V))
    tOcO_mn = tiles.acc_mn_view(thr_mma.partition_C(cO))
    acc_O_mn = tiles.acc_mn_view(acc_O)
    valid_rows = seqlen.seqlen_q - m_block * TILE_M
    for r in cutlass.range_constexpr(cute.size(o_scale)):
        padded = tOcO_mn[r, 0][0] >= valid_rows
        acc_O_mn[r, None].store(acc_O_mn[r, None].load() * o_scale[r])
        if padded:
            acc_O_mn[r, None].fill(0.0)
            lse[r] = -Float32.inf

    rO = cute.make_fragment_like(acc_O, DTYPE)
    rO.store(acc_O.load().to(DTYPE))
    # Before sQ is reused for O: the Q copy must have landed (a CTA with no key block never
    # waited for it) and every warp must be done reading sQ.
    cute.arch.cp_async_wait_group(0)
    cute.arch.barrier()
    sO = cute.make_tensor(sQ.iterator, sO_layout)
    smem_tiled_copy_O = cute.make_tiled_copy_C(cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), DTYPE), tiled_mma)
    smem_thr_copy_O = smem_tiled_copy_O.get_slice(tidx)
    cute.copy(smem_thr_copy_O, smem_thr_copy_O.retile(rO), smem_thr_copy_O.partition_D(sO))

    # lse: the quad's column-0 thread writes its rows
    written_rows = seqlen.rows_q - m_block * TILE_M
    gLSE = cute.local_tile(seqlen.lse_row(mLSE, batch, head), (TILE_M,), (m_block,))
    if tOcO_mn[0, 0][1] == 0:
        for r in cutlass.range_constexpr(cute.size(lse)):
            row = tOcO_mn[r, 0][0]
            if row < written_rows:
                gLSE[row] = lse[r]

    cute.arch.barrier()  # sO complete
    gO = cute.local_tile(seqlen.q_rows(mO, batch, head), (TILE_M, TILE_HDIM_V), (m_block, 0))
    tiles.store_rows(gmem_tiled_copy_store, tidx, sO, gO, written_rows, head_dim_v, CHECK_HDIM_V)




@dataclass(frozen=True)
class KeyBlockStep:
    """The partitions, fragments and copies of the main loop, built once per CTA.

    ``run`` does one key block: S = Q.K^T, bias (when the record has one),
    mask (when ``masked``), online softmax, O += P.V, with the cp.async pipeline of the module docstring.
    ``masked`` blocks may also be the block that runs past Sk_b, so their V
    load checks rows and zero-fills (P = 0 times an unwritten NaN would be NaN).
    """

    tiled_mma: cute.TiledMma
    acc_shape_S: object
    tScS: cute.Tensor       # this thread's coordinates in the (TILE_M, TILE_N) score tile
    t0ScS: cute.Tensor      # thread 0's (compile-time) coordinates
    tSrQ: cute.Tensor       # register fragments of the MMA operands
    tSrK: cute.Tensor
    tOrVt: cute.Tensor
    tSsQ: cute.Tensor       # their shared-memory sources, partitioned for ldmatrix
    tSsK: cute.Tensor
    tOsVt: cute.Tensor
    copy_Q: object          # ldmatrix thread copies
    copy_K: object
    copy_Vt: object
    gmem_tiled_copy: cute.TiledCopy
    tKgK: cute.Tensor       # (CPY, CPY_N, CPY_K, n_blocks) global K / V, and their shared tiles
    tKsK: cute.Tensor
    tVgV: cute.Tensor
    tVsV: cute.Tensor
    tKcK: cute.Tensor       # copy coordinates (rows of K and V alike) and head-dim predicates
    tKpK: cute.Tensor
    tVpV: cute.Tensor

    @cute.jit
    def run(self, n_block: Int32, n_block_min: Int32, m_block: Int32, seqlen_k: Int32, mask: AttentionMask,
            bias: ScoreBias | None, softmax: OnlineSoftmax, acc_O: cute.Tensor, masked: cutlass.Constexpr[bool]):
        acc_S = cute.make_rmem_tensor(self.acc_shape_S, Float32)
        acc_S.fill(0.0)
        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()  # K[n] landed; every warp is done with sV
        if const_expr(masked):
            tiles.load_rows(self.gmem_tiled_copy, self.tVgV[None, None, None, n_block], self.tVsV, self.tKcK,
                            self.tVpV, seqlen_k - n_block * TILE_N)
        else:
            tiles.copy_block(self.gmem_tiled_copy, self.tVgV[None, None, None, n_block], self.tVsV, self.tVpV,
                             CHECK_HDIM_V)
        cute.arch.cp_async_commit_group()

        tiles.gemm_ss(self.tiled_mma, acc_S, self.tSrQ, self.tSrK, self.tSsQ, self.tSsK, self.copy_Q, self.copy_K)
        if const_expr(HAS_BIAS):  # before the mask: a masked position's bias is never read into a score
            bias.to_log2_scores(acc_S, self.tScS, self.t0ScS, m_block, n_block, check_cols=masked)
        if const_expr(masked):
            mask.apply(acc_S, self.tScS, self.t0ScS, m_block, n_block)

        cute.arch.cp_async_wait_group(0)
        cute.arch.barrier()  # V[n] landed; every warp is done with sK
        if n_block - 1 >= n_block_min:
            tiles.copy_block(self.gmem_tiled_copy, self.tKgK[None, None, None, n_block - 1], self.tKsK, self.tKpK,
                             CHECK_HDIM_QK)
        cute.arch.cp_async_commit_group()

        softmax.step(acc_S, acc_O)
        rP = cute.make_fragment_like(acc_S, DTYPE)
        rP.store(acc_S.load().to(DTYPE))
        tiles.gemm_rs(self.tiled_mma, acc_O, tiles.acc_as_operand_a(rP), self.tOrVt, self.tOsVt, self.copy_Vt)
