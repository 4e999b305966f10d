"""frost's torch.library registration and the differentiable ``attention``.

Two custom ops wrap the functional API: ``frost::sdpa_forward`` (returns o and lse)
and ``frost::sdpa_backward`` (returns dq, dk, dv, dbias, dsinks). Each has a fake
(meta) implementation that only derives output shapes, so ``torch.compile`` traces
them without running an engine, and the forward's autograd formula calls the backward
op, so a compiled graph's backward is an op too. ``lse`` is an auxiliary output and
carries no gradient.

Custom-op schemas take no tuples of tensors nor optional outputs: ``window`` travels
as two ints, ``rope`` as two optional tensors, and an absent dbias or dsinks as an
empty tensor that the autograd formula turns back into None.
"""
from __future__ import annotations

import torch
from torch import Tensor

from frost import api
from frost.problem import split_rope, split_window

# The arguments after the leading tensors, in the order both ops' schemas list them.
KEYWORDS = (
    "scale", "causal", "causal_align", "window_left", "window_right", "seqlens_q", "seqlens_k",
    "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "bias", "sinks",
    "rope_cos", "rope_sin", "deterministic", "engine",
)  # fmt: skip


def _argument(name, args, kwargs):
    """One of ``KEYWORDS`` as passed, positionally or by name (None when left out)."""
    if name in kwargs:
        return kwargs[name]
    position = KEYWORDS.index(name)
    return args[position] if position < len(args) else None


@torch.library.custom_op("frost::sdpa_forward", mutates_args=())
def _sdpa_forward(
    q: Tensor, k: Tensor, v: Tensor,
    scale: float | None = None, causal: bool = False, causal_align: str = "top_left",
    window_left: int = -1, window_right: int = -1,
    seqlens_q: Tensor | None = None, seqlens_k: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    bias: Tensor | None = None, sinks: Tensor | None = None,
    rope_cos: Tensor | None = None, rope_sin: Tensor | None = None,
    deterministic: bool = False, engine: str | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    # deterministic is the backward's: it rides along for the autograd formula.
    return api.sdpa_forward(
        q, k, v, scale=scale, causal=causal, causal_align=causal_align, window=(window_left, window_right),
        seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, bias=bias, sinks=sinks,
        rope=None if rope_cos is None and rope_sin is None else (rope_cos, rope_sin), engine=engine,
    )  # fmt: skip


@_sdpa_forward.register_fake
def _sdpa_forward_fake(q, k, v, *args, **kwargs):
    o = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
    return o, q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("frost::sdpa_backward", mutates_args=())
def _sdpa_backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
    scale: float | None = None, causal: bool = False, causal_align: str = "top_left",
    window_left: int = -1, window_right: int = -1,
    seqlens_q: Tensor | None = None, seqlens_k: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    bias: Tensor | None = None, sinks: Tensor | None = None,
    rope_cos: Tensor | None = None, rope_sin: Tensor | None = None,
    deterministic: bool = False, engine: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    grads = api.sdpa_backward(
        do, q, k, v, o, lse,
        scale=scale, causal=causal, causal_align=causal_align, window=(window_left, window_right),
        seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, bias=bias, sinks=sinks,
        rope=None if rope_cos is None and rope_sin is None else (rope_cos, rope_sin),
        deterministic=deterministic, engine=engine,
    )  # fmt: skip
    def or_absent(grad):  # a fresh empty tensor each: outputs of a custom op may not alias
        return q.new_empty(0, dtype=torch.float32) if grad is None else grad

    return grads.dq, grads.dk, grads.dv, or_absent(grads.dbias), or_absent(grads.dsinks)


@_sdpa_backward.register_fake
def _sdpa_backward_fake(do, q, k, v, o, lse, *args, **kwargs):
    bias, sinks = _argument("bias", args, kwargs), _argument("sinks", args, kwargs)

    def grad_of(x):
        return q.new_empty(0, dtype=torch.float32) if x is None else x.new_empty(x.shape)

    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), grad_of(bias), grad_of(sinks)


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    keywords = dict(zip(KEYWORDS, inputs[3:]))
    ctx.mark_non_differentiable(output[1])
    ctx.tensor_names = [name for name, value in keywords.items() if isinstance(value, Tensor)]
    ctx.keywords = {name: value for name, value in keywords.items() if not isinstance(value, Tensor)}
    ctx.save_for_backward(q, k, v, *output, *(keywords[name] for name in ctx.tensor_names))


def _backward(ctx, grad_o, grad_lse):
    q, k, v, o, lse, *saved = ctx.saved_tensors
    keywords = dict(ctx.keywords, **dict(zip(ctx.tensor_names, saved)))
    if grad_o.stride(-1) != 1:  # e.g. the stride-0 gradient of o.sum()
        grad_o = grad_o.contiguous()
    dq, dk, dv, dbias, dsinks = torch.ops.frost.sdpa_backward(grad_o, q, k, v, o, lse, **keywords)
    grads = {"bias": dbias, "sinks": dsinks}
    return (dq, dk, dv, *(grads.get(name) if keywords[name] is not None else None for name in KEYWORDS))


_sdpa_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(
    q, k, v, *,
    scale=None, causal=False, causal_align="top_left", window=(-1, -1),
    seqlens_q=None, seqlens_k=None, cu_seqlens_q=None, cu_seqlens_k=None,
    max_seqlen_q=None, max_seqlen_k=None, bias=None, sinks=None, rope=None,
    deterministic=False, engine=None,
) -> Tensor:  # fmt: skip
    """Differentiable attention: ``o``. Gradients flow to q, k, v, bias and sinks.

    Keywords as ``frost.sdpa_forward``; ``deterministic`` applies to its backward, and
    ``engine`` names an engine family and forces both directions. Works under
    ``torch.compile``.
    """
    window_left, window_right = split_window(window)
    rope_cos, rope_sin = split_rope(rope)
    o, _ = torch.ops.frost.sdpa_forward(
        q, k, v, scale, causal, causal_align, window_left, window_right,
        seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        bias, sinks, rope_cos, rope_sin, deterministic, engine,
    )  # fmt: skip
    return o
