"""Legal but hostile input: every engine honors it or declines it with a reason, never NaN.

SEMANTICS.md, "Values the contract allows": any scale representable in float32 (zero
and negative included), any window >= -1 (wider than the sequence = no bound). And
"Garbage outside the valid region": rows the contract does not read may hold NaN and
Inf and change nothing. The harness poisons those rows in every case, on every device; the tests
here pin the findings that led to it, each against the float64 oracle or bit for bit.
"""
from __future__ import annotations

import math

import pytest
import torch

import frost
import frost_harness.oracle.reference
from frost.dispatch import ledger
from frost_harness.suites.harness import Case, check, make_inputs

FP16 = torch.float16

SCALE_CASES = [
    Case(name="negative-scale-causal", causal=True, scale=-0.5),
    Case(name="zero-scale-causal", causal=True, scale=0.0, dtype=FP16),
    Case(name="negative-scale-causal-gqa", causal=True, scale=-2.0, heads_q=4, heads_kv=2, seqlen_q=20),
    Case(name="zero-scale-window", window=(3, 0), scale=0.0),
]


# (case, engine): routed, and forced onto each native engine that accepts the problem
SCALE_RUNS = [(case, engine) for case in SCALE_CASES for engine in (None, "torch-sdpa", "unfused")
              if not (engine == "torch-sdpa" and case.window != (-1, -1))]  # torch-sdpa declines windows


@pytest.mark.L0
@pytest.mark.parametrize("case, engine", SCALE_RUNS, ids=lambda x: x.name if isinstance(x, Case) else str(x))
def test_scale_at_or_below_zero_matches_oracle(case, engine):
    """torch-sdpa's is_causal path gave o mostly NaN and lse +inf for these."""
    result = check(case, engine=engine)
    assert result.passed, result.describe()


@pytest.mark.L0
def test_attention_gradients_with_negative_scale_are_finite_and_right():
    case = Case(causal=True, scale=-0.5, heads_q=2, heads_kv=2, seqlen_q=9, seqlen_k=9, head_dim_qk=8)
    inputs = make_inputs(case)
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    o = frost.attention(q, k, v, causal=True, scale=-0.5)
    o.backward(inputs.do)
    ref = frost_harness.oracle.reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, causal=True, scale=-0.5)
    for name, got, want in (("dq", q.grad, ref.dq), ("dk", k.grad, ref.dk), ("dv", v.grad, ref.dv)):
        assert torch.isfinite(got).all(), name
        assert (got.double() - want).abs().max() < 0.05, name


@pytest.mark.L0
@pytest.mark.parametrize("scale", [3e38, -3e38, 1e37])
@pytest.mark.parametrize("layout", ["dense", "padded-bias-sinks-rope"])
def test_scale_near_float32_max_never_gives_nan(scale, layout):
    """Logits beyond float32: unfused serves (torch-sdpa declines, with its reason); o is
    exact, lse is the oracle's rounded to float32 (+inf past its range), nothing is NaN."""
    extra = {} if layout == "dense" else {"lengths_q": (10, 5), "lengths_k": (7, 24), "bias": "BH",
                                          "sinks": True, "rope": True}  # fmt: skip
    inputs = make_inputs(Case(causal=True, scale=scale, dtype=FP16, **extra))
    kw = inputs.keywords
    decision = frost.route(inputs.q, inputs.k, inputs.v, **kw)
    assert decision.engine == "unfused"
    if layout == "dense" and abs(scale) > 1e38:
        assert any(name == "torch-sdpa" and "overflows float32 logits" in why for name, why in decision.declined)
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **kw)
    o64, lse64 = frost_harness.oracle.reference.forward(inputs.q, inputs.k, inputs.v, **kw)
    assert not o.isnan().any() and not lse.isnan().any()
    # o is a convex combination of v whatever the logits: within fp16's rounding of it
    torch.testing.assert_close(o.double(), o64, rtol=0, atol=2e-3)
    # lse: float32's relative rounding of the float64 truth, +inf where that overflows
    torch.testing.assert_close(lse, lse64.float(), rtol=1e-5, atol=0)
    grads = frost.sdpa_backward(inputs.do, inputs.q, inputs.k, inputs.v, o, lse, **kw)
    for name, grad in grads._asdict().items():
        assert grad is None or not grad.isnan().any(), name


@pytest.mark.L0
def test_torch_sdpa_decline_boundary_for_scale():
    q = torch.randn(1, 8, 2, 16, dtype=torch.bfloat16)
    limit = torch.finfo(torch.float32).max / (16 * math.log2(math.e))
    assert frost.route(q, q, q, scale=limit * 0.999).engine == "torch-sdpa"
    decision = frost.route(q, q, q, scale=limit * 1.001)
    assert decision.engine == "unfused" and "overflows float32 logits" in dict(decision.declined)["torch-sdpa"]


@pytest.mark.L0
@pytest.mark.parametrize("window", [(10**30, 0), (10**30, 10**30), (24, -1), (-1, 24), (-1, 10**19)])
def test_window_wider_than_the_sequence_is_no_bound(window):
    q = torch.randn(2, 24, 2, 16, dtype=torch.bfloat16)
    k = torch.randn(2, 20, 2, 16, dtype=torch.bfloat16)
    plain = {"causal": window[1] == 0}
    problem = frost.route(q, k, k, window=window).problem
    assert problem == frost.route(q, k, k, **plain).problem
    o, lse = frost.sdpa_forward(q, k, k, window=window)
    o_plain, lse_plain = frost.sdpa_forward(q, k, k, **plain)
    assert torch.equal(o, o_plain) and torch.equal(lse, lse_plain)


@pytest.mark.L0
def test_window_just_inside_the_sequence_still_bounds():
    q = torch.randn(1, 24, 2, 16, dtype=torch.bfloat16)
    assert frost.route(q, q, q, window=(23, -1)).problem.window_left == 23
    assert frost.route(q, q, q, window=(-1, 23)).problem.window_right == 23


def _garbage_calls():
    """(inputs, keywords) of a padded problem with every feature that reads padded rows."""
    inputs = make_inputs(Case(lengths_q=(10, 5), lengths_k=(7, 24), sinks=True, rope=True, bias="BH",
                              heads_q=4, heads_kv=2, poison=False))  # fmt: skip
    return inputs, dict(inputs.keywords)


@pytest.mark.L0
@pytest.mark.parametrize("garbage", [math.nan, math.inf, -math.inf, 6e4])
def test_garbage_in_padded_rows_changes_no_bit(garbage):
    """unfused gave o, dq and dk entirely NaN for NaN in padded key rows (0 x NaN in P.V)."""
    inputs, kw = _garbage_calls()
    q, k, v, do = inputs.q, inputs.k, inputs.v, inputs.do
    o, lse = frost.sdpa_forward(q, k, v, **kw, engine="unfused")
    clean = frost.sdpa_backward(do, q, k, v, o, lse, **kw, engine="unfused")
    dirty = [x.clone() for x in (q, k, v, do, o)]
    for x, rows in zip(dirty, ((10, 5), (7, 24), (7, 24), (10, 5), (10, 5))):
        for b, n in enumerate(rows):
            x[b, n:] = garbage
    bias = kw["bias"].clone()
    bias[0, :, 10:], bias[0, :, :, 7:], bias[1, :, 5:] = garbage, garbage, garbage
    lse_dirty = lse.clone()
    lse_dirty[0, :, 10:], lse_dirty[1, :, 5:] = garbage, garbage
    dq_, dk_, dv_, do_, o_ = dirty
    dirty_kw = {**kw, "bias": bias}
    o2, lse2 = frost.sdpa_forward(dq_, dk_, dv_, **dirty_kw, engine="unfused")
    assert torch.equal(o2, o) and torch.equal(lse2, lse)
    grads = frost.sdpa_backward(do_, dq_, dk_, dv_, o_, lse_dirty, **dirty_kw, engine="unfused")
    for name, got, want in zip(clean._fields, grads, clean):
        assert torch.equal(got, want), name


@pytest.mark.L0
def test_harness_poisons_every_unread_row():
    padded = make_inputs(Case(lengths_q=(10, 5), lengths_k=(7, 24), bias="B1"))
    assert padded.poisoned
    assert padded.q[0, 10:].isnan().all() and not padded.q[0, :10].isnan().any()
    assert padded.k[0, 7:].isnan().all() and padded.v[0, 7:].isnan().all() and not padded.k[1].isnan().any()
    assert padded.do[1, 5:].isnan().all() and not padded.do[1, :5].isnan().any()
    bias = padded.keywords["bias"]
    assert bias[0, :, 10:].isnan().all() and bias[0, :, :, 7:].isnan().all() and not bias[1, :, :5].isnan().any()
    packed = make_inputs(Case(layout="thd", lengths_q=(3, 4), lengths_k=(5, 2), tail_q=2, tail_k=3, bias="11"))
    assert packed.q[7:].isnan().all() and not packed.q[:7].isnan().any()
    assert packed.k[7:].isnan().all() and packed.v[7:].isnan().all() and packed.do[7:].isnan().all()
    assert packed.keywords["bias"][0, :, 4:].isnan().all() and packed.keywords["bias"][0, :, :, 5:].isnan().all()
    assert not make_inputs(Case(lengths_q=(10, 5), poison=False)).q.isnan().any()
    assert make_inputs(Case(lengths_q=(10, 5), device="meta")).poisoned  # every device, not only the CPU


@pytest.mark.L0
def test_a_call_that_raises_is_not_in_the_ledger():
    """Finding 4 of the trust issue, pinned where the validation tests live too
    (frost_harness/suites/test_plans.py has the engine-raises case)."""
    q = torch.randn(1, 8, 2, 16, dtype=torch.bfloat16)
    before = ledger.mark()
    with pytest.raises(ValueError):
        frost.sdpa_forward(q, q, q, scale=1e39)
    assert ledger.mark() == before
