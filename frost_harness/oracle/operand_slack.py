"""What a problem's io-dtype operands cost by themselves: an allowance the rule adds on top.

Two operands that a contract-faithful engine must use carry rounding the float64 oracle does
not see, and an engine's error can be exactly that rounding's effect:

- **RoPE.** A same-precision engine with fused RoPE (FlashAttention's, frost's sm80, and the
  baseline X_lp itself) rotates q and k in float32 and rounds the rotated rows to the io dtype
  before the attention products. The oracle runs on exact rotations, so at large logits (|s| ~
  250 in fp16: logit errors of 0.03) the engine's error is the rotation's, and the baseline,
  which makes the same rounding plus fp16 scores, can land well under it on a problem with few
  informative rows (the H200 nightly of 2026-12-03: o at 3x rule 1 on an 8x9 problem; a CPU
  emulation of the kernel reproduced it).
- **The backward's given o and lse.** SEMANTICS.md's backward takes o (in the io dtype) and lse
  as inputs: ``p = exp(s - lse)`` with the given lse and ``D = rowsum(do * o)`` of the given o.
  Where a row's weight sits on one key (peaked logits, or one key beside a sink), ``dp - D`` is
  a small difference whose D carries o's io-dtype rounding, while the baseline (autograd) never
  reads o. The contract's own known limit is the extreme of it (one key, no sink: the truth is
  0 and only that residue is left). Found: the H200 grid's ``window_zero_sinks`` (sm80 dq, dk at
  1.03-1.04x rule 2), and the CPU fuzz of 2026-12-04: unfused on one key beside a sink (dk at
  1.02x), torch's CPU flash backward on a peaked fp16 problem (dq at 4x the baseline's L2).

``backward_slack`` / ``forward_slack`` compute, per output, the exact size of those effects:
the contract's formulas evaluated in float64 on the operands such an engine holds (with RoPE the
rotated q and k rounded to the io dtype; in the backward the given o and lse) minus the oracle's
truth. ``tolerance.check`` adds it to both rules' allowances (``slack``). The suites ask for it
only once a verdict fails without it (``harness.check``): it is an absolute error per element of
the contract's own arithmetic, so an engine judged with it is blamed only for what it adds. A
wrong rotation (sign, position, the inverse in the backward) or a wrong gradient moves the
outputs by O(1), far past it. Measured on the RoPE night's shrunk failures with a CPU emulation
of the sm80 arithmetic: the eight backward ones at worst ratio 0.81 with it (1.04-5.46 without),
the two forward ones at 0.51 and 0.77 (3.0 without).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from frost_harness.oracle import reference
from frost_harness.oracle.call import Call
from frost_harness.oracle.rope import rotate
from frost_harness.oracle.segments import bias_index

F64 = torch.float64


def rounded_rotation(x: Tensor, call: Call, index: str) -> Tensor:
    """x's valid rows rotated in float32 with the given tables and rounded to x's dtype, per
    sequence (positions count from each sequence's start), as the baseline and fused kernels do;
    x itself without RoPE."""
    if call.rope is None:
        return x
    cos, sin = (t.to(device=x.device, dtype=torch.float32) for t in call.rope)
    out = x.clone()
    for seg in call.layout.segments:
        rows = getattr(seg, index)
        out[rows] = rotate(x[rows].float(), cos, sin).to(x.dtype)
    return out


def forward_slack(q: Tensor, k: Tensor, v: Tensor, truth: tuple[Tensor, Tensor], **options) -> dict[str, Tensor]:
    """|oracle(rounded rotations) - oracle| for o and lse; ``truth`` is the oracle's (o, lse).
    Without RoPE the forward's operands are the oracle's own: no slack."""
    call = Call.of(q, k, v, **options)
    if call.rope is None:
        return {}
    plain = {name: value for name, value in options.items() if name != "rope"}
    o, lse = reference.forward(rounded_rotation(q, call, "q_index"), rounded_rotation(k, call, "k_index"), v, **plain)
    return {"o": _gap(o, truth[0]), "lse": _gap(lse, truth[1])}


def backward_slack(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, truth,
                   **options) -> dict[str, Tensor]:
    """|the contract's backward on (the given o and lse; with RoPE, rounded rotations) - truth|
    per gradient; ``truth`` is the oracle's Grads."""
    given = _backward_as_given(do, q, k, v, o, lse, Call.of(q, k, v, **options))
    return {name: _gap(value, getattr(truth, name)) for name, value in given.items()
            if value is not None and getattr(truth, name) is not None}


def _gap(x: Tensor, truth: Tensor) -> Tensor:
    """|x - truth| where both are finite, 0 elsewhere (infinities and unread rows match or are judged as such)."""
    x, truth = x.to(F64), truth.to(F64)
    both = torch.isfinite(x) & torch.isfinite(truth)
    return torch.where(both, (x - truth).abs(), torch.zeros_like(x))


def _backward_as_given(do, q, k, v, o, lse, call: Call) -> dict[str, Tensor | None]:
    """SEMANTICS.md's backward, float64, p from the given lse and D from the given o; with RoPE on
    q and k rotated and rounded as above, dq and dk taken back through the rotation's transpose.
    The scores come from the oracle's own blocks (``reference._blocks``, without the sink):
    p = e / z * exp(lse_own - lse_given)."""
    layout, device = call.layout, q.device
    plain = dataclasses.replace(call, rope=None)
    q_io, k_io = rounded_rotation(q, call, "q_index"), rounded_rotation(k, call, "k_index")
    sinks = None if call.sinks is None else call.sinks.to(device=device, dtype=F64)
    dq = torch.zeros(q.shape, dtype=F64, device=device)
    dk = torch.zeros(k.shape, dtype=F64, device=device)
    dv = torch.zeros(v.shape, dtype=F64, device=device)
    dbias = None if call.bias is None else torch.zeros(call.bias.shape, dtype=F64, device=device)
    dsinks = None if sinks is None else torch.zeros_like(sinks)
    for seg in layout.segments:
        if seg.sq == 0:
            continue
        seq = reference._load(plain, seg, q_io, k_io, v)  # q pre-scaled, head-major
        hkv, group, sq, dqk = seq.q.shape
        per_head = (hkv, group, sq, -1)
        lse_seq = lse[seg.lse_index].to(F64).reshape(hkv, group, sq)
        do_seq = do[seg.q_index].to(F64).permute(1, 0, 2).reshape(per_head)
        o_seq = o[seg.q_index].to(F64).permute(1, 0, 2).reshape(per_head)
        dq_seq, dk_seq, dv_seq = torch.zeros_like(seq.q), torch.zeros_like(seq.k), torch.zeros_like(seq.v)
        for blk in reference._blocks(seq, plain, None):
            nb = blk.rows.stop - blk.rows.start
            given = lse_seq[:, :, blk.rows].reshape(hkv, group * nb, 1)
            p = torch.where(torch.isfinite(given), blk.e / blk.z * torch.exp(blk.lse.view_as(given) - given), 0.0)
            do_b = do_seq[:, :, blk.rows].reshape(hkv, group * nb, -1)
            d_row = (do_b * o_seq[:, :, blk.rows].reshape(do_b.shape)).sum(-1, keepdim=True)
            ds = p * (torch.matmul(do_b, seq.v[:, blk.keys].transpose(1, 2)) - d_row)
            dq_seq[:, :, blk.rows] = torch.matmul(ds, seq.k[:, blk.keys]).view(hkv, group, nb, dqk)
            dk_seq[:, blk.keys] += torch.matmul(ds.transpose(1, 2), blk.q)
            dv_seq[:, blk.keys] += torch.matmul(p.transpose(1, 2), do_b)
            if dbias is not None:
                ds_h = ds.view(hkv * group, nb, -1)
                index = bias_index(call.bias, seg)
                dbias[index[0], :, blk.rows, blk.keys] += ds_h.sum(0, keepdim=True) if call.bias.shape[1] == 1 else ds_h
            if dsinks is not None:
                weight = torch.exp(sinks.view(hkv, group, 1) - given.view(hkv, group, nb))
                dsinks -= (weight * d_row.view(hkv, group, nb)).sum(-1).reshape(-1)
        dq[seg.q_index] = _unrotated((dq_seq.reshape(hkv * group, sq, dqk) * call.scale).permute(1, 0, 2), call)
        dk[seg.k_index] = _unrotated(dk_seq.permute(1, 0, 2), call)
        dv[seg.k_index] = dv_seq.permute(1, 0, 2)
    return {"dq": dq, "dk": dk, "dv": dv, "dbias": dbias, "dsinks": dsinks}


def _unrotated(grad: Tensor, call: Call) -> Tensor:
    """A gradient with respect to the rotated rows taken back to the unrotated ones (the
    rotation's transpose); itself without RoPE."""
    if call.rope is None:
        return grad
    cos, sin = (t.to(device=grad.device, dtype=F64) for t in call.rope)
    return rotate(grad, cos, sin, transpose=True)
