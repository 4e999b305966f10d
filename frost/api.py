"""frost's functional API: ``sdpa_forward``, ``sdpa_backward`` and ``route``.

Each call is gathered into its records (``frost.records``: Tensors, Options) and handed
to ``frost.plans``: a call seen before goes straight to its cached plan (the values of
seqlens / cu_seqlens and ``out=`` still checked), a new one is prepared
(``frost.problem``: validation, then the Problem), routed and compiled
(``frost.dispatch``). These
functions are not differentiable (engines run under ``torch.no_grad``); the
differentiable entry is ``frost.attention`` (``frost.ops``).

Keywords, shared by every entry (SEMANTICS.md has the meaning):
scale, causal, causal_align ("top_left" | "bottom_right"), window=(left, right),
seqlens_q / seqlens_k (dense padding), cu_seqlens_q / cu_seqlens_k (packed THD),
max_seqlen_q / max_seqlen_k (packed; default: the longest sequence, read on the host),
bias, sinks, rope=(cos, sin), engine (force one engine by name).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor

from frost import dispatch, plans
from frost.dispatch import Decision
from frost.engines.base import allocate_backward, allocate_forward
from frost.problem import Grads, prepare, split_rope, split_window
from frost.records import Options, Tensors

CausalAlign = Literal["top_left", "bottom_right"]
Direction = Literal["forward", "backward"]


def sdpa_forward(
    q: Tensor, k: Tensor, v: Tensor, *,
    scale: float | None = None, causal: bool = False, causal_align: CausalAlign = "top_left",
    window: tuple[int, int] = (-1, -1),
    seqlens_q: Tensor | None = None, seqlens_k: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    bias: Tensor | None = None, sinks: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
    engine: str | None = None, out: tuple[Tensor, Tensor] | None = None, deterministic: bool = False,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Attention forward: ``(o, lse)``. ``out=(o, lse)`` writes into preallocated tensors.

    ``deterministic`` is the backward's keyword; it is taken here only so that passing it
    gets validation's ValueError naming it rather than a TypeError.
    """
    # split in prepare's order, so a bad rope is reported before a bad window
    rope_cos, rope_sin = split_rope(rope)
    tensors = Tensors(q, k, v, None, None, None, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k,
                      bias, sinks, rope_cos, rope_sin)  # fmt: skip
    options = Options(scale, causal, causal_align, split_window(window), max_seqlen_q, max_seqlen_k,
                      deterministic)
    return serve("forward", tensors, options, engine, out)


def sdpa_backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, *,
    scale: float | None = None, causal: bool = False, causal_align: CausalAlign = "top_left",
    window: tuple[int, int] = (-1, -1),
    seqlens_q: Tensor | None = None, seqlens_k: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    bias: Tensor | None = None, sinks: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
    deterministic: bool = False, engine: str | None = None, out: Grads | None = None, bias_grad: bool = True,
) -> Grads:  # fmt: skip
    """Attention backward: ``Grads(dq, dk, dv, dbias, dsinks)``, None where absent.

    ``bias_grad=False`` computes no dbias (None): for a bias that takes no gradient, such as
    a fixed mask, it saves dbias's work and memory. ``out=Grads(...)`` writes into
    preallocated tensors (dbias iff bias and bias_grad, dsinks iff sinks).
    """
    rope_cos, rope_sin = split_rope(rope)
    tensors = Tensors(q, k, v, o, lse, do, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k,
                      bias, sinks, rope_cos, rope_sin)  # fmt: skip
    options = Options(scale, causal, causal_align, split_window(window), max_seqlen_q, max_seqlen_k, deterministic,
                      bias_grad)
    return serve("backward", tensors, options, engine, out)


def serve(direction: str, tensors: Tensors, options: Options, engine=None, out=None):
    """Serve one call given as records (``frost.ops`` calls this; the functions above
    gather their arguments into them). Validates, like every entry."""
    if isinstance(tensors.q, Tensor) and tensors.q.is_meta:
        return _shapes_only(direction, tensors, options, engine, out)
    # Engines run without autograd; entering no_grad only when needed saves its cost on
    # calls already under no_grad (the custom ops' implementations are) and on calls without
    # ``out`` whose tensors take no gradient (nothing computed from them records a graph).
    t = tensors  # (integer sequence lengths take no gradient; a non-tensor is answered False)
    floating = (t.q, t.k, t.v, t.o, t.lse, t.do, t.bias, t.sinks, t.rope_cos, t.rope_sin)
    if not torch.is_grad_enabled() or (out is None and not torch._C._any_requires_grad(*floating)):
        return plans.cache.serve(direction, tensors, options, engine, out)
    with torch.no_grad():
        return plans.cache.serve(direction, tensors, options, engine, out)


def _shapes_only(direction: str, tensors: Tensors, options: Options, engine, out):
    """A call on meta tensors (a model built there to count shapes or FLOPs): validated and
    routed like any other, then only its outputs, on the meta device (or ``out`` as given).
    Nothing runs and the ledger records nothing, as with the operators' fake implementations
    that ``frost.attention`` takes there. Packed and padded calls still need their sequence
    lengths' values, which the meta device does not hold: validation says so."""
    served, tensors, out, _ = plans.cache.plan(direction, tensors, options, engine, out)
    if out is not None:
        return out
    if direction == "forward":
        return allocate_forward(served.problem, zero=False)
    return allocate_backward(served.problem, tensors, zero=False)


def route(
    q: Tensor, k: Tensor, v: Tensor, *,
    scale: float | None = None, causal: bool = False, causal_align: CausalAlign = "top_left",
    window: tuple[int, int] = (-1, -1),
    seqlens_q: Tensor | None = None, seqlens_k: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    bias: Tensor | None = None, sinks: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
    deterministic: bool = False, engine: str | None = None, direction: Direction = "forward",
) -> Decision:  # fmt: skip
    """Which engine would serve this call and why each one ranked before it declined.

    Validates like a real call but runs nothing and records nothing. For
    ``direction="backward"`` the problem is the backward of these inputs (o, lse and
    do are not needed to route it).
    """
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction: expected 'forward' or 'backward', got {direction!r}")
    if not isinstance(deterministic, bool) or (deterministic and direction == "forward"):
        raise ValueError(f"deterministic: a bool, and only the backward takes it; got {deterministic!r}")
    problem, _ = prepare(
        "forward", q, k, v,
        scale=scale, causal=causal, causal_align=causal_align, window=window,
        seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, bias=bias, sinks=sinks, rope=rope,
    )  # fmt: skip
    if direction == "backward":
        problem = dataclasses.replace(problem, direction="backward", deterministic=deterministic)
    return dispatch.route(problem, engine=engine)
