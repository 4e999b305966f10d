"""The native engines against the float64 oracle under the acceptance rule, forward and backward.

Every case runs twice: routed (dispatch picks the engine, as a user's call would) and
forced onto ``unfused``, the engine that must serve everything. The L0 grid touches
every feature of SEMANTICS.md and the combinations that interact; L1 crosses them
wider. Each run goes through ``frost_harness.suites.harness.check``: poisoned outputs, untouched
packed tails, oracle verdicts, records for the report.
"""
from __future__ import annotations

import itertools

import pytest
import torch

from frost_harness.suites.harness import Case, check

BF16, FP16 = torch.bfloat16, torch.float16
THD = {"layout": "thd"}

L0_CASES = [
    Case(name="dense-bf16"),
    Case(name="dense-fp16-scale", dtype=FP16, scale=0.3, heads_q=2, heads_kv=2),
    Case(name="causal-sq<sk", causal=True, seqlen_q=16, seqlen_k=40),
    Case(name="causal-sq>sk-fp16", dtype=FP16, causal=True, seqlen_q=40, seqlen_k=16),
    Case(name="bottom-right-sq<sk", causal=True, causal_align="bottom_right", seqlen_q=16, seqlen_k=40),
    Case(name="bottom-right-sq>sk", causal=True, causal_align="bottom_right", seqlen_q=40, seqlen_k=16),
    Case(name="gqa-causal", heads_q=8, heads_kv=2, causal=True),
    Case(name="mqa", heads_q=4, heads_kv=1, dtype=FP16),
    Case(name="bias-BH-fp32", bias="BH"),
    Case(name="bias-large-fp16", bias="1H", bias_scale=30.0, dtype=FP16),
    Case(name="bias-1H-io-causal", bias="1H", bias_dtype=BF16, causal=True),
    Case(name="bias-11-holes-gqa", bias="11", bias_holes=True, heads_q=4, heads_kv=2),
    Case(name="bias-B1-holes-fp16", bias="B1", bias_holes=True, dtype=FP16, bias_dtype=FP16),
    Case(name="window-left-right", window=(4, 2)),
    Case(name="window-left", window=(3, -1), causal=True),
    Case(name="window-right-bottom-right", window=(-1, 5), causal_align="bottom_right", seqlen_q=30, seqlen_k=20),
    # window (0, 0) with a sink: each row sees one key plus the sink, so it is spread and all
    # of its outputs are judged (without the sink: test_window_zero_* below)
    Case(name="window-zero-sinks", window=(0, 0), sinks=True),
    Case(name="padding", lengths_q=(10, 0), lengths_k=(24, 7), causal=True, causal_align="bottom_right"),
    Case(name="padding-sinks-rope-bias", lengths_q=(10, 5), lengths_k=(7, 24), sinks=True, rope=True, bias="BH"),
    Case(name="thd-empty-tails", **THD, lengths_q=(7, 0, 19), lengths_k=(5, 12, 19), tail_q=3, tail_k=2),
    Case(name="thd-gqa-bottom-right", **THD, lengths_q=(7, 13, 19), lengths_k=(20, 12, 0), heads_q=4,
         heads_kv=2, causal=True, causal_align="bottom_right"),  # fmt: skip
    Case(name="thd-bias-window", **THD, lengths_q=(7, 13), lengths_k=(9, 12), bias="BH", window=(3, 1)),
    Case(name="thd-bias-sinks-rope", **THD, lengths_q=(7, 13), lengths_k=(9, 12), bias="11", sinks=True,
         rope=True, heads_q=4, heads_kv=1, tail_q=2),  # fmt: skip
    Case(name="sinks", sinks=True, dtype=FP16),
    Case(name="sinks-window-gqa", sinks=True, window=(2, 0), heads_q=4, heads_kv=2),
    Case(name="rope", rope=True),
    Case(name="rope-causal-fp16", rope=True, causal=True, dtype=FP16, head_dim_qk=64),
    Case(name="dqk-ne-dv", head_dim_v=16),
    Case(name="thd-dqk-ne-dv-mqa", **THD, lengths_q=(5, 11), lengths_k=(8, 3), head_dim_qk=16, head_dim_v=48,
         heads_q=4, heads_kv=1),  # fmt: skip
    Case(name="strided", strided=True, causal=True, heads_q=4, heads_kv=2),
    Case(name="thd-strided", **THD, lengths_q=(7, 13), lengths_k=(9, 12), strided=True),
    Case(name="deterministic-gqa", deterministic=True, heads_q=4, heads_kv=2),
    Case(name="thd-deterministic-bias", **THD, deterministic=True, lengths_q=(6, 9), lengths_k=(9, 4), bias="1H"),
    Case(name="large-logits", logit_scale=8.0),
    Case(name="large-logits-sinks-fp16", logit_scale=8.0, sinks=True, sink_scale=20.0, dtype=FP16),
]


def _l1_cases() -> list[Case]:
    """dtype x layout x heads x mask x extras, on shapes that differ in Sq and Sk; the head
    dims rotate through equal and unequal pairs so torch-sdpa serves its share."""
    cases = []
    layouts = [
        {"seqlen_q": 33, "seqlen_k": 47},
        {"seqlen_q": 47, "seqlen_k": 33, "lengths_q": (47, 12), "lengths_k": (0, 30)},
        {**THD, "lengths_q": (1, 40, 0, 17), "lengths_k": (9, 33, 6, 0), "tail_q": 4, "tail_k": 1},
    ]
    heads = [(4, 4), (4, 2), (6, 1)]
    masks = [
        {},
        {"causal": True},
        {"causal": True, "causal_align": "bottom_right"},
        {"window": (5, 3)},
        {"window": (7, -1), "causal_align": "bottom_right"},
    ]
    extras = [{}, {"bias": "B1"}, {"sinks": True}, {"rope": True}, {"bias": "BH", "sinks": True, "rope": True}]
    head_dims = [(64, 64), (32, 32), (64, 32)]
    grid = itertools.product((BF16, FP16), layouts, heads, masks, extras)
    for index, (dtype, layout, (hq, hkv), mask, extra) in enumerate(grid):
        dqk, dv = head_dims[index % len(head_dims)]
        cases.append(Case(dtype=dtype, heads_q=hq, heads_kv=hkv, head_dim_qk=dqk, head_dim_v=dv,
                          **layout, **mask, **extra))  # fmt: skip
    return cases


@pytest.mark.L0
@pytest.mark.parametrize("engine", [None, "unfused"], ids=["routed", "unfused"])
@pytest.mark.parametrize("case", L0_CASES, ids=lambda case: case.id)
def test_native_engines_match_oracle(case, engine):
    result = check(case, engine=engine)
    assert result.passed, result.describe()


@pytest.mark.L0
@pytest.mark.parametrize("engine", [None, "unfused"], ids=["routed", "unfused"])
def test_window_zero_is_judged_but_for_the_known_limit(engine):
    """Window (0, 0) without sinks: every row sees itself only, so SEMANTICS.md's known limit
    exempts dq, dk and dbias (exactly 0 in truth); o, lse and dv are judged as usual."""
    result = check(Case(name="window-zero", window=(0, 0), bias="1H"), engine=engine)
    assert result.passed, result.describe()
    exempt = {name for name, verdict in result.verdicts.items() if verdict.exempt}
    assert exempt == {"dq", "dk", "dbias"}, result.describe()
    assert result.verdicts["dv"].compared > 0 and result.verdicts["o"].compared > 0


@pytest.mark.L1
@pytest.mark.parametrize("engine", [None, "unfused"], ids=["routed", "unfused"])
@pytest.mark.parametrize("case", _l1_cases(), ids=lambda case: case.id)
def test_native_engines_match_oracle_wide(case, engine):
    result = check(case, engine=engine)
    assert result.passed, result.describe()


GPU_CASES = [
    Case(name="cuda-dense", device="cuda"),
    Case(name="cuda-causal-gqa-fp16", device="cuda", dtype=FP16, causal=True, heads_q=8, heads_kv=2),
    Case(name="cuda-bottom-right-bias-io", device="cuda", causal=True, causal_align="bottom_right", seqlen_q=20,
         seqlen_k=40, bias="1H", bias_dtype=BF16, bias_holes=True),  # fmt: skip
    Case(name="cuda-bias-fp32-declined", device="cuda", bias="BH"),
    Case(name="cuda-thd-sinks-rope", device="cuda", **THD, lengths_q=(7, 0, 19), lengths_k=(5, 12, 19), tail_q=3,
         sinks=True, rope=True),  # fmt: skip
    Case(name="cuda-strided-mqa", device="cuda", strided=True, heads_q=4, heads_kv=1, head_dim_qk=64),
]


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("engine", [None, "unfused"], ids=["routed", "unfused"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda case: case.id)
def test_native_engines_match_oracle_on_cuda(case, engine):
    result = check(case, engine=engine)
    assert result.passed, result.describe()


# Fresh outputs (out=None): the native plans allocate them uninitialized wherever they
# write every element. Poisoned out= tensors show which elements a plan writes.
FRESH_CASES = {
    "dense": Case(heads_q=4, heads_kv=2, causal=True, causal_align="bottom_right", seqlen_q=6, seqlen_k=9),
    "padding-bias-sinks": Case(lengths_q=(3, 7), lengths_k=(5, 2), bias="1H", sinks=True, seqlen_q=7, seqlen_k=5),
    "thd": Case(layout="thd", lengths_q=(3, 0, 5), lengths_k=(4, 2, 6), tail_q=3, tail_k=2, bias="BH", sinks=True),
}


def _poisoned_like(x):
    return None if x is None else torch.full_like(x, float("nan"))


@pytest.mark.L0
@pytest.mark.parametrize("engine", [None, "unfused"], ids=["routed", "unfused"])
@pytest.mark.parametrize("name", ["dense", "padding-bias-sinks"])
def test_dense_plans_write_every_output_element(name, engine):
    import frost
    from frost_harness.suites.harness import make_inputs

    inputs = make_inputs(FRESH_CASES[name])
    kw = inputs.keywords
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **kw, engine=engine)
    out = (torch.full_like(o, float("nan")), torch.full_like(lse, float("nan")))
    frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **kw, engine=engine, out=out)
    assert not any(x.isnan().any() for x in out)
    torch.testing.assert_close(out, (o, lse), rtol=0, atol=0)
    grads = frost.Grads(*(_poisoned_like(x) for x in (inputs.q, inputs.k, inputs.v, kw.get("bias"), kw.get("sinks"))))
    frost.sdpa_backward(inputs.do, inputs.q, inputs.k, inputs.v, o, lse, **kw, engine=engine, out=grads)
    assert not any(g.isnan().any() for g in grads if g is not None)


@pytest.mark.L0
def test_fresh_packed_outputs_read_zero_past_the_last_sequence():
    import frost
    from frost_harness.suites.harness import make_inputs

    inputs = make_inputs(FRESH_CASES["thd"])
    kw = inputs.keywords
    end_q, end_k = (int(kw[name][-1]) for name in ("cu_seqlens_q", "cu_seqlens_k"))
    assert end_q < inputs.q.shape[0] and end_k < inputs.k.shape[0]
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **kw)
    assert (o[end_q:] == 0).all() and (lse[:, end_q:] == 0).all()
    grads = frost.sdpa_backward(inputs.do, inputs.q, inputs.k, inputs.v, o, lse, **kw)
    assert (grads.dq[end_q:] == 0).all() and (grads.dk[end_k:] == 0).all() and (grads.dv[end_k:] == 0).all()


@pytest.mark.L0
def test_allocate_zero_keyword_keeps_zero_fill_the_default():
    import frost
    from frost.engines.base import allocate_backward, allocate_forward
    from frost.problem import prepare

    q, k, v = (torch.randn(1, 4, 2, 8, dtype=BF16) for _ in range(3))
    problem, tensors = prepare("forward", q, k, v)
    zeroed, empty = allocate_forward(problem), allocate_forward(problem, zero=False)
    assert all((x == 0).all() for x in zeroed)
    assert [(x.shape, x.dtype, x.is_contiguous()) for x in zeroed] == [(x.shape, x.dtype, True) for x in empty]
    grads = allocate_backward(problem, tensors, zero=False)
    assert isinstance(grads, frost.Grads) and grads.dq.shape == q.shape and grads.dbias is None
    assert all((g == 0).all() for g in allocate_backward(problem, tensors)[:3])


@pytest.mark.L0
@pytest.mark.parametrize("head_dim_v", [8, 12])
def test_outputs_allocated_like_a_strided_input_are_contiguous(head_dim_v):
    """o allocated like q (equal head dims) and gradients like their inputs: contiguous, of the
    problem's shapes and dtypes, however the inputs are strided (here heads-major views)."""
    from frost.engines.base import allocate_backward, allocate_forward
    from frost.problem import prepare

    q, k = (torch.randn(1, 2, 6, 8, dtype=BF16).transpose(1, 2) for _ in range(2))
    v = torch.randn(1, 2, 6, head_dim_v, dtype=BF16).transpose(1, 2)
    problem, tensors = prepare("forward", q, k, v)
    for zero in (True, False):
        o, lse = allocate_forward(problem, zero=zero, q=q)
        assert (o.shape, o.dtype, o.is_contiguous()) == (torch.Size([1, 6, 2, head_dim_v]), BF16, True)
        assert (lse.shape, lse.dtype, lse.is_contiguous()) == (torch.Size([1, 2, 6]), torch.float32, True)
        grads = allocate_backward(problem, tensors, zero=zero)
        assert [(g.shape, g.dtype, g.is_contiguous()) for g in grads[:3]] == [(x.shape, BF16, True) for x in (q, k, v)]
        if zero:
            assert all((x == 0).all() for x in (o, lse, *grads[:3]))


# torch-sdpa's CPU bf16 forward has two routes (frost.engines.native): the kernel on the bf16
# inputs (hosts with bf16 dot products) with the lse rows its fast exponential leaves outside the
# rule recomputed, or the kernel on float32 copies. Both run here whatever this host has. Small
# logits put lse rows near 0 (a causal row 0 sees one key; one key per row puts every |lse| below 1).
ROUTE_CASES = [  # each with whether its lse has rows near 0
    (Case(name="route-gqa", heads_q=4, heads_kv=2), False),
    (Case(name="route-causal-small-logits", causal=True, logit_scale=0.01, seqlen_q=40, seqlen_k=40), True),
    (Case(name="route-one-key-small-logits", seqlen_q=24, seqlen_k=1, logit_scale=0.01), True),
    (Case(name="route-bias-holes-one-key", bias="11", bias_holes=True, bias_scale=0.01, logit_scale=0.01,
          seqlen_q=24, seqlen_k=1, heads_q=4, heads_kv=2), True),  # fmt: skip
    (Case(name="route-bottom-right-small-logits", causal=True, causal_align="bottom_right", seqlen_q=16,
          seqlen_k=16, logit_scale=0.01), True),  # fmt: skip
    (Case(name="route-bottom-right", causal=True, causal_align="bottom_right", seqlen_q=16, seqlen_k=40), False),
]
ROUTES = {  # name: (the kernel on bf16 inputs, at most this many key elements gathered to recompute lse rows)
    "float32-copies": (False, None),
    "bf16": (True, None),
    "bf16-rerun-float32": (True, 0),
}


@pytest.mark.L0
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize(("case", "rows_near_0"), ROUTE_CASES, ids=[case.id for case, _ in ROUTE_CASES])
def test_torch_sdpa_cpu_bf16_routes_match_oracle(case, rows_near_0, route, monkeypatch):
    import frost
    from frost.engines import native
    from frost_harness.suites.harness import make_inputs

    direct, gather_limit = ROUTES[route]
    monkeypatch.setattr(native, "CPU_NATIVE_BF16", direct)
    if gather_limit is not None:
        monkeypatch.setattr(native, "_EXACT_ROWS_GATHER", gather_limit)
    repaired = []
    exact_rows = native._exact_lse_rows

    def spy(lse, *args):
        out = exact_rows(lse, *args)
        repaired.append(out is None or not torch.equal(out, lse))
        return out

    monkeypatch.setattr(native, "_exact_lse_rows", spy)
    result = check(case, engine="torch-sdpa", directions=("forward",))
    assert result.passed, result.describe()
    assert result.decisions["forward"].engine == "torch-sdpa"
    # rows near 0 are recomputed on the bf16 routes; the copies never call the repair
    assert repaired == ([] if not direct else [rows_near_0])
    inputs = make_inputs(case)  # fresh outputs (out=None) equal those written into out=
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **inputs.keywords, engine="torch-sdpa")
    out = (torch.full_like(o, float("nan")), torch.full_like(lse, float("nan")))
    frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **inputs.keywords, engine="torch-sdpa", out=out)
    torch.testing.assert_close(out, (o, lse), rtol=0, atol=0)
    assert o.is_contiguous() and lse.is_contiguous() and o.dtype == BF16 and lse.dtype == torch.float32


@pytest.mark.L0
@pytest.mark.parametrize("engine", ["torch-sdpa", "unfused"])
@pytest.mark.parametrize("direct", [False, True], ids=["float32-copies", "bf16"])
def test_engines_ignore_the_callers_autocast(engine, direct, monkeypatch):
    """Under the caller's CPU autocast (a training loop's backward inside its autocast block, say)
    the engines return the bits they return without it: their float32 products are not recast to
    bf16 (unfused's lse moved by 0.022 before dispatch turned autocast off around them), and the
    bf16 route's lse repair runs its float32 logits (it raised on a dtype mismatch)."""
    import frost
    from frost.engines import native
    from frost_harness.suites.harness import make_inputs

    monkeypatch.setattr(native, "CPU_NATIVE_BF16", direct)
    inputs = make_inputs(Case(causal=True, logit_scale=0.01, seqlen_q=40, seqlen_k=40, heads_q=4, heads_kv=2))
    q, k, v, do = inputs.q, inputs.k, inputs.v, inputs.do

    def both_directions():
        o, lse = frost.sdpa_forward(q, k, v, causal=True, engine=engine)
        return (o, lse, *frost.sdpa_backward(do, q, k, v, o, lse, causal=True, engine=engine)[:3])

    plain = both_directions()
    with torch.autocast("cpu", dtype=BF16):
        under = both_directions()
    assert all(torch.equal(a, b) for a, b in zip(plain, under))
