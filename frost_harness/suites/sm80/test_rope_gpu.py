"""GPU: RoPE on the SM80 engines (the rotation pass, sm80/rope.py) against the float64 oracle.

The features of the SM80 grid (frost_harness/suites/sm80/gpu_cases.py) that meet RoPE's
positions (dense, padded, packed with positions restarting per sequence and rows past
cu_seqlens[-1], GQA and MQA, causal and windows, bottom-right alignment, sinks, strided
inputs), each with ``rope=True``, forward and backward judged by the acceptance rule,
outputs poisoned and guarded (so is the workspace that holds the rotated q and k), routing
asserted through the ledger. Head dims rotate over the grid's and two more: 256, and 136
(D/2 = 68, not a multiple of 8: the pass's 8-byte accesses). The deterministic mode (both
ways of making dQ), split GQA groups, the packed-equals-per-sequence identity and the
autograd API with ``rope=`` each get their own test; so does the pass alone against the
rotation (which says whether a failure above is the pass's or the attention's).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import frost
from frost.dispatch import ledger
from frost_harness.fuzz.identities import IDENTITIES, check_identity
from frost_harness.suites.harness import check, make_inputs
from frost_harness.suites.sm80 import gpu_cases

pytestmark = pytest.mark.gpu

ENGINES = {"forward": "sdpa_fwd_sm80", "backward": "sdpa_bwd_sm80"}
FEATURES = ("dense", "causal", "gqa", "mqa", "window_both", "window_br", "causal_br_sq_gt_sk", "padding",
            "padding_causal_br", "thd", "thd_causal_gqa", "thd_br_window_sinks", "edge_thd", "strided", "sinks")
HEAD_DIMS = gpu_cases.HEAD_DIMS + ((256, 256), (136, 104))


def _case(feature: str, dtype, dims, direction: str = "backward", **more):
    return gpu_cases.case(direction, feature, dtype, dims, rope=True, **more)


def _assert_sm80(case, directions=("forward", "backward")):
    result = check(case, directions=directions)
    for direction in directions:
        assert result.decisions[direction].engine == ENGINES[direction], result.describe()
    assert result.passed, result.describe()


def _grid():
    return [(feature, gpu_cases.DTYPES[i % 2], HEAD_DIMS[i % len(HEAD_DIMS)]) for i, feature in enumerate(FEATURES)]


@pytest.mark.L0
@pytest.mark.parametrize("feature, dtype, dims", _grid(), ids=str)
def test_rope_sm80_forward_matches_oracle(feature, dtype, dims):
    _assert_sm80(_case(feature, dtype, dims, "forward"), directions=("forward",))


@pytest.mark.L0
@pytest.mark.parametrize("feature, dtype, dims", _grid(), ids=str)
def test_rope_sm80_backward_matches_oracle(feature, dtype, dims):
    _assert_sm80(_case(feature, dtype, dims), directions=("backward",))


def _engine(direction: str = "backward"):
    from frost import dispatch

    return next(e for e in dispatch.engines(direction) if e.name == ENGINES[direction])


@pytest.mark.L0
@pytest.mark.parametrize("dq_recompute", [False, True], ids=["default", "recompute"])
@pytest.mark.parametrize("feature", ["causal", "gqa", "thd_causal_gqa", "window_br"])
def test_rope_sm80_deterministic_matches_oracle(feature, dq_recompute, monkeypatch):
    """Both kinds of deterministic dQ: the default's (the sliced dQ, reduced into slices and
    summed by the conversion pass) and dQ recomputed by bwd_dq (no conversion pass: the RoPE pass
    rotates dq back in either way); judged and bitwise stable (the harness runs a deterministic
    backward twice)."""
    monkeypatch.setattr(_engine(), "dq_recompute", dq_recompute)
    _assert_sm80(_case(feature, torch.bfloat16, (128, 128), deterministic=True), directions=("backward",))


@pytest.mark.L0
@pytest.mark.parametrize("name, fields", [
    ("gqa", dict(heads_q=8, heads_kv=2, causal=True)),
    ("mqa_thd", dict(layout="thd", lengths_q=(70, 300), lengths_k=(150, 90), window=(20, 3),
                     causal_align="bottom_right", heads_q=4, heads_kv=1)),
])
def test_rope_sm80_split_group_matches_oracle(name, fields, monkeypatch):
    """dk summed from the split groups' partials, then rotated back."""
    monkeypatch.setattr(_engine(), "split", 2)
    case = dataclasses.replace(gpu_cases.BASE, dtype=torch.float16, head_dim_qk=64, head_dim_v=64, rope=True,
                               **fields)
    _assert_sm80(case, directions=("backward",))


@pytest.mark.L0
@pytest.mark.parametrize("dims", [(128, 128), (72, 40)], ids=str)
def test_rope_sm80_packed_equals_per_sequence_and_padded(dims):
    """Positions restart at every packed sequence: the packed problem == each sequence alone ==
    the padded dense one (frost_harness.fuzz.identities), on each SM80 engine."""
    case = dataclasses.replace(gpu_cases.BASE, dtype=torch.bfloat16, head_dim_qk=dims[0], head_dim_v=dims[1],
                               rope=True, layout="thd", lengths_q=(96, 0, 160, 33), lengths_k=(96, 7, 160, 64),
                               tail_q=5, tail_k=3, causal=True, heads_q=8, heads_kv=2)
    identity = IDENTITIES["packed_equals_per_sequence_and_padded"]
    for engine in ENGINES.values():
        check_identity(identity, case, engine=engine)


@pytest.mark.L0
def test_rope_sm80_attention_autograd_routes_to_sm80_and_matches_oracle():
    import frost_harness.oracle.baseline
    import frost_harness.oracle.reference
    import frost_harness.oracle.tolerance

    case = dataclasses.replace(gpu_cases.BASE, heads_q=8, heads_kv=2, causal=True, rope=True)
    inputs = make_inputs(case)
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (inputs.q, inputs.k, inputs.v))
    mark = ledger.mark()
    o = frost.attention(q, k, v, **inputs.keywords)
    o.backward(inputs.do)
    engines = [d.engine for d in ledger.since(mark)]
    assert engines == list(ENGINES.values()), engines
    kw = inputs.keywords
    o64, _ = frost_harness.oracle.reference.forward(inputs.q, inputs.k, inputs.v, **kw)
    o_lp, _ = frost_harness.oracle.baseline.forward(inputs.q, inputs.k, inputs.v, **kw)
    tolerance = frost_harness.oracle.tolerance
    verdicts = tolerance.check({"o": o.detach()}, {"o": o64}, {"o": o_lp}, io_dtype=case.dtype)
    ref = frost_harness.oracle.reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    base = frost_harness.oracle.baseline.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    grads = {"dq": q.grad, "dk": k.grad, "dv": v.grad}
    verdicts.update(tolerance.check(grads, ref.as_dict(), base.as_dict(), io_dtype=case.dtype))
    assert all(v.passed for v in verdicts.values()), "\n".join(v.describe() for v in verdicts.values())


@pytest.mark.L0
def test_rope_sm80_thd_rebinds_one_pass_across_token_totals():
    """The pass's packed token totals and sequence counts are dynamic: one artifact per record."""
    from frost.kernels.sm80 import compile as sm80_compile

    first = dataclasses.replace(gpu_cases.BASE, layout="thd", lengths_q=(96, 160), lengths_k=(96, 160), causal=True,
                                rope=True)
    _assert_sm80(first)
    before = sm80_compile.ROPE_CACHE.stats()
    _assert_sm80(dataclasses.replace(first, lengths_q=(64, 256, 30), lengths_k=(64, 256, 30)))
    after = sm80_compile.ROPE_CACHE.stats()
    assert after.compiles == before.compiles and after.hits > before.hits, (before, after)


PASS_CASES = [  # (dtype, head_dim, layout): both access widths, one to 31 threads per row
    (torch.bfloat16, 128, "bshd"), (torch.float16, 64, "thd"), (torch.bfloat16, 72, "thd"),
    (torch.float16, 8, "bshd"), (torch.bfloat16, 136, "bshd"), (torch.float16, 248, "thd"), (torch.bfloat16, 256, "thd"),
]


@pytest.mark.L0
@pytest.mark.parametrize("inverse", [False, True], ids=["rotate", "transpose"])
@pytest.mark.parametrize("dtype, head_dim, layout", PASS_CASES, ids=str)
def test_rope_pass_alone_matches_the_rotation(dtype, head_dim, layout, inverse):
    """The pass by itself (out of place for the rotation, in place for the transpose, as the
    engines run them) against the float64 rotation rounded to the io dtype: within one rounding
    of it (the pass computes in fp32), positions restarting per packed sequence, GQA heads (9 and
    3: a partial group of 8 and an odd tail), and packed rows past cu_seqlens[-1] untouched."""
    from frost.kernels.sm80 import compile as sm80_compile
    from frost.kernels.sm80.rope_params import RopeParams
    from frost_harness.oracle.rope import rotate

    gen = torch.Generator().manual_seed(head_dim)
    lengths = (70, 0, 130, 5) if layout == "thd" else (150, 150)
    rows, tail = (sum(lengths), 4) if layout == "thd" else (lengths[0], 0)
    lead = (rows + tail,) if layout == "thd" else (len(lengths), rows)
    q = torch.randn(*lead, 9, head_dim + 8, generator=gen).to("cuda", dtype)[..., :head_dim]  # strided rows
    k = torch.randn(*lead, 3, head_dim, generator=gen).to("cuda", dtype)
    angles = torch.rand(max(lengths), head_dim // 2, generator=gen) * 50
    cos, sin = angles.cos().cuda(), angles.sin().cuda()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    packed = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(lengths), max_seqlen_k=max(lengths))
    record = RopeParams(dtype=str(dtype).removeprefix("torch."), head_dim=head_dim, layout=layout, inverse=inverse)
    compiled = sm80_compile.compile_record(record)
    if inverse:  # in place, as the backward rotates dq and dk back
        q_out, k_out = q.clone(), k.clone()
        if layout == "thd":
            q_out[rows:], k_out[rows:] = float("nan"), float("nan")
        q_in, k_in = q_out, k_out
    else:
        q_in, k_in = q, k
        q_out, k_out = (torch.full_like(x, float("nan")) for x in (q, k))
    sm80_compile.launch_rope(compiled, q_in, k_in, q_out, k_out, cos, sin, **(packed if layout == "thd" else {}))
    torch.cuda.synchronize()
    eps = torch.finfo(dtype).eps
    for name, x, got in (("q", q, q_out), ("k", k, k_out)):
        sequences = [x[start:start + n] for start, n in zip(cu.tolist(), lengths)] if layout == "thd" else list(x)
        outputs = [got[start:start + n] for start, n in zip(cu.tolist(), lengths)] if layout == "thd" else list(got)
        for b, (seq, out) in enumerate(zip(sequences, outputs)):
            want = rotate(seq.double(), cos.double(), sin.double(), transpose=inverse)
            close = torch.isclose(out.double(), want, rtol=eps, atol=1e-5)
            assert bool(close.all()), f"{name} sequence {b}: {int((~close).sum())} elements off"
        if layout == "thd":
            assert bool(torch.isnan(got[rows:]).all()), f"{name}: rows past cu_seqlens[-1] were written"
