"""Compile-time identity of the SM80 kernels: TemplateParams records and their validators.

A params record is the only channel of configuration into a template. It is
frozen and hashable, it is the compile key (together with the template name),
and ``validate()`` raises ValueError naming the rule a combination breaks, so
that an engine whose Capabilities row admitted a problem never reaches a
template that cannot compile it (a ValueError here after check_support passed
is a bug in the row).

Flavors: the head-dim tiles of Q/K (``tile_hdim_qk``, the S = Q.K^T, dQ = dS.K
and dK = dS^T.Q products) and of V/O/dO (``tile_hdim_v``, the O = P.V, dP =
dO.V^T and dV = P^T.dO products). ``d64``, ``d128``, ``d192`` and ``d256`` use
one tile for both, ``d192x128`` 192 for Q/K and 128 for V. A problem runs on the
cheapest flavor that covers both of its head dims (``flavor_for``); head dims
below a tile, each a multiple of 8, have their extra columns predicated off.
Every tile is a multiple of 64, the column slab of the shared-memory swizzle
atom and of the global copies (``tiles.py``).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

DTYPES = ("float16", "bfloat16")
FLAVORS = {  # name -> (tile_hdim_qk, tile_hdim_v)
    "d64": (64, 64), "d128": (128, 128), "d192x128": (192, 128), "d192": (192, 192), "d256": (256, 256),
}
LAYOUTS = ("bshd", "thd")
HEAD_DIM_MULTIPLE = 8  # one 16-byte cp.async vector of fp16/bf16
SMEM_BYTES_MAX = 227 * 1024  # opt-in shared memory per CTA on SM80/SM90


class _Tiles:
    """What every record derives from its ``flavor`` and ``num_warps`` fields."""

    @property
    def tile_hdim_qk(self) -> int:
        """Head-dim tile of Q, K, dQ, dK (the contraction of S = Q.K^T)."""
        return FLAVORS[self.flavor][0]

    @property
    def tile_hdim_v(self) -> int:
        """Head-dim tile of V, O, dO, dV (the contraction of dP = dO.V^T)."""
        return FLAVORS[self.flavor][1]

    @property
    def num_threads(self) -> int:
        return 32 * self.num_warps


def _checker(record):
    """The ``bad(rule)`` of a record's ``validate`` (a ValueError naming the record), after the
    checks every record shares: known dtype, flavor and layout."""
    def bad(rule: str):
        raise ValueError(f"{type(record).__name__} {record}: {rule}")

    if record.dtype not in DTYPES or record.flavor not in FLAVORS or record.layout not in LAYOUTS:
        bad("dtype, flavor and layout must be known values")
    return bad


def flavor_for(head_dim_qk: int, head_dim_v: int) -> str | None:
    """The flavor with the narrowest tiles (least padded work) covering both head dims, or None:
    e.g. 192/128 and 160/96 run on ``d192x128``, 128/192 on ``d192``, 232/64 on ``d256``."""
    covering = [(qk + v, name) for name, (qk, v) in FLAVORS.items() if head_dim_qk <= qk and head_dim_v <= v]
    return min(covering)[1] if covering else None


@dataclasses.dataclass(frozen=True)
class FwdParams(_Tiles):
    """Everything that changes the generated code of ``sm80/fwd``.

    Head dims are runtime extents; only whether they fill the flavor's tile is
    static (a partial one adds column predicates and zero fill).
    """

    dtype: str              # "float16" | "bfloat16"
    flavor: str             # a key of FLAVORS: the head-dim tiles of Q/K and of V
    partial_hdim_qk: bool   # head_dim_qk < tile_hdim_qk: columns past it are predicated off
    partial_hdim_v: bool    # head_dim_v < tile_hdim_v
    tile_m: int             # query rows per CTA
    tile_n: int             # key rows per main-loop step
    num_warps: int          # warps per CTA, all along M
    layout: str             # "bshd" (dense, any strides) | "thd" (packed with cu_seqlens)
    has_seqlens: bool       # dense padding: seqlens_q / seqlens_k tensors
    has_window_left: bool   # a finite left window (runtime value)
    has_window_right: bool  # a finite right window (runtime value; causal is right == 0)
    bottom_right: bool      # align query i with key i + Sk_b - Sq_b
    has_sinks: bool         # per-head sink logit in the softmax denominator
    heavy_first: bool = False  # launch query blocks longest-first across the whole grid
    bias_dtype: str | None = None  # an additive bias ("float32" or the io dtype) read per score; None: none

    def smem_bytes(self) -> int:
        return 2 * (self.tile_hdim_qk * (self.tile_m + self.tile_n) + self.tile_hdim_v * self.tile_n)

    def validate(self) -> "FwdParams":
        def bad(rule: str):
            raise ValueError(f"FwdParams {self}: {rule}")

        if self.dtype not in DTYPES:
            bad(f"dtype must be one of {DTYPES}")
        if self.flavor not in FLAVORS:
            bad(f"flavor must be one of {tuple(FLAVORS)}")
        if self.layout not in LAYOUTS:
            bad(f"layout must be one of {LAYOUTS}")
        if self.layout == "thd" and self.has_seqlens:
            bad("padding seqlens apply to the dense layout only")
        if self.bottom_right and not (self.has_window_left or self.has_window_right):
            bad("bottom_right alignment needs a window or causal mask")
        if self.num_warps not in (4, 8):
            bad("num_warps must be 4 or 8")
        if self.tile_m <= 0 or self.tile_m % (16 * self.num_warps):
            bad("tile_m must be a positive multiple of 16 * num_warps")
        if self.tile_n <= 0 or self.tile_n % 16:
            bad("tile_n must be a positive multiple of 16")
        # the gmem copy moves 64-column slabs in 16-byte vectors: whole slabs of rows per step
        rows_per_copy_step = self.num_threads * 8 // 64
        if self.tile_m % rows_per_copy_step or self.tile_n % rows_per_copy_step:
            bad(f"tile_m and tile_n must be multiples of {rows_per_copy_step} (rows per gmem copy step)")
        if self.smem_bytes() > SMEM_BYTES_MAX:
            bad(f"shared memory {self.smem_bytes()} B exceeds {SMEM_BYTES_MAX} B")
        if self.tile_hdim_v > self.tile_hdim_qk:
            bad("tile_hdim_v must not exceed tile_hdim_qk (the epilogue stages O in Q's shared memory)")
        _check_bias_dtype(self, bad)
        return self


def _check_bias_dtype(record, bad) -> None:
    """A bias is float32 or the record's io dtype, or absent (None)."""
    if record.bias_dtype not in (None, "float32", record.dtype):
        bad(f"bias_dtype must be None, 'float32' or the io dtype {record.dtype!r}")


def fwd_params_for(
    *, dtype: str, head_dim_qk: int, head_dim_v: int, layout: str, has_seqlens: bool,
    window_left: int, window_right: int, bottom_right: bool, has_sinks: bool, bias_dtype: str | None = None,
) -> FwdParams:
    """Lower a forward problem's facts to the params the engine compiles (the tile policy).

    Tiles, measured on the H200 (bf16, 16k tokens, hidden 2048, TFLOP/s, 2026-12-02):
    - d64 non-causal: 128x128 (S=1k: 317; 128x64 gives 311);
    - d64 causal: 128x64 (S=1k: 230 against 169 for 128x128; S=4k: equal);
    - d128: 128x64; causal launches heaviest query blocks first (S=1k: 275 against 268).
    The wider flavors (``FWD_TILES``) are not measured yet: ``bench_sdpa.py --hdims --variants``
    times them against the alternatives.
    """
    flavor = flavor_for(head_dim_qk, head_dim_v)
    if flavor is None:
        raise ValueError(f"no flavor covers head dims {head_dim_qk}/{head_dim_v}")
    tile_qk, tile_v = FLAVORS[flavor]
    masked_right = window_right >= 0
    tile_m, tile_n, num_warps = FWD_TILES[flavor]
    if flavor == "d64" and (masked_right or bias_dtype is not None):
        tile_n = 64  # with a bias too: a 128x128 tile's bias loads spilled most of the registers
    return FwdParams(
        dtype=dtype, flavor=flavor, partial_hdim_qk=head_dim_qk < tile_qk, partial_hdim_v=head_dim_v < tile_v,
        tile_m=tile_m, tile_n=tile_n, num_warps=num_warps, layout=layout, has_seqlens=has_seqlens,
        has_window_left=window_left >= 0, has_window_right=masked_right,
        bottom_right=bottom_right and (window_left >= 0 or masked_right), has_sinks=has_sinks,
        heavy_first=flavor != "d64" and masked_right, bias_dtype=bias_dtype,
    ).validate()


# flavor -> the forward's (tile_m, tile_n, num_warps); d64 takes tile_n 64 under a right window.
# Each warp owns 16-row slabs of the query tile, so its accumulator of O holds 16 x tile_hdim_v
# fp32 per slab: a 256-wide O needs 8 warps for 128 rows (or 4 for 64). The wide flavors follow
# FlashAttention-2's SM80 choices (flash_fwd_launch_template.h, 2024): d192 and d192x128 128x64
# with 8 warps (96 / 88 KB shared memory, one CTA of 256 threads at 206-253 registers per SM); d256 64x64
# with 4 warps (96 KB: two CTAs per SM, FA2's pick for 228 KB-per-SM Hopper parts; its A100 pick
# is 128x64 with 8 warps, 128 KB).
FWD_TILES = {
    "d64": (128, 128, 4), "d128": (128, 64, 4), "d192x128": (128, 64, 8), "d192": (128, 64, 8), "d256": (64, 64, 4),
}


@dataclasses.dataclass(frozen=True)
class BwdPreParams(_Tiles):
    """``sm80/bwd_pre``: D = rowsum(dO * O), lse in log2 units, per-block dsink partials, and
    (``accum_tile_m`` > 0) the zeroing of the default mode's flat dQ accumulator."""

    dtype: str
    flavor: str             # tile_hdim_v: O and dO; tile_hdim_qk: the dQ accumulator's chunks
    partial_hdim_v: bool
    layout: str
    has_seqlens: bool
    has_sinks: bool
    tile_m: int = 64
    num_warps: int = 4
    accum_tile_m: int = 0   # the main kernel's tile_m whose dQ accumulator chunks this pass zeroes; 0: none
    # the accumulator holds slices (BwdParams.dq_slices, a runtime count): zero every one of them
    dq_slices: bool = False

    @classmethod
    def of(cls, main: "BwdParams", has_sinks: bool) -> "BwdPreParams":
        """The pass before ``main``: it zeroes the accumulator unless the main kernel writes it
        whole (``dq_slice_stores``), in whole chunks of ``main``'s query tile (its own tile no
        larger: 32 rows under a 32-row main tile)."""
        zeroes = main.reduces_dq and not main.dq_slice_stores
        return cls(dtype=main.dtype, flavor=main.flavor, partial_hdim_v=main.partial_hdim_v, layout=main.layout,
                   has_seqlens=main.has_seqlens, has_sinks=has_sinks, tile_m=min(cls.tile_m, main.tile_m) if zeroes
                   else cls.tile_m, accum_tile_m=main.tile_m if zeroes else 0, dq_slices=main.dq_slices and zeroes)

    def num_m_blocks(self, seqlen_q: int) -> int:
        """The grid's query-block extent: whole accumulator chunks when it zeroes them."""
        if self.accum_tile_m:
            return -(-seqlen_q // self.accum_tile_m) * (self.accum_tile_m // self.tile_m)
        return -(-seqlen_q // self.tile_m)

    def validate(self) -> "BwdPreParams":
        bad = _checker(self)
        if self.layout == "thd" and self.has_seqlens:
            bad("padding seqlens apply to the dense layout only")
        rows_per_step = self.num_threads * 8 // 64
        if self.tile_m % rows_per_step:
            bad(f"tile_m must be a multiple of {rows_per_step} (rows per copy step)")
        if self.accum_tile_m < 0 or self.accum_tile_m % self.tile_m:
            bad("accum_tile_m must be 0 or a multiple of tile_m")
        if self.dq_slices and not self.accum_tile_m:
            bad("dq_slices zeroes an accumulator's slices: it needs accum_tile_m")
        return self


DQ_REDUCE_WIDTHS = (1, 2, 4)  # floats per dQ reduction; 2 and 4 (red.global.add.v2/v4.f32) need SM90
# BwdParams.split_cluster: none, or clusters of 2 CTAs. 4 and 8 (portable sizes too) were measured
# and dropped: at one CTA per SM their main kernels took twice as long (H100, docs/DECISIONS.md,
# "Backward: cluster sum of a 2-way split")
SPLIT_CLUSTERS = (0, 2)
# fp32 elements past each row of the cluster sum's stash: a row of 8 (mod 32) words puts the 4
# rows of a half warp's fragment stores on distinct banks
CLUSTER_STASH_PAD = 8


@dataclasses.dataclass(frozen=True)
class BwdParams(_Tiles):
    """Everything that changes the generated code of ``sm80/bwd`` (dK, dV and dQ by reductions
    into a flat fp32 accumulator; deterministic, into slices of it, ``dq_slices``, or not at all)
    and of ``sm80/bwd_dq`` (the deterministic dQ recompute, which reads the same record).

    The MMA warp layouts follow FlashAttention-2's SM80 backward: S and dP tile
    ``(tile_m, tile_n)`` with ``warps_m_sdp`` warps along M; dK and dV tile
    ``(tile_n, hdim)`` with ``warps_n_dkv`` warps along N; dQ tiles
    ``(tile_m, hdim)`` with ``warps_m_dq`` warps along M.
    """

    dtype: str
    flavor: str
    partial_hdim_qk: bool
    partial_hdim_v: bool
    tile_m: int             # query rows per inner step
    tile_n: int             # key rows a CTA owns (K, V resident)
    num_warps: int
    warps_m_sdp: int
    warps_n_dkv: int
    warps_m_dq: int
    layout: str
    has_seqlens: bool
    has_window_left: bool
    has_window_right: bool
    bottom_right: bool
    deterministic: bool     # dQ in slices (dq_slices), or no dQ reductions: sm80/bwd_dq computes it per query block
    # floats per dQ reduction into the flat accumulator: 1 (red.global.add.f32, SM80) or 2 / 4
    # (red.global.add.v2 / v4.f32: fewer, wider reductions, but SM90 only, so the kernel compiles
    # for sm_90; compile.target_arch)
    dq_reduce_width: int = 1
    # the query heads of a GQA group are split over CTAs (a runtime count): dK and dV go to fp32
    # partials in the workspace, summed in split order afterwards (deterministic)
    split_group: bool = False
    heavy_first: bool = False  # key blocks launched across the whole grid heaviest (lowest) first
    # the dQ product and its reductions come first in a step, before the dV product, so that both
    # the dK and the dV products run while the reductions drain
    dq_first: bool = False
    bias_dtype: str | None = None   # an additive bias read by the recompute of P; None: none
    # where dS goes as dbias: stored per element in this dtype (the bias's own without broadcast;
    # float32 per-(batch, head) partials for a broadcast bias in deterministic mode), or with
    # ``dbias_reduce`` reduced (red.global.add.f32) into a float32 accumulator shaped like the bias;
    # None: no bias, or one whose gradient is not wanted (``bias_grad=False``)
    dbias_dtype: str | None = None
    dbias_reduce: bool = False
    # floats per dbias reduction: 1 (red.global.add.f32) or 2 (a thread's two adjacent columns
    # in one red.global.add.v2.f32: SM90, and the accumulator's rows 8-byte aligned)
    dbias_reduce_width: int = 1
    # the sequence is the grid's fastest index, then the key block, then the head: the CTAs of
    # one (key block, head) over all sequences run together, so a bias broadcast over the
    # batch is read, and its dbias reduced, while its tile is in L2 (launched with the key
    # block fastest, they are a whole batch of CTAs apart)
    batch_inner: bool = False
    # a float32 bias tile is copied into shared memory by cp.async a step ahead (sm80/bias.py,
    # BiasTileCopy) instead of read from global memory where the scores need it
    bias_staged: bool = False
    # deterministic mode: the grid's x holds dQ slices, and CTA x walks one key
    # block of each round of ``slices`` (a zigzag), reducing dQ into slice x of the accumulator,
    # which no other CTA touches; bwd_convert sums the slices in order (sm80/bwd.py, "Sliced dQ");
    # the slice count is runtime
    dq_slices: bool = False
    # the sliced dQ writes its slices whole: the CTA's first key block stores its dQ (without a
    # left window every later key block of the walk sees only query blocks the first one saw)
    # and zeros go where its walk sees no query block, so bwd_pre zeroes no slice
    dq_slice_stores: bool = False
    # a split group's CTAs of one key block run as a cluster of this many (the split count; 0:
    # none), which sum dK and dV in split order through distributed shared memory and write dk
    # and dv themselves: no fp32 partials, no bwd_combine (sm80/bwd.py, "Cluster sum"; SM90)
    split_cluster: int = 0
    # Q and dO buffers: 2 (the next step's tiles load while this one computes) or 1 (they load
    # after it: the shared memory of one stage less, for parts whose tiles do not fit otherwise)
    qdo_stages: int = 2

    @property
    def reduces_dq(self) -> bool:
        """Whether the main kernel reduces dQ into the flat accumulator (else sm80/bwd_dq computes it)."""
        return not self.deterministic or self.dq_slices

    @property
    def dq_chunk(self) -> int:
        """fp32 elements of one query block's chunk of the flat dQ accumulator."""
        return self.tile_m * self.tile_hdim_qk

    def cluster_stash_bytes(self) -> int:
        """The shared memory the cluster sum stashes fp32 dK and dV in (``split_cluster``): the
        kernel's tiles again, from the first (sK), which no pass reads by then."""
        return 4 * self.tile_n * (self.tile_hdim_qk + self.tile_hdim_v + CLUSTER_STASH_PAD)

    def cluster_fits(self, size: int) -> bool:
        """Whether a split group's CTAs of a key block can sum dK and dV as a cluster of ``size``
        (``split_cluster``): whole rows per CTA, and the fp32 stash within the kernel's shared tiles."""
        return self.tile_n % size == 0 and self.cluster_stash_bytes() <= self.smem_bytes()

    def smem_bytes(self) -> int:
        tiles = _bwd_tiles_smem(self.tile_m, self.tile_n, self.qdo_stages, self.tile_hdim_qk + self.tile_hdim_v)
        return tiles + (4 * self.tile_m * self.tile_n if self.bias_staged else 0)

    def validate(self) -> "BwdParams":
        bad = _checker(self)
        if self.layout == "thd" and self.has_seqlens:
            bad("padding seqlens apply to the dense layout only")
        if self.bottom_right and not (self.has_window_left or self.has_window_right):
            bad("bottom_right alignment needs a window or causal mask")
        w = self.num_warps
        for name, warps, extent, other in (
            ("warps_m_sdp", self.warps_m_sdp, self.tile_m, self.tile_n),
            ("warps_n_dkv", self.warps_n_dkv, self.tile_n, self.tile_hdim_qk),  # dK
            ("warps_n_dkv", self.warps_n_dkv, self.tile_n, self.tile_hdim_v),   # dV
            ("warps_m_dq", self.warps_m_dq, self.tile_m, self.tile_hdim_qk),
        ):
            if w % warps or extent % (16 * warps) or other % (16 * (w // warps)):
                bad(f"{name}={warps} does not tile {extent}x{other} with {w} warps in 16x16 steps")
        rows_per_step = self.num_threads * 8 // 64
        if self.tile_m % rows_per_step or self.tile_n % rows_per_step:
            bad(f"tile_m and tile_n must be multiples of {rows_per_step} (rows per copy step)")
        if self.tile_n % 32:
            bad("tile_n must be a multiple of 32 (the swizzle atom of the P and dS tiles)")
        if self.qdo_stages not in (1, 2):
            bad("qdo_stages must be 1 or 2")
        if self.dq_reduce_width not in DQ_REDUCE_WIDTHS:
            bad(f"dq_reduce_width must be one of {DQ_REDUCE_WIDTHS}")
        if self.dq_reduce_width > 1 and not self.reduces_dq:
            bad("the deterministic mode reduces dQ in the main kernel only in slices")
        if self.dq_slices and not self.deterministic:
            bad("dq_slices is a way of the deterministic mode")
        if self.dq_slices and (self.heavy_first or self.batch_inner):
            bad("dq_slices launches slices on the grid's x: no heavy_first or batch_inner")
        if self.dq_slice_stores and (not self.dq_slices or self.has_window_left):
            bad("dq_slice_stores writes the sliced dQ's slices whole (dq_slices), which a left window breaks")
        if self.dq_first and not self.reduces_dq:
            bad("dq_first orders the main kernel's dQ reductions: it needs them (reduces_dq)")
        if self.dq_chunk % (self.num_threads * self.dq_reduce_width):
            bad("the dQ chunk must split evenly into the threads' reductions")
        if self.smem_bytes() > SMEM_BYTES_MAX:
            bad(f"shared memory {self.smem_bytes()} B exceeds {SMEM_BYTES_MAX} B")
        _check_bias_dtype(self, bad)
        if self.dbias_dtype is not None and self.bias_dtype is None:
            bad("dbias_dtype needs a bias (bias_dtype)")
        if self.dbias_dtype not in (None, "float32", self.bias_dtype):
            bad("dbias_dtype must be the bias's dtype (stored as is) or float32 (partials, accumulator)")
        if self.dbias_reduce and (self.deterministic or self.dbias_dtype != "float32"):
            bad("dbias_reduce adds float atomics into a float32 accumulator: not in deterministic mode")
        if self.dbias_reduce_width not in (1, 2) or (self.dbias_reduce_width > 1 and not self.dbias_reduce):
            bad("dbias_reduce_width is 1, or 2 with dbias_reduce")
        if self.bias_staged and self.bias_dtype != "float32":
            bad("bias_staged copies float32 elements (4-byte cp.async): a float32 bias only")
        if self.batch_inner and self.heavy_first:
            bad("batch_inner is a launch order of its own: not with heavy_first")
        if self.split_cluster not in SPLIT_CLUSTERS or (self.split_cluster and not self.split_group):
            bad(f"split_cluster is one of {SPLIT_CLUSTERS[1:]} with split_group, 0 without")
        if self.split_cluster and not self.cluster_fits(self.split_cluster):
            bad("split_cluster needs tile_n rows per CTA and its fp32 dK / dV stash within the shared tiles")
        return self

    @property
    def target_arch(self) -> str:
        """The oldest architecture the generated code runs on."""
        wide = self.dq_reduce_width > 1 or self.dbias_reduce_width > 1
        return "sm_90" if wide or self.split_cluster else "sm_80"


def bwd_params_for(
    *, dtype: str, head_dim_qk: int, head_dim_v: int, layout: str, has_seqlens: bool,
    window_left: int, window_right: int, bottom_right: bool, deterministic: bool, dq_reduce_width: int = 1,
    split_group: bool = False, dq_slices: bool = False, bias_dtype: str | None = None,
    bias_broadcast: bool = False, bias_grad: bool = True, smem_limit: int = SMEM_BYTES_MAX,
) -> BwdParams:
    """Lower a backward problem to the main kernel's params, with the largest tiles of ``BWD_TILES``
    that fit ``smem_limit`` bytes of shared memory per block (the device's). ``dq_reduce_width``,
    ``split_group`` and, deterministic, ``dq_slices`` (else the bwd_dq recompute) are the engine's
    choices per device and per problem size (frost/engines/sm80.py); the sliced dQ writes its
    slices whole (``dq_slice_stores``) wherever no left window forbids it. ``bias_broadcast``: the
    bias has size 1 where the problem has several batches or heads, so dbias sums over them
    (sm80/bias.py says how); ``bias_grad`` False: no dbias is made.

    d64 issues the dQ product first (``dq_first``) with the sliced dQ and with 4-float
    reductions, the ways whose reductions it pays to start early. Measured on the H200
    (docs/DECISIONS.md, "Backward: 4-float dQ reductions and the dQ product first for d64"):
    default mode, 4 floats and dQ first +2-3% on d64 (neither alone gained; d128 1-4% slower)."""
    flavor = flavor_for(head_dim_qk, head_dim_v)
    if flavor is None:
        raise ValueError(f"no flavor covers head dims {head_dim_qk}/{head_dim_v}")
    sliced = deterministic and dq_slices
    dq_reduce_width = dq_reduce_width if not deterministic or sliced else 1
    tile_qk, tile_v = FLAVORS[flavor]
    tile = bwd_tile_for(flavor, smem_limit)
    if tile is None:
        raise ValueError(f"no backward tile of {flavor} fits {smem_limit} B of shared memory per block")
    return BwdParams(
        dtype=dtype, flavor=flavor, partial_hdim_qk=head_dim_qk < tile_qk, partial_hdim_v=head_dim_v < tile_v,
        **tile._asdict(), layout=layout, has_seqlens=has_seqlens, has_window_left=window_left >= 0,
        has_window_right=window_right >= 0,
        bottom_right=bottom_right and (window_left >= 0 or window_right >= 0), deterministic=deterministic,
        dq_reduce_width=dq_reduce_width, split_group=split_group,
        dq_slices=sliced, dq_slice_stores=sliced and window_left < 0,
        dq_first=flavor == "d64" and (sliced or (not deterministic and dq_reduce_width == 4)),
        **dbias_fields(bias_dtype, bias_broadcast, deterministic, bias_grad),
    ).validate()


def dbias_fields(bias_dtype: str | None, broadcast: bool, deterministic: bool, grad: bool = True) -> dict:
    """BwdParams' bias fields (sm80/bias.py): without broadcast dS is dbias, stored once per
    element in the bias's dtype; broadcast, float32 partials per (batch, head) summed in a fixed
    order afterwards (deterministic) or reductions into a float32 accumulator; no dbias at all
    when its gradient is not wanted."""
    if bias_dtype is None:
        return {}
    if not grad:
        return dict(bias_dtype=bias_dtype)
    if not broadcast:
        return dict(bias_dtype=bias_dtype, dbias_dtype=bias_dtype)
    return dict(bias_dtype=bias_dtype, dbias_dtype="float32", dbias_reduce=not deterministic)


class BwdTile(NamedTuple):
    """The main backward kernel's tiles and warps (BwdParams' fields of the same names)."""

    tile_m: int
    tile_n: int
    num_warps: int
    warps_m_sdp: int
    warps_n_dkv: int
    warps_m_dq: int
    qdo_stages: int

    def smem_bytes(self, flavor: str) -> int:
        """Shared memory of the main kernel with these tiles (no staged bias)."""
        return _bwd_tiles_smem(self.tile_m, self.tile_n, self.qdo_stages, sum(FLAVORS[flavor]))


def _bwd_tiles_smem(tile_m: int, tile_n: int, qdo_stages: int, widths: int) -> int:
    """Bytes of the main backward kernel's io-dtype tiles: K and V (``widths`` = their head-dim
    tiles together), Q and dO a tile per stage each, P and dS."""
    return 2 * (tile_n * widths + qdo_stages * tile_m * widths + 2 * tile_m * tile_n)


# flavor -> the main backward kernel's tiles, largest first: a device takes the first whose shared
# memory fits its opt-in limit per block (``bwd_tile_for``; a staged bias tile goes on top only
# where it fits too). The first of each is FlashAttention-2's SM80 choice for parts of 144 KiB
# and more (flash_bwd_launch_template.h): d64 128x128, d128 64x128, above 128 64x64 with S/dP split
# 4 x 2 and dK/dV, dQ 2 x 4 warps, Q and dO double-buffered (160 KiB for d64, d128, d192;
# d192x128 136 KiB; d256 208 KiB, Hopper only). The others fit smaller parts, each the largest
# tile of least spill that fits: A100 / A30 (163 KiB) take d256 64x64 with single-buffered Q and
# dO (144 KiB, FA2's A100 choice too); the 8.6 / 8.9 parts (99 KiB) d64 64x128 (96 KiB), d128
# 64x64 single-buffered (80 KiB), d192x128 64x64 single-buffered (96 KiB), d192 32x64
# single-buffered (80 KiB) and d256 32x32 with 4 warps single-buffered (68 KiB; 64x32 takes 104).
# Per thread the 8-warp wide tiles hold dK and dV (tile_n x tile_hdim / 256 fp32 each) across the
# loop and a dQ product at a time; sm_80 SASS of the small ones: 214-255 registers, no stack.
BWD_TILES = {
    "d64": (BwdTile(128, 128, 8, 2, 4, 4, 2), BwdTile(64, 128, 8, 2, 4, 2, 2)),
    "d128": (BwdTile(64, 128, 8, 2, 4, 2, 2), BwdTile(64, 64, 8, 2, 4, 4, 1)),
    "d192x128": (BwdTile(64, 64, 8, 4, 2, 2, 2), BwdTile(64, 64, 8, 4, 2, 2, 1)),
    "d192": (BwdTile(64, 64, 8, 4, 2, 2, 2), BwdTile(32, 64, 8, 2, 4, 2, 1)),
    "d256": (BwdTile(64, 64, 8, 4, 2, 2, 2), BwdTile(64, 64, 8, 4, 2, 2, 1), BwdTile(32, 32, 4, 2, 2, 2, 1)),
}


def bwd_tile_for(flavor: str, smem_limit: int) -> BwdTile | None:
    """The backward main kernel's tiles for a device allowing ``smem_limit`` bytes per block, or
    None when none fits (``BWD_TILES``)."""
    return next((tile for tile in BWD_TILES[flavor] if tile.smem_bytes(flavor) <= smem_limit), None)


@dataclasses.dataclass(frozen=True)
class BwdConvertParams(_Tiles):
    """``sm80/bwd_convert``: the default mode's flat fp32 dQ accumulator -> dq (io dtype),
    scaled, through shared memory to 128-bit stores. Reads the accumulator in the main
    kernel's dQ MMA fragment order, so it shares that kernel's tile, warps and reduce width."""

    dtype: str
    flavor: str
    partial_hdim_qk: bool
    layout: str
    tile_m: int
    num_warps: int
    warps_m_dq: int
    dq_reduce_width: int
    dq_slices: bool = False  # sum the accumulator's slices in order (BwdParams.dq_slices)
    # the main kernel wrote the slices whole (BwdParams.dq_slice_stores) but for the chunks a
    # slice's walk never reaches, which hold no values: the sum skips them, by the main's mask
    # (its key tile and mask fields below, default values otherwise)
    dq_slice_stores: bool = False
    tile_n: int = 0
    has_seqlens: bool = False
    has_window_right: bool = False
    bottom_right: bool = False
    has_window_left = False  # not a field: a left window rules out dq_slice_stores (AttentionMask reads it)

    @classmethod
    def of(cls, bwd: "BwdParams") -> "BwdConvertParams":
        masked = dict(dq_slice_stores=True, tile_n=bwd.tile_n, has_seqlens=bwd.has_seqlens,
                      has_window_right=bwd.has_window_right, bottom_right=bwd.bottom_right)
        return cls(dtype=bwd.dtype, flavor=bwd.flavor, partial_hdim_qk=bwd.partial_hdim_qk, layout=bwd.layout,
                   tile_m=bwd.tile_m, num_warps=bwd.num_warps, warps_m_dq=bwd.warps_m_dq,
                   dq_reduce_width=bwd.dq_reduce_width, dq_slices=bwd.dq_slices,
                   **(masked if bwd.dq_slice_stores else {}))

    def validate(self) -> "BwdConvertParams":
        bad = _checker(self)
        if self.dq_reduce_width not in DQ_REDUCE_WIDTHS:
            bad(f"dq_reduce_width must be one of {DQ_REDUCE_WIDTHS}")
        if (self.tile_m * self.tile_hdim_qk) % (self.num_threads * self.dq_reduce_width):
            bad("the dQ chunk must split evenly into the threads' reductions")
        if self.dq_slice_stores and not (self.dq_slices and self.tile_n > 0):
            bad("dq_slice_stores reads slices (dq_slices) by the main kernel's mask, which needs its tile_n")
        return self


@dataclasses.dataclass(frozen=True)
class BwdCombineParams(_Tiles):
    """``sm80/bwd_combine``: a split GQA group's fp32 dK / dV partials -> dk, dv (io dtype),
    summed in split order. The split count and the head dims are runtime values; the flavor
    gives the partials' widths."""

    dtype: str
    flavor: str
    layout: str

    @classmethod
    def of(cls, bwd: "BwdParams") -> "BwdCombineParams":
        return cls(dtype=bwd.dtype, flavor=bwd.flavor, layout=bwd.layout)

    def validate(self) -> "BwdCombineParams":
        _checker(self)
        return self


@dataclasses.dataclass(frozen=True)
class BwdDqParams(_Tiles):
    """``sm80/bwd_dq``: dQ of the deterministic backward, one CTA per query block.

    Same facts as BwdParams' masks and layouts; its own tiles (warps along M,
    like the forward), because here dS stays in registers as the A operand of
    dS.K and no atomics are needed.
    """

    dtype: str
    flavor: str
    partial_hdim_qk: bool
    partial_hdim_v: bool
    layout: str
    has_seqlens: bool
    has_window_left: bool
    has_window_right: bool
    bottom_right: bool
    tile_m: int = 64
    tile_n: int = 64
    num_warps: int = 4
    bias_dtype: str | None = None  # the additive bias the recompute of P reads

    @classmethod
    def of(cls, bwd: "BwdParams", smem_limit: int = SMEM_BYTES_MAX) -> "BwdDqParams":
        """The pass after ``bwd``: key tiles of 128 rows for d64, 64 above, halved down to 32
        while they exceed ``smem_limit`` (the device's; d256 on a 99 KiB part takes 32)."""
        record = cls(
            dtype=bwd.dtype, flavor=bwd.flavor, partial_hdim_qk=bwd.partial_hdim_qk,
            partial_hdim_v=bwd.partial_hdim_v, layout=bwd.layout, has_seqlens=bwd.has_seqlens,
            has_window_left=bwd.has_window_left, has_window_right=bwd.has_window_right,
            bottom_right=bwd.bottom_right, tile_n=128 if bwd.flavor == "d64" else 64, bias_dtype=bwd.bias_dtype,
        )
        while record.smem_bytes() > smem_limit and record.tile_n > 32:
            record = dataclasses.replace(record, tile_n=record.tile_n // 2)
        return record

    def smem_bytes(self) -> int:
        return 2 * (self.tile_m + self.tile_n) * (self.tile_hdim_qk + self.tile_hdim_v)  # Q, dO; K, V

    def validate(self) -> "BwdDqParams":
        bad = _checker(self)
        if self.tile_m != 16 * self.num_warps:
            bad("tile_m must be 16 * num_warps (one 16-row slab per warp)")
        rows_per_step = self.num_threads * 8 // 64
        if self.tile_m % rows_per_step or self.tile_n % rows_per_step or self.tile_n % 16:
            bad(f"tile_m and tile_n must be multiples of {rows_per_step} and 16")
        if self.smem_bytes() > SMEM_BYTES_MAX:
            bad(f"shared memory {self.smem_bytes()} B exceeds {SMEM_BYTES_MAX} B")
        _check_bias_dtype(self, bad)
        return self
