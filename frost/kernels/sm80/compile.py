"""Compiling the SM80 templates: fake arguments with dynamic extents, the cache, the counters.

Every extent and every stride except the unit last one is a ``cute.sym_int``
(strides carry divisibility 8 so 16-byte vector copies stay legal), so one
artifact per params record serves every batch size, sequence length, head
count and packed token total, and the number of packed sequences too: it is
the dynamic extent of cu_seqlens. The compile key is the template name, the
params record and the target architecture, and nothing else; the same triple
names the artifact in the disk cache (frost/kernels/disk_cache.py), so a fresh
process loads what an earlier one (or ``frost-compile``) built.

Compiled functions use the TVM FFI calling convention: they take torch
tensors directly and launch on torch's current stream.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

from frost.kernels.sm80.config import (
    BwdCombineParams, BwdConvertParams, BwdDqParams, BwdParams, BwdPreParams, FwdParams,
)
from frost.kernels.sm80.rope_params import RopeParams
from frost.kernels.template import compile_cache, load_template
from frost.records import Grads, Tensors

FWD_TEMPLATE = "sm80/fwd"
FWD_CACHE = compile_cache("sm80_fwd")
BWD_TEMPLATES = ("sm80/bwd_pre", "sm80/bwd", "sm80/bwd_dq", "sm80/bwd_convert", "sm80/bwd_combine")
BWD_CACHE = compile_cache("sm80_bwd")  # every kernel of the backward chain
ROPE_TEMPLATE = "sm80/rope"
ROPE_CACHE = compile_cache("sm80_rope")  # the RoPE pass of both directions
_DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
_VECTOR = 8  # elements per 16-byte vector


def _sym_stride():
    return cute.sym_int64(divisibility=_VECTOR)


def fake_rows_tensor(dtype, packed: bool, head_dim):
    """q/k/v/o: (B, S, H, D) dense or (T, H, D) packed, any strides, unit last stride."""
    if packed:
        shape = (cute.sym_int(), cute.sym_int(), head_dim)
        stride = (_sym_stride(), _sym_stride(), 1)
    else:
        shape = (cute.sym_int(), cute.sym_int(), cute.sym_int(), head_dim)
        stride = (_sym_stride(), _sym_stride(), _sym_stride(), 1)
    return make_fake_tensor(dtype, shape, stride, assumed_align=16)


def fake_lse_tensor(packed: bool):
    rank = 2 if packed else 3
    return make_fake_tensor(
        Float32, tuple(cute.sym_int() for _ in range(rank)), tuple(cute.sym_int64() for _ in range(rank)),
        assumed_align=4,
    )


def fake_bias_tensor(dtype_name: str | None):
    """A bias or dbias ``[B|1, H|1, Sq, Sk]`` of that dtype (None: no tensor): any strides with a
    unit last one, read and written per element (sm80/bias.py), so no alignment is assumed."""
    if dtype_name is None:
        return None
    dtype = {"float32": Float32, **_DTYPES}[dtype_name]
    shape = tuple(cute.sym_int() for _ in range(4))
    return make_fake_tensor(dtype, shape, (cute.sym_int64(), cute.sym_int64(), cute.sym_int64(), 1),
                            assumed_align=dtype.width // 8)


def fake_vector(dtype):
    return make_fake_tensor(dtype, (cute.sym_int(),), (1,), assumed_align=4)


def compile_fwd(params: FwdParams, arch: str | None = None):
    """The compiled forward for ``params`` (cached; counted in FWD_CACHE)."""
    return compile_record(params, arch)


def _build_fwd(params: FwdParams, options: str):
    module = load_template(FWD_TEMPLATE, params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    dim_qk = _head_dim(params.partial_hdim_qk, params.tile_hdim_qk)
    dim_v = _head_dim(params.partial_hdim_v, params.tile_hdim_v)
    q = fake_rows_tensor(dtype, packed, dim_qk)
    k = fake_rows_tensor(dtype, packed, dim_qk)
    v = fake_rows_tensor(dtype, packed, dim_v)
    o = fake_rows_tensor(dtype, packed, dim_v)
    lse = fake_lse_tensor(packed)
    cu_q = fake_vector(Int32) if packed else None
    cu_k = fake_vector(Int32) if packed else None
    seqlens_q = fake_vector(Int32) if params.has_seqlens else None
    seqlens_k = fake_vector(Int32) if params.has_seqlens else None
    sinks = fake_vector(Float32) if params.has_sinks else None
    bias = fake_bias_tensor(params.bias_dtype)
    return cute.compile(
        module.sdpa_fwd, q, k, v, o, lse, cu_q, cu_k, seqlens_q, seqlens_k, sinks, bias,
        Float32(1.0), Int32(-1), Int32(-1), Int32(0),
        make_fake_stream(use_tvm_ffi_env_stream=True),
        options=options,
    )


def _head_dim(partial: bool, tile: int):
    """A full head dim is static (no predicates); a partial one is a runtime multiple of 8."""
    return cute.sym_int(divisibility=_VECTOR) if partial else tile


def compile_bwd_pre(params: BwdPreParams, arch: str | None = None):
    return compile_record(params, arch)


def _build_bwd_pre(params: BwdPreParams, options: str):
    module = load_template(BWD_TEMPLATES[0], params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    dim_v = _head_dim(params.partial_hdim_v, params.tile_hdim_v)
    o = fake_rows_tensor(dtype, packed, dim_v)
    do = fake_rows_tensor(dtype, packed, dim_v)
    lse, d, lse2 = (fake_lse_tensor(packed) for _ in range(3))
    cu_q = fake_vector(Int32) if packed else None
    seqlens_q = fake_vector(Int32) if params.has_seqlens else None
    sinks = fake_vector(Float32) if params.has_sinks else None
    partial = (
        make_fake_tensor(Float32, (cute.sym_int(), cute.sym_int()), (cute.sym_int64(), 1), assumed_align=4)
        if params.has_sinks else None
    )
    dq_accum = fake_dq_accum(packed) if params.accum_tile_m else None
    return cute.compile(
        module.sdpa_bwd_pre, o, do, lse, d, lse2, cu_q, seqlens_q, sinks, partial, dq_accum, Int32(0),
        make_fake_stream(use_tvm_ffi_env_stream=True), options=options,
    )


def fake_dq_accum(packed: bool):
    """The flat fp32 dQ accumulator (layout: sm80/seqlen.py): (B, H, slab) dense, (H, slab) packed."""
    rank = 2 if packed else 3
    shape = tuple(cute.sym_int() for _ in range(rank))
    return make_fake_compact_tensor(Float32, shape, stride_order=tuple(reversed(range(rank))), assumed_align=16)


def fake_partials(packed: bool, tile_hdim: int):
    """fp32 dK / dV partials of a split GQA group: (splits, B, S, H, tile_hdim) / (splits, T, H, tile_hdim)."""
    rank = 4 if packed else 5
    shape = tuple(cute.sym_int() for _ in range(rank - 1)) + (tile_hdim,)
    return make_fake_compact_tensor(Float32, shape, stride_order=tuple(reversed(range(rank))), assumed_align=16)


def compile_bwd(params: BwdParams, arch: str | None = None):
    return compile_record(params, arch)


def _build_bwd(params: BwdParams, options: str):
    module = load_template(BWD_TEMPLATES[1], params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    dim_qk = _head_dim(params.partial_hdim_qk, params.tile_hdim_qk)
    dim_v = _head_dim(params.partial_hdim_v, params.tile_hdim_v)
    q, k = (fake_rows_tensor(dtype, packed, dim_qk) for _ in range(2))
    v, do = (fake_rows_tensor(dtype, packed, dim_v) for _ in range(2))
    if params.split_group and not params.split_cluster:
        dk, dv = fake_partials(packed, params.tile_hdim_qk), fake_partials(packed, params.tile_hdim_v)
    else:
        dk, dv = fake_rows_tensor(dtype, packed, dim_qk), fake_rows_tensor(dtype, packed, dim_v)
    lse2, d = fake_lse_tensor(packed), fake_lse_tensor(packed)
    dq_accum = fake_dq_accum(packed) if params.reduces_dq else None
    cu_q = fake_vector(Int32) if packed else None
    cu_k = fake_vector(Int32) if packed else None
    seqlens_q = fake_vector(Int32) if params.has_seqlens else None
    seqlens_k = fake_vector(Int32) if params.has_seqlens else None
    bias, dbias = fake_bias_tensor(params.bias_dtype), fake_bias_tensor(params.dbias_dtype)
    return cute.compile(
        module.sdpa_bwd, q, k, v, do, lse2, d, dq_accum, dk, dv, bias, dbias,
        cu_q, cu_k, seqlens_q, seqlens_k,
        Float32(1.0), Float32(1.0), Int32(-1), Int32(-1), Int32(0), Int32(1),
        make_fake_stream(use_tvm_ffi_env_stream=True), options=options,
    )


def compile_bwd_dq(params: BwdDqParams, arch: str | None = None):
    return compile_record(params, arch)


def _build_bwd_dq(params: BwdDqParams, options: str):
    module = load_template(BWD_TEMPLATES[2], params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    dim_qk = _head_dim(params.partial_hdim_qk, params.tile_hdim_qk)
    dim_v = _head_dim(params.partial_hdim_v, params.tile_hdim_v)
    q, k, dq = (fake_rows_tensor(dtype, packed, dim_qk) for _ in range(3))
    v, do = (fake_rows_tensor(dtype, packed, dim_v) for _ in range(2))
    lse2, d = fake_lse_tensor(packed), fake_lse_tensor(packed)
    cu_q = fake_vector(Int32) if packed else None
    cu_k = fake_vector(Int32) if packed else None
    seqlens_q = fake_vector(Int32) if params.has_seqlens else None
    seqlens_k = fake_vector(Int32) if params.has_seqlens else None
    return cute.compile(
        module.sdpa_bwd_dq, q, k, v, do, lse2, d, dq, fake_bias_tensor(params.bias_dtype),
        cu_q, cu_k, seqlens_q, seqlens_k,
        Float32(1.0), Float32(1.0), Int32(-1), Int32(-1), Int32(0),
        make_fake_stream(use_tvm_ffi_env_stream=True), options=options,
    )


def compile_bwd_convert(params: BwdConvertParams, arch: str | None = None):
    return compile_record(params, arch)


def _build_bwd_convert(params: BwdConvertParams, options: str):
    module = load_template(BWD_TEMPLATES[3], params)
    packed = params.layout == "thd"
    dtype, dim_qk = _DTYPES[params.dtype], _head_dim(params.partial_hdim_qk, params.tile_hdim_qk)
    cu_q = fake_vector(Int32) if packed else None
    # the main kernel's mask (dq_slice_stores only): k for its extents, the key lengths
    masked = params.dq_slice_stores
    k = fake_rows_tensor(dtype, packed, dim_qk) if masked else None
    cu_k = fake_vector(Int32) if masked and packed else None
    seqlens_q, seqlens_k = (fake_vector(Int32) if masked and params.has_seqlens else None for _ in range(2))
    return cute.compile(
        module.sdpa_bwd_convert, fake_dq_accum(packed), fake_rows_tensor(dtype, packed, dim_qk), cu_q, k, cu_k,
        seqlens_q, seqlens_k, Float32(1.0), Int32(0), Int32(0), make_fake_stream(use_tvm_ffi_env_stream=True),
        options=options,
    )


def _build_bwd_combine(params: BwdCombineParams, options: str):
    module = load_template(BWD_TEMPLATES[4], params)
    dtype, packed = _DTYPES[params.dtype], params.layout == "thd"
    # the head dims are runtime extents here: the kernel guards each 8-column vector
    dk, dv = fake_rows_tensor(dtype, packed, cute.sym_int()), fake_rows_tensor(dtype, packed, cute.sym_int())
    return cute.compile(
        module.sdpa_bwd_combine, fake_partials(packed, params.tile_hdim_qk), fake_partials(packed, params.tile_hdim_v),
        dk, dv, fake_vector(Int32) if packed else None, make_fake_stream(use_tvm_ffi_env_stream=True), options=options,
    )


def _build_rope(params: RopeParams, options: str):
    module = load_template(ROPE_TEMPLATE, params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    q, k, q_out, k_out = (fake_rows_tensor(dtype, packed, params.head_dim) for _ in range(4))
    # the tables are read a few scalars per thread and row: any strides, no alignment asked of them
    cos, sin = (make_fake_tensor(Float32, (cute.sym_int(), params.half), (cute.sym_int64(), cute.sym_int64()),
                                 assumed_align=4) for _ in range(2))
    cu_q = fake_vector(Int32) if packed else None
    cu_k = fake_vector(Int32) if packed else None
    return cute.compile(
        module.sdpa_rope, q, k, q_out, k_out, cos, sin, cu_q, cu_k, Int32(0), Int32(0),
        make_fake_stream(use_tvm_ffi_env_stream=True), options=options,
    )


def compile_record(params, arch: str | None = None):
    """The compiled kernel for any SM80 params record, built for ``arch`` (None: this process's
    target, ``target_arch``); from memory, the disk cache, or a fresh compile."""
    template, cache, build = _KINDS[type(params)]
    params.validate()
    arch, options = _target(params, arch)
    return cache.get_or_compile(
        (template, params, arch), lambda: build(params, options), persist=(template, params, arch),
    )


def template_of(params) -> str:
    """The template a params record specializes, e.g. ``"sm80/fwd"``."""
    return _KINDS[type(params)][0]


def min_arch(params) -> str:
    """The oldest architecture a record's code runs on (sm_90 for SM90-only instructions)."""
    return getattr(params, "target_arch", "sm_80")


def arch_number(arch: str) -> int:
    """``"sm_90a"`` -> 90."""
    return int(arch.removeprefix("sm_").rstrip("a"))


def target_arch(params=None) -> str:
    """The architecture this process builds ``params`` for: the GPU's when one is present, else
    CUTE_DSL_ARCH or sm_80, raised to the record's own minimum."""
    return _target(params, None)[0]


def _target(params, arch: str | None) -> tuple[str, str]:
    """(the architecture the artifact is built for, the cute.compile options).

    Options: the TVM FFI calling convention, and the target architecture. With a GPU present
    and no ``arch`` asked for, the DSL targets the device it finds (sm_90 runs this SM80
    code natively), which is what we want there; the key then names the device's compute
    capability. Without one it needs a target: CUTE_DSL_ARCH when set, else sm_80, raised
    to the record's minimum for code that uses newer instructions. An explicit ``arch``
    (frost-compile's cross-compiling) is used as given, and must not be older than that.
    """
    least = min_arch(params) if params is not None else "sm_80"
    if arch is None:
        if _has_cuda():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}", "--enable-tvm-ffi"
        arch = os.environ.get("CUTE_DSL_ARCH") or "sm_80"
        if arch_number(least) > arch_number(arch):
            arch = least
    elif arch_number(least) > arch_number(arch):
        raise ValueError(f"{type(params).__name__} needs {least} or newer; cannot build it for {arch}")
    return arch, f"--enable-tvm-ffi --gpu-arch {arch}"


def _has_cuda() -> bool:
    return torch.cuda.is_available()


_KINDS = {  # params type -> (template, cache it is counted in, builder)
    FwdParams: (FWD_TEMPLATE, FWD_CACHE, _build_fwd),
    BwdPreParams: (BWD_TEMPLATES[0], BWD_CACHE, _build_bwd_pre),
    BwdParams: (BWD_TEMPLATES[1], BWD_CACHE, _build_bwd),
    BwdDqParams: (BWD_TEMPLATES[2], BWD_CACHE, _build_bwd_dq),
    BwdConvertParams: (BWD_TEMPLATES[3], BWD_CACHE, _build_bwd_convert),
    BwdCombineParams: (BWD_TEMPLATES[4], BWD_CACHE, _build_bwd_combine),
    RopeParams: (ROPE_TEMPLATE, ROPE_CACHE, _build_rope),
}


LOG2_E = 1.4426950408889634


def launch_fwd(compiled, q, k, v, o, lse, *, scale: float, window_left: int, window_right: int,
               cu_seqlens_q=None, cu_seqlens_k=None, seqlens_q=None, seqlens_k=None, sinks=None, bias=None,
               max_seqlen_q: int = 0) -> None:
    """Launch a compiled forward on torch tensors (current stream). No validation: the
    engine's check_support and the Problem did that before the plan was made. With no query
    rows (``max_seqlen_q`` 0) the grid would be empty and nothing is launched."""
    if max_seqlen_q == 0 or q.numel() == 0:
        return
    compiled(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, sinks, bias,
             scale * LOG2_E, window_left, window_right, max_seqlen_q)


class BwdLaunch(NamedTuple):
    """What a backward plan fixes for every call of ``launch_bwd``: the compiled chain, the
    plan's launch choices and the Problem's scalars."""

    pre: Any      # bwd_pre
    main: Any     # bwd
    last: Any     # bwd_convert (an accumulator: default and sliced deterministic), else bwd_dq
    combine: Any  # bwd_combine for a split GQA group's partials (``splits`` > 1 without a cluster sum), else None
    splits: int
    zero_accum: bool   # False: bwd_pre leaves the accumulator alone (compiled without it: dq_slice_stores)
    convert_masked: bool  # bwd_convert reads k and the key lengths (BwdConvertParams.dq_slice_stores)
    scale: float
    window_left: int
    window_right: int
    batch: int
    max_seqlen_q: int
    max_seqlen_k: int


def launch_bwd(chain: BwdLaunch, t: Tensors, grads: Grads, scratch: dict) -> None:
    """Run the backward chain on torch tensors (current stream) into ``grads`` (dq, dk, dv as the
    kernels write them; dbias, dsinks where wanted).

    ``t`` is the call's tensors; ``scratch`` the carved workspace (d, lse2;
    dq_accum unless the deterministic mode recomputes dQ; dsink_partial with sinks; dk_partial,
    dv_partial when ``splits`` > 1; with a bias, dbias_target, what the main kernel writes dS
    into: dbias itself, or a float32 accumulator or partials that are reduced into dbias at the
    end, sm80/bias.py). Default mode and sliced deterministic mode: bwd_pre (which also zeroes
    the accumulator unless the main kernel writes it whole), bwd (dK, dV, dQ reductions),
    bwd_convert (dq). Deterministic without an accumulator: bwd_pre, bwd (dK, dV
    only), bwd_dq. Split GQA groups (bwd_combine): the fp32 partials are summed in split order
    into dk, dv (with a cluster sum the main kernel writes dk and dv itself).

    A kernel whose grid would be empty (no sequence, no query or no key rows) is not launched:
    CUDA rejects a zero grid, and there is nothing for it to write. With no query rows the main
    kernel still runs and writes dk = dv = 0; with no key rows bwd_convert / bwd_dq write dq = 0.
    """
    queries, keys = chain.batch > 0 and chain.max_seqlen_q > 0, chain.batch > 0 and chain.max_seqlen_k > 0
    accum = scratch.get("dq_accum")
    scale, scale_log2, left, right = chain.scale, chain.scale * LOG2_E, chain.window_left, chain.window_right
    if queries:
        chain.pre(t.o, t.do, t.lse, scratch["d"], scratch["lse2"], t.cu_seqlens_q, t.seqlens_q, t.sinks,
                  scratch.get("dsink_partial"), accum if chain.zero_accum else None, chain.max_seqlen_q)
    dk_out, dv_out = (scratch["dk_partial"], scratch["dv_partial"]) if chain.combine is not None else (grads.dk, grads.dv)
    if keys:
        chain.main(t.q, t.k, t.v, t.do, scratch["lse2"], scratch["d"], accum, dk_out, dv_out,
                   t.bias, scratch.get("dbias_target"), t.cu_seqlens_q, t.cu_seqlens_k, t.seqlens_q, t.seqlens_k,
                   scale, scale_log2, left, right, chain.max_seqlen_k, chain.splits)
    if queries and accum is None:
        chain.last(t.q, t.k, t.v, t.do, scratch["lse2"], scratch["d"], grads.dq, t.bias, t.cu_seqlens_q,
                   t.cu_seqlens_k, t.seqlens_q, t.seqlens_k, scale, scale_log2, left, right, chain.max_seqlen_q)
    elif queries:
        masks = (t.k, t.cu_seqlens_k, t.seqlens_q, t.seqlens_k) if chain.convert_masked else (None,) * 4
        chain.last(accum, grads.dq, t.cu_seqlens_q, *masks, scale, right, chain.max_seqlen_q)
    if chain.combine is not None and keys:
        chain.combine(dk_out, dv_out, grads.dk, grads.dv, t.cu_seqlens_k)
    if grads.dsinks is not None:
        torch.sum(scratch["dsink_partial"], dim=1, out=grads.dsinks)
    if grads.dbias is not None and scratch["dbias_target"] is not grads.dbias:
        finish_dbias(grads.dbias, scratch["dbias_target"])


def finish_dbias(dbias, target) -> None:
    """dbias from the main kernel's float32 target (sm80/bias.py): per-(batch, head) partials are
    summed over the dimensions the bias broadcasts (torch's reduction: a fixed order, so
    deterministic), an accumulator shaped like the bias is only converted to its dtype."""
    dims = [d for d in (0, 1) if dbias.shape[d] == 1 and target.shape[d] > 1]
    dbias.copy_(target.sum(dims, keepdim=True) if dims else target)


def launch_rope(compiled, q, k, q_out, k_out, cos, sin, *, cu_seqlens_q=None, cu_seqlens_k=None,
                max_seqlen_q: int = 0, max_seqlen_k: int = 0) -> None:
    """Launch a compiled RoPE pass (current stream): q, k -> q_out, k_out (the same tensors
    to rotate in place). ``max_seqlen_*`` size the packed grid (dense reads the extents). A
    call with no rows at all would have an empty grid and is not launched."""
    rows = (q.shape[0] * q.shape[1] + k.shape[0] * k.shape[1]) if cu_seqlens_q is None else (
        (max_seqlen_q + max_seqlen_k) * (cu_seqlens_q.shape[0] - 1))
    if rows == 0:
        return
    compiled(q, k, q_out, k_out, cos, sin, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def copy_rows(dst, src, cu_seqlens=None) -> None:
    """dst = src, but for packed tensors (``cu_seqlens`` given) only rows before cu_seqlens[-1]:
    the rows past it stay untouched. The row mask is built on the device, so nothing is read
    back to the host and the copy can be captured in a CUDA graph."""
    if cu_seqlens is None:
        dst.copy_(src)
        return
    inside = torch.arange(dst.shape[0], device=dst.device) < cu_seqlens[-1]
    dst.copy_(torch.where(inside.view(-1, *([1] * (dst.dim() - 1))), src, dst))
