"""SEMANTICS.md transcribed row by row: an independent second forward for tiny problems.

It shares no code with ``oracle`` (its own layout walk, visibility test and
rotation), loops over (sequence, head, query row) in Python and follows the
contract's wording step by step, so a misreading in the oracle's blocked,
vectorized code shows up as a disagreement. It is differentiable through
torch.autograd, which gives a second, independent check of the analytic
backward. Outputs follow the oracle's layouts and conventions (padded rows
``o = 0, lse = -inf``; packed rows past ``cu_seqlens[-1]`` NaN).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def _rot(x: Tensor, position: int, rope) -> Tensor:
    if rope is None:
        return x
    cos, sin = (t[position].double() for t in rope)
    half = x.shape[-1] // 2
    x1, x2 = x[:half], x[half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin))


def _visible(i: int, j: int, sq: int, sk: int, left: int, right: int, bottom_right: bool) -> bool:
    delta = sk - sq if bottom_right else 0
    return (j < sk and (left < 0 or j >= i + delta - left)
            and (right < 0 or j <= i + delta + right))


def _row(b, h, i, qb, kb, vb, sq, sk, scale, bias, sinks, rope, left, right, bottom_right):
    """o_i [Dv] and lse_i (0-dim) of row i of head h in sequence b."""
    g = h // (qb.shape[1] // kb.shape[1])
    qi = _rot(qb[i, h], i, rope)
    logits, values = [], []
    for j in range(sk):
        if not _visible(i, j, sq, sk, left, right, bottom_right):
            continue
        s = scale * torch.dot(qi, _rot(kb[j, g], j, rope))
        if bias is not None:
            s = s + bias[b if bias.shape[0] > 1 else 0, h if bias.shape[1] > 1 else 0, i, j]
        logits.append(s)
        values.append(vb[j, g])
    terms = logits + ([sinks[h]] if sinks is not None else [])
    if not terms:
        return vb.new_zeros(vb.shape[-1]), vb.new_tensor(-math.inf)
    lse = torch.logsumexp(torch.stack(terms), 0)
    if not logits or torch.isinf(lse):  # nothing visible (or all logits -inf): o = 0
        return vb.new_zeros(vb.shape[-1]), lse
    p = torch.exp(torch.stack(logits) - lse)
    return (p.unsqueeze(1) * torch.stack(values)).sum(0), lse


def attention(q, k, v, *, scale=None, causal=False, causal_align="top_left", window=(-1, -1),
              seqlens_q=None, seqlens_k=None, cu_seqlens_q=None, cu_seqlens_k=None, bias=None,
              sinks=None, rope=None, block_q=None) -> tuple[Tensor, Tensor]:
    """``(o, lse)`` in float64 for tiny problems; ``block_q`` is accepted and unused."""
    q, k, v = q.double(), k.double(), v.double()
    bias = None if bias is None else bias.double()
    sinks = None if sinks is None else sinks.double()
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    left, right = window
    if causal:
        right = 0
    bottom_right = causal_align == "bottom_right"
    packed = cu_seqlens_q is not None
    hq, dv = q.shape[-2], v.shape[-1]
    batch = len(cu_seqlens_q) - 1 if packed else q.shape[0]
    o_seqs, lse_seqs = [], []
    for b in range(batch):
        if packed:
            qb = q[int(cu_seqlens_q[b]):int(cu_seqlens_q[b + 1])]
            kb = k[int(cu_seqlens_k[b]):int(cu_seqlens_k[b + 1])]
            vb = v[int(cu_seqlens_k[b]):int(cu_seqlens_k[b + 1])]
            sq, sk = qb.shape[0], kb.shape[0]
        else:
            qb, kb, vb = q[b], k[b], v[b]
            sq = qb.shape[0] if seqlens_q is None else int(seqlens_q[b])
            sk = kb.shape[0] if seqlens_k is None else int(seqlens_k[b])
        rows = [[_row(b, h, i, qb, kb, vb, sq, sk, scale, bias, sinks, rope, left, right,
                      bottom_right) for h in range(hq)] for i in range(sq)]
        o_b = torch.stack([torch.stack([o for o, _ in r]) for r in rows]) if rows else q.new_zeros(0, hq, dv)
        lse_b = torch.stack([torch.stack([s for _, s in r]) for r in rows]).T if rows else q.new_zeros(hq, 0)
        o_seqs.append(o_b)
        lse_seqs.append(lse_b)
    if packed:
        tail = q.shape[0] - int(cu_seqlens_q[-1])
        o = torch.cat(o_seqs + [q.new_full((tail, hq, dv), math.nan)])
        lse = torch.cat(lse_seqs + [q.new_full((hq, tail), math.nan)], dim=1)
        return o, lse
    pad = q.shape[1]
    o = torch.stack([torch.cat([o_b, q.new_zeros(pad - o_b.shape[0], hq, dv)]) for o_b in o_seqs])
    lse = torch.stack([torch.cat([s, q.new_full((hq, pad - s.shape[1]), -math.inf)], dim=1)
                       for s in lse_seqs])
    return o, lse
