"""Compiling the SM80 templates: fake arguments with dynamic extents, the cache, the counters.

Every extent and every stride except the unit last one is a ``cute.sym_int``
(strides carry divisibility 8 so 16-byte vector copies stay legal), so one
artifact per params record serves every batch size, sequence length, head
count and packed token total, and the number of packed sequences too: it is
the dynamic extent of cu_seqlens. The compile key is the template name plus
the params record and nothing else.

Compiled functions use the TVM FFI calling convention: they take torch
tensors directly and launch on torch's current stream.
"""
from __future__ import annotations

import os

import torch

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor

from frost.kernels.sm80.config import BwdDqParams, BwdParams, BwdPreParams, FwdParams
from frost.kernels.template import compile_cache, load_template

FWD_TEMPLATE = "sm80/fwd"
FWD_CACHE = compile_cache("sm80_fwd")
BWD_TEMPLATES = ("sm80/bwd_pre", "sm80/bwd", "sm80/bwd_dq")
BWD_CACHE = compile_cache("sm80_bwd")  # every kernel of the backward chain
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


def fake_vector(dtype):
    return make_fake_tensor(dtype, (cute.sym_int(),), (1,), assumed_align=4)


def compile_fwd(params: FwdParams):
    """The compiled forward for ``params`` (cached; counted in FWD_CACHE)."""
    params.validate()
    return FWD_CACHE.get_or_compile((FWD_TEMPLATE, params), lambda: _build_fwd(params))


def _build_fwd(params: FwdParams):
    module = load_template(FWD_TEMPLATE, params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    dim_qk = _head_dim(params.partial_hdim_qk, params.tile_hdim)
    dim_v = _head_dim(params.partial_hdim_v, params.tile_hdim)
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
    with _arch_for_compile():
        return cute.compile(
            module.sdpa_fwd, q, k, v, o, lse, cu_q, cu_k, seqlens_q, seqlens_k, sinks,
            Float32(1.0), Int32(-1), Int32(-1), Int32(0),
            make_fake_stream(use_tvm_ffi_env_stream=True),
            options="--enable-tvm-ffi",
        )


def _head_dim(partial: bool, tile: int):
    """A full head dim is static (no predicates); a partial one is a runtime multiple of 8."""
    return cute.sym_int(divisibility=_VECTOR) if partial else tile


def compile_bwd_pre(params: BwdPreParams):
    params.validate()
    return BWD_CACHE.get_or_compile((BWD_TEMPLATES[0], params), lambda: _build_bwd_pre(params))


def _build_bwd_pre(params: BwdPreParams):
    module = load_template(BWD_TEMPLATES[0], params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    dim_v = _head_dim(params.partial_hdim_v, params.tile_hdim)
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
    with _arch_for_compile():
        return cute.compile(
            module.sdpa_bwd_pre, o, do, lse, d, lse2, cu_q, seqlens_q, sinks, partial, Int32(0),
            make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi",
        )


def fake_dq_accum(packed: bool, tile_hdim: int):
    """fp32 dQ accumulator: (B, H, S, tile_hdim) dense, (H, T, tile_hdim) packed, compact."""
    rank = 3 if packed else 4
    shape = tuple(cute.sym_int() for _ in range(rank - 1)) + (tile_hdim,)
    return make_fake_compact_tensor(Float32, shape, stride_order=tuple(reversed(range(rank))), assumed_align=16)


def compile_bwd(params: BwdParams):
    params.validate()
    return BWD_CACHE.get_or_compile((BWD_TEMPLATES[1], params), lambda: _build_bwd(params))


def _build_bwd(params: BwdParams):
    module = load_template(BWD_TEMPLATES[1], params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    dim_qk = _head_dim(params.partial_hdim_qk, params.tile_hdim)
    dim_v = _head_dim(params.partial_hdim_v, params.tile_hdim)
    q, k, dk = (fake_rows_tensor(dtype, packed, dim_qk) for _ in range(3))
    v, do, dv = (fake_rows_tensor(dtype, packed, dim_v) for _ in range(3))
    lse2, d = fake_lse_tensor(packed), fake_lse_tensor(packed)
    dq_accum = None if params.deterministic else fake_dq_accum(packed, params.tile_hdim)
    cu_q = fake_vector(Int32) if packed else None
    cu_k = fake_vector(Int32) if packed else None
    seqlens_q = fake_vector(Int32) if params.has_seqlens else None
    seqlens_k = fake_vector(Int32) if params.has_seqlens else None
    with _arch_for_compile("sm_90" if params.vector_dq_atomics else "sm_80"):
        return cute.compile(
            module.sdpa_bwd, q, k, v, do, lse2, d, dq_accum, dk, dv, cu_q, cu_k, seqlens_q, seqlens_k,
            Float32(1.0), Float32(1.0), Int32(-1), Int32(-1), Int32(0),
            make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi",
        )


def compile_bwd_dq(params: BwdDqParams):
    params.validate()
    return BWD_CACHE.get_or_compile((BWD_TEMPLATES[2], params), lambda: _build_bwd_dq(params))


def _build_bwd_dq(params: BwdDqParams):
    module = load_template(BWD_TEMPLATES[2], params)
    dtype = _DTYPES[params.dtype]
    packed = params.layout == "thd"
    dim_qk = _head_dim(params.partial_hdim_qk, params.tile_hdim)
    dim_v = _head_dim(params.partial_hdim_v, params.tile_hdim)
    q, k, dq = (fake_rows_tensor(dtype, packed, dim_qk) for _ in range(3))
    v, do = (fake_rows_tensor(dtype, packed, dim_v) for _ in range(2))
    lse2, d = fake_lse_tensor(packed), fake_lse_tensor(packed)
    cu_q = fake_vector(Int32) if packed else None
    cu_k = fake_vector(Int32) if packed else None
    seqlens_q = fake_vector(Int32) if params.has_seqlens else None
    seqlens_k = fake_vector(Int32) if params.has_seqlens else None
    with _arch_for_compile():
        return cute.compile(
            module.sdpa_bwd_dq, q, k, v, do, lse2, d, dq, cu_q, cu_k, seqlens_q, seqlens_k,
            Float32(1.0), Float32(1.0), Int32(-1), Int32(-1), Int32(0),
            make_fake_stream(use_tvm_ffi_env_stream=True), options="--enable-tvm-ffi",
        )


class _arch_for_compile:
    """Without a GPU the DSL needs CUTE_DSL_ARCH to pick a target; default it to ``arch``
    (sm_80, or sm_90 for code that uses SM90 instructions).

    With a GPU present the DSL targets the device it finds, which is what we
    want there (sm_90 runs this SM80 code natively).
    """

    def __init__(self, arch: str = "sm_80"):
        self.arch = arch

    def __enter__(self):
        self._set = False
        if "CUTE_DSL_ARCH" not in os.environ and not _has_cuda():
            os.environ["CUTE_DSL_ARCH"] = self.arch
            self._set = True

    def __exit__(self, *exc):
        if self._set:
            os.environ.pop("CUTE_DSL_ARCH", None)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


LOG2_E = 1.4426950408889634


def launch_fwd(compiled, q, k, v, o, lse, *, scale: float, window_left: int, window_right: int,
               cu_seqlens_q=None, cu_seqlens_k=None, seqlens_q=None, seqlens_k=None, sinks=None,
               max_seqlen_q: int = 0) -> None:
    """Launch a compiled forward on torch tensors (current stream). No validation: the
    engine's check_support and the Problem did that before the plan was made."""
    compiled(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, seqlens_q, seqlens_k, sinks,
             scale * LOG2_E, window_left, window_right, max_seqlen_q)


def launch_bwd(compiled_pre, compiled_main, compiled_dq, t, dq, dk, dv, dsinks, scratch, *,
               scale: float, window_left: int, window_right: int, max_seqlen_q: int, max_seqlen_k: int) -> None:
    """Run the backward chain on torch tensors (current stream).

    ``t`` is the call's frost.problem.Tensors; ``scratch`` the carved workspace
    (d, lse2, and dq_accum unless deterministic, dsink_partial with sinks).
    Default mode: bwd_pre, zero the accumulator, bwd (dK, dV, scaled dQ atomics),
    then one strided copy of the accumulator into dq. Deterministic:
    bwd_pre, bwd (dK, dV only), bwd_dq (dq directly).
    """
    seqlens_q, seqlens_k = t.seqlens_q, t.seqlens_k
    compiled_pre(t.o, t.do, t.lse, scratch["d"], scratch["lse2"], t.cu_seqlens_q, seqlens_q, t.sinks,
                 scratch.get("dsink_partial"), max_seqlen_q)
    accum = scratch.get("dq_accum")
    if accum is not None:
        accum.zero_()
    compiled_main(t.q, t.k, t.v, t.do, scratch["lse2"], scratch["d"], accum, dk, dv,
                  t.cu_seqlens_q, t.cu_seqlens_k, seqlens_q, seqlens_k,
                  scale, scale * LOG2_E, window_left, window_right, max_seqlen_k)
    if accum is None:
        compiled_dq(t.q, t.k, t.v, t.do, scratch["lse2"], scratch["d"], dq, t.cu_seqlens_q, t.cu_seqlens_k,
                    seqlens_q, seqlens_k, scale, scale * LOG2_E, window_left, window_right, max_seqlen_q)
    else:
        head_dim = dq.shape[-1]
        if t.cu_seqlens_q is not None:  # (H, T, D) -> (T, H, D); rows past cu_seqlens_q[-1] untouched
            end = int(t.cu_seqlens_q[-1])
            dq[:end].copy_(accum.permute(1, 0, 2)[:end, :, :head_dim])
        else:  # (B, H, S, D) -> (B, S, H, D)
            dq.copy_(accum.permute(0, 2, 1, 3)[..., :head_dim])
    if dsinks is not None:
        torch.sum(scratch["dsink_partial"], dim=1, out=dsinks)
