"""Metamorphic identities: the oracle agrees with itself under rewrites that must not matter.

Each test states an identity of SEMANTICS.md and checks forward outputs and
every gradient on both sides:

- packed THD == each sequence run alone == the padded dense layout;
- GQA == MHA with K/V heads repeated (dk/dv summed back over the group);
- a sink == an extra key with a zero key and value vector and the sink as its
  bias (and dsink == that bias column's gradient summed);
- a per-row constant added through the bias changes o, dq, dk, dv, dbias not
  at all and shifts lse by the constant;
- a -inf bias entry == masking that pair (window as bias; a -inf column ==
  removing that key);
- bottom-right alignment with Sq_b == Sk_b == top-left.
"""
from __future__ import annotations

import math

import pytest
import torch

from frost_harness.oracle import reference
from frost_harness.suites.oracle.cases import FEATURES_BY_NAME, Case, build

pytestmark = pytest.mark.L0

TIGHT = {"rtol": 1e-12, "atol": 1e-13}


def _run(p, **overrides):
    options = dict(p.options, **overrides)
    o, lse = reference.forward(p.q, p.k, p.v, **options)
    return o, lse, reference.backward(p.do, p.q, p.k, p.v, **options)


def _close(got, want, name, **tol):
    torch.testing.assert_close(got, want, **(tol or TIGHT), equal_nan=True, msg=name)


PACKED = FEATURES_BY_NAME["packed_everything"]


PACKED_PLAIN = Case("packed_plain", layout="thd", lengths_q=(2, 5, 0), lengths_k=(3, 0, 4), tail_q=3, tail_k=3,
                    heads_q=4, heads_kv=1)


@pytest.mark.parametrize("case", [PACKED, PACKED_PLAIN], ids=str)
def test_packed_equals_per_sequence_equals_padded(case):
    p = build(case, seed=21)
    o, lse, g = _run(p)
    cu_q, cu_k = (p.options[n].tolist() for n in ("cu_seqlens_q", "cu_seqlens_k"))
    bias, sinks = p.options.get("bias"), p.options.get("sinks")
    lens_q, lens_k = case.lengths_q, case.lengths_k
    max_q, max_k = max(lens_q), max(lens_k)
    dense = {n: v for n, v in p.options.items() if n not in ("cu_seqlens_q", "cu_seqlens_k", "bias")}

    # Padded dense: the same rows, garbage (never zero) in the padding.
    gen = torch.Generator().manual_seed(22)
    packed_rows = {"q": (p.q, cu_q, lens_q, max_q), "do": (p.do, cu_q, lens_q, max_q),
                   "k": (p.k, cu_k, lens_k, max_k), "v": (p.v, cu_k, lens_k, max_k)}
    padded = {}
    for n, (src, cu, lens, longest) in packed_rows.items():
        padded[n] = torch.randn(len(lens), longest, *src.shape[1:], generator=gen, dtype=src.dtype)
        for b in range(len(lens)):
            padded[n][b, :lens[b]] = src[cu[b]:cu[b + 1]]
    pd = p.with_inputs(**padded)
    pad_options = dict(dense, seqlens_q=torch.tensor(lens_q, dtype=torch.int32),
                       seqlens_k=torch.tensor(lens_k, dtype=torch.int32),
                       bias=None if bias is None else bias[:, :, :max_q, :max_k])
    o_p, lse_p = reference.forward(pd.q, pd.k, pd.v, **pad_options)
    g_p = reference.backward(pd.do, pd.q, pd.k, pd.v, **pad_options)

    dsinks_sum = 0
    for b in range(len(lens_q)):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        nq, nk = lens_q[b], lens_k[b]
        one_bias = None if bias is None else bias[b:b + 1 if bias.shape[0] > 1 else 1, :, :nq, :nk]
        one = p.with_inputs(q=p.q[rq][None], k=p.k[rk][None], v=p.v[rk][None], do=p.do[rq][None])
        o_1, lse_1, g_1 = _run(one, **{n: None for n in ("cu_seqlens_q", "cu_seqlens_k")},
                               bias=one_bias)
        for got, want, name in ((o[rq], o_1[0], "o"), (lse[:, rq], lse_1[0], "lse"),
                                (g.dq[rq], g_1.dq[0], "dq"), (g.dk[rk], g_1.dk[0], "dk"),
                                (g.dv[rk], g_1.dv[0], "dv"),
                                (o_p[b, :nq], o_1[0], "o padded"), (lse_p[b, :, :nq], lse_1[0], "lse padded"),
                                (g_p.dq[b, :nq], g_1.dq[0], "dq padded"),
                                (g_p.dk[b, :nk], g_1.dk[0], "dk padded"),
                                (g_p.dv[b, :nk], g_1.dv[0], "dv padded")):
            _close(got, want, f"{name}, sequence {b}")
        if bias is not None and bias.shape[0] > 1:
            _close(g.dbias[b, :, :nq, :nk], g_1.dbias[0], f"dbias, sequence {b}")
        if sinks is not None:
            dsinks_sum = dsinks_sum + g_1.dsinks
        # Padding rows and keys of the dense layout follow the contract.
        assert (o_p[b, nq:] == 0).all() and (lse_p[b, :, nq:] == -math.inf).all()
        assert (g_p.dq[b, nq:] == 0).all() and (g_p.dk[b, nk:] == 0).all() and (g_p.dv[b, nk:] == 0).all()
    if bias is not None:
        _close(g_p.dbias, g.dbias[:, :, :max_q, :max_k], "dbias padded")
        assert (g.dbias[:, :, max_q:] == 0).all() and (g.dbias[:, :, :, max_k:] == 0).all()
    if sinks is not None:
        _close(g.dsinks, dsinks_sum, "dsinks")
        _close(g_p.dsinks, dsinks_sum, "dsinks padded")


@pytest.mark.parametrize("name", ["gqa_window_sinks", "mqa_causal_bottom_right_sinks",
                                  "rope_table_bias_gqa", "packed_everything", "padded_everything"])
def test_gqa_equals_mha_with_repeated_kv(name):
    p = build(FEATURES_BY_NAME[name], seed=23)
    head_dim = p.k.dim() - 2
    group = p.q.shape[head_dim] // p.k.shape[head_dim]
    mha = p.with_inputs(k=p.k.repeat_interleave(group, dim=head_dim),
                        v=p.v.repeat_interleave(group, dim=head_dim))
    o, lse, g = _run(p)
    o_m, lse_m, g_m = _run(mha)
    _close(o, o_m, "o")
    _close(lse, lse_m, "lse")
    for n in ("dq", "dbias", "dsinks"):
        _close(getattr(g, n), getattr(g_m, n), n)
    for n in ("dk", "dv"):
        summed = getattr(g_m, n).unflatten(head_dim, (p.k.shape[head_dim], group)).sum(head_dim + 1)
        _close(getattr(g, n), summed, n)


@pytest.mark.parametrize("with_rope", [False, True])
def test_sink_equals_extra_key_with_zero_value(with_rope):
    case = Case("sink_as_key", batch=2, seqlen_q=5, seqlen_k=4, heads_q=4, heads_kv=2, bias="BH", sinks=True,
                rope=with_rope)
    p = build(case, seed=24)
    bias, sinks = p.options["bias"].clone(), p.options["sinks"]
    bias[0, 1, 2, :] = -math.inf  # a row that sees only its sink
    bias[1, 3, :, 1] = -math.inf
    p = p.with_inputs(bias=bias)
    zero_key = torch.zeros(case.batch, 1, case.heads_kv, case.head_dim_qk, dtype=p.k.dtype)
    zero_value = torch.zeros(case.batch, 1, case.heads_kv, case.dim_v, dtype=p.v.dtype)
    sink_column = sinks.view(1, -1, 1, 1).expand(case.batch, -1, case.seqlen_q, 1)
    extra = p.with_inputs(k=torch.cat((p.k, zero_key), 1), v=torch.cat((p.v, zero_value), 1),
                          bias=torch.cat((bias, sink_column), -1), sinks=None)
    o, lse, g = _run(p)
    o_x, lse_x, g_x = _run(extra)
    _close(o, o_x, "o")
    _close(lse, lse_x, "lse")
    _close(g.dq, g_x.dq, "dq")
    _close(g.dk, g_x.dk[:, :-1], "dk")
    _close(g.dv, g_x.dv[:, :-1], "dv")
    _close(g.dbias, g_x.dbias[..., :-1], "dbias")
    _close(g.dsinks, g_x.dbias[..., -1].sum((0, 2)), "dsinks == dbias of the sink column")


@pytest.mark.parametrize("name", ["rope_bias", "gqa_window_sinks", "packed_everything"])
def test_per_row_constant_through_bias_changes_nothing_but_lse(name):
    case = FEATURES_BY_NAME[name]
    p = build(case, seed=25)
    # Sinks are not shifted by a bias, so the identity holds without them.
    p = p.with_inputs(sinks=None)
    gen = torch.Generator().manual_seed(26)
    bias = p.options.get("bias")
    if bias is None:
        bias = torch.randn(case.batch, case.heads_q, case.seqlen_q, case.seqlen_k, generator=gen, dtype=p.q.dtype)
        p = p.with_inputs(bias=bias)
    shift = 40 * torch.randn(*bias.shape[:3], 1, generator=gen, dtype=bias.dtype)
    shifted = p.with_inputs(bias=bias + shift)
    o, lse, g = _run(p)
    o_s, lse_s, g_s = _run(shifted)
    loose = {"rtol": 1e-9, "atol": 1e-11}  # the shift costs a few ulps of the logits' new magnitude
    _close(o_s, o, "o", **loose)
    for n in ("dq", "dk", "dv", "dbias"):
        _close(getattr(g_s, n), getattr(g, n), n, **loose)
    rows = shift[..., 0]
    if p.options.get("cu_seqlens_q") is None:
        expected_lse = lse + rows
    else:  # packed: lse [Hq, Tq]; row i of sequence b is token cu[b] + i
        expected_lse = lse.clone()
        cu = p.options["cu_seqlens_q"].tolist()
        for b in range(len(cu) - 1):
            expected_lse[:, cu[b]:cu[b + 1]] += rows[b if rows.shape[0] > 1 else 0, :, :cu[b + 1] - cu[b]]
    _close(lse_s, expected_lse, "lse", **loose)


def _visible(sq, sk, left, right, bottom_right):
    """The visibility predicate of SEMANTICS.md step 3, spelled out pair by pair."""
    delta = sk - sq if bottom_right else 0
    return torch.tensor([[(left < 0 or j >= i + delta - left) and (right < 0 or j <= i + delta + right)
                          for j in range(sk)] for i in range(sq)])


@pytest.mark.parametrize("window,align", [((1, 2), "bottom_right"), ((0, 0), "top_left"),
                                          ((2, 0), "bottom_right"), ((-1, 1), "top_left")])
def test_minus_inf_bias_equals_masking(window, align):
    case = Case("window_as_bias", batch=2, seqlen_q=6, seqlen_k=5, heads_q=4, heads_kv=2, window=window,
                causal_align=align, bias="B1", sinks=True)
    p = build(case, seed=27)
    visible = _visible(case.seqlen_q, case.seqlen_k, *window, align == "bottom_right")
    as_bias = p.with_inputs(bias=p.options["bias"].masked_fill(~visible, -math.inf))
    o, lse, g = _run(p)
    o_b, lse_b, g_b = _run(as_bias, window=(-1, -1))
    _close(o_b, o, "o")
    _close(lse_b, lse, "lse")
    for n in ("dq", "dk", "dv", "dbias", "dsinks"):
        _close(getattr(g_b, n), getattr(g, n), n)
    assert (g_b.dbias[..., ~visible] == 0).all()


def test_minus_inf_bias_column_equals_removing_the_key():
    case = Case("drop_key", batch=2, seqlen_q=4, seqlen_k=6, heads_q=4, heads_kv=2, bias="1H", sinks=True)
    p = build(case, seed=28)
    dropped = 2
    bias = p.options["bias"].clone()
    bias[..., dropped] = -math.inf
    keep = [j for j in range(case.seqlen_k) if j != dropped]
    masked = p.with_inputs(bias=bias)
    removed = p.with_inputs(k=p.k[:, keep], v=p.v[:, keep], bias=p.options["bias"][..., keep])
    o, lse, g = _run(masked)
    o_r, lse_r, g_r = _run(removed)
    _close(o, o_r, "o")
    _close(lse, lse_r, "lse")
    _close(g.dq, g_r.dq, "dq")
    _close(g.dsinks, g_r.dsinks, "dsinks")
    for n in ("dk", "dv"):
        _close(getattr(g, n)[:, keep], getattr(g_r, n), n)
        assert (getattr(g, n)[:, dropped] == 0).all()
    _close(g.dbias[..., keep], g_r.dbias, "dbias")
    assert (g.dbias[..., dropped] == 0).all()


@pytest.mark.parametrize("window", [(-1, -1), (2, -1), (1, 1), (0, 3)])
@pytest.mark.parametrize("layout", ["dense", "packed"])
def test_bottom_right_equals_top_left_when_sq_equals_sk(window, layout):
    if layout == "dense":
        case = Case("square", batch=2, seqlen_q=5, seqlen_k=5, heads_q=4, heads_kv=2, causal=True, window=window,
                    bias="BH", sinks=True)
    else:
        case = Case("square_packed", layout="thd", lengths_q=(3, 0, 5), lengths_k=(3, 0, 5), tail_q=2, tail_k=2,
                    heads_q=2, heads_kv=1, causal=True, window=window, rope=True, sinks=True)
    p = build(case, seed=29)
    o, lse, g = _run(p, causal_align="top_left")
    o_br, lse_br, g_br = _run(p, causal_align="bottom_right")
    _close(o_br, o, "o", rtol=0, atol=0)
    _close(lse_br, lse, "lse", rtol=0, atol=0)
    for n, t in g.as_dict().items():
        _close(getattr(g_br, n), t, n, rtol=0, atol=0)
