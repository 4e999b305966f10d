"""Problems the acceptance rule cannot judge in the backward, which backward properties leave out.

oracle/tolerance.py states the limit ("Known limit"): where every softmax row has a
single key with non-zero probability, the exact dq and dk are 0, so are the
same-precision baseline's, and the allowance shrinks to the floors; an engine that
takes ``D = rowsum(do * o)`` from its rounded o, as SEMANTICS.md tells it to, is left
with dq and dk of order ``ulp(o) * |do| * |k|`` and fails. Window (0, 0), or every
``Sk_b <= 1`` without sinks, are the structural cases; -inf bias holes and huge
logits make more (a row whose other keys lie more than ``GAP`` below its largest
logit has a probability vector that is one-hot in float32, so the baseline computes
``p * (dp - sum(p * dp)) = 0`` exactly).

``one_key_rows(case)`` finds those problems from the case's own inputs, in float64:
for each sequence, head and query row it counts the softmax entries (visible keys
and the sink) within ``GAP`` of the row's largest logit. Forward properties keep
such problems; only the backward properties filter them, with this module as their
written reason.
"""
from __future__ import annotations

import torch

from oracle.call import Call
from oracle.rope import rotate
from suites.harness import Case, make_inputs

# exp(-17) = 4e-8 < 2**-24: a float32 probability that small beside 1 vanishes in 1 - p.
GAP = 17.0


def one_key_rows(case: Case) -> bool:
    """True when every softmax row of the problem has at most one entry that counts."""
    inputs = make_inputs(case)
    call = Call.of(inputs.q, inputs.k, inputs.v, **inputs.keywords)
    f64 = torch.float64
    sinks = None if call.sinks is None else call.sinks.to(f64)
    for seg in call.layout.segments:
        if seg.sq == 0:
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
            sink_column = sinks.view(-1, 1, 1).expand(-1, seg.sq, 1)
            logits = torch.cat((logits, sink_column), dim=-1)
        top = logits.amax(dim=-1, keepdim=True)
        counted = (logits >= top - GAP) & torch.isfinite(logits)
        if (counted.sum(dim=-1) > 1).any():
            return False
    return True
