"""Compile-time identity of the SM80 kernels: TemplateParams records and their validators.

A params record is the only channel of configuration into a template. It is
frozen and hashable, it is the compile key (together with the template name),
and ``validate()`` raises ValueError naming the rule a combination breaks, so
that an engine whose Capabilities row admitted a problem never reaches a
template that cannot compile it (a ValueError here after check_support passed
is a bug in the row).

Flavors: the head-dim tile both Q/K and V use. ``d64`` serves head dims up to
64, ``d128`` up to 128, each a multiple of 8; a smaller head dim runs on the
covering flavor with its extra columns predicated off.
"""
from __future__ import annotations

import dataclasses

DTYPES = ("float16", "bfloat16")
FLAVORS = {"d64": 64, "d128": 128}
LAYOUTS = ("bshd", "thd")
HEAD_DIM_MULTIPLE = 8  # one 16-byte cp.async vector of fp16/bf16
SMEM_BYTES_MAX = 227 * 1024  # opt-in shared memory per CTA on SM80/SM90


class _Tiles:
    """What every record derives from its ``flavor`` and ``num_warps`` fields."""

    @property
    def tile_hdim(self) -> int:
        return FLAVORS[self.flavor]

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
    """The smallest flavor covering both head dims, or None."""
    need = max(head_dim_qk, head_dim_v)
    for name, width in sorted(FLAVORS.items(), key=lambda kv: kv[1]):
        if need <= width:
            return name
    return None


@dataclasses.dataclass(frozen=True)
class FwdParams(_Tiles):
    """Everything that changes the generated code of ``sm80/fwd``.

    Head dims are runtime extents; only whether they fill the flavor's tile is
    static (a partial one adds column predicates and zero fill).
    """

    dtype: str              # "float16" | "bfloat16"
    flavor: str             # "d64" | "d128": the head-dim tile of Q/K and of V
    partial_hdim_qk: bool   # head_dim_qk < tile: columns past it are predicated off
    partial_hdim_v: bool    # head_dim_v < tile
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

    def smem_bytes(self) -> int:
        return 2 * self.tile_hdim * (self.tile_m + 2 * self.tile_n)

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
        return self


def fwd_params_for(
    *, dtype: str, head_dim_qk: int, head_dim_v: int, layout: str, has_seqlens: bool,
    window_left: int, window_right: int, bottom_right: bool, has_sinks: bool,
) -> FwdParams:
    """Lower a forward problem's facts to the params the engine compiles (the tile policy).

    Tiles, measured on the H200 (bf16, 16k tokens, hidden 2048, TFLOP/s, 2026-12-02):
    - d64 non-causal: 128x128 (S=1k: 317; 128x64 gives 311);
    - d64 causal: 128x64 (S=1k: 230 against 169 for 128x128; S=4k: equal);
    - d128: 128x64; causal launches heaviest query blocks first (S=1k: 275 against 268).
    """
    flavor = flavor_for(head_dim_qk, head_dim_v)
    if flavor is None:
        raise ValueError(f"no flavor covers head dims {head_dim_qk}/{head_dim_v}")
    width = FLAVORS[flavor]
    masked_right = window_right >= 0
    tile_n = 128 if flavor == "d64" and not masked_right else 64
    return FwdParams(
        dtype=dtype, flavor=flavor, partial_hdim_qk=head_dim_qk < width, partial_hdim_v=head_dim_v < width,
        tile_m=128, tile_n=tile_n, num_warps=4, layout=layout, has_seqlens=has_seqlens,
        has_window_left=window_left >= 0, has_window_right=masked_right,
        bottom_right=bottom_right and (window_left >= 0 or masked_right), has_sinks=has_sinks,
        heavy_first=flavor == "d128" and masked_right,
    ).validate()


@dataclasses.dataclass(frozen=True)
class BwdPreParams(_Tiles):
    """``sm80/bwd_pre``: D = rowsum(dO * O), lse in log2 units, per-block dsink partials, and
    (``accum_tile_m`` > 0) the zeroing of the default mode's flat dQ accumulator."""

    dtype: str
    flavor: str             # head-dim tile of V/O/dO
    partial_hdim_v: bool
    layout: str
    has_seqlens: bool
    has_sinks: bool
    tile_m: int = 64
    num_warps: int = 4
    accum_tile_m: int = 0   # the main kernel's tile_m whose dQ accumulator chunks this pass zeroes; 0: none
    dq_counters: bool = False  # also zero the ordered deterministic mode's per-query-block counters

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
        if self.dq_counters and not self.accum_tile_m:
            bad("dq_counters count accumulator chunks: they need accum_tile_m")
        return self


DQ_REDUCE_WIDTHS = (1, 2, 4)  # floats per dQ reduction; 2 and 4 (red.global.add.v2/v4.f32) need SM90


@dataclasses.dataclass(frozen=True)
class BwdParams(_Tiles):
    """Everything that changes the generated code of ``sm80/bwd`` (dK, dV and, unless
    ``deterministic``, dQ by reductions into a flat fp32 accumulator) and of
    ``sm80/bwd_dq`` (the deterministic dQ pass, which reads the same record).

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
    deterministic: bool     # no dQ reductions in sm80/bwd; sm80/bwd_dq computes dQ per query block
    # floats per dQ reduction into the flat accumulator: 1 (red.global.add.f32, SM80) or 2 / 4
    # (red.global.add.v2 / v4.f32: fewer, wider reductions, but SM90 only, so the kernel compiles
    # for sm_90; compile.target_arch)
    dq_reduce_width: int = 1
    # the query heads of a GQA group are split over CTAs (a runtime count): dK and dV go to fp32
    # partials in the workspace, summed in split order afterwards (deterministic)
    split_group: bool = False
    heavy_first: bool = False  # key blocks launched across the whole grid heaviest (lowest) first
    # deterministic mode without the dQ recompute: dQ is reduced as in the default mode but in a
    # fixed order per query block (key blocks from the lowest up, launched in that order:
    # heavy_first), each CTA waiting on a per-block counter for its turn (sm80/bwd.py, "Ordered dQ")
    dq_ordered: bool = False

    @property
    def reduces_dq(self) -> bool:
        """Whether the main kernel reduces dQ into the flat accumulator (else sm80/bwd_dq computes it)."""
        return not self.deterministic or self.dq_ordered

    @property
    def dq_chunk(self) -> int:
        """fp32 elements of one query block's chunk of the flat dQ accumulator."""
        return self.tile_m * self.tile_hdim

    def smem_bytes(self) -> int:
        k_v = 2 * self.tile_n * self.tile_hdim
        q_do = 2 * 2 * self.tile_m * self.tile_hdim  # Q and dO, two stages each
        p_ds = 2 * self.tile_m * self.tile_n
        return 2 * (k_v + q_do + p_ds)

    def validate(self) -> "BwdParams":
        bad = _checker(self)
        if self.layout == "thd" and self.has_seqlens:
            bad("padding seqlens apply to the dense layout only")
        if self.bottom_right and not (self.has_window_left or self.has_window_right):
            bad("bottom_right alignment needs a window or causal mask")
        w = self.num_warps
        for name, warps, extent, other in (
            ("warps_m_sdp", self.warps_m_sdp, self.tile_m, self.tile_n),
            ("warps_n_dkv", self.warps_n_dkv, self.tile_n, self.tile_hdim),
            ("warps_m_dq", self.warps_m_dq, self.tile_m, self.tile_hdim),
        ):
            if w % warps or extent % (16 * warps) or other % (16 * (w // warps)):
                bad(f"{name}={warps} does not tile {extent}x{other} with {w} warps in 16x16 steps")
        rows_per_step = self.num_threads * 8 // 64
        if self.tile_m % rows_per_step or self.tile_n % rows_per_step:
            bad(f"tile_m and tile_n must be multiples of {rows_per_step} (rows per copy step)")
        if self.tile_n % 64:
            bad("tile_n must be a multiple of 64 (the swizzle atom of the P and dS tiles)")
        if self.dq_reduce_width not in DQ_REDUCE_WIDTHS:
            bad(f"dq_reduce_width must be one of {DQ_REDUCE_WIDTHS}")
        if self.dq_reduce_width > 1 and self.deterministic:
            bad("the deterministic mode reduces dQ one float at a time, in order")
        if self.dq_ordered and not self.deterministic:
            bad("dq_ordered is a way of the deterministic mode")
        if self.dq_ordered and not self.heavy_first:
            bad("dq_ordered needs heavy_first: key blocks launched lowest first (each waits on the ones below it)")
        if self.dq_chunk % (self.num_threads * self.dq_reduce_width):
            bad("the dQ chunk must split evenly into the threads' reductions")
        if self.smem_bytes() > SMEM_BYTES_MAX:
            bad(f"shared memory {self.smem_bytes()} B exceeds {SMEM_BYTES_MAX} B")
        return self

    @property
    def target_arch(self) -> str:
        """The oldest architecture the generated code runs on."""
        return "sm_90" if self.dq_reduce_width > 1 else "sm_80"


def bwd_params_for(
    *, dtype: str, head_dim_qk: int, head_dim_v: int, layout: str, has_seqlens: bool,
    window_left: int, window_right: int, bottom_right: bool, deterministic: bool, dq_reduce_width: int = 1,
    split_group: bool = False, dq_ordered: bool = False,
) -> BwdParams:
    """Lower a backward problem to the main kernel's params (FlashAttention-2's SM80 tiles:
    d64 128x128, d128 64x128, 8 warps). ``dq_reduce_width`` and ``split_group`` are the
    engine's choices per device and per problem size (frost/engines/sm80.py)."""
    flavor = flavor_for(head_dim_qk, head_dim_v)
    if flavor is None:
        raise ValueError(f"no flavor covers head dims {head_dim_qk}/{head_dim_v}")
    width = FLAVORS[flavor]
    tile_m, warps_m_dq = (128, 4) if flavor == "d64" else (64, 2)
    return BwdParams(
        dtype=dtype, flavor=flavor, partial_hdim_qk=head_dim_qk < width, partial_hdim_v=head_dim_v < width,
        tile_m=tile_m, tile_n=128, num_warps=8, warps_m_sdp=2, warps_n_dkv=4, warps_m_dq=warps_m_dq,
        layout=layout, has_seqlens=has_seqlens, has_window_left=window_left >= 0,
        has_window_right=window_right >= 0,
        bottom_right=bottom_right and (window_left >= 0 or window_right >= 0), deterministic=deterministic,
        dq_reduce_width=1 if deterministic else dq_reduce_width, split_group=split_group,
        dq_ordered=deterministic and dq_ordered, heavy_first=deterministic and dq_ordered,
    ).validate()


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

    @classmethod
    def of(cls, bwd: "BwdParams") -> "BwdConvertParams":
        return cls(dtype=bwd.dtype, flavor=bwd.flavor, partial_hdim_qk=bwd.partial_hdim_qk, layout=bwd.layout,
                   tile_m=bwd.tile_m, num_warps=bwd.num_warps, warps_m_dq=bwd.warps_m_dq,
                   dq_reduce_width=bwd.dq_reduce_width)

    def validate(self) -> "BwdConvertParams":
        bad = _checker(self)
        if self.dq_reduce_width not in DQ_REDUCE_WIDTHS:
            bad(f"dq_reduce_width must be one of {DQ_REDUCE_WIDTHS}")
        if (self.tile_m * self.tile_hdim) % (self.num_threads * self.dq_reduce_width):
            bad("the dQ chunk must split evenly into the threads' reductions")
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

    @classmethod
    def of(cls, bwd: "BwdParams") -> "BwdDqParams":
        return cls(
            dtype=bwd.dtype, flavor=bwd.flavor, partial_hdim_qk=bwd.partial_hdim_qk,
            partial_hdim_v=bwd.partial_hdim_v, layout=bwd.layout, has_seqlens=bwd.has_seqlens,
            has_window_left=bwd.has_window_left, has_window_right=bwd.has_window_right,
            bottom_right=bwd.bottom_right, tile_n=128 if bwd.flavor == "d64" else 64,
        )

    def validate(self) -> "BwdDqParams":
        bad = _checker(self)
        if self.tile_m != 16 * self.num_warps:
            bad("tile_m must be 16 * num_warps (one 16-row slab per warp)")
        rows_per_step = self.num_threads * 8 // 64
        if self.tile_m % rows_per_step or self.tile_n % rows_per_step or self.tile_n % 16:
            bad(f"tile_m and tile_n must be multiples of {rows_per_step} and 16")
        return self
