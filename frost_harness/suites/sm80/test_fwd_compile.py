"""CPU: the SM80 forward traces and compiles (CUTE_DSL_ARCH=sm_80) for every params
combination its Capabilities row admits (a covering subset in L0, all in L1), and one
compiled artifact serves every packed token total and number of sequences."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import cutlass  # noqa: E402,F401  (a hard dependency: a missing DSL fails these suites, it does not skip them)

from frost.engines.sm80 import Sm80Forward  # noqa: E402
from frost.kernels.sm80 import compile as sm80_compile  # noqa: E402
from frost.kernels.sm80.config import FLAVORS, FwdParams  # noqa: E402
from frost.problem import Problem  # noqa: E402
from frost_harness.suites.sm80.params_space import RecordSweep, parametrize_sweeps  # noqa: E402

SWEEP = RecordSweep("fwd")


def _id(p: FwdParams) -> str:
    return "-".join(str(v) for v in dataclasses.astuple(p))


pytestmark = pytest.mark.usefixtures("cpu_target")


def pytest_generate_tests(metafunc):
    parametrize_sweeps(metafunc, {"test_fwd_compiles_covering_subset": lambda: SWEEP.l0,
                                  "test_fwd_compiles_every_admitted_combination": SWEEP.rest}, _id)


@pytest.mark.L0
def test_fwd_compiles_covering_subset(params):
    assert sm80_compile.compile_fwd(params) is not None


@pytest.mark.L1
def test_fwd_compiles_every_admitted_combination(params):
    assert sm80_compile.compile_fwd(params) is not None


@pytest.mark.L0
def test_admitted_space_is_what_the_row_promises():
    # every flavor, both layouts and padding, every mask flag, sinks; nothing invalid
    assert {p.flavor for p in SWEEP.every} == set(FLAVORS)
    assert {(p.layout, p.has_seqlens) for p in SWEEP.every} == {("bshd", False), ("bshd", True), ("thd", False)}
    assert {p.bias_dtype for p in SWEEP.every} == {None, "float32", "float16", "bfloat16"}
    assert all(p.bias_dtype in (None, "float32", p.dtype) for p in SWEEP.every)
    assert all(p.validate() is p for p in SWEEP.every)
    # the bias (three values: none, float32, io dtype) raised the pairwise cover from 15 to 24
    assert len(SWEEP.every) > 100 and len(SWEEP.l0) < 30


@pytest.mark.L0
@pytest.mark.parametrize(
    "change, rule",
    [
        (dict(layout="thd", has_seqlens=True), "padding seqlens apply to the dense layout only"),
        (dict(bottom_right=True, has_window_left=False, has_window_right=False), "bottom_right alignment"),
        (dict(tile_m=96), "tile_m must be"),
        (dict(tile_n=40), "tile_n must be"),
        (dict(flavor="d512"), "flavor must be"),
        (dict(tile_m=512, tile_n=256, flavor="d128"), "shared memory"),
        (dict(dtype="float16", bias_dtype="bfloat16"), "bias_dtype must be None, 'float32' or the io dtype"),
    ],
)
def test_invalid_params_name_the_rule(change, rule):
    with pytest.raises(ValueError, match=rule):
        dataclasses.replace(SWEEP.l0[0], **change).validate()


def _packed_problem(lengths, dtype=torch.bfloat16, head_dim=64):
    total = sum(lengths)
    q = torch.randn(total + 5, 4, head_dim, dtype=dtype)
    k = torch.randn(total + 3, 2, head_dim, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor([n + 1 for n in lengths]).cumsum(0).tolist()], dtype=torch.int32)
    cu_k[-1] = min(int(cu_k[-1]), total + 3)
    return Problem.from_call("forward", q, k, k, cu_seqlens_q=cu, cu_seqlens_k=cu_k, causal=True)


@pytest.mark.L0
def test_thd_token_totals_and_sequence_counts_reuse_one_artifact():
    engine = Sm80Forward()  # compile() needs no GPU; check_support would decline on CPU
    first = _packed_problem([96, 160])
    engine.compile(first)  # compiles, or hits if another test compiled these params
    before = sm80_compile.FWD_CACHE.stats()
    second = _packed_problem([64, 256])
    assert (second.total_q, second.seqlen_q) != (first.total_q, first.seqlen_q)
    engine.compile(second)
    after = sm80_compile.FWD_CACHE.stats()
    assert after.compiles == before.compiles, "a new token total recompiled"
    assert after.hits >= before.hits + 1
    engine.compile(_packed_problem([64, 100, 30]))  # a different number of sequences: dynamic too
    assert sm80_compile.FWD_CACHE.stats().compiles == after.compiles, "a new number of sequences recompiled"


@pytest.mark.L0
@pytest.mark.parametrize("bias", ["BH", "1H", "B1", "11"])
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_bias_lowers_to_one_record_per_dtype_whatever_its_broadcast(bias, bias_dtype):
    """A bias enters the forward's key by its dtype only: broadcast is a runtime index clamp
    (sm80/bias.py), so every shape of [B|1, Hq|1, Sq, Sk] shares the record, and it compiles."""
    q = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16)
    shape = (2 if bias[0] == "B" else 1, 4 if bias[1] == "H" else 1, 16, 16)
    problem = Problem.from_call("forward", q, q, q, bias=torch.zeros(shape, dtype=bias_dtype), causal=True)
    (params,) = Sm80Forward().records(problem)
    want = "float32" if bias_dtype == torch.float32 else "bfloat16"
    assert params.bias_dtype == want and not params.heavy_first  # a bias keeps the plain order (forward_heavy_first)
    assert params == dataclasses.replace(Sm80Forward().records(dataclasses.replace(problem, bias=None))[0],
                                         bias_dtype=want, heavy_first=False)
    assert sm80_compile.compile_fwd(params) is not None


@pytest.mark.L0
def test_d64_forward_launches_heavy_first_only_with_few_heads():
    """The d64 forward under a right-bounded mask without a bias launches its longest query blocks
    first while its heads (sequences x query heads) are at most half the SMs (132 off a GPU),
    else in plain order; the wider flavors always heavy-first; unmasked and biased d64 problems
    plain."""
    def params_of(batch, heads_q=8, heads_kv=8, head_dim=64, **keywords):
        q = torch.randn(batch, 64, heads_q, head_dim, dtype=torch.bfloat16)
        k = torch.randn(batch, 64, heads_kv, head_dim, dtype=torch.bfloat16)
        return Sm80Forward().records(Problem.from_call("forward", q, k, k, **keywords))[0]

    assert params_of(8, causal=True).heavy_first  # 64 heads
    assert not params_of(9, causal=True).heavy_first  # 72: over half the SMs
    assert params_of(4, heads_q=16, heads_kv=2, window=(-1, 8)).heavy_first  # GQA: query heads count
    assert not params_of(5, heads_q=16, heads_kv=2, window=(-1, 8)).heavy_first
    assert not params_of(8).heavy_first and not params_of(8, window=(8, -1)).heavy_first
    assert not params_of(8, causal=True, bias=torch.randn(8, 8, 64, 64)).heavy_first
    assert params_of(9, causal=True, head_dim=128).heavy_first and not params_of(9, head_dim=128).heavy_first
    assert all(p in set(SWEEP.every) for p in (params_of(8, causal=True), params_of(9, causal=True)))
