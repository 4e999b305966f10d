"""The allowance for a problem's io-dtype operands (frost_harness/oracle/operand_slack.py): RoPE's
rounded rotations, the backward's given o and lse, its float32 D and dp."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from frost_harness.oracle import baseline, reference, operand_slack, tolerance
from frost_harness.oracle.call import Call
from frost_harness.suites.harness import Case, backward_feed, judged, make_inputs

pytestmark = pytest.mark.L0

CASES = {
    "dense_gqa_sinks_bias": Case(seqlen_q=7, seqlen_k=9, heads_q=4, heads_kv=2, sinks=True, bias="1H", causal=True,
                                 causal_align="bottom_right", rope=True, poison=False),
    "packed_window_bias": Case(layout="thd", lengths_q=(3, 0, 5), lengths_k=(4, 2, 6), heads_q=2, heads_kv=1,
                               window=(2, 1), bias="BH", rope=True, tail_q=1, tail_k=2, poison=False),
}


@pytest.mark.parametrize("name", CASES)
def test_the_given_backward_is_the_contract_and_float32_operands_cost_nothing(name):
    """In float32 the rounded rotation is the rotation to 1e-7, so the slack of both directions is
    at that level: the backward evaluated from the given o and lse is the oracle's gradient, across
    GQA, sinks, a broadcast bias, masks, packed sequences with an empty one and unread tails."""
    inputs = make_inputs(dataclasses.replace(CASES[name], dtype=torch.float32))
    kw = inputs.keywords
    o, lse = reference.forward(inputs.q, inputs.k, inputs.v, **kw)
    grads = reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    slack = operand_slack.backward_slack(inputs.do, inputs.q, inputs.k, inputs.v, o, lse, grads, **kw)
    assert set(slack) == {"dq", "dk", "dv", "dbias"} | ({"dsinks"} if kw.get("sinks") is not None else set())
    for key, gap in slack.items():
        scale = float(getattr(grads, key).nan_to_num(0).abs().max())
        # what remains is the bound of float32 D and dp, (Dv - 1) * 2^-24 of the products' magnitudes
        assert float(gap.max()) < 1e-4 * scale, key
    assert all(float(gap.max()) < 1e-5 for gap in operand_slack.forward_slack(inputs.q, inputs.k, inputs.v, (o, lse),
                                                                           **kw).values())


def _fused_rope_engine(inputs, sign: float = 1.0):
    """A same-precision engine with fused RoPE, exact but for its operands: the rotated q and k
    rounded to fp16 (sign -1: the rotation with sin negated, a real bug); forward and backward
    (from the given o and lse) computed in float64 on them and rounded to fp16."""
    kw = dict(inputs.keywords)
    cos, sin = kw["rope"]
    call = Call.of(inputs.q, inputs.k, inputs.v, **{**kw, "rope": (cos, sign * sin)})
    q_io = operand_slack.rounded_rotation(inputs.q, call, "q_index")
    k_io = operand_slack.rounded_rotation(inputs.k, call, "k_index")
    plain = {n: x for n, x in kw.items() if n != "rope"}
    o, lse = reference.forward(q_io, k_io, inputs.v, **plain)
    return o.half(), lse.float()


def test_a_fused_rope_engine_passes_with_the_slack_and_a_wrong_rotation_does_not():
    """fp16, logits in the hundreds (the H200 nightly's regime): the operands' rounding alone
    fails the rule as written on this problem, passes it with the slack, and a rotation with the
    wrong sign fails it with the slack too."""
    case = Case(seqlen_q=8, seqlen_k=9, heads_q=1, heads_kv=1, head_dim_qk=64, head_dim_v=64,
                causal_align="bottom_right", window=(1, 1), bias="1H", rope=True, scale=1.0, dtype=torch.float16,
                logit_scale=16.0, poison=False)
    worst = []
    for seed in range(8):
        inputs = make_inputs(dataclasses.replace(case, seed=seed))
        kw = inputs.keywords
        truth = reference.forward(inputs.q, inputs.k, inputs.v, **kw)
        base = baseline.forward(inputs.q, inputs.k, inputs.v, **kw)
        slack = operand_slack.forward_slack(inputs.q, inputs.k, inputs.v, truth, **kw)
        fused = _fused_rope_engine(inputs)
        judged = tolerance.check_forward(fused, truth, base, io_dtype=torch.float16, slack=slack)
        assert judged["o"].passed, tolerance.summary(judged)
        strict = tolerance.check_forward(fused, truth, base, io_dtype=torch.float16)
        worst.append(strict["o"].ratio)
        wrong = tolerance.check_forward(_fused_rope_engine(inputs, sign=-1.0), truth, base, io_dtype=torch.float16,
                                        slack=slack)
        assert not wrong["o"].passed and wrong["o"].ratio > 10, tolerance.summary(wrong)
    assert max(worst) > 1, worst  # the rule as written fails some of these honest engines


def test_the_backward_slack_admits_the_fused_engine_and_not_a_wrong_rotation():
    """The backward on the given (o, lse) with the operands rounded (what the sm80 kernel
    computes, here exactly, then rounded to fp16) passes with the slack; the same with the
    rotation's sin negated (forward and back) fails with it."""
    case = dataclasses.replace(CASES["dense_gqa_sinks_bias"], dtype=torch.float16, logit_scale=16.0)
    inputs = make_inputs(case)
    kw = inputs.keywords
    o64, lse64 = reference.forward(inputs.q, inputs.k, inputs.v, **kw)
    o, lse = o64.half(), lse64.float()
    truth = reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    base = baseline.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    slack = operand_slack.backward_slack(inputs.do, inputs.q, inputs.k, inputs.v, o, lse, truth, **kw)
    cos, sin = kw["rope"]

    def engine(tables):
        call = Call.of(inputs.q, inputs.k, inputs.v, **{**kw, "rope": tables})
        grads, _ = operand_slack._backward_as_given(inputs.do, inputs.q, inputs.k, inputs.v, o, lse, call)
        return dataclasses.replace(truth, **{n: g.to(torch.float16 if n in ("dq", "dk", "dv") else torch.float32)
                                            for n, g in grads.items() if g is not None})

    judged = tolerance.check_backward(engine((cos, sin)), truth, base, io_dtype=torch.float16, slack=slack)
    assert all(v.passed for v in judged.values()), tolerance.summary(judged)
    wrong = tolerance.check_backward(engine((cos, -sin)), truth, base, io_dtype=torch.float16, slack=slack)
    assert not wrong["dq"].passed and not wrong["dk"].passed, tolerance.summary(wrong)


# One key beside a sink in each row (window (0, 0)), fp16: where the key outweighs the sink,
# dS = P (dP - D) is a small difference and D comes from the given, fp16-rounded o.
ONE_KEY_BESIDE_A_SINK = Case(seqlen_q=17, seqlen_k=17, heads_q=2, heads_kv=2, head_dim_qk=16, head_dim_v=32,
                             causal_align="bottom_right", window=(0, 0), sinks=True, sink_scale=20.0,
                             dtype=torch.float16, logit_scale=4.0, poison=False)


def _contract_literal_engine(inputs, o, lse, dq_factor: float = 1.0):
    """The contract's backward computed exactly from the given o and lse, rounded to fp16 (what a
    faithful engine can at best return); ``dq_factor`` != 1 is a real bug, a scaled dq."""
    grads, _ = operand_slack._backward_as_given(inputs.do, inputs.q, inputs.k, inputs.v, o, lse,
                                                Call.of(inputs.q, inputs.k, inputs.v, **inputs.keywords))  # fmt: skip
    grads["dq"] = grads["dq"] * dq_factor
    return {n: g.to(torch.float16 if n in ("dq", "dk", "dv") else torch.float32) for n, g in grads.items()
            if g is not None}


def test_the_given_o_costs_what_the_slack_says_and_a_wrong_gradient_still_fails():
    """Without RoPE the forward has no slack and the backward's is what D from the fp16 o costs:
    the exact contract-literal engine fails the rule as written on some seeds (the truth is
    smaller than that residue), passes with the slack on all, and a dq 2% off fails with it."""
    worst = []
    for seed in range(6):
        inputs = make_inputs(dataclasses.replace(ONE_KEY_BESIDE_A_SINK, seed=seed))
        kw = inputs.keywords
        o64, lse64 = reference.forward(inputs.q, inputs.k, inputs.v, **kw)
        assert operand_slack.forward_slack(inputs.q, inputs.k, inputs.v, (o64, lse64), **kw) == {}
        o, lse = backward_feed(inputs, o64, lse64)
        truth = reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
        base = baseline.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
        slack = operand_slack.backward_slack(inputs.do, inputs.q, inputs.k, inputs.v, o, lse, truth, **kw)
        engine = _contract_literal_engine(inputs, o, lse)
        strict = tolerance.check(engine, truth.as_dict(), base.as_dict(), io_dtype=torch.float16)
        worst.append(max(v.ratio_l2 for v in strict.values()))
        relaxed = tolerance.check(engine, truth.as_dict(), base.as_dict(), io_dtype=torch.float16, slack=slack)
        assert all(v.passed for v in relaxed.values()), tolerance.summary(relaxed)
        wrong = tolerance.check(_contract_literal_engine(inputs, o, lse, dq_factor=1.02), truth.as_dict(),
                                base.as_dict(), io_dtype=torch.float16, slack=slack)  # fmt: skip
        assert not wrong["dq"].passed, tolerance.summary(wrong)
    assert max(worst) > 1, worst  # the rule as written fails the exact contract-literal engine


def test_judged_asks_for_the_slack_only_when_a_verdict_fails():
    calls = []

    def slack_of():
        calls.append(1)
        return {"dq": torch.ones(())}

    def judge(slack):
        return {"dq": tolerance.Verdict("dq", slack is not None, 0, 0, 0, 0, 0, 0, 0)}

    assert judged(judge, slack_of)["dq"].passed and calls == [1]
    assert judged(lambda slack: {"dq": tolerance.Verdict("dq", True, 0, 0, 0, 0, 0, 0, 0)}, slack_of)["dq"].passed
    assert calls == [1]  # a pass without it never computed it
    assert not judged(judge, lambda: {})["dq"].passed  # no slack to give: the failure stands
