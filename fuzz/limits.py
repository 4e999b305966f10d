"""Problems whose backward the acceptance rule cannot judge, which backward properties leave out.

oracle/tolerance.py states the limit ("Known limit"): where every softmax row has a
single key, the exact dq and dk are 0, so are the same-precision baseline's, and the
allowance shrinks to the floors, which no engine that rounds can meet. The fuzz search
found the limit reaches further: wherever *every* row's softmax is peaked, the
baseline's gradient error comes from a few vanishing terms and says nothing about the
error an honest engine makes. Measured on 700 drawn CPU backward problems (ci
strategies, native engines), by the largest spread ``1 - max_j p_ij`` over all rows
(the sink counted as one more entry):

| largest spread | problems | failing the rule (unfused) |
|---|---|---|
| < 1e-3 | 23 | 12 |
| 1e-3 .. 1e-2 | 10 | 2 |
| >= 1e-2 | 667 | 2 |

and an engine that takes ``D = rowsum(do * o)`` from its rounded o, as SEMANTICS.md
tells it to, fails already at moderate peaking (suites/oracle/fp32_engine.py, bias
of standard deviation 6 over 6 keys: dq ratio 1.9). So the backward properties judge
a problem only when some row's spread reaches ``SPREAD``; forward properties keep
every problem. Window (0, 0), every ``Sk_b <= 1`` without sinks, -inf bias holes
that leave one key, and logits scaled far apart all fall below it.
"""
from __future__ import annotations

import torch

from oracle.call import Call
from oracle.rope import rotate
from suites.harness import Case, make_inputs

SPREAD = 1e-2


def largest_spread(case: Case) -> float:
    """The largest ``1 - max_j p_ij`` over every sequence, head and query row with an entry (float64)."""
    inputs = make_inputs(case)
    call = Call.of(inputs.q, inputs.k, inputs.v, **inputs.keywords)
    f64 = torch.float64
    sinks = None if call.sinks is None else call.sinks.to(f64)
    largest = 0.0
    for seg in call.layout.segments:
        if seg.sq == 0 or (seg.sk == 0 and sinks is None):
            continue
        q = inputs.q[seg.q_index].to(f64)  # [sq, Hq, D]
        k = inputs.k[seg.k_index].to(f64)
        if call.rope is not None:
            cos, sin = (t.to(f64) for t in call.rope)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(call.layout.group, dim=1)
        logits = torch.einsum("ihd,jhd->hij", q, k) * call.scale  # [Hq, sq, sk]
        if call.bias is not None:
            bias = call.bias[seg.batch if call.bias.shape[0] > 1 else 0, :, : seg.sq, : seg.sk]
            logits = logits + bias.to(f64)
        mask = call.visibility.block_mask(0, seg.sq, 0, seg.sk, seg.sq, seg.sk, logits.device)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        if sinks is not None:
            logits = torch.cat((logits, sinks.view(-1, 1, 1).expand(-1, seg.sq, 1)), dim=-1)
        seen = torch.isfinite(logits).any(dim=-1)
        if seen.any():
            p = torch.softmax(logits[seen], dim=-1)
            largest = max(largest, float(1 - p.max(dim=-1).values.min()))
    return largest


def backward_judgeable(case: Case) -> bool:
    """Whether the acceptance rule can judge this problem's backward (some row spreads enough)."""
    return largest_spread(case) >= SPREAD
