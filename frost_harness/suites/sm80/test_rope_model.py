"""CPU: the SM80 RoPE design, modeled with torch ops, passes the acceptance rule.

The pass (sm80/rope.py) rotates q and k in fp32 and rounds them to the io dtype before the
attention kernels see them, and takes dq and dk back with the transpose of the rotation (fp32,
rounded once more). This models those steps around frost's CPU engines (attention without
RoPE) and judges the result against the float64 oracle with RoPE: the roundings the design
adds stay within SEMANTICS.md's rule, positions restart per packed sequence, and the
transpose (not the rotation again) is what takes the gradients back. The kernel's own
arithmetic is judged on a GPU (test_rope_gpu.py).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import frost
import frost_harness.oracle.baseline
import frost_harness.oracle.reference
import frost_harness.oracle.tolerance
from frost_harness.oracle.rope import rotate
from frost_harness.oracle.segments import split
from frost_harness.suites.harness import Case, make_inputs

pytestmark = pytest.mark.L0
BASE = Case(seqlen_q=70, seqlen_k=90, heads_q=4, heads_kv=2, head_dim_qk=64, rope=True, poison=False)
CASES = {
    "dense": BASE,
    "causal_fp16": dataclasses.replace(BASE, causal=True, dtype=torch.float16),
    "d72_window": dataclasses.replace(BASE, head_dim_qk=72, head_dim_v=40, window=(20, 5)),
    "thd_br": dataclasses.replace(BASE, layout="thd", lengths_q=(30, 0, 45), lengths_k=(40, 7, 45), causal=True,
                                  causal_align="bottom_right"),
    "thd_mqa_fp16": dataclasses.replace(BASE, layout="thd", lengths_q=(64, 17), lengths_k=(64, 33), heads_q=8,
                                        heads_kv=1, dtype=torch.float16, head_dim_qk=128),
}


def _pass(x: torch.Tensor, rows: str, layout, rope, transpose: bool) -> torch.Tensor:
    """The pass over q-like (``rows="q"``) or k-like rows: each sequence from position 0, in fp32,
    rounded to x's dtype; rows no sequence owns stay as they are."""
    out = x.clone()
    for seg in layout.segments:
        index = seg.q_index if rows == "q" else seg.k_index
        out[index] = rotate(x[index].float(), *rope, transpose=transpose).to(x.dtype)
    return out


def _modeled(inputs, transpose_back: bool = True):
    kw = dict(inputs.keywords)
    rope = kw.pop("rope")
    layout = split(inputs.q, inputs.k, inputs.v, **{n: kw.get(n) for n in (
        "seqlens_q", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k")})  # fmt: skip
    q, k = _pass(inputs.q, "q", layout, rope, False), _pass(inputs.k, "k", layout, rope, False)
    o, lse = frost.sdpa_forward(q, k, inputs.v, **kw)
    grads = frost.sdpa_backward(inputs.do, q, k, inputs.v, o, lse, **kw)
    dq = _pass(grads.dq, "q", layout, rope, transpose_back)
    dk = _pass(grads.dk, "k", layout, rope, transpose_back)
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": grads.dv}


def _verdicts(case: Case, **model):
    inputs = make_inputs(case)
    got = _modeled(inputs, **model)
    q, k, v, kw = inputs.q, inputs.k, inputs.v, inputs.keywords
    reference, baseline = frost_harness.oracle.reference, frost_harness.oracle.baseline
    tolerance = frost_harness.oracle.tolerance
    verdicts = tolerance.check_forward((got["o"], got["lse"]), reference.forward(q, k, v, **kw),
                                       baseline.forward(q, k, v, **kw), io_dtype=case.dtype)
    verdicts.update(tolerance.check({n: got[n] for n in ("dq", "dk", "dv")},
                                    reference.backward(inputs.do, q, k, v, **kw).as_dict(),
                                    baseline.backward(inputs.do, q, k, v, **kw).as_dict(), io_dtype=case.dtype))
    return verdicts


@pytest.mark.parametrize("name", CASES)
def test_rotation_pass_design_passes_the_rule(name):
    verdicts = _verdicts(CASES[name])
    assert all(v.passed for v in verdicts.values()), "\n".join(v.describe() for v in verdicts.values())


def test_rotating_the_gradients_forward_again_fails_the_rule():
    """The model is sensitive to the direction the gradients are taken back in."""
    verdicts = _verdicts(CASES["dense"], transpose_back=False)
    assert verdicts["o"].passed and not verdicts["dq"].passed and not verdicts["dk"].passed
