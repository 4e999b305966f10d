"""GPU: the SM80 backward chain against the float64 oracle under the acceptance rule.

dq, dk, dv and dsinks for every feature of the backward's Capabilities row,
both dtypes and both flavors, gradients poisoned before launch (frost_harness.suites.harness
feeds the oracle's o and lse, rounded, so the backward is judged on its own),
routing asserted through the ledger; the THD compile-key test with the re-bound
call's gradients judged too; deterministic mode bitwise-stable over 20 runs.

The grid keeps the CPU twin's hard cases (frost_harness/suites/test_native_engines.py): rows
that see one key plus a sink (``window_zero_sinks``, ``sinks_empty_rows``), large
logits with and without large sinks, and window (0, 0), where every row sees exactly
one key and SEMANTICS.md's known limit exempts dq and dk per output (dv is judged;
``test_bwd_sm80_window_zero_judges_dv_and_exempts_dq_dk``). Empty rows (no key) are
covered by ``sinks_empty_rows`` and the bottom-right cases.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

import frost
from frost import devices
from frost.dispatch import ledger
from frost.kernels.sm80.config import BwdDqParams, BwdParams
from frost.problem import prepare
from frost_harness.suites.sm80 import gpu_cases
from frost_harness.suites.harness import Case, bits_equal, check, make_inputs, run_backward

pytestmark = pytest.mark.gpu

ENGINE = "sdpa_bwd_sm80"
DIRECTION = "backward"
L0_CASES = gpu_cases.l0_grid(DIRECTION)


def _case(feature: str, dtype, dims, seed=0, **more) -> Case:
    return gpu_cases.case(DIRECTION, feature, dtype, dims, seed=seed, **more)


def _assert_sm80(case: Case):
    result = check(case, directions=("backward",))
    assert result.decisions["backward"].engine == ENGINE, result.describe()
    assert result.passed, result.describe()




@pytest.mark.L0
@pytest.mark.parametrize("feature, dtype, dims", L0_CASES, ids=lambda x: str(x))
def test_bwd_sm80_matches_oracle(feature, dtype, dims):
    _assert_sm80(_case(feature, dtype, dims))


@pytest.mark.L0
@pytest.mark.parametrize("dtype", gpu_cases.DTYPES, ids=str)
def test_bwd_sm80_window_zero_judges_dv_and_exempts_dq_dk(dtype):
    """Every row sees itself only: dq and dk are exactly 0 in truth and exempt (the known limit);
    dv = do of the row's own key is judged like any output, and NaN in dq or dk would still fail."""
    result = check(_case("window_zero", dtype, (64, 64)), directions=("backward",))
    assert result.decisions["backward"].engine == ENGINE, result.describe()
    assert result.passed, result.describe()
    assert {name for name, v in result.verdicts.items() if v.exempt} == {"dq", "dk"}, result.describe()
    assert result.verdicts["dv"].compared > 0


@pytest.mark.L0
@pytest.mark.parametrize("feature", ["causal", "gqa", "thd_causal_gqa", "sinks"])
def test_bwd_sm80_deterministic_mode_matches_oracle(feature):
    _assert_sm80(_case(feature, torch.bfloat16, (128, 128), deterministic=True))


def _engine():
    from frost import dispatch

    return next(e for e in dispatch.engines(DIRECTION) if e.name == ENGINE)


@pytest.mark.L0
@pytest.mark.parametrize("feature, dtype, dims", L0_CASES, ids=lambda x: str(x))
def test_bwd_sm80_other_dq_reduce_width_matches_oracle(feature, dtype, dims, monkeypatch):
    """The dQ reduce width the dispatch does not pick on this SM90 device: 1 float per reduction
    (what SM80 devices run) where it picks 4 (d64 without a bias, the dQ product first), else 4
    (red.global.add.v4.f32); the default grid covers the width it picks."""
    from frost.engines.sm80 import default_dq_reduce_width

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("red.global.add.v4.f32 needs an SM90 device: an SM80 device runs width 1 only")
    case = _case(feature, dtype, dims)
    inputs = make_inputs(case)
    problem, _ = prepare("forward", inputs.q, inputs.k, inputs.v, **inputs.keywords)  # facts only: as a backward
    other = 5 - default_dq_reduce_width(dataclasses.replace(problem, direction=DIRECTION))  # 1 <-> 4
    monkeypatch.setattr(_engine(), "dq_reduce_width", other)
    _assert_sm80(case)
    assert any(p.dq_reduce_width == other and p.dq_first == (other == 4 and p.flavor == "d64")
               for p in _bwd_records(BwdParams))


SPLIT_CASES = {  # GQA / MQA problems with the group forced into splits
    "gqa_dense": dict(heads_q=8, heads_kv=2, causal=True),
    "mqa_window": dict(heads_q=6, heads_kv=1, window=(50, 0), seqlen_q=260, seqlen_k=300),
    "gqa_padding": dict(heads_q=8, heads_kv=2, lengths_q=(257, 0), lengths_k=(190, 260)),
    "gqa_thd": dict(layout="thd", lengths_q=(200, 1, 0, 130), lengths_k=(200, 2, 9, 150), causal=True,
                    heads_q=8, heads_kv=2, tail_q=3, tail_k=2),
    "mqa_thd_sinks": dict(layout="thd", lengths_q=(70, 300), lengths_k=(150, 90), window=(20, 3),
                          causal_align="bottom_right", sinks=True, heads_q=4, heads_kv=1),
}


@pytest.mark.L0
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_bwd_sm80_split_group_matches_oracle(name, deterministic, monkeypatch):
    heads_q, heads_kv = SPLIT_CASES[name]["heads_q"], SPLIT_CASES[name]["heads_kv"]
    monkeypatch.setattr(_engine(), "split", heads_q // heads_kv // (1 if heads_q // heads_kv == 2 else 2))
    dims = (64, 64) if deterministic else (128, 128)
    case = dataclasses.replace(gpu_cases.BASE, dtype=torch.bfloat16, head_dim_qk=dims[0], head_dim_v=dims[1],
                               deterministic=deterministic, **SPLIT_CASES[name])
    _assert_sm80(case)
    assert any(p.split_group and p.deterministic == deterministic
               for p in _bwd_records(BwdParams)), "no split record was compiled"


@pytest.mark.L0
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("name", ["mqa_window", "gqa_padding", "gqa_thd"])
def test_bwd_sm80_combine_of_one_split_per_head_matches_oracle(name, deterministic, monkeypatch):
    """The combine (16 key rows per CTA, 4 splits' loads before their adds) with one split per
    query head (6 splits: a group of 4 and a group of 2; 4 splits): judged against the oracle;
    the plan combined that many splits' partials."""
    from frost.kernels.sm80.config import BwdCombineParams

    fields = SPLIT_CASES[name]
    splits = fields["heads_q"] // fields["heads_kv"]
    monkeypatch.setattr(_engine(), "split", splits)
    case = dataclasses.replace(gpu_cases.BASE, dtype=torch.bfloat16, deterministic=deterministic, **fields)
    _assert_sm80(case)
    inputs = make_inputs(case)
    problem, _ = prepare("forward", inputs.q, inputs.k, inputs.v, **inputs.keywords)  # facts only: as a backward
    plan = _engine().compile(dataclasses.replace(problem, direction=DIRECTION, deterministic=deterministic))
    assert plan.splits == splits and isinstance(plan.params[3], BwdCombineParams)


@pytest.mark.L0
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("name", list(SPLIT_CASES))
def test_bwd_sm80_cluster_sum_matches_oracle_and_the_combine_bit_for_bit(name, deterministic, monkeypatch):
    """SM90: a split group's dK and dV summed by the clusters of its CTAs (``split_cluster``: no
    partials, no bwd_combine; clusters of 2, config.SPLIT_CLUSTERS), 2 splits: judged
    against the oracle (poisoned, guarded outputs), and dq, dk, dv bit for bit those of the
    partials and bwd_combine (the same adds in the same order)."""
    if not devices.profile_for("cuda:0").sm90:
        pytest.skip("clusters need SM90: the plans are made for an SM8x part")
    fields = SPLIT_CASES[name]
    monkeypatch.setattr(_engine(), "split", 2)
    monkeypatch.setattr(_engine(), "cluster_sum", True)
    dims = (64, 64) if deterministic else (128, 128)
    case = dataclasses.replace(gpu_cases.BASE, dtype=torch.bfloat16, head_dim_qk=dims[0], head_dim_v=dims[1],
                               deterministic=deterministic, **fields)
    _assert_sm80(case)
    assert any(p.split_cluster == 2 and p.deterministic == deterministic
               for p in _bwd_records(BwdParams)), "no cluster record was compiled"
    inputs = make_inputs(case)
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **inputs.keywords)
    clustered = run_backward(inputs, o, lse, deterministic=deterministic)[0]
    monkeypatch.setattr(_engine(), "cluster_sum", False)
    combined = run_backward(inputs, o, lse, deterministic=deterministic)[0]
    if deterministic:  # the default mode's dQ reductions land in any order
        assert bits_equal(clustered[0], combined[0])
    assert bits_equal(clustered[1], combined[1]) and bits_equal(clustered[2], combined[2])


LAUNCH_ORDER_CASES = {  # right-bounded masks in each launch order; "many_heads": the dispatch's own pick
    "causal": dict(causal=True),
    "window_br_d256": dict(window=(30, 10), causal_align="bottom_right", seqlen_q=100, seqlen_k=260,
                           head_dim_qk=256),
    "thd_causal_gqa": gpu_cases.FEATURES["thd_causal_gqa"],
    "many_heads": dict(causal=True, batch=17, seqlen_q=130, seqlen_k=130),  # 17 x 4 heads: over half the SMs
}


@pytest.mark.L0
@pytest.mark.parametrize("heavy_first", [False, True, None], ids=["plain", "heavy_first", "chosen"])
@pytest.mark.parametrize("name", list(LAUNCH_ORDER_CASES))
def test_bwd_sm80_launch_orders_match_oracle(name, heavy_first, monkeypatch):
    """Default mode under a right-bounded mask, key blocks launched heaviest first or in plain
    order (forced, and as the dispatch chooses: plain once the heads outnumber half the SMs,
    ``heavy_first_keeps_locality``)."""
    monkeypatch.setattr(_engine(), "heavy_first", heavy_first)
    case = dataclasses.replace(gpu_cases.BASE, dtype=torch.bfloat16, **{"head_dim_qk": 64, **LAUNCH_ORDER_CASES[name]})
    _assert_sm80(case)
    batch = len(case.lengths_q) if case.layout == "thd" else case.batch
    # these GQA groups are split at most into 4 parts, which keeps their few heads under half the SMs
    want = heavy_first if heavy_first is not None else 2 * batch * case.heads_kv <= devices.profile_for("cuda:0").sm_count
    assert any(p.has_window_right and p.heavy_first == want and not p.deterministic
               for p in _bwd_records(BwdParams)), f"no record with heavy_first={want} was compiled"


def _bwd_records(kind) -> list:
    """The records of one kernel of the chain (``kind``: BwdParams for the main kernel) in this
    process's compile cache, which holds every kernel's: their params types have different fields."""
    from frost.kernels.sm80 import compile as sm80_compile

    return [key[1] for key in sm80_compile.BWD_CACHE.keys() if isinstance(key[1], kind)]


@pytest.mark.L1
@pytest.mark.parametrize(
    "feature, dtype, dims",
    [c if c[0] not in gpu_cases.BACKWARD_KNOWN_FAILURES else pytest.param(*c, marks=pytest.mark.xfail(
        strict=False, reason=gpu_cases.BACKWARD_KNOWN_FAILURES[c[0]] + " (its size varies with dtype and head dim)"))
     for c in itertools.product(gpu_cases.FEATURES, gpu_cases.DTYPES, gpu_cases.HEAD_DIMS)
     if c not in gpu_cases.l0_grid()],
    ids=lambda x: str(x),
)
def test_bwd_sm80_matches_oracle_every_dtype_and_flavor(feature, dtype, dims):
    _assert_sm80(_case(feature, dtype, dims, seed=1))


@pytest.mark.L0
def test_bwd_sm80_thd_rebinds_one_chain_across_token_totals():
    from frost.kernels.sm80 import compile as sm80_compile

    first = dataclasses.replace(gpu_cases.BASE, layout="thd", lengths_q=(96, 160), lengths_k=(96, 160), causal=True)
    _assert_sm80(first)
    before = sm80_compile.BWD_CACHE.stats()
    _assert_sm80(dataclasses.replace(first, lengths_q=(64, 256), lengths_k=(64, 256)))  # judged, not discarded
    after = sm80_compile.BWD_CACHE.stats()
    assert after.compiles == before.compiles and after.hits >= before.hits + 2, (before, after)
    _assert_sm80(dataclasses.replace(first, lengths_q=(64, 100, 30), lengths_k=(64, 100, 30)))
    assert sm80_compile.BWD_CACHE.stats().compiles == after.compiles
    print(f"backward compile cache before={before} after={after} final={sm80_compile.BWD_CACHE.stats()}")


RECOMPUTE_CASES = ("causal", "gqa", "thd_causal_gqa", "sinks", "window_br", "padding_causal_br", "mqa",
                 "window_left", "causal_br_sq_gt_sk", "thd_br_window_sinks")


@pytest.mark.L0
@pytest.mark.parametrize("feature", RECOMPUTE_CASES)
def test_bwd_sm80_recompute_deterministic_matches_oracle(feature, monkeypatch):
    """Deterministic mode's other way (the default reduces dQ into slices of its own per CTA): dQ
    recomputed per query block by bwd_dq (``dq_recompute``, what problems whose slices would not
    fit take), judged like the default mode (bitwise twice)."""
    monkeypatch.setattr(_engine(), "dq_recompute", True)
    i = RECOMPUTE_CASES.index(feature)
    _assert_sm80(_case(feature, gpu_cases.DTYPES[i % 2], gpu_cases.HEAD_DIMS[i % 4], deterministic=True))
    assert _bwd_records(BwdDqParams)


DETERMINISM_CASES = {
    "causal": dict(causal=True, seqlen_q=1000, seqlen_k=1000),
    "window": dict(window=(100, 20), seqlen_q=777, seqlen_k=900, causal_align="bottom_right"),
    "gqa": dict(heads_q=8, heads_kv=2, seqlen_q=600, seqlen_k=600),
    "thd": dict(layout="thd", lengths_q=(500, 3, 0, 260), lengths_k=(500, 9, 4, 300), causal=True, tail_q=4),
    "gqa_split": dict(heads_q=8, heads_kv=1, seqlen_q=600, seqlen_k=600, causal=True),
    "recompute_causal": dict(causal=True, seqlen_q=1000, seqlen_k=1000),
    "recompute_thd_window": dict(layout="thd", lengths_q=(500, 3, 0, 260), lengths_k=(500, 9, 4, 300),
                               window=(100, 20), causal_align="bottom_right", tail_q=4),
    "recompute_gqa_split": dict(heads_q=8, heads_kv=1, seqlen_q=600, seqlen_k=700),
}


def _assert_bitwise_over_20_runs(case: Case) -> None:
    """The sm80 engine serves the deterministic backward of ``case`` and 20 runs agree bit for bit
    on dq, dk, dv and (with a bias) dbias."""
    inputs = make_inputs(case)
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **inputs.keywords)
    first, decision = run_backward(inputs, o, lse, deterministic=True)
    assert decision.engine == ENGINE
    for _ in range(19):
        again, _ = run_backward(inputs, o, lse, deterministic=True)
        for name, a, b in zip(("dq", "dk", "dv", "dbias"), first, again):
            assert bits_equal(a, b), f"{name} differs between runs"


@pytest.mark.L0
@pytest.mark.parametrize("name", list(DETERMINISM_CASES))
def test_bwd_sm80_deterministic_is_bitwise_stable_over_20_runs(name, monkeypatch):
    if name.endswith("gqa_split"):
        monkeypatch.setattr(_engine(), "split", 4)
    if name.startswith("recompute"):
        monkeypatch.setattr(_engine(), "dq_recompute", True)
    _assert_bitwise_over_20_runs(dataclasses.replace(gpu_cases.BASE, deterministic=True, **DETERMINISM_CASES[name]))
    if name.endswith("gqa_split"):
        assert any(p.split_group and p.deterministic for p in _bwd_records(BwdParams))
    if name.startswith("recompute"):
        assert any(p.deterministic and not p.dq_slices for p in _bwd_records(BwdParams))
    else:  # the deterministic default: the sliced dQ
        assert any(p.deterministic and p.dq_slices for p in _bwd_records(BwdParams))


@pytest.mark.L0
def test_attention_forward_and_backward_route_to_sm80_and_match_oracle():
    import frost_harness.oracle.reference
    import frost_harness.oracle.tolerance
    import frost_harness.oracle.baseline

    case = dataclasses.replace(gpu_cases.BASE, heads_q=8, heads_kv=2, causal=True, sinks=True)
    inputs = make_inputs(case)
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (inputs.q, inputs.k, inputs.v))
    sinks = inputs.keywords["sinks"].clone().requires_grad_(True)
    mark = ledger.mark()
    o = frost.attention(q, k, v, **{**inputs.keywords, "sinks": sinks})
    o.backward(inputs.do)
    engines = [d.engine for d in ledger.since(mark)]
    assert engines == ["sdpa_fwd_sm80", ENGINE], engines
    kw = inputs.keywords
    o64, lse64 = frost_harness.oracle.reference.forward(inputs.q, inputs.k, inputs.v, **kw)
    o_lp, lse_lp = frost_harness.oracle.baseline.forward(inputs.q, inputs.k, inputs.v, **kw)
    verdicts = frost_harness.oracle.tolerance.check({"o": o.detach()}, {"o": o64}, {"o": o_lp}, io_dtype=case.dtype)
    ref = frost_harness.oracle.reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    base = frost_harness.oracle.baseline.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    grads = {"dq": q.grad, "dk": k.grad, "dv": v.grad, "dsinks": sinks.grad}
    verdicts.update(frost_harness.oracle.tolerance.check(grads, ref.as_dict(), base.as_dict(), io_dtype=case.dtype))
    assert all(v.passed for v in verdicts.values()), "\n".join(v.describe() for v in verdicts.values())


@pytest.mark.L0
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("feature, dtype, dims, bias_io", gpu_cases.bias_grid(), ids=lambda x: str(x))
def test_bwd_sm80_bias_matches_oracle(feature, dtype, dims, bias_io, deterministic):
    """dq, dk, dv and dbias (summed over the broadcast dims, in the bias's dtype; 0 at padded
    positions) against the oracle, in the default mode (reductions into fp32 for a broadcast
    bias) and the deterministic one (fp32 partials summed in a fixed order)."""
    _assert_sm80(gpu_cases.bias_case(feature, dtype, dims, bias_io, deterministic=deterministic))


BIAS_WAYS = {  # the backward's bias choices the dispatch may not pick for these cases, forced
    "read_key_inner_w1": dict(bias_staged=False, batch_inner=False, dbias_reduce_width=1),
    "staged_key_inner_w2": dict(bias_staged=True, batch_inner=False, dbias_reduce_width=2),
    "read_batch_inner_w1": dict(bias_staged=False, batch_inner=True, heavy_first=False, dbias_reduce_width=1),
}
BIAS_WAY_FEATURES = ("bias_11_gqa", "bias_1H_padding_holes", "bias_1H_thd_gqa_causal", "bias_11_mqa_edges")


@pytest.mark.L0
@pytest.mark.parametrize("way", list(BIAS_WAYS))
@pytest.mark.parametrize("feature", BIAS_WAY_FEATURES)
def test_bwd_sm80_bias_ways_match_oracle(feature, way, monkeypatch):
    """A float32 bias read from global memory or staged through shared memory, and a dbias
    reduced over the batch with key blocks or sequences launched fastest, one or two floats per
    reduction (two need SM90 and an even Sk; an odd one takes one float per reduction)."""
    forced = BIAS_WAYS[way]
    if forced["dbias_reduce_width"] > 1 and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("red.global.add.v2.f32 needs an SM90 device")
    for name, value in forced.items():
        monkeypatch.setattr(_engine(), name, value)
    i = BIAS_WAY_FEATURES.index(feature)
    case = gpu_cases.bias_case(feature, gpu_cases.DTYPES[i % 2], gpu_cases.HEAD_DIMS[i], False)
    _assert_sm80(case)
    odd_rows = make_inputs(case).keywords["bias"].shape[-1] % 2  # bias_11_mqa_edges: 255 keys
    width = 1 if odd_rows else forced["dbias_reduce_width"]
    room = devices.profile_for("cuda:0").smem_per_block_optin  # a staged tile only where the device has room

    def staged(p):
        return forced["bias_staged"] and dataclasses.replace(p, bias_staged=True).smem_bytes() <= room

    assert any(p.bias_staged == staged(p) and p.batch_inner == forced["batch_inner"]
               and p.dbias_reduce_width == width for p in _bwd_records(BwdParams))


@pytest.mark.L0
def test_bwd_sm80_dbias_into_rows_the_paired_reductions_cannot_address():
    """A caller's float32 dbias with an odd row stride: the two-float reductions go to a staging
    accumulator, then into the caller's tensor; what lies between its rows is never written."""
    if not devices.profile_for("cuda:0").sm90:
        pytest.skip("the paired reductions are SM90's: the plans are made for an SM8x part")
    inputs = make_inputs(gpu_cases.bias_case("bias_11_gqa", torch.bfloat16, (64, 64), False))
    kw = inputs.keywords
    assert kw["bias"].shape[-1] % 2 == 0  # the plan's own accumulator takes paired reductions
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **kw)
    args = (inputs.do, inputs.q, inputs.k, inputs.v, o, lse)
    expected = frost.sdpa_backward(*args, **kw).dbias
    wide = torch.full((*kw["bias"].shape[:-1], kw["bias"].shape[-1] + 1), float("nan"), device="cuda")
    dbias = wide[..., :-1]
    grads = frost.sdpa_backward(*args, **kw, out=frost.Grads(*(torch.empty_like(x) for x in args[1:4]), dbias))
    assert grads.dbias is dbias
    assert any(p.dbias_reduce_width == 2 for p in _bwd_records(BwdParams))
    assert wide[..., -1].isnan().all(), "a reduction landed outside dbias"
    # the same sums in another order (float atomics): equal to a few ulps of the largest element
    torch.testing.assert_close(dbias, expected, rtol=0, atol=1e-6 * expected.abs().max().item())


@pytest.mark.L0
@pytest.mark.parametrize("feature", ["bias_11_holes", "bias_1H_causal", "bias_1H_padding_holes"])
def test_bwd_sm80_bias_recompute_deterministic_matches_oracle(feature, monkeypatch):
    """The deterministic mode's dQ recompute pass (bwd_dq) reads the bias too."""
    monkeypatch.setattr(_engine(), "dq_recompute", True)
    _assert_sm80(gpu_cases.bias_case(feature, torch.bfloat16, (64, 64), False, deterministic=True))
    assert any(p.bias_dtype for p in _bwd_records(BwdDqParams))


BIAS_DETERMINISM_CASES = {  # broadcast (partials summed in order) and not (stored once), padded, GQA
    "BH": dict(bias="BH", causal=True, seqlen_q=700, seqlen_k=700),
    "1H_gqa": dict(bias="1H", heads_q=8, heads_kv=2, seqlen_q=600, seqlen_k=600),
    "11_padding_holes": dict(bias="11", bias_holes=True, lengths_q=(500, 37), lengths_k=(300, 512),
                             seqlen_q=512, seqlen_k=512),
    "B1_thd": dict(layout="thd", bias="B1", lengths_q=(500, 3, 0, 260), lengths_k=(500, 9, 4, 300), causal=True,
                   tail_q=4),
}


@pytest.mark.L0
@pytest.mark.parametrize("bias_io", [False, True], ids=["bias_fp32", "bias_io"])
@pytest.mark.parametrize("name", list(BIAS_DETERMINISM_CASES))
def test_bwd_sm80_bias_deterministic_is_bitwise_stable_over_20_runs(name, bias_io):
    case = dataclasses.replace(gpu_cases.BASE, deterministic=True, **BIAS_DETERMINISM_CASES[name])
    _assert_bitwise_over_20_runs(dataclasses.replace(case, bias_dtype=case.dtype if bias_io else torch.float32))


@pytest.mark.L0
def test_strided_vectors_are_served_like_contiguous_ones():
    """Sinks, seqlens and cu_seqlens given as strided views (legal input) reach the kernels, which
    read them at unit stride, as the same values: both directions equal the contiguous call."""
    gen = torch.Generator().manual_seed(3)

    def every_other(x):  # a view of x with stride 2 over a buffer twice its length
        return torch.stack([x, torch.full_like(x, 7)], dim=-1)[..., 0]

    q, k, v, do = (torch.randn(37, 4, 64, generator=gen).to("cuda", torch.bfloat16) for _ in range(4))
    cu = torch.tensor([0, 11, 11, 37], dtype=torch.int32, device="cuda")
    sinks = torch.randn(4, generator=gen).to("cuda")
    given = dict(cu_seqlens_q=every_other(cu), cu_seqlens_k=every_other(cu), sinks=every_other(sinks))
    assert given["sinks"].stride(0) == 2 and given["cu_seqlens_q"].stride(0) == 2
    want = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, sinks=sinks)
    results = []
    for kw in (given, want):
        mark = ledger.mark()
        o, lse = frost.sdpa_forward(q, k, v, causal=True, **kw)
        grads = frost.sdpa_backward(do, q, k, v, o, lse, causal=True, **kw)
        assert {d.engine for d in ledger.since(mark)} == {"sdpa_fwd_sm80", "sdpa_bwd_sm80"}
        results.append((o, lse, grads.dq, grads.dk, grads.dv, grads.dsinks))
    for got, expect in zip(*results):
        assert torch.equal(got, expect)


SLICED_CASES = {  # masks, padding, THD, split groups, a bias, the wide flavors
    "dense": dict(seqlen_q=1000, seqlen_k=1000),
    "gqa_q_longer": dict(heads_q=8, heads_kv=2, seqlen_q=900, seqlen_k=400),  # fewer key than query blocks
    # more key blocks than query blocks, and a sequence with fewer of each
    "padding": dict(seqlen_q=700, seqlen_k=1100, lengths_q=(700, 301), lengths_k=(1100, 129)),
    "thd_sinks": dict(layout="thd", lengths_q=(500, 3, 0, 260), lengths_k=(300, 9, 4, 700), sinks=True, tail_q=4),
    "gqa_split": dict(heads_q=8, heads_kv=1, seqlen_q=600, seqlen_k=600),
    # top-left causal with more keys than queries: key blocks past the last row's reach see no row
    "causal_k_longer": dict(causal=True, seqlen_q=200, seqlen_k=700),
    "gqa_split_window_br": dict(heads_q=8, heads_kv=1, window=(100, 20), causal_align="bottom_right",
                                seqlen_q=777, seqlen_k=900),
    "thd_causal_padded_tail": dict(layout="thd", lengths_q=(500, 3, 0, 260), lengths_k=(300, 9, 4, 700), causal=True,
                                   causal_align="bottom_right", tail_q=4),
    "bias_causal": dict(causal=True, bias="1H", seqlen_q=500, seqlen_k=700),
    "many_heads_d128": dict(batch=4, heads_q=32, heads_kv=8, seqlen_q=1100, seqlen_k=1100, causal=True,
                            head_dim_qk=128, head_dim_v=128),
    "d256_window": dict(head_dim_qk=256, head_dim_v=256, window=(200, 30), seqlen_q=700, seqlen_k=800),
    # a split group under a causal mask, packed: passes of every length, and none, in one walk
    "gqa_split_causal_thd": dict(layout="thd", heads_q=8, heads_kv=2, lengths_q=(500, 3, 0, 260),
                                 lengths_k=(300, 9, 4, 700), causal=True, causal_align="bottom_right", tail_q=4),
}
# the device's reduce width (4 on SM90), one float (SM80's), two slices forced (every CTA then
# walks several key blocks)
SLICED_MODES = {"device_width": dict(), "scalar": dict(dq_reduce_width=1), "two_slices": dict(dq_slices=2)}


@pytest.mark.L0
@pytest.mark.parametrize("mode", list(SLICED_MODES))
@pytest.mark.parametrize("name", list(SLICED_CASES))
def test_bwd_sm80_sliced_dq_matches_oracle_and_is_bitwise_stable(name, mode, monkeypatch):
    """The sliced dQ (deterministic mode's default: each CTA walks one key block of each round of
    slices and writes dQ into a slice of its own, summed in order by bwd_convert): judged
    against the oracle (the workspace holds NaN-payload sentinels: a chunk no kernel wrote fails)
    and 20 runs bit for bit, with the device's reduce width, with one float, and with two slices
    forced (every CTA then walks several key blocks); its slices written whole, or zeroed by
    bwd_pre under a left window; the plan took what was asked."""
    from frost.engines.sm80 import dq_slice_count

    defaults = {"dq_reduce_width": None, "dq_slices": None}
    for attribute, value in {**defaults, **SLICED_MODES[mode]}.items():
        monkeypatch.setattr(_engine(), attribute, value)
    if name.startswith("gqa_split"):
        monkeypatch.setattr(_engine(), "split", 4)
    case = dataclasses.replace(gpu_cases.BASE, deterministic=True, **SLICED_CASES[name])
    _assert_sm80(case)
    _assert_bitwise_over_20_runs(case)
    inputs = make_inputs(case)
    problem, _ = prepare("forward", inputs.q, inputs.k, inputs.v, **inputs.keywords)  # facts only: as a backward
    problem = dataclasses.replace(problem, direction=DIRECTION, deterministic=True)
    plan = _engine().compile(problem)
    pre, main, convert = plan.params[:3]
    assert main.dq_slices and convert.dq_slices and not main.heavy_first
    assert main.dq_slice_stores == (not main.has_window_left) != pre.dq_slices
    assert convert.dq_slice_stores == main.dq_slice_stores  # then it skips the chunks the main left unwritten
    sm90 = devices.profile_for("cuda:0").sm90  # the device the plans are made for (a forced profile's)
    assert main.dq_reduce_width == (4 if sm90 and mode != "scalar" else 1)
    forced = SLICED_MODES[mode].get("dq_slices")
    assert plan.slices == (forced or dq_slice_count(problem, main, plan.splits))
    assert main.split_group or not name.startswith("gqa_split")
