"""frost's torch.library registration and the differentiable ``attention``.

Two operators wrap the functional API: ``frost::sdpa_forward`` (returns o and lse)
and ``frost::sdpa_backward`` (returns dq, dk, dv, dbias, dsinks). Each has a fake
implementation that only derives output shapes, so ``torch.compile`` traces them
without running an engine; the forward's autograd formula calls the backward op, so a
compiled graph's backward is an op too. Eager calls of ``attention`` skip the operators
(``_eager``): the same autograd formula calls the implementations directly. ``lse`` is an
auxiliary output and carries no gradient.

Why they are registered by hand (``Library.define`` / ``impl``) and not with
``torch.library.custom_op``: measured on a CPU, custom_op's wrappers cost about 4x the
call they wrap at a tiny shape. Its autograd kernel refills every schema default on
each call (``fill_defaults``, quadratic in the argument count: 20 arguments were
~150 us per forward), and its backend kernel is wrapped to disable dynamo and to
check aliasing on every call. Here the Autograd kernel is a plain
``torch.autograd.Function`` that redispatches below autograd, as custom_op's does, and
the backend kernel calls ``frost.api`` directly.

Schemas are short: the tensors (each optional one its own ``Tensor?``; a list would
cost a pytree pass per call), ``max_seqlen_q`` / ``max_seqlen_k`` (``SymInt?``: under
``torch.compile`` a packed batch's longest sequence may be a symbolic size, which no
constant table can hold) and one ``int settings``, the index of the call's static
keywords (scale, causal, causal_align, window, deterministic, engine, and whether the call
was traced) in a process-wide side table. Under ``torch.compile`` the index is computed at trace
time and baked into the graph as a constant, so a compiled graph is only meaningful in
the process that traced it (what torch.compile does anyway); the table only grows, and
with the distinct settings a program uses, so an index never changes meaning. Values
are kept as given, so bad ones reach ``frost.validation`` and raise its ValueError.
An absent dbias or dsinks travels as an empty tensor that the autograd formula turns
back into None.

A call traced by ``torch.compile`` runs with ``Options.check_lengths=False``: once its
signature was validated, the values of seqlens / cu_seqlens are not read back on later
calls where the launch does not need them (``frost.validation.check_values``), so a
compiled step does not wait for the device in every layer.
"""
from __future__ import annotations

import math
import threading
from typing import NamedTuple

import torch
from torch import Tensor

from frost import api, dispatch, plans
from frost.api import CausalAlign
from frost.problem import split_rope, split_window
from frost.records import Options, Tensors

# The optional tensors after the leading ones, in the order both schemas list them.
OPTIONAL_TENSORS = ("bias", "sinks", "seqlens_q", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k", "rope_cos", "rope_sin")
_OPTIONALS = ", ".join(f"Tensor? {name}" for name in OPTIONAL_TENSORS) + ", SymInt? max_seqlen_q, SymInt? max_seqlen_k"

_lib = torch.library.Library("frost", "FRAGMENT")
_lib.define(f"sdpa_forward(Tensor q, Tensor k, Tensor v, {_OPTIONALS}, int settings) -> (Tensor, Tensor)")
_lib.define(
    f"sdpa_backward(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, {_OPTIONALS}, int settings)"
    " -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


class Settings(NamedTuple):
    """The static keywords of one ``attention`` call, as given: each direction's Options
    (their ``max_seqlen_*`` travel apart, as the ops' SymInt arguments)."""

    forward: Options
    backward: Options  # the same, with deterministic and bias_grad
    engine: str | None


_settings: list[Settings] = []
_settings_index: dict[tuple, int] = {}
_settings_lock = threading.Lock()


@torch.compiler.assume_constant_result
def settings_id(scale, causal, causal_align, window_left, window_right, deterministic, engine, bias_grad=True,
                traced=False) -> int:  # fmt: skip
    """The side-table index of these settings (the ops' ``settings`` argument), added if new.
    ``traced``: the call is being traced by torch.compile (its Options get ``check_lengths=False``).

    Raises TypeError for an unhashable value (no valid call has one; ``attention``
    then lets validation name it).
    """
    values = (scale, causal, causal_align, window_left, window_right, deterministic, engine, bias_grad, traced)
    # type-tagged: 1 and True hash alike, and validation accepts only one of them
    key = (values, tuple(map(type, values)))
    index = _settings_index.get(key)
    if index is not None:
        return index
    forward = Options(scale, causal, causal_align, (window_left, window_right), None, None, False,
                      check_lengths=not traced)  # fmt: skip
    with _settings_lock:
        index = _settings_index.get(key)
        if index is None:
            index = len(_settings)
            _settings.append(Settings(forward, forward._replace(deterministic=deterministic, bias_grad=bias_grad),
                                      engine))
            _settings_index[key] = index
    return index


def _tensors(q, k, v, bias, sinks, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k, rope_cos, rope_sin,
             o=None, lse=None, do=None) -> Tensors:  # fmt: skip
    return Tensors(q, k, v, o, lse, do, seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k, bias, sinks,
                   rope_cos, rope_sin)  # fmt: skip


def _unpack(rest, direction: str):
    """The ops' trailing arguments (optional tensors, max_seqlen_q / _k, settings index) as
    ``(optional tensors, Options, engine)``."""
    *optional, max_seqlen_q, max_seqlen_k, index = rest
    settings = _settings[index]
    options = settings.forward if direction == "forward" else settings.backward
    if max_seqlen_q is not None or max_seqlen_k is not None:
        options = options._replace(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    return optional, options, settings.engine


def _forward_kernel(q, k, v, *rest):
    optional, options, engine = _unpack(rest, "forward")
    return api.serve("forward", _tensors(q, k, v, *optional), options, engine)


def _backward_kernel(do, q, k, v, o, lse, *rest):
    optional, options, engine = _unpack(rest, "backward")
    grads = api.serve("backward", _tensors(q, k, v, *optional, o=o, lse=lse, do=do), options, engine)

    def or_absent(grad):  # a fresh empty tensor each: outputs may not alias
        return q.new_empty(0, dtype=torch.float32) if grad is None else grad

    return grads.dq, grads.dk, grads.dv, or_absent(grads.dbias), or_absent(grads.dsinks)


_lib.impl("sdpa_forward", _forward_kernel, "CompositeExplicitAutograd")
_lib.impl("sdpa_backward", _backward_kernel, "CompositeExplicitAutograd")
_FORWARD = torch.ops.frost.sdpa_forward.default
_BACKWARD = torch.ops.frost.sdpa_backward.default


@torch.library.register_fake("frost::sdpa_forward")
def _forward_fake(q, k, v, *optional_and_settings):
    o = q.new_empty((*q.shape[:-1], v.shape[-1]))
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
    return o, q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.register_fake("frost::sdpa_backward")
def _backward_fake(do, q, k, v, o, lse, bias, sinks, *rest):
    def grad_of(x):
        return q.new_empty(0, dtype=torch.float32) if x is None else x.new_empty(x.shape)

    dbias = grad_of(bias if _settings[rest[-1]].backward.bias_grad else None)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias, grad_of(sinks)


_NO_DOUBLE_BACKWARD = "frost::sdpa_backward: has no autograd formula (double backward is not supported)"


def _eager(q, k, v) -> bool:
    """Whether this call may skip the dispatcher: plain tensors off the meta device, no mode
    or transform that the operators exist to meet (torch.compile, fake tensors, functorch,
    tensor subclasses). Meta tensors take the operators' shape-only implementations."""
    return (
        not torch.compiler.is_compiling()  # first: dynamo folds it, and traces nothing after it
        and type(q) in plans.PLAIN and type(k) in plans.PLAIN and type(v) in plans.PLAIN
        and not q.is_meta
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
    )


class _Attention(torch.autograd.Function):
    """The forward op's autograd formula: saves what the backward op reads.

    ``direct`` (eager calls, see ``_eager``) runs both directions' kernels without the
    operators: on a small problem each dispatcher round trip of a Python operator, its
    arguments boxed both ways, costs about what the kernel launch costs, and autograd runs
    the backward on its own device thread where host work is dearer still. So the direct
    backward also skips its plan lookup: the forward's plan hands it the backward plan it
    led to before (``PlanCache.serve_backward_of``). Traced calls go through the
    operators, so a compiled graph holds them.

    The tensors that take no gradient (seqlens, cu_seqlens, RoPE tables), max_seqlen_q / _k and
    the settings index travel as one tuple, ``rest``: every argument of ``apply`` costs autograd
    a pass.
    """

    @staticmethod
    def forward(ctx, direct, q, k, v, bias, sinks, rest):
        *optional, max_seqlen_q, max_seqlen_k, index = rest
        if direct:  # autograd runs this under no_grad already
            _, options, engine = _unpack(rest, "forward")
            served, tensors, _, _ = plans.cache.plan("forward", _tensors(q, k, v, bias, sinks, *optional), options,
                                                     engine)  # fmt: skip
            o, lse = dispatch.run(served, tensors)
            ctx.served = served
        else:
            with torch._C._AutoDispatchBelowAutograd():
                o, lse = _FORWARD(q, k, v, bias, sinks, *rest)
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # lse's gradient is never read: no zeros for it
        ctx.direct, ctx.scalars = direct, (max_seqlen_q, max_seqlen_k, index)
        ctx.save_for_backward(q, k, v, o, lse, bias, sinks, *optional)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        if grad_o is None:
            return (None,) * 7
        q, k, v, o, lse, bias, sinks, *optional = ctx.saved_tensors
        if grad_o.stride(-1) != 1:  # e.g. the stride-0 gradient of o.sum()
            grad_o = grad_o.contiguous()
        if ctx.direct:
            tensors = _tensors(q, k, v, bias, sinks, *optional, o=o, lse=lse, do=grad_o)
            if not torch.is_grad_enabled():  # autograd turns it off unless create_graph=True
                grads = _direct_backward(ctx, tensors)
            elif torch._C._any_requires_grad(grad_o, q, k, v, bias, sinks):
                raise RuntimeError(_NO_DOUBLE_BACKWARD)
            else:
                with torch.no_grad():
                    grads = _direct_backward(ctx, tensors)
            return None, grads.dq, grads.dk, grads.dv, grads.dbias, grads.dsinks, None
        dq, dk, dv, dbias, dsinks = _BACKWARD(grad_o, q, k, v, o, lse, bias, sinks, *optional, *ctx.scalars)
        dbias = dbias if bias is not None and _settings[ctx.scalars[-1]].backward.bias_grad else None
        return None, dq, dk, dv, dbias, dsinks if sinks is not None else None, None


# Function.apply's Python wrapper, skipped by eager calls (no functorch transform active, which
# _eager checks): of what it does per call only the unwrapping of dead functorch wrappers
# (tensors that outlived their transform) applies, and _apply_direct does that itself.
_apply = super(torch.autograd.Function, _Attention).apply
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _apply_direct(q, k, v, bias, sinks, rest):
    bias = bias if bias is None else _unwrap_if_dead(bias)
    sinks = sinks if sinks is None else _unwrap_if_dead(sinks)
    return _apply(True, _unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v), bias, sinks, rest)


def _direct_backward(ctx, tensors: Tensors):
    _, options, engine = _unpack(ctx.scalars, "backward")
    return plans.cache.serve_backward_of(ctx.served, ctx.scalars[-1], tensors, options, engine)


def _forward_autograd(q, k, v, bias, sinks, *rest):
    if torch.is_grad_enabled() and torch._C._any_requires_grad(q, k, v, bias, sinks):
        return _Attention.apply(False, q, k, v, bias, sinks, rest)
    with torch._C._AutoDispatchBelowAutograd():
        return _FORWARD(q, k, v, bias, sinks, *rest)


def _backward_autograd(*args):
    if torch.is_grad_enabled() and torch._C._any_requires_grad(*args):
        raise RuntimeError(_NO_DOUBLE_BACKWARD)
    with torch._C._AutoDispatchBelowAutograd():
        return _BACKWARD(*args)


_lib.impl("sdpa_forward", _forward_autograd, "Autograd")
_lib.impl("sdpa_backward", _backward_autograd, "Autograd")


_AUTOCAST_DEVICES = ("cpu", "cuda")
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _autocast(q, k, v, bias):
    """Under autocast, q, k and v in autocast's dtype, as torch's sdpa (on autocast's list of
    ops that run in the lower precision) gets them; casts are differentiable, so gradients
    reach the float32 leaves in float32. A bias in float32 stays (frost takes it as given),
    one in the other half dtype is cast too; sinks and RoPE tables are float32 by contract."""
    if not torch._C._is_any_autocast_enabled() or not isinstance(q, Tensor):  # one C call off autocast
        return q, k, v, bias
    device = q.device.type
    if device not in _AUTOCAST_DEVICES:
        return q, k, v, bias
    if not torch.is_autocast_enabled(device) or torch.get_autocast_dtype(device) not in _HALF_DTYPES:
        return q, k, v, bias
    dtype = torch.get_autocast_dtype(device)

    def cast(x):
        return x.to(dtype) if isinstance(x, Tensor) and x.is_floating_point() and x.dtype != dtype else x

    if isinstance(bias, Tensor) and bias.dtype in _HALF_DTYPES:
        bias = cast(bias)
    return cast(q), cast(k), cast(v), bias


def attention(
    q: Tensor, k: Tensor, v: Tensor, *,
    scale: float | None = None, causal: bool = False, causal_align: CausalAlign = "top_left",
    window: tuple[int, int] = (-1, -1),
    seqlens_q: Tensor | None = None, seqlens_k: Tensor | None = None,
    cu_seqlens_q: Tensor | None = None, cu_seqlens_k: Tensor | None = None,
    max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
    bias: Tensor | None = None, sinks: Tensor | None = None, rope: tuple[Tensor, Tensor] | None = None,
    deterministic: bool = False, engine: str | None = None, return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """Differentiable attention: ``o``, or ``(o, lse)`` with ``return_lse=True`` (lse carries no
    gradient). Gradients flow to q, k, v, bias and sinks (a bias that does not require grad
    gets none computed: no dbias work in the backward).

    Keywords as ``frost.sdpa_forward``; ``deterministic`` applies to its backward, and
    ``engine`` names an engine family and forces both directions. Works under
    ``torch.compile``, where ``max_seqlen_q`` / ``max_seqlen_k`` may be symbolic sizes.
    Under autocast, q, k and v run in autocast's dtype, as sdpa's do.
    """
    q, k, v, bias = _autocast(q, k, v, bias)
    window_left, window_right = split_window(window)
    rope_cos, rope_sin = split_rope(rope)
    try:
        if not (_size_or_none(max_seqlen_q) and _size_or_none(max_seqlen_k)):
            raise TypeError("max_seqlen_q / max_seqlen_k")  # the ops' SymInt? arguments would refuse it unnamed
        if isinstance(scale, float):
            # the identity, which dynamo evaluates to a constant: under dynamic shapes a float read from a
            # module attribute is a lazy constant that assume_constant_result cannot take as it is
            scale = math.ldexp(scale, 0)
        settings = settings_id(scale, causal, causal_align, window_left, window_right, deterministic, engine,
                               not isinstance(bias, Tensor) or bias.requires_grad,
                               torch.compiler.is_compiling())  # fmt: skip
    except TypeError:  # an unhashable or mistyped keyword, which no valid call has: let validation name it
        api.route(
            q, k, v, scale=scale, causal=causal, causal_align=causal_align, window=window,
            seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, bias=bias, sinks=sinks, rope=rope,
            deterministic=deterministic, engine=engine, direction="backward",
        )  # fmt: skip
        raise
    rest = (seqlens_q, seqlens_k, cu_seqlens_q, cu_seqlens_k, rope_cos, rope_sin, max_seqlen_q, max_seqlen_k, settings)
    if not _eager(q, k, v):
        result = _FORWARD(q, k, v, bias, sinks, *rest)
    elif torch.is_grad_enabled() and torch._C._any_requires_grad(q, k, v, bias, sinks):
        result = _apply_direct(q, k, v, bias, sinks, rest)
    else:
        result = _forward_kernel(q, k, v, bias, sinks, *rest)
    return result if return_lse else result[0]


def _size_or_none(value) -> bool:
    """Whether ``value`` fits an op's ``SymInt?`` argument: None, an int (not a bool) or a SymInt."""
    return value is None or (isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool))
