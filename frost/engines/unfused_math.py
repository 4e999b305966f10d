"""The unfused engine's math: SEMANTICS.md written with plain torch ops, one block at a time.

A block is B sequences of equal (padded) extents with all their heads: the whole of a
dense call, or one packed sequence (B = 1) of a THD call. The logits S and dP come
from fp32 matmuls of the exactly upcast io operands (q and k rotated by RoPE in fp32
and kept there), and softmax, lse, D and dS are fp32. The forward's P.V runs in the io
dtype as a kernel's would (P rounded to it, fp32 accumulation inside torch). The
backward's products dS.K, dS^T.Q and P^T.dO take fp32 dS and P and upcast operands, and
round once at the end: rounded to the io dtype first, dS loses 2^-9 of itself (bf16),
and where the products cancel (two keys of nearly equal weight whose k rows nearly agree)
that is many times dq (the CPU fuzz of 2026-12-04: bf16, head dim 1, 4 keys, dq 8.7% off,
13 times the same-precision baseline's worst error, all of it that rounding of the exact
dS). Rounding S, dP or the
rotated q and k to the io dtype costs accuracy the acceptance rule notices: with
``window=(0, 0)`` (p = 1) dS must vanish and a bf16 dP leaves it at dP's rounding
error; bf16-rounded rotated q and k put a relative error of about 1e-3 into dsinks
(bf16, B2 Sq33 Sk47 H6/1, bias, sinks and RoPE: 5.9e-3 on a dsink of -4.65). GQA never
repeats K/V: query heads are viewed as ``[B, Hkv, G * Sq, D]`` so one matmul per kv head
serves its whole group, and the same view sums dK and dV over the group.

The backward is analytic (SEMANTICS.md's formulas), with P recomputed by the engine's
own softmax of its own logits rather than from the given lse: the given lse is the
oracle's (or another engine's) rounded to float32, and at logits of a few hundred its
rounding, |s| * 2**-24, no longer normalizes this engine's fp32 logits, so a one-hot
row's P is 1 + 3e-5 and dS, which must vanish there, does not (the unfiltered fuzz found
dq 1e3 times over the rule on rows of two keys whose logits differ by hundreds). It takes
``D_i = sum_j p_ij dp_ij`` (fp32), which equals SEMANTICS.md's ``do_i . o_i`` in exact
arithmetic (the oracle does the same), rather than the dot product with the given o:
that o is rounded to the io dtype, and its rounding would reach dsinks as a relative
error of the io dtype's epsilon, several times the same-precision baseline's (measured:
bf16, B2 Sq33 Sk47 H6/1 with a sink, dsinks off by 4.7e-3 with ``do . o`` against 5.6e-4
for the baseline, failing the L2 rule). ``dp - D`` is taken relative to each row's most
probable key (``_centered_ds``), so a peaked row keeps its small dS instead of losing it
to cancellation.
A sink joins the softmax as one extra logit column that
carries no value, which also keeps rows with no visible key finite: they get
``o = 0``, ``lse = -inf`` (or the sink) and zero gradients.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from frost.problem import Problem

_NEG_INF = float("-inf")


class Block(NamedTuple):
    """The tensors of one block; positions count from 0 within each sequence."""

    q: torch.Tensor  # [B, Sq, Hq, Dqk]
    k: torch.Tensor  # [B, Sk, Hkv, Dqk]
    v: torch.Tensor  # [B, Sk, Hkv, Dv]
    lens_q: torch.Tensor | None  # [B] valid lengths (dense padding), None: full
    lens_k: torch.Tensor | None
    bias: torch.Tensor | None  # [B|1, Hq|1, Sq, Sk]
    sinks: torch.Tensor | None  # [Hq] float32
    rope_cos: torch.Tensor | None  # [>= max(Sq, Sk), Dqk // 2] float32
    rope_sin: torch.Tensor | None


class BlockGrads(NamedTuple):
    dq: torch.Tensor  # [B, Sq, Hq, Dqk] io dtype
    dk: torch.Tensor  # [B, Sk, Hkv, Dqk]
    dv: torch.Tensor  # [B, Sk, Hkv, Dv]
    dbias: torch.Tensor | None  # fp32, bias's shape
    dsinks: torch.Tensor | None  # fp32 [Hq], this block's share


def forward(problem: Problem, block: Block) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o [B, Sq, Hq, Dv] io dtype, lse [B, Hq, Sq] fp32)`` of one block."""
    block = _without_garbage(block)
    q, k = _rotated(block)
    p, lse = _softmax(problem, block, _scores(problem, block, q, k))
    batch, seqlen_q, heads_q, _ = q.shape
    o = _by_kv_head(p.to(block.v.dtype), problem.group_size) @ _heads_first(block.v)
    return o.view(batch, heads_q, seqlen_q, block.v.shape[-1]).transpose(1, 2), lse


def backward(problem: Problem, block: Block, do: torch.Tensor) -> BlockGrads:
    """Gradients of one block from do ``[B, Sq, Hq, Dv]`` (P and lse recomputed, see the module)."""
    block = _without_garbage(block)
    do = _zero_padded_rows(do, block.lens_q)
    q, k = _rotated(block)
    io = block.q.dtype
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k = k.shape[1]
    group = problem.group_size
    s = _scores(problem, block, q, k)
    wide = s.dtype == torch.float64  # logits beyond float32's reach (``_wide_logits``)
    p, lse = _softmax(problem, block, s)
    lse = lse.unsqueeze(-1)
    do_kv = _by_kv_head(_heads_first(do), group).float()  # [B, Hkv, G*Sq, Dv]: dP's and dV's operand
    dp = (do_kv @ _heads_first(block.v).float().transpose(-1, -2)).view(batch, heads_q, seqlen_q, seqlen_k)
    delta = (p * dp).sum(dim=-1, keepdim=True)  # D: [B, Hq, Sq, 1]
    sink_weight = None
    if block.sinks is not None:
        sink_weight = torch.where(torch.isfinite(lse), torch.exp(block.sinks.view(1, -1, 1, 1) - lse), 0.0)
    ds = _centered_ds(p, dp, sink_weight)
    # The gradient products take dS and P as computed (fp32; float64 for wide logits) and upcast
    # operands, rounded to the io dtype once at the end (module docstring). A wide scale multiplies
    # after the products (and RoPE's rotation back): scaled first, dS would overflow.
    work = ds.dtype
    ds_kv = _by_kv_head(ds if wide else ds * problem.scale, group)  # [B, Hkv, G*Sq, Sk]
    dq = (ds_kv @ _heads_first(k.to(work))).view(batch, heads_q, seqlen_q, k.shape[-1]).transpose(1, 2)
    dk = (ds_kv.transpose(-1, -2) @ _by_kv_head(_heads_first(q.to(work)), group)).transpose(1, 2)
    dv = (_by_kv_head(p, group).transpose(-1, -2) @ do_kv.to(work)).transpose(1, 2).to(io)
    if block.rope_cos is not None:
        dq = _rotate(dq, block.rope_cos, -block.rope_sin)
        dk = _rotate(dk, block.rope_cos, -block.rope_sin)
    if wide:
        dq, dk = dq * problem.scale, dk * problem.scale
    dq, dk = dq.to(io), dk.to(io)
    dbias = None if block.bias is None or not problem.bias.grad else _sum_to(ds, block.bias.shape)
    dsinks = None if sink_weight is None else -(sink_weight * delta).sum(dim=(0, 2, 3))
    return BlockGrads(dq, dk, dv, dbias, dsinks)


def _centered_ds(p: torch.Tensor, dp: torch.Tensor, sink_weight: torch.Tensor | None) -> torch.Tensor:
    """``dS = P (dP - D)`` with ``dP - D`` taken relative to each row's most probable key m.

    With ``c = dP_m`` and the keys' weights summing to ``1 - p_sink``,
    ``dP_i - D = (dP_i - c) - sum_j p_j (dP_j - c) + c p_sink``, whose term at m is exactly
    0. Formed directly, ``dP_m - D`` of a peaked row is a difference of two nearly equal
    fp32 numbers and loses the row's small dS (measured: dq 1% off, 30 times the
    baseline's error, on fp16 rows with a spread of 3e-7, failing the rule).
    """
    if p.shape[-1] == 0:  # no keys: nothing to differentiate (argmax needs an entry)
        return p
    c = dp.gather(-1, p.argmax(dim=-1, keepdim=True))
    centered = dp - c
    inner = centered - (p * centered).sum(dim=-1, keepdim=True)
    if sink_weight is not None:
        inner = inner + c * sink_weight
    return p * inner


def _without_garbage(block: Block) -> Block:
    """The block with its padded rows of q, k and v zeroed (copies; the caller's stay as given).

    SEMANTICS.md lets padded rows hold any bits, NaN included. Masking the logits is not
    enough: the products P.V, dS.K, dS^T.Q and P^T.dO multiply those rows by exact zeros,
    and 0 * NaN is NaN, which the sums then carry into every valid row.
    """
    if block.lens_q is None:
        return block
    return block._replace(
        q=_zero_padded_rows(block.q, block.lens_q),
        k=_zero_padded_rows(block.k, block.lens_k),
        v=_zero_padded_rows(block.v, block.lens_k),
    )


def _zero_padded_rows(x: torch.Tensor, lens: torch.Tensor | None) -> torch.Tensor:
    """x ``[B, S, H, D]`` with rows ``>= lens[b]`` zeroed by selection (never by multiplication)."""
    if lens is None:
        return x
    rows = torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1) < lens.view(-1, 1, 1, 1)
    return torch.where(rows, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _rotated(block: Block) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k in fp32, after RoPE when the block has it."""
    if block.rope_cos is None:
        return block.q.float(), block.k.float()
    return _rotate(block.q, block.rope_cos, block.rope_sin), _rotate(block.k, block.rope_cos, block.rope_sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``rot(x, p)`` of SEMANTICS.md over x ``[B, S, H, D]`` at positions 0..S-1, in fp32.

    Passing ``-sin`` applies the transpose of the rotation (gradients back to the
    unrotated q and k).
    """
    seqlen = x.shape[1]
    cos = cos[:seqlen, None, :]
    sin = sin[:seqlen, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _heads_first(x: torch.Tensor) -> torch.Tensor:
    """``[B, S, H, D]`` -> ``[B, H, S, D]`` (a view)."""
    return x.transpose(1, 2)


def _by_kv_head(x: torch.Tensor, group: int) -> torch.Tensor:
    """``[B, Hq, S, X]`` -> ``[B, Hkv, G * S, X]``: query head h belongs to kv head h // G."""
    batch, heads, seqlen, last = x.shape
    return x.reshape(batch, heads // group, group * seqlen, last)


def _visible(problem: Problem, block: Block, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """Which key each query row sees, bool ``[B|1, 1, Sq, Sk]`` (SEMANTICS.md step 3)."""
    device = block.q.device
    i = torch.arange(seqlen_q, device=device).view(1, 1, seqlen_q, 1)
    j = torch.arange(seqlen_k, device=device).view(1, 1, 1, seqlen_k)
    if block.lens_q is None:
        len_q, len_k = seqlen_q, seqlen_k
    else:
        len_q, len_k = block.lens_q.view(-1, 1, 1, 1), block.lens_k.view(-1, 1, 1, 1)
    delta = len_k - len_q if problem.causal_align == "bottom_right" else 0
    visible = (i < len_q) & (j < len_k)
    if problem.window_left >= 0:
        visible = visible & (j >= i + delta - problem.window_left)
    if problem.window_right >= 0:
        visible = visible & (j <= i + delta + problem.window_right)
    return visible


def _scores(problem: Problem, block: Block, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Masked logits ``s = scale * q k^T + bias`` from fp32 q, k: ``[B, Hq, Sq, Sk]``, -inf where invisible.

    fp32, or float64 where fp32 logits could overflow (see ``_wide_logits``).
    """
    batch, seqlen_q, heads_q, _ = q.shape
    seqlen_k = k.shape[1]
    qk = _by_kv_head(_heads_first(q), problem.group_size) @ _heads_first(k).transpose(-1, -2)
    bias = None if block.bias is None else block.bias.float()
    if _wide_logits(qk, problem.scale, bias):
        q, k, bias = q.double(), k.double(), None if bias is None else bias.double()
        qk = _by_kv_head(_heads_first(q), problem.group_size) @ _heads_first(k).transpose(-1, -2)
    s = qk.view(batch, heads_q, seqlen_q, seqlen_k) * problem.scale
    if bias is not None:
        s = s + bias
    return s.masked_fill(~_visible(problem, block, seqlen_q, seqlen_k), _NEG_INF)


def _wide_logits(qk: torch.Tensor, scale: float, bias: torch.Tensor | None) -> bool:
    """Whether the logits need float64: some scaled fp32 logit (plus bias) could overflow.

    SEMANTICS.md allows any scale representable in float32, and a logit of +inf makes the
    softmax form inf - inf = NaN. float64 holds every such logit; the lse that exceeds
    float32 then rounds to +inf where it is stored, and o stays exact. A NaN in a visible
    input takes this path too (and propagates, as the contract says). Costs one reduction
    and, on CUDA, one host sync, only in this fallback engine.
    """
    if qk.numel() == 0:
        return False
    bound = float(qk.abs().amax()) * abs(scale)
    if bias is not None and bias.numel():
        bound += float(bias.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0).amax())  # -inf holes are masks
    # a quarter of the range: the softmax's sums and D's products need headroom too
    return not bound <= torch.finfo(torch.float32).max / 4


def _softmax(problem: Problem, block: Block, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p [B, Hq, Sq, Sk], lse [B, Hq, Sq])`` in fp32, the sink as an extra value-less logit."""
    batch, heads, seqlen_q, seqlen_k = s.shape
    if block.sinks is not None:
        sink = block.sinks.view(1, heads, 1, 1).expand(batch, heads, seqlen_q, 1)
    else:
        sink = s.new_full((batch, heads, seqlen_q, 1), _NEG_INF)
    logits = torch.cat([s, sink], dim=-1)
    peak = logits.amax(dim=-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, 0.0)
    e = torch.exp(logits - peak)
    z = e.sum(dim=-1, keepdim=True)
    p = torch.where(z > 0, e[..., :seqlen_k] / z, 0.0)
    lse = (peak + torch.log(z)).squeeze(-1)
    if block.lens_q is not None:  # padded query rows: lse = -inf even with a sink
        padded = torch.arange(seqlen_q, device=s.device).view(1, 1, seqlen_q) >= block.lens_q.view(-1, 1, 1)
        lse = lse.masked_fill(padded, _NEG_INF)
    return p, lse


def _sum_to(x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum ``x`` over the dimensions where ``shape`` broadcasts (size 1)."""
    dims = tuple(d for d, (have, want) in enumerate(zip(x.shape, shape)) if want == 1 and have != 1)
    return x.sum(dim=dims, keepdim=True) if dims else x
