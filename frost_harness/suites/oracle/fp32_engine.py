"""A stand-in engine for testing the acceptance rule: how a flash kernel rounds, in plain torch.

Dense layout, MHA/GQA, causal, windows and bias (the features the tolerance
tests need). Like an SM80 kernel it computes logits, softmax and every
accumulation in float32 from io-dtype inputs, rounds P to the io dtype for
P @ V, rounds its outputs to the io dtype, and in the backward takes
``D = rowsum(do * o)`` from its own rounded o, as SEMANTICS.md specifies for
engines. ``right_shift`` widens the right window edge by that many keys: the
mask-off-by-one bug the rule must catch.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch

from frost_harness.oracle.masking import Visibility
from frost_harness.oracle.reference import Grads


def run(q, k, v, do, *, scale=None, causal=False, causal_align="top_left", window=(-1, -1), bias=None,
        right_shift=0, **_unused):
    """``((o, lse), Grads)``: o and gradients in q's dtype, lse in float32."""
    io = q.dtype
    _, sq, hq, dqk = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    scale = 1 / math.sqrt(dqk) if scale is None else scale
    qf, kf, vf, dof = (t.float().transpose(1, 2) for t in (q, k, v, do))
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    s = qf @ kf.transpose(-1, -2) * scale
    if bias is not None:
        s = s + bias.float()
    visibility = Visibility.from_args(causal, causal_align, window)
    if right_shift:
        visibility = replace(visibility, right=visibility.right + right_shift)
    mask = visibility.block_mask(0, sq, 0, sk, sq, sk, q.device)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    o = (p.to(io).float() @ vf).to(io)
    d_row = (dof * o.float()).sum(-1, keepdim=True)  # from the rounded o, as engines do
    ds = p * (dof @ vf.transpose(-1, -2) - d_row)
    dq = (ds @ kf * scale).transpose(1, 2).to(io)
    dk = (ds.transpose(-1, -2) @ qf * scale).unflatten(1, (hkv, group)).sum(2).transpose(1, 2).to(io)
    dv = (p.to(io).float().transpose(-1, -2) @ dof).unflatten(1, (hkv, group)).sum(2).transpose(1, 2).to(io)
    dbias = None
    if bias is not None:
        dims = [d for d in (0, 1) if bias.shape[d] == 1]
        dbias = (ds.sum(dims, keepdim=True) if dims else ds).to(bias.dtype)
    return (o.transpose(1, 2), lse), Grads(dq, dk, dv, dbias)
