"""Closed forms at the edges: fully masked rows, empty sequences, huge logits, bad arguments.

Every expected value here is written down from SEMANTICS.md directly (no
second implementation): rows with nothing visible give ``o = 0``,
``lse = -inf`` or the sink and zero gradients; empty sequences contribute
nothing; logits of magnitude 1e4 give the one-hot (or uniform) softmax they
stand for, finite everywhere.
"""
from __future__ import annotations

import math

import pytest
import torch

from frost_harness.oracle import reference
from frost_harness.suites.oracle.cases import Case, build

pytestmark = pytest.mark.L0


def _run(p, **overrides):
    options = dict(p.options, **overrides)
    o, lse = reference.forward(p.q, p.k, p.v, **options)
    return o, lse, reference.backward(p.do, p.q, p.k, p.v, **options)


def _all_finite(*tensors):
    return all(t is None or torch.isfinite(t).all() for t in tensors)


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("how", ["bottom_right_sq_gt_sk", "window_zero_sq_gt_sk", "bias_row_minus_inf"])
def test_fully_masked_rows(how, sinks):
    """Rows that see no key: o = 0, lse = -inf (or the sink), zero gradients, no NaN."""
    sq, sk = 6, 3
    case = {
        "bottom_right_sq_gt_sk": Case(how, seqlen_q=sq, seqlen_k=sk, causal=True, causal_align="bottom_right",
                                      sinks=sinks),
        "window_zero_sq_gt_sk": Case(how, seqlen_q=sq, seqlen_k=sk, window=(0, 0), sinks=sinks),
        "bias_row_minus_inf": Case(how, seqlen_q=sq, seqlen_k=sk, bias="BH", sinks=sinks),
    }[how]
    p = build(case, seed=31)
    # Bottom-right with delta = -3 hides keys from rows 0..2; the diagonal window
    # (j == i) and the -inf bias rows hide them from rows 3..5.
    blind_rows = slice(0, 3) if how == "bottom_right_sq_gt_sk" else slice(3, sq)
    blind = torch.zeros(case.batch, case.heads_q, sq, dtype=torch.bool)  # [b, h, i]: sees nothing
    blind[:, :, blind_rows] = True
    if how == "bias_row_minus_inf":
        bias = p.options["bias"].clone()
        bias[:, :, blind_rows] = -math.inf
        p = p.with_inputs(bias=bias)
    o, lse, g = _run(p)
    assert _all_finite(o, g.dq, g.dk, g.dv, g.dbias, g.dsinks)
    assert (o.permute(0, 2, 1, 3)[blind] == 0).all()
    if sinks:
        expected_lse = p.options["sinks"].view(1, -1, 1).expand_as(lse)
    else:
        expected_lse = torch.full_like(lse, -math.inf)
    assert torch.equal(lse[blind], expected_lse[blind])
    assert torch.isfinite(lse[~blind]).all()
    assert (g.dq.permute(0, 2, 1, 3)[blind] == 0).all()
    if g.dbias is not None:
        assert (g.dbias[:, :, blind_rows] == 0).all()


def test_all_keys_masked_everywhere():
    """No key visible anywhere: every output is the closed form, every gradient zero."""
    for sinks in (False, True):
        p = build(Case("nothing", seqlen_q=3, seqlen_k=4, window=(0, 0), causal_align="bottom_right", sinks=sinks,
                       causal=False), seed=32)
        p = p.with_inputs(k=p.k[:, :0], v=p.v[:, :0])  # Sk = 0
        o, lse, g = _run(p)
        assert (o == 0).all() and o.shape == (2, 3, 2, 4)
        want = p.options["sinks"].view(1, -1, 1).expand_as(lse) if sinks else torch.full_like(lse, -math.inf)
        assert torch.equal(lse, want)
        assert (g.dq == 0).all() and g.dk.numel() == 0 and g.dv.numel() == 0
        assert g.dsinks is None or (g.dsinks == 0).all()


def test_empty_sequences_packed_and_padded():
    """A sequence without queries leaves its keys with dk = dv = 0; one without keys gives o = 0."""
    for layout in ("thd", "bshd"):  # packed, and dense padded by the same lengths
        tail = 2 if layout == "thd" else 0
        case = Case(f"empty_{layout}", layout=layout, seqlen_q=4, seqlen_k=5, lengths_q=(0, 4, 3),
                    lengths_k=(5, 0, 2), batch=3, tail_q=tail, tail_k=tail, sinks=True, bias="BH")
        p = build(case, seed=33)
        o, lse, g = _run(p)
        if layout == "thd":
            no_queries_keys, no_keys_rows = slice(0, 5), slice(0, 4)
            assert (g.dk[no_queries_keys] == 0).all() and (g.dv[no_queries_keys] == 0).all()
            assert (o[no_keys_rows] == 0).all() and (g.dq[no_keys_rows] == 0).all()
            assert torch.equal(lse[:, no_keys_rows], p.options["sinks"].double().view(-1, 1).expand(-1, 4))
            assert torch.isnan(o[7:]).all() and torch.isnan(lse[:, 7:]).all()
            assert torch.isnan(g.dq[7:]).all() and torch.isnan(g.dk[7:]).all()
        else:
            assert (g.dk[0] == 0).all() and (g.dv[0] == 0).all()
            assert (o[1] == 0).all() and (g.dq[1] == 0).all() and (lse[0] == -math.inf).all()
            assert torch.equal(lse[1], p.options["sinks"].double().view(-1, 1).expand(-1, 4))
        # Nothing in bias belongs to an empty sequence's pairs: its gradient is zero there.
        assert (g.dbias[0] == 0).all() and (g.dbias[1] == 0).all()
        assert _all_finite(g.dbias, g.dsinks)


def test_no_sequences_at_all():
    q = torch.randn(3, 2, 4, dtype=torch.float64)
    k = torch.randn(2, 2, 4, dtype=torch.float64)
    cu = torch.zeros(1, dtype=torch.int32)
    o, lse = reference.forward(q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu)
    g = reference.backward(q, q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert torch.isnan(o).all() and torch.isnan(lse).all()
    assert torch.isnan(g.dq).all() and torch.isnan(g.dk).all()


def test_large_logits_one_hot():
    """A key 1e4 above the rest takes all the weight: o = its value, lse = its logit, no NaN."""
    case = Case("one_hot", seqlen_q=4, seqlen_k=5, heads_q=2, heads_kv=1, bias="BH", sinks=True)
    p = build(case, seed=34)
    winner = torch.tensor([[0, 3, 1, 4], [2, 2, 0, 1]])  # [b, i] -> key
    bias = p.options["bias"].clone()
    for b in range(2):
        for i in range(4):
            bias[b, :, i, winner[b, i]] += 1e4
    p = p.with_inputs(bias=bias)
    o, lse, g = _run(p)
    assert _all_finite(o, lse, g.dq, g.dk, g.dv, g.dbias, g.dsinks)
    scale = 1 / math.sqrt(case.head_dim_qk)
    for b in range(2):
        for h in range(2):
            for i in range(4):
                j = int(winner[b, i])
                logit = scale * torch.dot(p.q[b, i, h], p.k[b, j, 0]) + bias[b, h, i, j]
                torch.testing.assert_close(o[b, i, h], p.v[b, j, 0], rtol=0, atol=0)
                torch.testing.assert_close(lse[b, h, i], logit, rtol=1e-15, atol=0)
    # p is exactly one-hot in float64 (exp(-1e4) == 0), so ds = 0: no logit gradient at all.
    assert (g.dq == 0).all() and (g.dk == 0).all() and (g.dbias == 0).all() and (g.dsinks == 0).all()
    dv = torch.zeros_like(g.dv)
    for b in range(2):
        for i in range(4):
            dv[b, winner[b, i], 0] += p.do[b, i].sum(0)
    torch.testing.assert_close(g.dv, dv, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("offset", [1e4, -1e4])
def test_large_uniform_logits_are_shift_invariant(offset):
    """All logits (and sinks) moved by +-1e4: o and gradients unchanged, lse moved by the offset."""
    case = Case("uniform_shift", seqlen_q=4, seqlen_k=5, heads_q=2, heads_kv=2, bias="11", sinks=True, causal=True)
    p = build(case, seed=35)
    o, lse, g = _run(p)
    shifted = p.with_inputs(bias=p.options["bias"] + offset, sinks=p.options["sinks"] + offset)
    o_s, lse_s, g_s = _run(shifted)
    assert _all_finite(o_s, lse_s, g_s.dq, g_s.dk, g_s.dv, g_s.dbias, g_s.dsinks)
    # 1e4 has an ulp of 2e-12 in float64; the shifted problem is that far from exact.
    loose = {"rtol": 1e-9, "atol": 1e-9}
    torch.testing.assert_close(o_s, o, **loose)
    torch.testing.assert_close(lse_s, lse + offset, **loose)
    for n in ("dq", "dk", "dv", "dbias", "dsinks"):
        torch.testing.assert_close(getattr(g_s, n), getattr(g, n), **loose, msg=n)


def test_huge_sink_swallows_the_row():
    """A sink 1e4 above every logit: o = 0 and lse = sink to the last bit; dsinks = -sum D_i = 0."""
    p = build(Case("huge_sink", seqlen_q=3, seqlen_k=4, sinks=True), seed=36)
    p = p.with_inputs(sinks=torch.tensor([1e4, -2.0], dtype=torch.float64))
    o, lse, g = _run(p)
    assert (o[:, :, 0] == 0).all() and (lse[:, 0] == 1e4).all()
    assert (g.dq[:, :, 0] == 0).all() and g.dsinks[0] == 0
    assert torch.isfinite(o).all() and (o[:, :, 1] != 0).all()


def test_valid_rows_mask():
    cu = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    assert reference.valid_rows_mask(7, cu).tolist() == [True] * 5 + [False] * 2
    assert reference.valid_rows_mask(3).tolist() == [True] * 3


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


def _packed(q, k, v):
    return q[0], k[0], v[0]


# What the message must name -> how to spoil a valid dense call: (q, k, v), extra keywords.
BAD_ARGUMENTS = {
    "q": lambda q, k, v: ((q[0], k, v), {}),
    "Hkv": lambda q, k, v: ((q[:, :, :3], k, v), {}),
    "cu_seqlens_q and cu_seqlens_k": lambda q, k, v: (_packed(q, k, v), {"cu_seqlens_q": _i32(0, 2)}),
    "cu_seqlens_q must start at 0": lambda q, k, v: (
        _packed(q, k, v), {"cu_seqlens_q": _i32(1, 2), "cu_seqlens_k": _i32(0, 2)}),
    "seqlens_k": lambda q, k, v: ((q, k, v), {"seqlens_k": _i32(9, 1)}),
    "bias": lambda q, k, v: ((q, k, v), {"bias": torch.zeros(2, 3, 4, 5)}),
    "sinks": lambda q, k, v: ((q, k, v), {"sinks": torch.zeros(3)}),
    "rope": lambda q, k, v: ((q, k, v), {"rope": (torch.zeros(3, 2), torch.zeros(3, 2))}),
    "causal_align": lambda q, k, v: ((q, k, v), {"causal": True, "causal_align": "diagonal"}),
    "window": lambda q, k, v: ((q, k, v), {"window": (-2, 0)}),
    "block_q": lambda q, k, v: ((q, k, v), {"block_q": 0}),
    "max_seqlen_q": lambda q, k, v: (
        _packed(q, k, v), {"cu_seqlens_q": _i32(0, 4), "cu_seqlens_k": _i32(0, 5), "max_seqlen_q": 3}),
}


@pytest.mark.parametrize("needle", BAD_ARGUMENTS)
def test_bad_arguments_raise_value_error_naming_them(needle):
    p = build(Case("args", seqlen_q=4, seqlen_k=5, heads_q=4, heads_kv=2), seed=37)
    args, kwargs = BAD_ARGUMENTS[needle](p.q, p.k, p.v)
    with pytest.raises(ValueError, match=needle):
        reference.forward(*args, **kwargs)


def test_do_shape_is_checked():
    p = build(Case("args"), seed=38)
    with pytest.raises(ValueError, match="do"):
        reference.backward(p.do[:, :1], p.q, p.k, p.v)
