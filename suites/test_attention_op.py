"""``frost.attention``: the torch.library custom ops, their autograd, opcheck and torch.compile."""
from __future__ import annotations

import pytest
import torch

import frost
import oracle.baseline
import oracle.reference
import oracle.tolerance
from frost.dispatch import ledger
from suites.harness import Case, make_inputs

BF16 = torch.bfloat16

OP_CASES = {
    "dense-gqa-causal": Case(heads_q=4, heads_kv=2, causal=True, seqlen_q=6, seqlen_k=9, head_dim_qk=8),
    "dense-bias-sinks-rope": Case(bias="1H", sinks=True, rope=True, seqlen_q=5, seqlen_k=7, head_dim_qk=8,
                                  heads_q=2, heads_kv=2),  # fmt: skip
    "thd-window-bias": Case(layout="thd", lengths_q=(3, 0, 5), lengths_k=(4, 2, 6), tail_q=2, window=(2, 1),
                            bias="BH", heads_q=2, heads_kv=1, head_dim_qk=8),  # fmt: skip
}


def _differentiable(inputs):
    """q, k, v and the float keywords (bias, sinks) as leaves that require grad."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    keywords = dict(inputs.keywords)
    for name in ("bias", "sinks"):
        if keywords.get(name) is not None:
            keywords[name] = keywords[name].detach().clone().requires_grad_()
    return q, k, v, keywords


def _op_arguments(q, k, v, keywords):
    window_left, window_right = keywords.pop("window")
    cos, sin = keywords.pop("rope", None) or (None, None)
    return (q, k, v), {**keywords, "window_left": window_left, "window_right": window_right,
                       "rope_cos": cos, "rope_sin": sin}  # fmt: skip


@pytest.mark.L0
@pytest.mark.parametrize("name", OP_CASES)
def test_opcheck_forward_op(name):
    args, kwargs = _op_arguments(*_differentiable(make_inputs(OP_CASES[name])))
    torch.library.opcheck(torch.ops.frost.sdpa_forward.default, args, kwargs)


@pytest.mark.L0
@pytest.mark.parametrize("name", OP_CASES)
def test_opcheck_backward_op(name):
    inputs = make_inputs(OP_CASES[name])
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **inputs.keywords)
    (q, k, v), kwargs = _op_arguments(inputs.q, inputs.k, inputs.v, dict(inputs.keywords))
    torch.library.opcheck(torch.ops.frost.sdpa_backward.default, (inputs.do, q, k, v, o, lse), kwargs)


@pytest.mark.L0
@pytest.mark.parametrize("name", OP_CASES)
def test_attention_forward_and_autograd_match_oracle(name):
    case = OP_CASES[name]
    inputs = make_inputs(case)
    q, k, v, keywords = _differentiable(inputs)
    o = frost.attention(q, k, v, **keywords)
    o.backward(inputs.do)
    kw = inputs.keywords
    reference = oracle.reference.forward(inputs.q, inputs.k, inputs.v, **kw)[0]
    baseline = oracle.baseline.forward(inputs.q, inputs.k, inputs.v, **kw)[0]
    verdicts = oracle.tolerance.check({"o": o.detach()}, {"o": reference}, {"o": baseline}, io_dtype=case.dtype)
    grads = frost.Grads(q.grad, k.grad, v.grad, *(keywords[n].grad if n in keywords else None for n in ("bias", "sinks")))
    ref = oracle.reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    base = oracle.baseline.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    verdicts |= oracle.tolerance.check_backward(grads, ref, base, io_dtype=case.dtype)
    assert all(v.passed for v in verdicts.values()), oracle.tolerance.summary(verdicts)


@pytest.mark.L0
def test_lse_carries_no_gradient_and_engine_forces_both_directions():
    inputs = make_inputs(Case(heads_q=4, heads_kv=2, seqlen_q=6, seqlen_k=6, head_dim_qk=8))
    q, k, v, keywords = _differentiable(inputs)
    mark = ledger.mark()
    o = frost.attention(q, k, v, **keywords, engine="unfused", deterministic=True)
    o.sum().backward()  # a stride-0 gradient
    forward, backward = ledger.since(mark)
    assert (forward.engine, backward.engine, backward.problem.deterministic) == ("unfused", "unfused", True)
    args, kwargs = _op_arguments(q, k, v, keywords)
    _, lse = torch.ops.frost.sdpa_forward(*args, **kwargs)
    assert not lse.requires_grad


def _loss(q, k, v, bias, do):
    return (frost.attention(q, k, v, causal=True, bias=bias) * do).sum()


@pytest.mark.L0
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_matches_eager(dynamic):
    inputs = make_inputs(Case(heads_q=4, heads_kv=2, seqlen_q=8, seqlen_k=8, head_dim_qk=16, bias="11"))
    eager = _differentiable(inputs)
    compiled = _differentiable(inputs)
    _loss(*eager[:3], eager[3]["bias"], inputs.do).backward()
    torch.compiler.reset()
    step = torch.compile(_loss, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    step(*compiled[:3], compiled[3]["bias"], inputs.do).backward()
    for a, b in zip((*eager[:3], eager[3]["bias"]), (*compiled[:3], compiled[3]["bias"])):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)
