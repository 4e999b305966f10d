"""The records of one attention call: what it asks for (Problem), what it was given
(Tensors), and what a backward returns (Grads).

``prepare`` is the single entry that turns a call's arguments into these records:
it splits the keywords, has ``frost.validation`` reject bad input with a ValueError,
and builds a Problem that holds facts only (shapes, layout, dtype, masks, features),
never tensors and never a judgement of support. Engines read the Problem to decide
whether a call is theirs; plans read the Tensors to run it.

The Problem is canonical: two calls that mean the same thing build equal Problems,
so routing and compile caches see one problem, not two spellings of it:

- ``causal=True`` is ``window_right = 0``, and a window with ``window_right = 0`` is
  causal;
- without any window bound the alignment is irrelevant and reads ``top_left``; so it
  does for dense inputs without padding and ``Sq == Sk``, where both alignments
  coincide;
- ``scale=None`` resolves to ``1 / sqrt(head_dim_qk)``;
- a window side at least as wide as the longest sequence is no bound (-1);
- for packed (THD) inputs ``seqlen_q`` / ``seqlen_k`` are the longest sequence, or
  the ``max_seqlen_q`` / ``max_seqlen_k`` given by the caller (validated to be at
  least the longest), and ``batch`` leaves out trailing sequences empty on both sides.
  Computing the longest sequence, like the other checks of cu_seqlens and seqlens, reads
  those tensors on the host: one device-to-host copy per call for packed or padded inputs
  (a call traced by torch.compile reads them only where its launch needs them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from frost import validation
from frost.records import Grads, Options, Tensors  # noqa: F401  (frost.problem.Grads etc. stay importable)

DIRECTIONS = ("forward", "backward")

# Feature tags, in the order reports and decline reasons list them, with the words
# a person reads in a decline reason.
FEATURES = {
    "thd": "packed (THD) layout with cu_seqlens",
    "padding": "dense padding (seqlens_q / seqlens_k)",
    "gqa": "grouped-query attention (1 < Hkv < Hq)",
    "mqa": "multi-query attention (Hkv == 1 < Hq)",
    "causal": "causal masking",
    "bottom_right": "bottom-right mask alignment",
    "window": "sliding window",
    "bias": "additive bias",
    "sinks": "attention sinks",
    "rope": "fused RoPE",
    "dqk_ne_dv": "head_dim_qk != head_dim_v",
    "strided": "non-contiguous inputs",
}


@dataclass(frozen=True)
class BiasSpec:
    """The facts of an additive bias: its shape ``[B|1, Hq|1, Sq, Sk]`` and dtype.

    A dimension of size 1 is broadcast (read with stride 0). For packed input the
    last two extents cover the longest sequence and are indexed by in-sequence
    positions.
    """

    shape: tuple[int, int, int, int]
    dtype: torch.dtype
    unit_last_stride: bool = True  # whether keys are adjacent in memory (what the SM80 kernels read)
    grad: bool = True  # backward: whether its gradient is wanted (``bias_grad``; False: dbias is None)

    @property
    def broadcast_batch(self) -> bool:
        return self.shape[0] == 1

    @property
    def broadcast_heads(self) -> bool:
        return self.shape[1] == 1


@dataclass(frozen=True)
class Problem:
    """What one call asks for: facts only, hashable, equal for equal calls."""

    direction: str  # "forward" | "backward"
    layout: str  # "bshd" | "thd"
    dtype: torch.dtype  # io dtype of q, k, v (o, do)
    device: str  # e.g. "cpu", "cuda:0"
    batch: int  # B, or the number of packed sequences
    seqlen_q: int  # Sq, or max_seqlen_q for thd
    seqlen_k: int  # Sk, or max_seqlen_k for thd
    total_q: int | None  # thd: rows of q (Tq), else None
    total_k: int | None  # thd: rows of k and v (Tk), else None
    heads_q: int
    heads_kv: int
    head_dim_qk: int
    head_dim_v: int
    scale: float
    causal: bool
    causal_align: str  # "top_left" | "bottom_right"
    window_left: int  # -1: unbounded
    window_right: int  # -1: unbounded; 0 when causal
    has_seqlens: bool  # dense padding
    bias: BiasSpec | None
    has_sinks: bool
    has_rope: bool
    deterministic: bool  # backward only
    strided: bool  # some input tensor is not contiguous
    vector_aligned: bool  # every input's data pointer and strides but the last are multiples of 16 bytes

    @classmethod
    def from_call(cls, direction: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **keywords: Any) -> Problem:
        """Validate a call's arguments and return its Problem (see ``prepare``)."""
        return prepare(direction, q, k, v, **keywords)[0]

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def group_size(self) -> int:
        """Query heads per kv head."""
        return self.heads_q // self.heads_kv

    @property
    def features(self) -> frozenset[str]:
        tags = set()
        if self.layout == "thd":
            tags.add("thd")
        if self.has_seqlens:
            tags.add("padding")
        if self.heads_kv == 1 and self.heads_q > 1:
            tags.add("mqa")
        elif self.heads_kv < self.heads_q:
            tags.add("gqa")
        if self.causal:
            tags.add("causal")
        if self.causal_align == "bottom_right":
            tags.add("bottom_right")
        if self.window_left >= 0 or self.window_right > 0:
            tags.add("window")
        if self.bias is not None:
            tags.add("bias")
        if self.has_sinks:
            tags.add("sinks")
        if self.has_rope:
            tags.add("rope")
        if self.head_dim_qk != self.head_dim_v:
            tags.add("dqk_ne_dv")
        if self.strided:
            tags.add("strided")
        return frozenset(tags)

    @property
    def feature_group(self) -> str:
        """The features joined in their canonical order, "dense" when there are none."""
        return "+".join(tag for tag in FEATURES if tag in self.features) or "dense"

    @property
    def o_shape(self) -> tuple[int, ...]:
        if self.layout == "thd":
            return (self.total_q, self.heads_q, self.head_dim_v)
        return (self.batch, self.seqlen_q, self.heads_q, self.head_dim_v)

    @property
    def lse_shape(self) -> tuple[int, ...]:
        if self.layout == "thd":
            return (self.heads_q, self.total_q)
        return (self.batch, self.heads_q, self.seqlen_q)

    def describe(self) -> str:
        """One line for messages and reports, e.g.
        ``forward bf16 bshd B2 Sq64 Sk64 H8/2 D64/64 window(-1,0) gqa+causal``."""
        dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(self.dtype, str(self.dtype))
        extent = f"T{self.total_q}/{self.total_k} " if self.layout == "thd" else ""
        return (
            f"{self.direction} {dtype} {self.layout} B{self.batch} {extent}Sq{self.seqlen_q} "
            f"Sk{self.seqlen_k} H{self.heads_q}/{self.heads_kv} D{self.head_dim_qk}/{self.head_dim_v} "
            f"window({self.window_left},{self.window_right}) {self.feature_group}"
        )


def split_window(window) -> tuple[int, int]:
    """``window`` as two ints, or a ValueError naming it."""
    if type(window) is tuple and len(window) == 2 and type(window[0]) is int and type(window[1]) is int:
        return window  # the usual form, checked in three C calls (a bool is not ``int`` here either)
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window: expected a (left, right) pair of ints, got {window!r}")
    left, right = window
    for value in (left, right):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"window: expected a (left, right) pair of ints, got {window!r}")
    return left, right


def split_rope(rope) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``rope`` as (cos, sin), (None, None) when absent, or a ValueError naming it."""
    if rope is None:
        return None, None
    if not isinstance(rope, (tuple, list)) or len(rope) != 2:
        raise ValueError(f"rope: expected a (cos, sin) pair of tensors, got {type(rope).__name__}")
    return rope[0], rope[1]


def prepare(
    direction: str,
    q,
    k,
    v,
    *,
    o=None,
    lse=None,
    do=None,
    scale=None,
    causal=False,
    causal_align="top_left",
    window=(-1, -1),
    seqlens_q=None,
    seqlens_k=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    bias=None,
    sinks=None,
    rope=None,
    deterministic=False,
    bias_grad=True,
) -> tuple[Problem, Tensors]:
    """Validate one call and build its (Problem, Tensors). Raises ValueError on bad input."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
    rope_cos, rope_sin = split_rope(rope)
    tensors = Tensors(
        q=q, k=k, v=v, o=o, lse=lse, do=do,
        seqlens_q=seqlens_q, seqlens_k=seqlens_k,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        bias=bias, sinks=sinks, rope_cos=rope_cos, rope_sin=rope_sin,
    )  # fmt: skip
    options = Options(
        scale=scale, causal=causal, causal_align=causal_align, window=split_window(window),
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, deterministic=deterministic, bias_grad=bias_grad,
    )  # fmt: skip
    problem, tensors, _ = prepare_records(direction, tensors, options)
    return problem, tensors


def prepare_records(
    direction: str, tensors: Tensors, options: Options
) -> tuple[Problem, Tensors, validation.Extents]:
    """``prepare`` for arguments already gathered into records (rope split, window split).

    Also returns the extents validation derived, which ``frost.plans`` keys on.
    """
    extents = validation.validate(direction, tensors, options)
    problem = _build(direction, tensors, options, extents)
    return problem, bind_lengths(problem, tensors), extents


def _build(direction: str, t: Tensors, options: Options, extents: validation.Extents) -> Problem:
    q, k, v = t.q, t.k, t.v
    window_left, window_right = _normalized_window(options.window, extents)
    causal = options.causal or window_right == 0
    if causal:
        window_right = 0
    align = options.causal_align
    unmasked = window_left < 0 and window_right < 0
    coincide = extents.layout == "bshd" and t.seqlens_q is None and t.seqlens_k is None and (
        extents.seqlen_q == extents.seqlen_k
    )
    if unmasked or coincide:
        align = "top_left"
    head_dim_qk = q.shape[-1]
    scale = float(options.scale) if options.scale is not None else 1.0 / math.sqrt(head_dim_qk)
    read = [q, k, v] + ([t.o, t.do] if direction == "backward" else [])
    return Problem(
        direction=direction,
        layout=extents.layout,
        dtype=q.dtype,
        device=str(q.device),
        batch=extents.batch,
        seqlen_q=extents.seqlen_q,
        seqlen_k=extents.seqlen_k,
        total_q=q.shape[0] if extents.layout == "thd" else None,
        total_k=k.shape[0] if extents.layout == "thd" else None,
        heads_q=q.shape[-2],
        heads_kv=k.shape[-2],
        head_dim_qk=head_dim_qk,
        head_dim_v=v.shape[-1],
        scale=scale,
        causal=causal,
        causal_align=align,
        window_left=window_left,
        window_right=window_right,
        has_seqlens=t.seqlens_q is not None or t.seqlens_k is not None,
        bias=BiasSpec(tuple(t.bias.shape), t.bias.dtype, t.bias.shape[-1] <= 1 or t.bias.stride(-1) == 1,
                      grad=bool(options.bias_grad)) if t.bias is not None else None,
        has_sinks=t.sinks is not None,
        has_rope=t.rope_cos is not None,
        deterministic=bool(options.deterministic),
        strided=not all(x.is_contiguous() for x in read),
        vector_aligned=all(_vector_aligned(x) for x in read),
    )


def _normalized_window(window: tuple[int, int], extents: validation.Extents) -> tuple[int, int]:
    """A side at least as wide as the longest extent is no bound (-1), as SEMANTICS.md says.

    With i < Sq_b and j < Sk_b, ``j >= i + delta - left`` holds for every pair once
    ``left >= max(Sq, Sk)`` (delta is 0 or Sk_b - Sq_b), and likewise the right side, so the
    Problem routes like an unbounded window and no engine meets an int beyond int64.
    ``max(..., 1)`` keeps ``right = 0`` (causal) causal on empty sequences.
    """
    widest = max(extents.seqlen_q, extents.seqlen_k, 1)
    return tuple(-1 if side >= widest else side for side in window)


def _vector_aligned(x: torch.Tensor) -> bool:
    """16-byte vector loads can address every row: the pointer and the outer strides are aligned."""
    size = x.element_size()
    return x.data_ptr() % 16 == 0 and all(stride * size % 16 == 0 for stride in x.stride()[:-1])


def bind_lengths(problem: Problem, t: Tensors) -> Tensors:
    """The call's length tensors as plans read them: dense padding given for one side only gets
    the full length on the other; packed cu_seqlens are cut to the problem's sequences (their
    trailing sequences empty on both sides are not launched, ``frost.validation``)."""
    if problem.layout == "thd":
        if t.cu_seqlens_q.shape[0] == problem.batch + 1:
            return t
        return replace(t, cu_seqlens_q=t.cu_seqlens_q[: problem.batch + 1],
                       cu_seqlens_k=t.cu_seqlens_k[: problem.batch + 1])  # fmt: skip
    if not problem.has_seqlens or (t.seqlens_q is not None and t.seqlens_k is not None):
        return t
    def full(extent: int) -> torch.Tensor:
        return torch.full((problem.batch,), extent, dtype=torch.int32, device=t.q.device)
    return replace(
        t,
        seqlens_q=t.seqlens_q if t.seqlens_q is not None else full(problem.seqlen_q),
        seqlens_k=t.seqlens_k if t.seqlens_k is not None else full(problem.seqlen_k),
    )
