"""The same-precision baseline X_lp of the acceptance rule (SEMANTICS.md, "Numerical acceptance").

A plain implementation in the io dtype: it shows how much error an honest
implementation at that precision makes, and the acceptance rule allows an
engine a small multiple of it. Per sequence, with ``io = q.dtype``:

- RoPE in float32 (tables as given), rounded back to io, as fused kernels do;
- ``scores = (q @ k^T)`` in io, times ``scale`` in io; K/V heads are repeated
  for GQA (autograd sums dk/dv back over the group in io);
- bias added in float32 to the upcast scores (a bias of magnitude 1e4 rounded
  into fp16 scores would make the baseline, and so the allowance, useless);
- masking, sinks and the softmax in float32 (max-subtracted; a row with
  nothing visible gives p = 0, lse = -inf or the sink, never NaN);
- probabilities rounded to io, ``o = P @ V`` in io.

Outputs: o in io, lse in float32, in the reference's layouts and with the
reference's conventions for rows no sequence owns (NaN in packed tails).
Gradients come from torch.autograd through that forward in the same precision:
dq/dk/dv in io, dbias in bias's dtype, dsinks in float32. The keywords are
those of ``frost_harness.oracle.reference.forward``; ``block_q`` is accepted and has no
effect (the baseline materializes each sequence's scores whole, as the plain
implementation it stands for does). This module is the only place in oracle
that relies on autograd.
"""
from __future__ import annotations

import torch
from torch import Tensor

from frost_harness.oracle.call import Call
from frost_harness.oracle.reference import Grads
from frost_harness.oracle.rope import rotate
from frost_harness.oracle.segments import Segment, bias_index

F32 = torch.float32


def _rotated(x: Tensor, call: Call) -> Tensor:
    if call.rope is None:
        return x
    cos, sin = (t.to(device=x.device, dtype=F32) for t in call.rope)
    return rotate(x.to(F32), cos, sin).to(x.dtype)


def _sequence(call: Call, seg: Segment, q: Tensor, k: Tensor, v: Tensor,
              bias: Tensor | None, sinks: Tensor | None) -> tuple[Tensor, Tensor]:
    """``o [sq, Hq, Dv]`` (io) and ``lse [Hq, sq]`` (fp32) of one sequence, autograd-friendly."""
    group = call.layout.group
    qh = _rotated(q[seg.q_index], call).transpose(0, 1)  # [Hq, sq, Dqk]
    kh = _rotated(k[seg.k_index], call).transpose(0, 1).repeat_interleave(group, dim=0)
    vh = v[seg.k_index].transpose(0, 1).repeat_interleave(group, dim=0)
    s = (torch.matmul(qh, kh.transpose(1, 2)) * call.scale).to(F32)
    if bias is not None:
        s = s + bias[bias_index(bias, seg)].to(F32)
    mask = call.visibility.block_mask(0, seg.sq, 0, seg.sk, seg.sq, seg.sk, s.device)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.detach().amax(-1) if seg.sk else s.new_full(s.shape[:-1], float("-inf"))
    if sinks is not None:
        m = torch.maximum(m, sinks.detach().unsqueeze(-1))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m.unsqueeze(-1))
    z = e.sum(-1)
    if sinks is not None:
        z = z + torch.exp(sinks.unsqueeze(-1) - m)
    p = e / torch.where(z > 0, z, torch.ones_like(z)).unsqueeze(-1)
    o = torch.matmul(p.to(q.dtype), vh)
    return o.transpose(0, 1), m + torch.log(z)


def _sinks32(call: Call, device) -> Tensor | None:
    return None if call.sinks is None else call.sinks.detach().to(device=device, dtype=F32)


def forward(q: Tensor, k: Tensor, v: Tensor, **options) -> tuple[Tensor, Tensor]:
    """``(o, lse)``: o in q's dtype, lse in float32; keywords of ``frost_harness.oracle.reference.forward``."""
    call = Call.of(q, k, v, **options)
    layout = call.layout
    o = layout.new_rows(layout.o_shape(v.shape[-1]), 0.0, dtype=q.dtype, device=q.device)
    lse = layout.new_rows(layout.lse_shape(), float("-inf"), dtype=F32, device=q.device)
    sinks = _sinks32(call, q.device)
    with torch.no_grad():
        for seg in layout.segments:
            o[seg.q_index], lse[seg.lse_index] = _sequence(call, seg, q, k, v, call.bias, sinks)
    return o, lse


def backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, **options) -> Grads:
    """Autograd of the same-precision forward; keywords of ``frost_harness.oracle.reference.forward``."""
    call = Call.of(q, k, v, **options)
    layout = call.layout
    if do.shape != layout.o_shape(v.shape[-1]):
        raise ValueError(f"do must have o's shape {layout.o_shape(v.shape[-1])}, got {tuple(do.shape)}")
    sinks = _sinks32(call, q.device)
    leaves = {"dq": q, "dk": k, "dv": v, "dbias": call.bias, "dsinks": sinks}
    leaves = {name: t.detach().requires_grad_() for name, t in leaves.items() if t is not None}
    outputs, grad_outputs = [], []
    with torch.enable_grad():
        for seg in layout.segments:
            o, _ = _sequence(call, seg, leaves["dq"], leaves["dk"], leaves["dv"], leaves.get("dbias"),
                             leaves.get("dsinks"))
            outputs.append(o)
            grad_outputs.append(do[seg.q_index].to(q.dtype))
    grads = torch.autograd.grad(outputs, list(leaves.values()), grad_outputs, allow_unused=True)
    grads = {name: torch.zeros_like(t) if g is None else g
             for (name, t), g in zip(leaves.items(), grads)}
    if layout.packed:
        # Rows no sequence owns carry NaN, as in the reference.
        grads["dq"][layout.owned_q:] = float("nan")
        grads["dk"][layout.owned_k:] = float("nan")
        grads["dv"][layout.owned_k:] = float("nan")
    return Grads(**grads)
