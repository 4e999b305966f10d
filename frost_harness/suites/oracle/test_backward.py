"""The analytic float64 backward is the derivative of the forward, for every feature.

Three independent witnesses, on every case of ``cases.FEATURES``:
torch.autograd through the oracle's own forward (``_forward_autograd``),
torch.autograd through the row-by-row transcription (``naive``), and
finite differences (``torch.autograd.gradcheck`` on a Function whose backward
is ``frost_harness.oracle.reference.backward``).
"""
from __future__ import annotations

import pytest
import torch

from frost_harness.oracle import reference
from frost_harness.suites.oracle import naive
from frost_harness.suites.oracle.cases import FEATURES, FEATURES_BY_NAME, build

pytestmark = pytest.mark.L0

GRAD_NAMES = {"q": "dq", "k": "dk", "v": "dv", "bias": "dbias", "sinks": "dsinks"}


def _autograd(forward, problem):
    """Gradients of sum(do * o) by torch.autograd, keyed like Grads' fields."""
    leaves = {name: t.detach().clone().requires_grad_() for name, t in problem.differentiable.items()}
    p = problem.with_inputs(**leaves)
    o, _ = forward(p.q, p.k, p.v, **p.options)
    valid = problem.valid_q
    if not o.requires_grad:  # nothing visible anywhere: o is a constant
        return {GRAD_NAMES[name]: torch.zeros_like(t) for name, t in leaves.items()}
    grads = torch.autograd.grad(o[valid], list(leaves.values()), problem.do[valid], allow_unused=True)
    return {GRAD_NAMES[name]: torch.zeros_like(leaves[name]) if g is None else g
            for name, g in zip(leaves, grads)}


def _assert_grads_match(problem, expected):
    got = reference.backward(problem.do, problem.q, problem.k, problem.v, **problem.options).as_dict()
    valid = {"dq": problem.valid_q, "dk": problem.valid_k, "dv": problem.valid_k}
    for name, want in expected.items():
        rows = valid.get(name, slice(None))
        torch.testing.assert_close(got[name][rows], want[rows], rtol=1e-10, atol=1e-12, msg=name)
        assert torch.isfinite(got[name][rows]).all(), name


@pytest.mark.parametrize("case", FEATURES, ids=str)
def test_backward_equals_autograd_of_own_forward(case):
    problem = build(case, seed=1)
    _assert_grads_match(problem, _autograd(reference._forward_autograd, problem))


@pytest.mark.parametrize("case", FEATURES, ids=str)
def test_backward_equals_autograd_of_transcription(case):
    problem = build(case, seed=2)
    _assert_grads_match(problem, _autograd(naive.attention, problem))


@pytest.mark.parametrize("case", FEATURES, ids=str)
def test_backward_nan_exactly_on_unowned_packed_rows(case):
    problem = build(case, seed=3)
    grads = reference.backward(problem.do, problem.q, problem.k, problem.v, **problem.options)
    for name, rows in (("dq", problem.valid_q), ("dk", problem.valid_k), ("dv", problem.valid_k)):
        g = getattr(grads, name)
        assert torch.isfinite(g[rows]).all(), name
        assert torch.isnan(g[~rows]).all(), name
    for extra in (grads.dbias, grads.dsinks):
        assert extra is None or torch.isfinite(extra).all()


class _OracleAttention(torch.autograd.Function):
    """o of the oracle's forward, differentiated by the oracle's analytic backward."""

    @staticmethod
    def forward(ctx, q, k, v, bias, sinks, options):
        ctx.save_for_backward(q, k, v, bias, sinks)
        ctx.options = options
        return reference.forward(q, k, v, bias=bias, sinks=sinks, **options)[0]

    @staticmethod
    def backward(ctx, do):
        q, k, v, bias, sinks = ctx.saved_tensors
        g = reference.backward(do, q, k, v, bias=bias, sinks=sinks, **ctx.options)
        # Rows no packed sequence owns are NaN by convention; as inputs they have no influence.
        dq, dk, dv = (torch.nan_to_num(t, nan=0.0) if ctx.options.get("cu_seqlens_q") is not None
                      else t for t in (g.dq, g.dk, g.dv))
        return dq, dk, dv, g.dbias, g.dsinks, None


def _gradcheck(case, fast_mode):
    problem = build(case, seed=4)
    options = {n: t for n, t in problem.options.items() if n not in ("bias", "sinks")}
    valid = problem.valid_q
    inputs = [t.detach().clone().requires_grad_() for t in (problem.q, problem.k, problem.v)]
    for name in ("bias", "sinks"):
        extra = problem.options.get(name)
        inputs.append(None if extra is None else extra.detach().clone().requires_grad_())

    def fn(q, k, v, bias, sinks):
        return _OracleAttention.apply(q, k, v, bias, sinks, options)[valid]

    return torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=fast_mode)


@pytest.mark.parametrize("case", FEATURES, ids=str)
def test_gradcheck(case):
    """Fast mode: a random projection u^T J v per case, which any wrong entry of J changes."""
    assert _gradcheck(case, fast_mode=True)


@pytest.mark.parametrize("name", ["packed_everything", "padded_everything"])
def test_gradcheck_full_jacobian(name):
    """Every entry of the Jacobian, on the two cases that combine the most features."""
    assert _gradcheck(FEATURES_BY_NAME[name], fast_mode=False)


@pytest.mark.parametrize("gap", [46.0, 80.0])
def test_backward_keeps_ds_of_a_row_peaked_beyond_float64(gap):
    """One query row, two keys whose logits lie ``gap`` apart (weight ~1e-20 or ~1e-35 on the
    second): ``dp - D`` formed as a difference would round the first key's ds to the wrong value
    (1 - p_1 is 0 in float64); the closed form ``ds_1 = -ds_2 = p_1 p_2 (dp_1 - dp_2)`` is exact."""
    gen = torch.Generator().manual_seed(7)
    q, k, v, do = (torch.randn(shape, generator=gen, dtype=torch.float64)
                   for shape in ((1, 1, 1, 8), (1, 2, 1, 8), (1, 2, 1, 8), (1, 1, 1, 8)))
    bias = torch.tensor([0.0, -gap], dtype=torch.float64).view(1, 1, 1, 2)
    scale = 0.25
    g = reference.backward(do, q, k, v, scale=scale, bias=bias)
    logits = scale * (k[0, :, 0] @ q[0, 0, 0]) + bias.view(2)
    p_2 = torch.sigmoid(logits[1] - logits[0])
    p_1 = torch.sigmoid(logits[0] - logits[1])
    dp = v[0, :, 0] @ do[0, 0, 0]
    ds_1 = p_1 * p_2 * (dp[0] - dp[1])
    want_dq = scale * ds_1 * (k[0, 0, 0] - k[0, 1, 0])
    torch.testing.assert_close(g.dq[0, 0, 0], want_dq, rtol=1e-12, atol=0)
    torch.testing.assert_close(g.dbias.view(2), torch.stack([ds_1, -ds_1]), rtol=1e-12, atol=0)
