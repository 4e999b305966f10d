"""frost's own SM80 engines: the CuTe-DSL kernels of ``frost.kernels.sm80`` behind the engine contract.

``sdpa_fwd_sm80`` serves the forward (FlashAttention-2 style, see
``frost/kernels/sm80/fwd.py``); ``sdpa_bwd_sm80`` the backward chain
(``bwd_pre`` -> ``bwd`` -> dQ conversion, or ``bwd_dq`` when deterministic).
Their Capabilities rows say what they accept; ``check_support`` adds the facts
a row cannot express (a CUDA device of compute capability 8.x or 9.x, a
positive scale, 16-byte aligned rows, the DSL installed).

Lowering: ``frost.kernels.sm80.config`` turns the problem into frozen params
records (flavor, tiles, feature flags); ``frost.kernels.sm80.compile`` returns
the cached artifact for each. Nothing here imports the DSL until a plan is
compiled.
"""
from __future__ import annotations

import functools
import importlib.util
import math

import torch

from frost.engines.base import Capabilities, Engine, Plan, allocate_backward, allocate_forward
from frost.problem import Grads, Problem, Tensors

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
VECTOR_ELEMENTS = 8  # one 16-byte cp.async vector of fp16/bf16

SM80_CAPABILITIES = Capabilities(
    dtypes=frozenset(_DTYPE_NAMES),
    layouts=frozenset({"bshd", "thd"}),
    features=frozenset(
        {"thd", "padding", "gqa", "mqa", "causal", "bottom_right", "window", "sinks", "dqk_ne_dv", "strided"}
    ),
    device_types=frozenset({"cuda"}),
    head_dim_multiple=VECTOR_ELEMENTS,
    max_head_dim=128,
    deterministic=True,
)


@functools.lru_cache(maxsize=None)
def _compute_capability(device: str) -> tuple[int, int]:
    return torch.cuda.get_device_capability(torch.device(device))


@functools.lru_cache(maxsize=None)
def _dsl_installed() -> bool:
    return importlib.util.find_spec("cutlass") is not None


def sm80_decline(problem: Problem) -> str | None:
    """What every SM80 engine needs beyond its Capabilities row."""
    major, minor = _compute_capability(problem.device)
    if major not in (8, 9):
        return f"needs an SM80-class GPU (compute capability 8.x or 9.x), got {major}.{minor}"
    if problem.scale <= 0:
        return f"needs a positive scale, got {problem.scale}"
    if not problem.vector_aligned:
        return "needs 16-byte aligned rows (data pointers and all strides but the last a multiple of 8 elements)"
    if not _dsl_installed():
        return "nvidia-cutlass-dsl is not installed"
    return None


class Sm80Forward(Engine):
    name = "sdpa_fwd_sm80"
    family = "sm80"
    direction = "forward"
    native = False
    capabilities = SM80_CAPABILITIES

    def check_support(self, problem: Problem) -> str | None:
        return super().check_support(problem) or sm80_decline(problem)

    def compile(self, problem: Problem) -> Plan:
        from frost.kernels.sm80 import compile as sm80_compile
        from frost.kernels.sm80.config import fwd_params_for

        params = fwd_params_for(
            dtype=_DTYPE_NAMES[problem.dtype], head_dim_qk=problem.head_dim_qk, head_dim_v=problem.head_dim_v,
            layout=problem.layout, has_seqlens=problem.has_seqlens, window_left=problem.window_left,
            window_right=problem.window_right, bottom_right=problem.causal_align == "bottom_right",
            has_sinks=problem.has_sinks,
        )
        return _Sm80ForwardPlan(problem, params, sm80_compile.compile_fwd(params))


class Sm80Backward(Engine):
    """``vector_dq_atomics=True`` reduces dQ in column pairs (``red.global.add.v2.f32``) on
    SM90 devices. It is off in the dispatch table until the benchmark shows it helps."""

    name = "sdpa_bwd_sm80"
    family = "sm80"
    direction = "backward"
    native = False
    capabilities = SM80_CAPABILITIES

    def __init__(self, vector_dq_atomics: bool = False):
        self.vector_dq_atomics = vector_dq_atomics

    def _vector_atomics(self, problem: Problem) -> bool:
        return (self.vector_dq_atomics and not problem.deterministic and problem.device_type == "cuda"
                and torch.cuda.get_device_capability(problem.device) >= (9, 0))

    def check_support(self, problem: Problem) -> str | None:
        return super().check_support(problem) or sm80_decline(problem)

    def compile(self, problem: Problem) -> Plan:
        from frost.kernels.sm80 import compile as sm80_compile
        from frost.kernels.sm80.config import BwdDqParams, BwdPreParams, bwd_params_for

        dtype = _DTYPE_NAMES[problem.dtype]
        main = bwd_params_for(
            dtype=dtype, head_dim_qk=problem.head_dim_qk, head_dim_v=problem.head_dim_v, layout=problem.layout,
            has_seqlens=problem.has_seqlens, window_left=problem.window_left, window_right=problem.window_right,
            bottom_right=problem.causal_align == "bottom_right", deterministic=problem.deterministic,
            vector_dq_atomics=self._vector_atomics(problem),
        )
        pre = BwdPreParams(
            dtype=dtype, flavor=main.flavor, partial_hdim_v=main.partial_hdim_v, layout=problem.layout,
            has_seqlens=problem.has_seqlens, has_sinks=problem.has_sinks,
        )
        dq = BwdDqParams.of(main) if problem.deterministic else None
        return _Sm80BackwardPlan(
            problem, pre, main, dq,
            sm80_compile.compile_bwd_pre(pre), sm80_compile.compile_bwd(main),
            sm80_compile.compile_bwd_dq(dq) if dq is not None else None,
        )


def _vector_aligned(x: torch.Tensor) -> bool:
    return x.data_ptr() % 16 == 0 and all(s % VECTOR_ELEMENTS == 0 for s in x.stride()[:-1]) and x.stride(-1) == 1


class _Sm80ForwardPlan(Plan):
    def __init__(self, problem: Problem, params, compiled):
        super().__init__(problem)
        self.params = params
        self._compiled = compiled

    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        from frost.kernels.sm80.compile import launch_fwd

        p = self.problem
        o, lse = out if out is not None else allocate_forward(p)
        # a caller's o with rows the 16-byte stores cannot address goes through a staging copy
        o_kernel = o if _vector_aligned(o) else torch.empty(p.o_shape, dtype=p.dtype, device=o.device)
        launch_fwd(
            self._compiled, tensors.q, tensors.k, tensors.v, o_kernel, lse,
            scale=p.scale, window_left=p.window_left, window_right=p.window_right,
            cu_seqlens_q=tensors.cu_seqlens_q, cu_seqlens_k=tensors.cu_seqlens_k,
            seqlens_q=tensors.seqlens_q, seqlens_k=tensors.seqlens_k, sinks=tensors.sinks,
            max_seqlen_q=p.seqlen_q,
        )
        if o_kernel is not o:
            _copy_rows(p.layout, tensors.cu_seqlens_q, o_kernel, o)
        return o, lse


class _Workspace:
    """The backward's scratch, carved from one byte buffer: D and lse2 (lse-shaped fp32),
    the fp32 dQ accumulator (default mode), and per-block dsink partials (with sinks)."""

    ALIGN = 256

    def __init__(self, problem: Problem, pre_tile_m: int, tile_hdim: int):
        p = problem
        self.parts: list[tuple[str, tuple[int, ...]]] = [("d", p.lse_shape), ("lse2", p.lse_shape)]
        if not p.deterministic:
            accum = (p.heads_q, p.total_q, tile_hdim) if p.layout == "thd" else (
                p.batch, p.heads_q, p.seqlen_q, tile_hdim)
            self.parts.append(("dq_accum", accum))
        if p.has_sinks:
            self.parts.append(("dsink_partial", (p.heads_q, p.batch * math.ceil(p.seqlen_q / pre_tile_m))))
        self.offsets = {}
        offset = 0
        for name, shape in self.parts:
            self.offsets[name] = offset
            offset += -(-4 * math.prod(shape) // self.ALIGN) * self.ALIGN
        self.nbytes = offset

    def carve(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        views = {}
        for name, shape in self.parts:
            start = self.offsets[name]
            views[name] = buffer[start : start + 4 * math.prod(shape)].view(torch.float32).view(shape)
        return views


class _Sm80BackwardPlan(Plan):
    def __init__(self, problem: Problem, pre, main, dq, compiled_pre, compiled_main, compiled_dq):
        super().__init__(problem)
        self.params = (pre, main, dq)
        self._pre, self._main, self._dq = compiled_pre, compiled_main, compiled_dq
        self._workspace = _Workspace(problem, pre.tile_m, main.tile_hdim)

    @property
    def workspace_bytes(self) -> int:
        return self._workspace.nbytes

    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        from frost.kernels.sm80.compile import launch_bwd

        p, t = self.problem, tensors
        grads = Grads(*out) if out is not None else allocate_backward(p, t)
        if workspace is None:
            workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=t.q.device)
        scratch = self._workspace.carve(workspace)
        staged = [g if _vector_aligned(g) else torch.empty(g.shape, dtype=g.dtype, device=g.device)
                  for g in grads[:3]]
        launch_bwd(
            self._pre, self._main, self._dq, t, *staged, grads.dsinks, scratch,
            scale=p.scale, window_left=p.window_left, window_right=p.window_right,
            max_seqlen_q=p.seqlen_q, max_seqlen_k=p.seqlen_k,
        )
        for kernel_out, given, rows in zip(staged, grads[:3], (t.cu_seqlens_q, t.cu_seqlens_k, t.cu_seqlens_k)):
            if kernel_out is not given:
                _copy_rows(p.layout, rows, kernel_out, given)
        return grads


def _copy_rows(layout: str, cu_seqlens, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy what a kernel wrote; packed rows past cu_seqlens[-1] stay untouched in ``dst``."""
    if layout == "thd":
        end = int(cu_seqlens[-1])
        dst[:end].copy_(src[:end])
    else:
        dst.copy_(src)
