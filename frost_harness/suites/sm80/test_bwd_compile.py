"""CPU: every kernel of the SM80 backward chain compiles (CUTE_DSL_ARCH=sm_80) for every
params combination the engine can produce (a pairwise-covering subset in L0, all in L1);
packed token totals and sequence counts reuse one compiled chain; the compiled head-dim
tile is always the flavor the adapter selected."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import cutlass  # noqa: E402,F401  (a hard dependency: a missing DSL fails these suites, it does not skip them)

from frost.engines.sm80 import Sm80Backward  # noqa: E402
from frost.kernels.sm80 import compile as sm80_compile  # noqa: E402
from frost.kernels.sm80.config import (  # noqa: E402
    BwdCombineParams, BwdConvertParams, BwdDqParams, BwdParams, BwdPreParams,
)
from frost.problem import Problem  # noqa: E402
from frost_harness.suites.sm80.params_space import RecordSweep, parametrize_sweeps  # noqa: E402

SWEEP = RecordSweep("bwd")
COMPILE = {BwdPreParams: sm80_compile.compile_bwd_pre, BwdParams: sm80_compile.compile_bwd,
           BwdDqParams: sm80_compile.compile_bwd_dq, BwdConvertParams: sm80_compile.compile_bwd_convert,
           BwdCombineParams: sm80_compile.compile_record}  # fmt: skip


def _id(p) -> str:
    return type(p).__name__ + "-" + "-".join(str(v) for v in dataclasses.astuple(p))


pytestmark = pytest.mark.usefixtures("cpu_target")


def pytest_generate_tests(metafunc):
    parametrize_sweeps(metafunc, {"test_bwd_chain_compiles_covering_subset": lambda: SWEEP.l0,
                                  "test_bwd_chain_compiles_every_admitted_combination": SWEEP.rest}, _id)


@pytest.mark.L0
def test_bwd_chain_compiles_covering_subset(params):
    assert COMPILE[type(params)](params) is not None


@pytest.mark.L1
def test_bwd_chain_compiles_every_admitted_combination(params):
    assert COMPILE[type(params)](params) is not None


@pytest.mark.L0
def test_admitted_chain_covers_every_kernel_and_mode():
    kinds = {type(p) for p in SWEEP.every}
    assert kinds == {BwdPreParams, BwdParams, BwdDqParams, BwdConvertParams, BwdCombineParams}
    mains = [p for p in SWEEP.every if isinstance(p, BwdParams)]
    assert {p.deterministic for p in mains} == {False, True}
    assert {p.dq_reduce_width for p in mains} == {1, 4}
    assert {p.split_group for p in mains} == {False, True}
    assert {p.heavy_first for p in mains} == {False, True}
    assert {(p.deterministic, p.dq_slices) for p in mains} == {(False, False), (True, False), (True, True)}
    assert {(p.dq_slice_stores, p.has_window_left) for p in mains if p.dq_slices} == {
        (True, False), (False, True)}  # a left window: the slices are zeroed
    assert {p.dq_reduce_width for p in mains if p.dq_slices} == {1, 4}  # SM80's and SM90's
    for kind in (BwdPreParams, BwdConvertParams):  # they zero and sum the slices
        assert {p.dq_slices for p in SWEEP.every if isinstance(p, kind)} == {False, True}
    # slices written whole: the convert skips the chunks the main left unwritten, by its mask
    converts = [p for p in SWEEP.every if isinstance(p, BwdConvertParams) and p.dq_slices]
    assert {(p.dq_slice_stores, p.has_window_right) for p in converts} >= {(False, False), (True, False), (True, True)}
    # a bias in each dtype; dbias stored in it, as fp32 partials, or reduced into fp32
    assert {(p.bias_dtype == p.dtype, p.dbias_dtype, p.dbias_reduce) for p in mains if p.bias_dtype} == {
        (False, "float32", False), (False, "float32", True), (True, "float16", False), (True, "bfloat16", False),
        (True, "float32", False), (True, "float32", True), (False, None, False), (True, None, False)}  # None: bias_grad=False
    assert not any(p.dbias_reduce and p.deterministic for p in mains)
    assert {(p.bias_staged, p.batch_inner, p.dbias_reduce_width) for p in mains if p.dbias_reduce} == {
        (s, b, w) for s in (False, True) for b in (False, True) for w in (1, 2)}
    assert not any(p.bias_staged and p.bias_dtype != "float32" for p in mains)
    assert {p.bias_dtype for p in SWEEP.every if isinstance(p, BwdDqParams)} == {None, "float32", "float16", "bfloat16"}
    assert all(p.validate() is p for p in SWEEP.every)
    # every new field of every record is compiled in L0 with each of its values
    for kind in kinds:
        for field in dataclasses.fields(kind):
            values = {getattr(p, field.name) for p in SWEEP.every if isinstance(p, kind)}
            assert values == {getattr(p, field.name) for p in SWEEP.l0 if isinstance(p, kind)}, (kind, field.name)


def _packed_problem(lengths, head_dim=64, deterministic=False, sinks=False):
    total = sum(lengths)
    q = torch.randn(total + 5, 4, head_dim, dtype=torch.bfloat16)
    k = torch.randn(total + 3, 2, head_dim, dtype=torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    lse = torch.randn(4, total + 5)
    return Problem.from_call(
        "backward", q, k, k, o=q, lse=lse, do=q, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True,
        deterministic=deterministic, sinks=torch.zeros(4) if sinks else None,
    )


@pytest.mark.L0
@pytest.mark.parametrize("deterministic", [False, True])
def test_thd_token_totals_and_sequence_counts_reuse_one_chain(deterministic):
    engine = Sm80Backward()  # compile() needs no GPU; check_support would decline on CPU
    first = _packed_problem([96, 160], deterministic=deterministic)
    engine.compile(first)
    before = sm80_compile.BWD_CACHE.stats()
    second = _packed_problem([64, 256], deterministic=deterministic)
    assert second.total_q != first.total_q or second.seqlen_q != first.seqlen_q
    engine.compile(second)
    after = sm80_compile.BWD_CACHE.stats()
    # bwd_pre, bwd, then bwd_dq (recompute deterministic) or bwd_convert, and bwd_combine if split
    chain_length = len(engine.records(second))
    assert after.compiles == before.compiles, "a new token total recompiled part of the chain"
    assert after.hits == before.hits + chain_length
    engine.compile(_packed_problem([64, 100, 30], deterministic=deterministic))
    assert sm80_compile.BWD_CACHE.stats().compiles == after.compiles, "a new number of sequences recompiled"


@pytest.mark.L0
@pytest.mark.parametrize("head_dim, flavor, tile", [(64, "d64", 64), (40, "d64", 64), (128, "d128", 128),
                                                     (72, "d128", 128)])
def test_compiled_head_dim_tile_is_the_selected_flavor(head_dim, flavor, tile):
    plan = Sm80Backward().compile(_packed_problem([33, 70], head_dim=head_dim, deterministic=True, sinks=True))
    assert all(p.flavor == flavor and p.tile_hdim_qk == p.tile_hdim_v == tile for p in plan.params), plan.params
    # and the artifacts that were compiled for it are keyed by exactly those records
    keys = {key[1] for key in sm80_compile.BWD_CACHE.keys()}
    assert set(plan.params) <= keys


@pytest.mark.L0
def test_wide_dq_reductions_compile_for_sm90_and_refuse_the_recompute_mode():
    """dq_reduce_width 4 (red.global.add.v4.f32) compiles for sm_90 whatever CUTE_DSL_ARCH says
    (the record raises its own target); deterministic mode reduces dQ only in slices (dq_slices),
    with the recompute pass there are no reductions."""
    default = next(p for p in SWEEP.l0 if isinstance(p, BwdParams) and not p.deterministic)
    wide = dataclasses.replace(default, dq_reduce_width=4)
    assert wide.target_arch == "sm_90" and default.target_arch == "sm_80"
    assert sm80_compile.compile_bwd(wide) is not None
    with pytest.raises(ValueError, match="only in slices"):
        dataclasses.replace(default, deterministic=True, dq_reduce_width=4).validate()
    with pytest.raises(ValueError, match="dq_reduce_width"):
        dataclasses.replace(default, dq_reduce_width=3).validate()


@pytest.mark.L0
@pytest.mark.parametrize("heads, lengths, sms, want", [
    ((32, 8), (4096,) * 2, 132, 1),   # 32 key blocks x 8 kv heads x 2 = 512 CTAs: already ~4 waves
    ((8, 1), (4096,) * 2, 132, 4),    # MQA: 64 CTAs -> 4 of the group's 8 heads per split
    ((8, 2), (2048,) * 4, 132, 2),
    ((8, 8), (128,), 132, 1),         # MHA never splits
    ((6, 1), (128,), 132, 6),         # under two waves even fully split: the whole group
])
def test_group_split_reaches_two_waves(heads, lengths, sms, want):
    from frost.engines.sm80 import group_split

    b, s = len(lengths), lengths[0]
    q = torch.randn(b, s, heads[0], 64, dtype=torch.bfloat16)
    k = torch.randn(b, s, heads[1], 64, dtype=torch.bfloat16)
    problem = Problem.from_call("backward", q, k, k, o=q, lse=torch.zeros(b, heads[0], s), do=q, causal=True)
    assert group_split(problem, 128, sms) == want


@pytest.mark.L0
@pytest.mark.usefixtures("stand_in_kernels")
def test_recompute_chain_where_the_slices_would_not_fit_or_when_forced():
    """Deterministic mode takes the dQ recompute (bwd_pre without an accumulator to zero, the main
    kernel making dK and dV only, bwd_dq) where filling the SMs would take more slices than
    SLICED_EXTRA_SCRATCH holds (``sliced_fills_the_device``), where a forced slice count does not
    fit, and with ``dq_recompute=True``; elsewhere the sliced dQ. Its workspace holds no dQ
    accumulator."""
    from frost.engines import sm80 as engine

    def problem(b, s, h, d, causal=False):
        q = torch.empty(b, s, h, d, dtype=torch.bfloat16)
        return Problem.from_call("backward", q, q, q, o=q, lse=torch.zeros(b, h, s), do=q, causal=causal,
                                 deterministic=True)

    def assert_recompute(plan):
        pre, main, last = plan.params
        assert isinstance(last, BwdDqParams) and last == BwdDqParams.of(main)
        assert main.deterministic and not main.reduces_dq and not main.dq_slices and pre.accum_tile_m == 0
        assert "dq_accum" not in plan._workspace.words and plan.slices == 1

    # one fp32 dQ accumulator of 512 MiB, 32 CTAs a slice: filling 132 SMs takes 4 slices, past the bound
    big = problem(1, 32768, 32, 128)
    sliced = engine.backward_choices(big, None, sliced_dq=True)[0]
    assert not engine.sliced_fills_the_device(big, sliced) and engine.extra_slices_fit(big, 3)
    assert not engine.extra_slices_fit(big, 4)
    for causal in (False, True):
        assert_recompute(Sm80Backward().compile(problem(1, 32768, 32, 128, causal)))
    assert Sm80Backward(dq_slices=3).records(big)[1].dq_slices  # forced within the bound: sliced
    assert_recompute(Sm80Backward(dq_slices=4).compile(big))
    small = problem(2, 1000, 8, 64, causal=True)
    assert Sm80Backward().records(small)[1].dq_slices
    assert_recompute(Sm80Backward(dq_recompute=True).compile(small))
    assert not Sm80Backward(dq_recompute=True).records(dataclasses.replace(small, deterministic=False))[1].deterministic


@pytest.mark.L0
def test_sliced_plan_is_the_least_estimated_chain_within_the_scratch_bound():
    """Deterministic mode's sliced dQ takes the (split, slices) of least scratch within
    SLICED_PLAN_SLACK of the least ``sliced_chain_seconds`` among the plans whose slices beyond
    the first fit SLICED_EXTRA_SCRATCH (its mask term counts the pairs a causal mask keeps; its
    streaming term the q and dO rows each pass reads, shared by the slices of a head)."""
    from frost.engines import sm80 as engine

    def problem(b, s, hq, hkv, d, causal=True):
        q, k = torch.empty(b, s, hq, d, dtype=torch.bfloat16), torch.empty(b, s, hkv, d, dtype=torch.bfloat16)
        return Problem.from_call("backward", q, k, k, o=q, lse=torch.zeros(b, hq, s), do=q, causal=causal,
                                 deterministic=True)

    # the benchmark's: off a GPU an SM90's plan, 2 splits (summed in clusters: no partials) x 8
    # slices, 128 CTAs; without the clusters' saving 4 x 4 (the least scratch within the slack)
    d64 = problem(4, 2048, 8, 2, 64)
    records, splits = Sm80Backward()._chain(d64)
    plans = engine._sliced_plans(d64, records[1])
    assert (splits, engine.dq_slice_count(d64, records[1], splits)) == (2, 8) and {(4, 4), (4, 8)} < set(plans)
    assert records[1].split_cluster == 2 and len(records) == 3  # no bwd_combine
    estimates = {plan: engine.sliced_chain_seconds(d64, records[1], *plan) for plan in plans}
    assert estimates[2, 8] == min(estimates.values())
    partials = (4 * 2048 * 2 * 128 * (4 * 2 * 2 + 2)) / engine.SLICED_PASS_BYTES  # what the clusters save
    assert estimates[4, 4] <= (estimates[2, 8] + partials) * (1 + engine.SLICED_PLAN_SLACK)
    assert estimates[2, 8] < estimates[2, 4] and estimates[4, 4] < estimates[4, 2]  # the slices' shared streams
    # MHA: a head's key blocks in two CTAs, not one walking all eight (the streaming term; H100:
    # 1.073 of the default against 1.167, docs/DECISIONS.md, "Sliced dQ: plan by the estimated
    # chain time")
    mha = problem(16, 1024, 16, 16, 128, causal=False)
    assert engine.dq_slice_count(mha, Sm80Backward()._chain(mha)[0][1], 1) == 2
    assert abs(engine._visible_fraction(d64) - 0.5) < 0.01
    assert engine._visible_fraction(problem(4, 2048, 8, 2, 64, causal=False)) == 1
    for empty in (problem(2, 0, 8, 2, 64), problem(2, 0, 8, 2, 64, causal=False)):  # no rows: no work, no plan cost
        assert engine.sliced_chain_seconds(empty, records[1], 4, 4) == 0.0
        assert Sm80Backward()._chain(empty)[1] == 1
    big = problem(1, 32768, 32, 32, 128, causal=False)  # one fp32 dQ accumulator: 512 MiB, 32 CTAs a slice
    # the most slices within the bound (the chain then recomputes dQ: the test above)
    assert engine.dq_slice_count(big, engine.backward_choices(big, None, sliced_dq=True)[0], 1) == 3


@pytest.mark.L0
@pytest.mark.usefixtures("stand_in_kernels")
def test_sliced_deterministic_plan_zeroes_sums_and_carves_its_slices():
    """Deterministic mode's sliced dQ: the chain is bwd_pre, the main kernel writing its own slice
    (no launch order of its own) and bwd_convert summing them; the accumulator's head axis holds
    the slices (``dq_slice_count``, or a forced ``dq_slices``); the default mode ignores the
    option. Without a left window the main kernel writes its slices whole and bwd_pre zeroes
    nothing (``dq_slice_stores``); with one, bwd_pre zeroes every slice."""
    from frost.engines.sm80 import MAX_DQ_SLICES, dq_slice_count

    q = torch.randn(2, 1000, 8, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 1000, 8, 64, dtype=torch.bfloat16)

    def problem(deterministic=True, **keywords):
        return Problem.from_call("backward", q, k, k, o=q, lse=torch.zeros(2, 8, 1000), do=q, causal=True,
                                 deterministic=deterministic, **keywords)

    sliced = Sm80Backward().compile(problem())
    pre, main, last = sliced.params
    assert main.dq_slices and main.reduces_dq and not (main.heavy_first or main.batch_inner)
    assert main.dq_slice_stores and not pre.dq_slices and pre.accum_tile_m == 0
    assert isinstance(last, BwdConvertParams) and last.dq_slices
    assert last == BwdConvertParams.of(main) and last.dq_slice_stores and (last.tile_n, last.has_window_right) == (
        main.tile_n, True)
    zeroed = Sm80Backward().compile(problem(window=(100, 0)))
    assert zeroed.params[1].dq_slices and not zeroed.params[1].dq_slice_stores
    assert zeroed.params[0].dq_slices and zeroed.params[0].accum_tile_m == main.tile_m
    assert not zeroed.params[2].dq_slice_stores and zeroed.params[2].tile_n == 0
    assert main.dq_reduce_width == 4 and main.dq_first  # off a GPU the plan is an SM90's; d64: dQ first
    # 2 x 8 heads of 8 key blocks on 132 SMs: 8 slices (128 CTAs), one key block each
    assert sliced.slices == 8 == dq_slice_count(problem(), main, 1)
    accum = sliced._workspace.carve(torch.empty(sliced.workspace_bytes, dtype=torch.uint8))["dq_accum"]
    assert accum.shape == (2, 8 * 8, 8 * main.dq_chunk)
    forced = Sm80Backward(dq_slices=3).compile(problem())
    assert forced.slices == 3 and forced._workspace.carve(
        torch.empty(forced.workspace_bytes, dtype=torch.uint8))["dq_accum"].shape[1] == 3 * 8
    assert not Sm80Backward(dq_slices=3).compile(problem(deterministic=False)).params[1].dq_slices
    # many short heads: one slice, each CTA walks both its key blocks (a second slice would cost
    # more to sum than the q and dO reads it shares); never more than MAX_DQ_SLICES
    many = Problem.from_call("backward", *(torch.randn(64, 256, 32, 64, dtype=torch.bfloat16),) * 3,
                             o=torch.randn(64, 256, 32, 64, dtype=torch.bfloat16), lse=torch.zeros(64, 32, 256),
                             do=torch.randn(64, 256, 32, 64, dtype=torch.bfloat16), deterministic=True)
    assert dq_slice_count(many, main, 1) == 1 and 1 < MAX_DQ_SLICES <= 8
    assert Sm80Backward().records(many)[1].dq_slice_stores  # one slice is written whole too
    # B2 S4096 d128 causal: Hq32 / Hkv8 stays unsplit (sliced_chain_seconds: a split slows the main
    # kernel more than 8 slices' reads cost), MQA needs every split and slice to fill the SMs
    for heads, want in (((32, 8), (1, 8)), ((8, 1), (8, 8)), ((16, 16), (1, 4))):
        gqa = Problem.from_call("backward", torch.empty(2, 4096, heads[0], 128, dtype=torch.bfloat16),
                                *(torch.empty(2, 4096, heads[1], 128, dtype=torch.bfloat16),) * 2,
                                o=torch.empty(2, 4096, heads[0], 128, dtype=torch.bfloat16),
                                lse=torch.zeros(2, heads[0], 4096), do=torch.empty(2, 4096, heads[0], 128,
                                dtype=torch.bfloat16), causal=True, deterministic=True)  # fmt: skip
        records, splits = Sm80Backward()._chain(gqa)
        assert (splits, dq_slice_count(gqa, records[1], splits)) == want, heads
    for bad, match in ((dict(heavy_first=True), "dq_slices launches"), (dict(batch_inner=True), "dq_slices launches"),
                       (dict(deterministic=False), "dq_slices")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(main, **bad).validate()
    with pytest.raises(ValueError, match="dq_slices zeroes"):
        dataclasses.replace(pre, dq_slices=True, accum_tile_m=0).validate()
    for bad in (dict(has_window_left=True), dict(dq_slices=False)):
        with pytest.raises(ValueError, match="dq_slice_stores"):
            dataclasses.replace(main, **bad).validate()


@pytest.mark.L0
def test_bias_choices_follow_the_bias_and_the_device(as_device):
    """A float32 bias is staged in shared memory where the device has room; a dbias reduced over
    the batch launches sequences fastest (in place of heavy-first) with two floats per reduction
    on SM90 and an even Sk; nothing of it where dbias is stored per element or as partials
    summed in order (deterministic)."""
    from frost.engines import sm80
    from frost.engines.sm80 import backward_choices

    def main_of(bias_shape, bias_dtype=torch.float32, seqlen=300, **keywords):
        q = torch.randn(2, seqlen, 4, 64, dtype=torch.bfloat16)
        bias = torch.randn(*bias_shape[:2], seqlen, seqlen, dtype=bias_dtype)
        problem = Problem.from_call("backward", q, q, q, o=q, lse=torch.zeros(2, 4, seqlen), do=q, bias=bias,
                                    **keywords)
        return backward_choices(problem, heavy_first=None, batch_inner=None, dbias_reduce_width=None,
                                bias_staged=None)[0]

    over_batch = main_of((1, 4), causal=True)  # off a GPU the device is an H200
    assert over_batch.batch_inner and not over_batch.heavy_first and over_batch.dbias_reduce_width == 2
    assert over_batch.bias_staged and over_batch.smem_bytes() > 160 * 1024
    assert main_of((1, 4), seqlen=255).dbias_reduce_width == 1  # odd rows: 4-byte aligned only
    over_heads = main_of((2, 1), causal=True)
    assert over_heads.dbias_reduce and not over_heads.batch_inner and over_heads.heavy_first
    per_element = main_of((2, 4))
    assert not per_element.dbias_reduce and not per_element.batch_inner and per_element.dbias_reduce_width == 1
    assert not main_of((1, 4), bias_dtype=torch.bfloat16).bias_staged
    deterministic = main_of((1, 4), deterministic=True)
    assert not deterministic.batch_inner and deterministic.dbias_reduce_width == 1
    with pytest.raises(ValueError, match="batch_inner"):
        dataclasses.replace(over_batch, heavy_first=True).validate()
    # a bias whose gradient is not wanted (bias_grad=False): read, no dbias, no dbias workspace
    for deterministic in (False, True):
        no_grad = main_of((1, 4), bias_grad=False, deterministic=deterministic)
        assert no_grad.bias_dtype == "float32" and no_grad.dbias_dtype is None and not no_grad.batch_inner
        q = torch.randn(2, 300, 4, 64, dtype=torch.bfloat16)
        problem = Problem.from_call("backward", q, q, q, o=q, lse=torch.zeros(2, 4, 300), do=q,
                                    bias=torch.randn(1, 4, 300, 300), bias_grad=False, deterministic=deterministic)
        (pre, main, *_), splits = Sm80Backward()._chain(problem)
        assert main.bias_dtype == "float32" and main.dbias_dtype is None and not {"dbias_partial", "dbias_accum"} & {
            name for name, _ in sm80._Workspace(problem, splits, pre, main).parts}
    # an A100-like device: 163 KB of shared memory, no paired reductions
    q = torch.randn(2, 300, 4, 64, dtype=torch.bfloat16)
    problem = dataclasses.replace(Problem.from_call(
        "backward", q, q, q, o=q, lse=torch.zeros(2, 4, 300), do=q, bias=torch.randn(1, 4, 300, 300)), device="cuda:0")
    as_device("a100")
    a100 = backward_choices(problem, heavy_first=None, batch_inner=None, dbias_reduce_width=None, bias_staged=None)[0]
    assert not a100.bias_staged and a100.dbias_reduce_width == 1 and a100.batch_inner


@pytest.mark.L0
def test_d64_default_mode_reduces_four_floats_with_the_dq_product_first(monkeypatch):
    """The default mode's d64 chain on SM90 (an H200 off a GPU) reduces dQ four floats at a time
    with the dQ product first in a step, and converts four at a time; d128, a bias, the
    recompute mode, an SM80 device or a forced width keep one float and the usual order."""
    from frost.engines import sm80

    def chain(head_dim=64, engine=None, **keywords):
        q = torch.randn(2, 300, 4, head_dim, dtype=torch.bfloat16)
        problem = Problem.from_call("backward", q, q, q, o=q, lse=torch.zeros(2, 4, 300), do=q, causal=True,
                                    **keywords)
        return (engine or Sm80Backward()).records(problem)

    _, main, last = chain()
    assert main.dq_reduce_width == last.dq_reduce_width == 4 and main.dq_first and not main.deterministic
    for other in (chain(128), chain(bias=torch.randn(1, 4, 300, 300)), chain(engine=Sm80Backward(dq_reduce_width=1)),
                  chain(deterministic=True, engine=Sm80Backward(dq_recompute=True))):
        assert other[1].dq_reduce_width == 1 and not other[1].dq_first
    assert not chain(128, engine=Sm80Backward(dq_reduce_width=4))[1].dq_first  # d128: 1-4% slower first
    with pytest.raises(ValueError, match="dq_first"):  # the recompute mode has no reductions to order
        dataclasses.replace(chain(deterministic=True, engine=Sm80Backward(dq_recompute=True))[1], dq_first=True).validate()
    monkeypatch.setattr(sm80, "_problem_sm90", lambda problem: False)  # no red.global.add.v4.f32
    assert chain()[1].dq_reduce_width == 1 and not chain()[1].dq_first


@pytest.mark.L0
def test_heavy_first_only_while_a_wave_holds_two_ctas_per_head():
    """The default mode launches a right-bounded problem heaviest key blocks first while its heads
    (sequences x kv heads x split parts) are at most half the SMs (132 off a GPU), else in plain
    order (key blocks of a head together, sharing its query-side tiles in L2); a forced order
    wins; unmasked problems keep the plain order."""
    from frost.engines.sm80 import backward_choices

    def main_of(batch, heads_q=8, heads_kv=8, heavy_first=None, **keywords):
        q = torch.randn(batch, 256, heads_q, 256, dtype=torch.bfloat16)
        k = torch.randn(batch, 256, heads_kv, 256, dtype=torch.bfloat16)
        problem = Problem.from_call("backward", q, k, k, o=q, lse=torch.zeros(batch, heads_q, 256), do=q, **keywords)
        return backward_choices(problem, heavy_first=heavy_first)[0]

    assert main_of(8, causal=True).heavy_first  # 64 heads
    assert not main_of(9, causal=True).heavy_first  # 72: over half the SMs
    assert not main_of(9, window=(-1, 16)).heavy_first and main_of(8, window=(-1, 16)).heavy_first
    assert main_of(9, causal=True, heavy_first=True).heavy_first
    assert not main_of(8).heavy_first and not main_of(8, window=(16, -1)).heavy_first
    assert main_of(16, heads_q=32, heads_kv=4, causal=True).heavy_first  # GQA: 64 groups


@pytest.mark.L0
@pytest.mark.usefixtures("stand_in_kernels")
def test_split_plan_reports_the_partials_in_its_workspace():
    """A split plan carries the split count and sizes fp32 dK / dV partials (one per split) in its
    workspace; unsplit, none."""
    q = torch.randn(2, 300, 8, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 300, 1, 64, dtype=torch.bfloat16)
    problem = Problem.from_call("backward", q, k, k, o=q, lse=torch.zeros(2, 8, 300), do=q, causal=True)
    split = Sm80Backward(split=4).compile(problem)
    whole = Sm80Backward(split=1).compile(problem)
    assert split.splits == 4 and split.params[1].split_group and not whole.params[1].split_group
    assert isinstance(split.params[3], BwdCombineParams) and len(whole.params) == 3  # the partials' combine
    partials = 2 * 4 * (2 * 300 * 1 * 64) * 4
    assert split.workspace_bytes - whole.workspace_bytes >= partials


@pytest.mark.L0
@pytest.mark.usefixtures("stand_in_kernels")
def test_two_splits_sum_in_clusters_on_sm90_without_partials_or_combine(as_device):
    """On SM90 (a CPU problem's plan) a group split in 2 sums dK and dV in clusters of its 2 CTAs
    (``split_cluster``): the chain has no bwd_combine and the workspace no partials; 4 splits keep
    the partials even when clusters are asked for; ``cluster_sum=False`` keeps them at 2 too; an SM80
    device never gets clusters. The record needs sm_90 and names its rules when invalid."""
    from frost.engines import sm80 as engine
    from frost.kernels.sm80.compile import min_arch

    q = torch.randn(2, 300, 8, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 300, 2, 64, dtype=torch.bfloat16)
    problem = Problem.from_call("backward", q, k, k, o=q, lse=torch.zeros(2, 8, 300), do=q, causal=True)

    def plan(**choice):
        compiled = Sm80Backward(**choice).compile(problem)
        return compiled.params, set(compiled._workspace.words)

    (_, main, _), parts = plan(split=2)
    assert main.split_group and main.split_cluster == 2 and min_arch(main) == "sm_90"
    assert not {"dk_partial", "dv_partial"} & parts
    for choice, cluster in ((dict(split=4), 0), (dict(split=2, cluster_sum=False), 0),
                            (dict(split=4, cluster_sum=True), 0)):
        params, parts = plan(**choice)
        assert params[1].split_cluster == cluster and (len(params) == 3) == bool(cluster), choice
        assert ({"dk_partial", "dv_partial"} <= parts) == (not cluster), choice
    as_device("a100")
    a100 = dataclasses.replace(problem, device="cuda:0")
    for choice in (dict(split=2), dict(split=2, cluster_sum=True)):
        assert Sm80Backward(**choice)._chain(a100)[0][1].split_cluster == 0
    for bad, match in ((dict(split_group=False), "split_cluster"), (dict(split_cluster=4), "split_cluster")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(main, **bad).validate()


@pytest.mark.L0
@pytest.mark.usefixtures("stand_in_kernels")
def test_workspace_carves_disjoint_typed_views_at_the_buffer_offset():
    """Each part of a split, sliced, sinks-carrying backward's workspace is one contiguous float32
    view of the caller's bytes, at its own offset, none overlapping another, and relative to
    where the given buffer starts (a slice of a larger allocation)."""
    from frost.engines.sm80 import _Workspace

    q = torch.randn(2, 300, 8, 64, dtype=torch.bfloat16)
    k = torch.randn(2, 300, 1, 64, dtype=torch.bfloat16)
    problem = Problem.from_call("backward", q, k, k, o=q, lse=torch.zeros(2, 8, 300), do=q, causal=True,
                                deterministic=True, sinks=torch.zeros(8))  # fmt: skip
    plan = Sm80Backward(split=4).compile(problem)
    assert plan.params[1].dq_slices and plan.slices > 1
    workspace = _Workspace(problem, plan.splits, plan.params[0], plan.params[1], plan.slices)
    names = [name for name, _ in workspace.parts]
    assert {"dq_accum", "dsink_partial", "dk_partial", "dv_partial"} <= set(names)
    lead = _Workspace.ALIGN
    backing = torch.zeros(lead + workspace.nbytes, dtype=torch.uint8)
    views = workspace.carve(backing[lead:])
    spans = []
    for name, shape in workspace.parts:
        view = views[name]
        assert view.shape == shape and view.is_contiguous(), name
        assert view.dtype == torch.float32, name
        start = view.data_ptr() - backing.data_ptr()
        assert start >= lead and start % _Workspace.ALIGN == 0, name
        spans.append((start, start + 4 * view.numel()))
        view.fill_(1)
    spans.sort()
    assert all(end <= next_start for (_, end), (next_start, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= lead + workspace.nbytes and int(backing[:lead].sum()) == 0


@pytest.mark.L0
@pytest.mark.parametrize("change, rule", [
    (dict(dbias_dtype="float32"), "needs a bias"),
    (dict(bias_dtype="float32", dbias_dtype="float16"), "dbias_dtype must be"),
    (dict(bias_dtype="float32", dbias_dtype="float32", dbias_reduce=True, deterministic=True), "dbias_reduce"),
    (dict(bias_dtype="float32", dbias_dtype="float32", dbias_reduce_width=2), "dbias_reduce_width"),
    (dict(bias_dtype="bfloat16", bias_staged=True), "bias_staged"),
    (dict(batch_inner=True, heavy_first=True), "batch_inner"),
])
def test_invalid_bias_fields_name_the_rule(change, rule):
    main = next(p for p in SWEEP.l0 if isinstance(p, BwdParams) and p.dtype == "bfloat16" and not p.dq_slices)
    plain = dataclasses.replace(main, bias_dtype=None, dbias_dtype=None, dbias_reduce=False, dbias_reduce_width=1,
                                bias_staged=False, batch_inner=False, heavy_first=False).validate()
    with pytest.raises(ValueError, match=rule):
        dataclasses.replace(plain, **change).validate()


@pytest.mark.L0
@pytest.mark.parametrize("shape, deterministic, extra_bytes", [
    ((2, 4, 300, 300), True, 0),                 # no broadcast: dS stored straight into dbias
    ((1, 4, 300, 300), False, 4 * 4 * 300 * 300),  # io-dtype bias, reduced: an fp32 accumulator like it
    ((1, 1, 300, 300), True, 4 * 2 * 4 * 300 * 300),  # deterministic broadcast: per-(b, h) fp32 partials
])
def test_bias_plan_compiles_and_reports_its_dbias_workspace(shape, deterministic, extra_bytes):
    q = torch.randn(2, 300, 4, 64, dtype=torch.bfloat16)
    problem = Problem.from_call("backward", q, q, q, o=q, lse=torch.zeros(2, 4, 300), do=q, causal=True,
                                deterministic=deterministic, bias=torch.zeros(shape, dtype=torch.bfloat16))
    plain = Sm80Backward(split=1).compile(dataclasses.replace(problem, bias=None))
    plan = Sm80Backward(split=1).compile(problem)
    assert plan.params[1].bias_dtype == "bfloat16"
    assert extra_bytes <= plan.workspace_bytes - plain.workspace_bytes < extra_bytes + 4096
