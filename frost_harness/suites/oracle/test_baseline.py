"""The same-precision baseline implements every feature and rounds where it says it does.

Run in float32 it must agree with the float64 oracle to float32 accuracy on
every case of ``cases.FEATURES`` (forward and autograd backward), which shows
it handles each feature; in fp16/bf16 its outputs have the documented dtypes
and the reference's row conventions, and huge logits stay finite.
"""
from __future__ import annotations

import math

import pytest
import torch

from frost_harness.oracle import baseline, reference
from frost_harness.suites.oracle.cases import FEATURES, FEATURES_BY_NAME, Case, build

pytestmark = pytest.mark.L0


def _relative_error(got, want):
    """max |got - want| / max |want| over the positions where want is finite (NaN/inf must match)."""
    got = got.double()
    finite = torch.isfinite(want)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got[torch.isinf(want)], want[torch.isinf(want)])
    if not finite.any():
        return 0.0
    return float((got - want)[finite].abs().max() / want[finite].abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("case", FEATURES, ids=str)
def test_float32_baseline_matches_the_oracle(case):
    p = build(case, seed=51, dtype=torch.float32)
    o, lse = baseline.forward(p.q, p.k, p.v, **p.options)
    o64, lse64 = reference.forward(p.q, p.k, p.v, **p.options)
    assert _relative_error(o, o64) < 1e-5 and _relative_error(lse, lse64) < 1e-5
    g = baseline.backward(p.do, p.q, p.k, p.v, **p.options).as_dict()
    g64 = reference.backward(p.do, p.q, p.k, p.v, **p.options).as_dict()
    for name, want in g64.items():
        if want is None:
            assert g[name] is None
        else:
            assert _relative_error(g[name], want) < 1e-5, name


@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.float16])
def test_low_precision_output_dtypes_and_row_conventions(bias_dtype):
    p = build(FEATURES_BY_NAME["packed_everything"], seed=52, dtype=torch.float16)
    p = p.with_inputs(bias=p.options["bias"].to(bias_dtype))
    o, lse = baseline.forward(p.q, p.k, p.v, **p.options)
    g = baseline.backward(p.do, p.q, p.k, p.v, **p.options)
    assert (o.dtype, lse.dtype) == (torch.float16, torch.float32)
    assert (g.dq.dtype, g.dk.dtype, g.dv.dtype) == (torch.float16,) * 3
    assert g.dbias.dtype == bias_dtype and g.dsinks.dtype == torch.float32
    o64, lse64 = reference.forward(p.q, p.k, p.v, **p.options)
    assert torch.equal(torch.isnan(o), torch.isnan(o64)) and torch.equal(torch.isnan(lse), torch.isnan(lse64))
    g64 = reference.backward(p.do, p.q, p.k, p.v, **p.options)
    for name in ("dq", "dk", "dv"):
        assert torch.equal(torch.isnan(getattr(g, name)), torch.isnan(getattr(g64, name))), name


def test_padded_rows_follow_the_contract():
    p = build(FEATURES_BY_NAME["padded_everything"], seed=53, dtype=torch.bfloat16)
    o, lse = baseline.forward(p.q, p.k, p.v, **p.options)
    g = baseline.backward(p.do, p.q, p.k, p.v, **p.options)
    assert (o[1, 1:] == 0).all() and (lse[1, :, 1:] == -math.inf).all()
    assert (g.dq[1, 1:] == 0).all() and (g.dk[0, 3:] == 0).all() and (g.dv[0, 3:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_large_logits_stay_finite(dtype):
    case = Case("huge", seqlen_q=6, seqlen_k=5, bias="BH", sinks=True, causal=True, causal_align="bottom_right")
    p = build(case, seed=54, dtype=dtype)
    p = p.with_inputs(bias=p.options["bias"] * 1e4, sinks=p.options["sinks"] * 1e4)
    o, lse = baseline.forward(p.q, p.k, p.v, **p.options)
    g = baseline.backward(p.do, p.q, p.k, p.v, **p.options)
    for t in (o, lse, *(x for x in g.as_dict().values())):
        assert torch.isfinite(t).all()
    o64, _ = reference.forward(p.q, p.k, p.v, **p.options)
    torch.testing.assert_close(o.double(), o64, rtol=0, atol=2e-2)
