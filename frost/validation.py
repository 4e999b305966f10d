"""Rejection of bad input, before any engine sees a call.

Every check raises ValueError whose message starts with the argument's name and
says what was wrong (``"cu_seqlens_q: must start at 0, got 3"``). The checks follow
SEMANTICS.md; they judge the call's arguments, never whether an engine supports
them (that is each engine's ``check_support``).

cu_seqlens and seqlens are read on the host (one device-to-host copy each) to check
their values, to find the longest packed sequence and to leave out trailing sequences that
are empty on both sides (a caller that builds cu_seqlens on the device without knowing how
many sequences there are gives it room for more, as zero-length ones at its end). Those
checks are ``check_values``: a repeated call whose shapes, strides, dtypes and options were
validated before (``frost.plans``) still runs them, since only the values can answer;
except under a CUDA-graph capture, and for calls traced by torch.compile
(``Options.check_lengths=False``) whose launch does not need the values.

This module reads the records of ``frost.records`` and never imports ``frost.problem``
(which imports it).
"""
from __future__ import annotations

import bisect
import math
import operator
from typing import NamedTuple

import torch

from frost.records import TENSOR_FIELDS, Grads, Options, Tensors

IO_DTYPES = (torch.float16, torch.bfloat16)
ALIGNMENTS = ("top_left", "bottom_right")
_F32_MAX = torch.finfo(torch.float32).max


class Extents(NamedTuple):
    """Sizes that validation derives from the arguments."""

    layout: str  # "bshd" | "thd"
    batch: int
    seqlen_q: int  # dense Sq, or max_seqlen_q for thd (given, else the longest sequence)
    seqlen_k: int
    longest_q: int  # the longest valid query sequence (dense: Sq)
    longest_k: int


def validate(direction: str, t: Tensors, options: Options) -> Extents:
    """Check one call; return its extents or raise ValueError naming the argument."""
    _check_tensor_types(t)
    layout = _check_dtypes_and_rank(t)
    _check_devices(t)
    _check_last_dim_strides(t)
    if layout == "bshd":
        extents = _check_dense(t, options)
    else:
        extents = _check_packed(t, options)
    _check_options(options, direction)
    _check_bias(t, extents)
    _check_sinks(t)
    check_rope(t, _positions_read(extents))
    if direction == "backward":
        _check_backward_tensors(t, extents)
    return extents


def check_out(direction: str, out, tensors: Tensors, bias_grad: bool = True):
    """Check preallocated outputs (``out=``) against the call's tensors; return them normalized.

    Forward: ``(o, lse)``. Backward: ``Grads`` (or a 5-tuple) of dq, dk, dv, dbias,
    dsinks, with dbias given iff bias is (and ``bias_grad``) and dsinks iff sinks is. The
    call itself must have passed ``validate``.
    """
    if out is None:
        return None
    q, v = tensors.q, tensors.v
    device, dtype = q.device, q.dtype
    if direction == "forward":
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError("out: expected a (o, lse) pair of tensors for the forward")
        o, lse = out
        lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
        _check_out_tensor("out.o", o, (*q.shape[:-1], v.shape[-1]), dtype, device)
        _check_out_tensor("out.lse", lse, lse_shape, torch.float32, device)
        _check_out_memory((("out.o", o), ("out.lse", lse)), tensors)
        return o, lse
    if not isinstance(out, (tuple, list)) or len(out) != 5:
        raise ValueError("out: expected Grads(dq, dk, dv, dbias, dsinks) for the backward")
    grads = Grads(*out)
    _check_out_tensor("out.dq", grads.dq, tuple(q.shape), dtype, device)
    _check_out_tensor("out.dk", grads.dk, tuple(tensors.k.shape), dtype, device)
    _check_out_tensor("out.dv", grads.dv, tuple(v.shape), dtype, device)
    if not bias_grad and grads.dbias is not None:
        raise ValueError("out.dbias: must be None when bias_grad=False (no dbias is computed)")
    wanted_bias = tensors.bias if bias_grad else None
    for name, source, grad in (("dbias", wanted_bias, grads.dbias), ("dsinks", tensors.sinks, grads.dsinks)):
        if source is None and grad is not None:
            raise ValueError(f"out.{name}: must be None when {name[1:]} is not given")
        if source is not None:
            if grad is None:
                raise ValueError(f"out.{name}: a tensor is required since {name[1:]} is given")
            _check_out_tensor(f"out.{name}", grad, tuple(source.shape), source.dtype, device)
    named = [(f"out.{name}", x) for name, x in zip(Grads._fields, grads) if x is not None]
    _check_out_memory(named, tensors)
    return grads


def _check_out_memory(outputs, tensors: Tensors) -> None:
    """Outputs must not overlap themselves, each other or any input (SEMANTICS.md's inputs
    are read while outputs are written: an alias would be overwritten or read half-written).

    Cheap on every call (a cached plan's too): byte spans compared as ints, the inputs'
    computed once; only spans that intersect (slices interleaved in one buffer, e.g. dq,
    dk, dv of a packed dqkv) get the exact, O(numel) test.
    """
    if tensors.q.device.type == "meta":  # no memory to overlap
        return
    spans = []
    for name, x in outputs:
        if not x.is_contiguous() and _self_overlapping(x):
            raise ValueError(
                f"{name}: its elements overlap in memory (shape {tuple(x.shape)}, strides {tuple(x.stride())}); "
                "an output needs one element per address"
            )
        spans.append((name, x, _span(x)))
    inputs = [(name, y, _span(y)) for name, y in _present(tensors)]
    for index, (name, x, span) in enumerate(spans):
        if span is None:
            continue
        for other, y, other_span in spans[:index]:
            if _overlap(x, span, y, other_span):
                raise ValueError(f"{name}: overlaps {other} in memory; every output needs memory of its own")
        for other, y, other_span in inputs:
            if _overlap(x, span, y, other_span):
                raise ValueError(f"{name}: overlaps the input {other} in memory; out= must not alias an input")


def _span(x: torch.Tensor) -> tuple[int, int] | None:
    """The byte addresses ``[first, last + 1)`` of x's elements; None when it has none."""
    numel = x.numel()
    if numel == 0:
        return None
    start = x.data_ptr()
    if x.is_contiguous():
        return start, start + numel * x.element_size()
    last = sum((n - 1) * stride for n, stride in zip(x.shape, x.stride()))
    return start, start + (last + 1) * x.element_size()


def _self_overlapping(x: torch.Tensor) -> bool:
    """No proof that x's elements have distinct addresses: with the dims sorted by stride,
    each stride must pass the farthest offset the smaller dims reach (torch's own rule)."""
    reach = 0
    for stride, n in sorted((stride, n) for n, stride in zip(x.shape, x.stride()) if n > 1):
        if stride <= reach:
            return True
        reach += (n - 1) * stride
    return False


def _overlap(x: torch.Tensor, x_span, y: torch.Tensor, y_span) -> bool:
    """Whether x and y share a byte: spans first, then byte by byte within their union."""
    if x_span is None or y_span is None or x_span[1] <= y_span[0] or y_span[1] <= x_span[0]:
        return False
    low = min(x_span[0], y_span[0])
    marks = torch.zeros(max(x_span[1], y_span[1]) - low, dtype=torch.uint8, device=x.device)
    _bytes_of(marks, x, low).fill_(1)
    return bool(_bytes_of(marks, y, low).any())


def _bytes_of(marks: torch.Tensor, x: torch.Tensor, low: int) -> torch.Tensor:
    """The bytes of x's elements as a view of ``marks``, whose byte 0 is address ``low``."""
    size = x.element_size()
    return marks.as_strided((*x.shape, size), (*(stride * size for stride in x.stride()), 1), x.data_ptr() - low)


def _check_out_tensor(name, x, shape, dtype, device) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if x.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name}: on {x.device} but the inputs are on {device}")
    check_stride(name, x)


def _present(t: Tensors):
    """(name, tensor) for every tensor argument given, in argument order."""
    for name in TENSOR_FIELDS:
        x = getattr(t, name)
        if x is not None:
            yield ("rope" if name.startswith("rope") else name), x


def _check_tensor_types(t: Tensors) -> None:
    for name in ("q", "k", "v"):
        if getattr(t, name) is None:
            raise ValueError(f"{name}: required, got None")
    for name, x in _present(t):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _check_dtypes_and_rank(t: Tensors) -> str:
    q = t.q
    if q.dtype not in IO_DTYPES:
        raise ValueError(f"q: dtype {q.dtype} is not supported (frost takes torch.float16 or torch.bfloat16)")
    for name in ("k", "v", "o", "do"):
        x = getattr(t, name)
        if x is not None and x.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {x.dtype} does not match q's {q.dtype}")
    if q.dim() not in (3, 4):
        raise ValueError(
            f"q: expected 4 dims [B, Sq, Hq, Dqk] or 3 packed dims [Tq, Hq, Dqk], got shape {tuple(q.shape)}"
        )
    for name in ("k", "v", "o", "do"):
        x = getattr(t, name)
        if x is not None and x.dim() != q.dim():
            raise ValueError(f"{name}: has {x.dim()} dims but q has {q.dim()} (layouts cannot be mixed)")
    return "bshd" if q.dim() == 4 else "thd"


def _check_devices(t: Tensors) -> None:
    device = t.q.device
    for name, x in _present(t):
        if x.device != device:
            raise ValueError(f"{name}: on {x.device} but q is on {device} (mixed devices)")


def check_stride(name: str, x: torch.Tensor) -> None:
    if x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must have stride 1, got strides {tuple(x.stride())}")


def _check_last_dim_strides(t: Tensors) -> None:
    for name in ("q", "k", "v", "o", "lse", "do"):
        x = getattr(t, name)
        if x is not None:
            check_stride(name, x)


def _check_heads(t: Tensors, head_axis: int) -> None:
    q, k, v = t.q, t.k, t.v
    heads_q, heads_kv = q.shape[head_axis], k.shape[head_axis]
    for name, heads in (("q", heads_q), ("k", heads_kv)):
        if heads < 1:
            raise ValueError(f"{name}: head counts must be >= 1, got Hq={heads_q}, Hkv={heads_kv}")
    if v.shape[head_axis] != heads_kv:
        raise ValueError(f"v: has {v.shape[head_axis]} heads but k has {heads_kv}")
    if heads_q % heads_kv != 0:
        raise ValueError(f"k: Hq={heads_q} is not a multiple of Hkv={heads_kv}")
    for name, x in (("q", q), ("v", v)):
        if x.shape[-1] < 1:
            raise ValueError(f"{name}: head dims must be >= 1, got Dqk={q.shape[-1]}, Dv={v.shape[-1]}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k: head dim {k.shape[-1]} does not match q's {q.shape[-1]}")


def _check_int_vector(name: str, x: torch.Tensor, length: int | None) -> list[int]:
    if x.device.type == "meta":  # checked first: tolist() below would raise NotImplementedError
        raise ValueError(f"{name}: on the meta device, which holds no values; frost reads {name} on the host")
    if x.dtype != torch.int32:
        raise ValueError(f"{name}: dtype must be torch.int32, got {x.dtype}")
    if x.dim() != 1:
        raise ValueError(f"{name}: expected a 1-dim tensor, got shape {tuple(x.shape)}")
    if length is not None and x.shape[0] != length:
        raise ValueError(f"{name}: expected {length} entries, got {x.shape[0]}")
    return x.tolist()


def _check_dense(t: Tensors, options: Options) -> Extents:
    q, k, v = t.q, t.k, t.v
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        if getattr(t, name) is not None:
            raise ValueError(f"{name}: only for packed 3-dim inputs; q is 4-dim [B, Sq, Hq, Dqk]")
    for name in ("max_seqlen_q", "max_seqlen_k"):
        if getattr(options, name) is not None:
            raise ValueError(f"{name}: only for packed 3-dim inputs; q is 4-dim [B, Sq, Hq, Dqk]")
    batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    if batch < 1:
        raise ValueError(f"q: batch must be >= 1, got {batch}")
    if k.shape[0] != batch:
        raise ValueError(f"k: batch {k.shape[0]} does not match q's {batch}")
    if v.shape[0] != batch or v.shape[1] != seqlen_k:
        raise ValueError(f"v: shape {tuple(v.shape)} does not match k's [B={batch}, Sk={seqlen_k}, ...]")
    _check_heads(t, head_axis=2)
    return _dense_values(t)


def check_values(layout: str, t: Tensors, options: Options) -> Extents:
    """The checks only the values of seqlens / cu_seqlens can answer, and the extents they give.

    Part of ``validate``; run alone on a call whose every other fact was validated
    before (same shapes, strides, dtypes, devices and options). While the current CUDA
    stream is capturing a graph nothing may be read back to the host, and a traced call
    (``check_lengths=False``) reads nothing that its launch does not need, dense padding and
    packed calls that name both ``max_seqlen_*`` (a compiled step then never waits for the
    device): see ``extents_unread``.
    """
    if capturing(t.q) or not (options.check_lengths or _launch_reads_values(layout, options)):
        return extents_unread(layout, t, options)
    return _dense_values(t) if layout == "bshd" else _packed_values(t, options, options.check_lengths)


def reads_no_values(layout: str, t: Tensors) -> bool:
    """Whether ``check_values`` would read nothing for such a call: dense, without seqlens. Its
    extents are then the shapes' (capturing or not), which a signature already fixes."""
    return layout == "bshd" and t.seqlens_q is None and t.seqlens_k is None


def capturing(x: torch.Tensor) -> bool:
    """Whether ``x``'s CUDA stream is being captured into a graph (never on other devices)."""
    return x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _launch_reads_values(layout: str, options: Options) -> bool:
    """Whether a launch needs values read back: a packed call that does not name its longest
    sequences (the grid covers them) does."""
    return layout == "thd" and (options.max_seqlen_q is None or options.max_seqlen_k is None)


def extents_unread(layout: str, t: Tensors, options: Options) -> Extents:
    """The extents of a call whose values are not read (a CUDA-graph capture, a traced call),
    from shapes and options only.

    The values of seqlens / cu_seqlens are not checked here: reading them would sync with
    the device, which a capture forbids, and a graph replays with whatever those tensors
    hold at replay time anyway (the eager call that must precede the capture checked them
    once; a traced call's first call with its signature did). Packed calls therefore name
    their longest sequences: ``max_seqlen_q`` and ``max_seqlen_k`` are required. The
    longest-sequence fields are None: unknown.
    """
    if layout == "bshd":
        return Extents("bshd", t.q.shape[0], t.q.shape[1], t.k.shape[1], t.q.shape[1], t.k.shape[1])
    for name in ("max_seqlen_q", "max_seqlen_k"):
        given = getattr(options, name)
        if given is None:
            raise ValueError(f"{name}: required for packed inputs while capturing a CUDA graph "
                             "(the longest sequence cannot be read back from the device during a capture)")
    return Extents("thd", t.cu_seqlens_q.shape[0] - 1, options.max_seqlen_q, options.max_seqlen_k, None, None)


def _dense_values(t: Tensors) -> Extents:
    batch, seqlen_q, seqlen_k = t.q.shape[0], t.q.shape[1], t.k.shape[1]
    for name, x, extent in (("seqlens_q", t.seqlens_q, seqlen_q), ("seqlens_k", t.seqlens_k, seqlen_k)):
        if x is None:
            continue
        values = _check_int_vector(name, x, batch)
        if min(values) < 0 or max(values) > extent:
            raise ValueError(
                f"{name}: values must lie in [0, {extent}], got min {min(values)}, max {max(values)}"
            )
    return Extents("bshd", batch, seqlen_q, seqlen_k, seqlen_q, seqlen_k)


def _check_cu_seqlens(name: str, values: list[int], rows: int, tensor: str) -> None:
    if len(values) < 2:
        raise ValueError(f"{name}: needs at least 2 entries (one sequence), got {len(values)}")
    if values[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {values[0]}")
    # map runs the comparisons in C: a traced caller's cu_seqlens has a slot per token, thousands
    if not all(map(operator.le, values, values[1:])):
        i = next(i for i in range(1, len(values)) if values[i] < values[i - 1])
        raise ValueError(
            f"{name}: must be non-decreasing, but entry {i} ({values[i]}) < entry {i - 1} ({values[i - 1]})"
        )
    if values[-1] > rows:
        raise ValueError(f"{name}: ends at {values[-1]} but {tensor} has only {rows} rows")


def _check_packed(t: Tensors, options: Options) -> Extents:
    k, v = t.k, t.v
    for name in ("seqlens_q", "seqlens_k"):
        if getattr(t, name) is not None:
            raise ValueError(f"{name}: dense padding is for 4-dim inputs; packed inputs use cu_seqlens")
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        if getattr(t, name) is None:
            raise ValueError(f"{name}: required for packed 3-dim inputs [T, H, D]")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"v: has {v.shape[0]} rows but k has {k.shape[0]}")
    _check_heads(t, head_axis=1)
    return _packed_values(t, options)


def _packed_values(t: Tensors, options: Options, check: bool = True) -> Extents:
    """The extents the values of cu_seqlens give; ``check``: their checks too (a traced call's
    repeated ones skip them, reading only what the launch needs)."""
    q, k = t.q, t.k
    cu_q = _check_int_vector("cu_seqlens_q", t.cu_seqlens_q, None)
    same = t.cu_seqlens_k is t.cu_seqlens_q  # as transformers passes them for self-attention: one read
    cu_k = cu_q if same else _check_int_vector("cu_seqlens_k", t.cu_seqlens_k, None)
    if check:
        _check_cu_seqlens("cu_seqlens_q", cu_q, q.shape[0], "q")
        _check_cu_seqlens("cu_seqlens_k", cu_k, k.shape[0], "k")
        if len(cu_k) != len(cu_q):
            raise ValueError(
                f"cu_seqlens_k: describes {len(cu_k) - 1} sequences but cu_seqlens_q describes {len(cu_q) - 1}"
            )
    longest_q = max(map(operator.sub, cu_q[1:], cu_q))
    longest_k = longest_q if same else max(map(operator.sub, cu_k[1:], cu_k))
    # the sequences launched: trailing ones empty on both sides add nothing (at least one stays);
    # in a non-decreasing cu_seqlens they start where its last value first appears
    used = max(bisect.bisect_left(cu_q, cu_q[-1]), bisect.bisect_left(cu_k, cu_k[-1]), 1)
    seqlen = []
    for name, longest in (("max_seqlen_q", longest_q), ("max_seqlen_k", longest_k)):
        given = getattr(options, name)
        if given is None:
            seqlen.append(longest)
            continue
        if isinstance(given, bool) or not isinstance(given, int):
            raise ValueError(f"{name}: expected an int, got {given!r}")
        if given < longest:
            raise ValueError(f"{name}: {given} is less than the longest sequence ({longest})")
        seqlen.append(given)
    return Extents("thd", used, seqlen[0], seqlen[1], longest_q, longest_k)


def _check_options(options: Options, direction: str) -> None:
    scale = options.scale
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise ValueError(f"scale: expected a finite number or None, got {scale!r}")
        if abs(scale) > _F32_MAX:  # SEMANTICS.md: any finite float representable in float32
            raise ValueError(f"scale: {scale!r} is beyond float32's range (|scale| <= {_F32_MAX:.7g})")
    if not isinstance(options.causal, bool):
        raise ValueError(f"causal: expected a bool, got {options.causal!r}")
    if options.causal_align not in ALIGNMENTS:
        raise ValueError(f"causal_align: expected one of {ALIGNMENTS}, got {options.causal_align!r}")
    left, right = options.window
    if left < -1 or right < -1:
        raise ValueError(f"window: values must be >= -1 (-1 is unbounded), got {options.window}")
    if options.causal and right > 0:
        raise ValueError(f"window: window_right={right} conflicts with causal=True (causal means window_right=0)")
    if not isinstance(options.deterministic, bool):
        raise ValueError(f"deterministic: expected a bool, got {options.deterministic!r}")
    if options.deterministic and direction != "backward":
        raise ValueError("deterministic: only the backward takes it")
    if not isinstance(options.bias_grad, bool):
        raise ValueError(f"bias_grad: expected a bool, got {options.bias_grad!r}")
    if not options.bias_grad and direction != "backward":
        raise ValueError("bias_grad: only the backward takes it")


def _check_bias(t: Tensors, extents: Extents) -> None:
    bias = t.bias
    if bias is None:
        return
    q = t.q
    if bias.dtype not in (torch.float32, q.dtype):
        raise ValueError(f"bias: dtype must be torch.float32 or q's {q.dtype}, got {bias.dtype}")
    # packed: the sequences as given (trailing empty ones are left out of the launch, not of the bias)
    batch = extents.batch if extents.layout == "bshd" else t.cu_seqlens_q.shape[0] - 1
    heads = q.shape[-2]
    if extents.layout == "bshd":
        want = f"[B|1={batch}|1, Hq|1={heads}|1, Sq={extents.seqlen_q}, Sk={extents.seqlen_k}]"
        fits = bias.dim() == 4 and bias.shape[2] == extents.seqlen_q and bias.shape[3] == extents.seqlen_k
    else:
        want = (f"[B|1={batch}|1, Hq|1={heads}|1, >= {extents.longest_q}, >= {extents.longest_k}] "
                "(the last two dims cover the longest sequences)")  # fmt: skip
        fits = bias.dim() == 4 and bias.shape[2] >= extents.longest_q and bias.shape[3] >= extents.longest_k
    fits = fits and bias.shape[0] in (1, batch) and bias.shape[1] in (1, heads)
    if not fits:
        raise ValueError(f"bias: shape {tuple(bias.shape)} does not broadcast to {want}")


def _check_sinks(t: Tensors) -> None:
    sinks = t.sinks
    if sinks is None:
        return
    heads = t.q.shape[-2]
    if sinks.dtype != torch.float32:
        raise ValueError(f"sinks: dtype must be torch.float32, got {sinks.dtype}")
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks: expected shape ({heads},) (one per query head), got {tuple(sinks.shape)}")


def _positions_read(extents: Extents) -> int:
    """The RoPE positions a call reads: dense, every row of the tensors has one; packed, the
    longest sequence's."""
    if extents.layout == "bshd":
        return max(extents.seqlen_q, extents.seqlen_k)
    return max(extents.longest_q, extents.longest_k)


def check_rope(t: Tensors, needed: int) -> None:
    """``rope_cos`` / ``rope_sin``: float32 ``[>= needed, Dqk // 2]`` tables, on q's device
    (checked with the other tensors) and for an even head dim."""
    cos, sin = t.rope_cos, t.rope_sin
    if cos is None and sin is None:
        return
    if cos is None or sin is None:
        raise ValueError("rope: expected a (cos, sin) pair of tensors, got a None inside")
    head_dim = t.q.shape[-1]
    if head_dim % 2:
        raise ValueError(f"rope: head_dim_qk={head_dim} is odd; RoPE needs an even head dim")
    for x in (cos, sin):
        if x.dtype != torch.float32:
            raise ValueError(f"rope: tables must be torch.float32, got {x.dtype}")
        if x.dim() != 2 or x.shape[1] != head_dim // 2:
            raise ValueError(f"rope: tables must have shape [max_pos, {head_dim // 2}], got {tuple(x.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"rope: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ in shape")
    if cos.shape[0] < needed:
        raise ValueError(
            f"rope: tables have {cos.shape[0]} positions but positions up to {needed - 1} are used "
            f"(need >= {needed})"
        )


def _check_backward_tensors(t: Tensors, extents: Extents) -> None:
    q, v = t.q, t.v
    for name in ("o", "lse", "do"):
        if getattr(t, name) is None:
            raise ValueError(f"{name}: required by the backward")
    o_shape = (*q.shape[:-1], v.shape[-1])
    for name in ("o", "do"):
        x = getattr(t, name)
        if tuple(x.shape) != o_shape:
            raise ValueError(
                f"{name}: expected shape {o_shape} (q's rows and heads, v's head dim), got {tuple(x.shape)}"
            )
    if extents.layout == "bshd":
        lse_shape = (extents.batch, q.shape[2], q.shape[1])
    else:
        lse_shape = (q.shape[1], q.shape[0])
    if tuple(t.lse.shape) != lse_shape:
        raise ValueError(f"lse: expected shape {lse_shape}, got {tuple(t.lse.shape)}")
    if t.lse.dtype != torch.float32:
        raise ValueError(f"lse: dtype must be torch.float32, got {t.lse.dtype}")
