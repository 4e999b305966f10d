"""CPU: RoPE on the SM80 engines without a GPU.

The pass (sm80/rope.py) traces and compiles (CUTE_DSL_ARCH=sm_80) for every record the
engines can produce (a pairwise-covering subset over representative head dims in L0, every
head dim in L1); the engines admit RoPE with the features it meets (their rows, with the
compute capability patched); their plans list the pass's records (so ``frost-compile`` and
``build_records`` prebuild them) and report its workspace; packed token totals reuse one
artifact; a table shorter than the longest sequence is a ValueError naming ``rope`` before
any engine is asked.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import cutlass  # noqa: F401  (a hard dependency: a missing DSL fails these suites, it does not skip them)

import frost
from frost.engines import sm80
from frost.engines.sm80 import Sm80Backward, Sm80Forward
from frost.kernels.sm80 import compile as sm80_compile
from frost.kernels.sm80.rope_params import RopeParams
from frost.problem import Problem
from frost_harness.suites.sm80.params_space import RecordSweep, parametrize_sweeps

SWEEP = RecordSweep("rope")


def _id(p: RopeParams) -> str:
    return "-".join(str(v) for v in dataclasses.astuple(p))


pytestmark = pytest.mark.usefixtures("cpu_target")


def pytest_generate_tests(metafunc):
    parametrize_sweeps(metafunc, {"test_rope_pass_compiles_covering_subset": lambda: SWEEP.l0,
                                  "test_rope_pass_compiles_every_admitted_record": SWEEP.rest}, _id)


@pytest.mark.L0
def test_rope_pass_compiles_covering_subset(params):
    assert sm80_compile.compile_record(params) is not None


@pytest.mark.L1
def test_rope_pass_compiles_every_admitted_record(params):
    assert sm80_compile.compile_record(params) is not None


@pytest.mark.L0
def test_admitted_rope_records_cover_what_the_row_promises():
    assert {p.head_dim for p in SWEEP.every} == set(range(8, 257, 8))
    assert {(p.dtype, p.layout, p.inverse) for p in SWEEP.every} == {
        (d, layout, inverse) for d in ("float16", "bfloat16") for layout in ("bshd", "thd") for inverse in (False, True)
    }
    assert all(p.validate() is p for p in SWEEP.every)
    # both access widths and both directions in L0
    assert {p.vector for p in SWEEP.l0} == {4, 8} and {p.inverse for p in SWEEP.l0} == {False, True}


@pytest.mark.L0
@pytest.mark.parametrize("head_dim, vector, row_threads, tokens", [
    (128, 8, 8, 16), (256, 8, 16, 8), (64, 8, 4, 32), (72, 4, 9, 14), (8, 4, 1, 128), (248, 4, 31, 4),
])
def test_rope_thread_layout(head_dim, vector, row_threads, tokens):
    """16-byte accesses where both halves start 16-byte aligned (D a multiple of 16), else 8;
    whole rows per CTA of at most 128 threads."""
    p = RopeParams(dtype="bfloat16", head_dim=head_dim, layout="thd", inverse=False).validate()
    assert (p.vector, p.threads_per_row, p.tokens_per_cta) == (vector, row_threads, tokens)
    assert p.num_threads == tokens * row_threads <= 128


@pytest.mark.L0
@pytest.mark.parametrize("change, rule", [
    (dict(head_dim=12), "multiple of 8"), (dict(head_dim=264), "up to 256"), (dict(head_dim=0), "positive"),
    (dict(layout="bhsd"), "layout"), (dict(dtype="float32"), "dtype"),
])
def test_rope_params_validator_names_the_rule(change, rule):
    base = RopeParams(dtype="float16", head_dim=64, layout="bshd", inverse=True)
    with pytest.raises(ValueError, match=rule):
        dataclasses.replace(base, **change).validate()


# -- routing and plans ------------------------------------------------------------------------


@pytest.fixture
def _hopper(as_device):
    as_device("h200")


def _tables(positions: int, head_dim: int):
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * torch.rand(head_dim // 2)
    return angles.cos(), angles.sin()


def _dense(direction, *, hq=8, hkv=2, d=128, sq=40, sk=56, positions=None, **kw):
    q = torch.randn(2, sq, hq, d, dtype=torch.bfloat16)
    k, v = (torch.randn(2, sk, hkv, d, dtype=torch.bfloat16) for _ in range(2))
    extra = {}
    if direction == "backward":
        extra = dict(o=q, do=q, lse=torch.zeros(2, hq, sq))
    rope = _tables(positions or max(sq, sk), d)
    return Problem.from_call(direction, q, k, v, rope=rope, **extra, **kw)


def _packed(direction, lengths, *, d=64, positions=None, tail=3, **kw):
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(total + tail, 4, d, dtype=torch.bfloat16)
    k, v = (torch.randn(total, 2, d, dtype=torch.bfloat16) for _ in range(2))
    extra = dict(o=q, do=q, lse=torch.zeros(4, total + tail)) if direction == "backward" else {}
    return Problem.from_call(direction, q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu,
                             rope=_tables(positions or max(lengths), d), **extra, **kw)


def _on_cuda(problem: Problem) -> Problem:
    return dataclasses.replace(problem, device="cuda:0")


ADMITTED = {
    "dense": dict(), "causal_gqa": dict(causal=True), "window": dict(window=(16, 4), causal_align="bottom_right"),
    "padded": dict(seqlens_q=torch.tensor([40, 7], dtype=torch.int32)), "sinks": dict(sinks=torch.zeros(8)),
}


@pytest.mark.L0
@pytest.mark.parametrize("engine", [Sm80Forward(), Sm80Backward()], ids=lambda e: e.name)
@pytest.mark.parametrize("name", ADMITTED)
def test_sm80_engines_admit_rope(engine, name, _hopper):
    dense = _on_cuda(_dense(engine.direction, **ADMITTED[name]))
    assert "rope" in dense.features and engine.check_support(dense) is None
    packed = _on_cuda(_packed(engine.direction, [30, 0, 17], causal=True, deterministic=engine.direction == "backward"))
    assert {"rope", "thd"} <= packed.features and engine.check_support(packed) is None


@pytest.mark.L0
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_rope_table_shorter_than_the_longest_sequence_is_refused_before_any_engine(direction):
    """Dense: the padded extent (every row has a position); packed: the longest sequence,
    not the token total."""
    with pytest.raises(ValueError, match=r"^rope: tables have 55 positions"):
        _dense(direction, sq=40, sk=56, positions=55)
    _dense(direction, sq=40, sk=56, positions=56)
    with pytest.raises(ValueError, match=r"^rope: tables have 29 positions"):
        _packed(direction, [30, 17], positions=29)
    _packed(direction, [30, 17], positions=30)  # 47 packed rows, but no sequence past position 29
    q = torch.randn(1, 9, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^rope:"):  # the public API raises the same, before routing
        frost.sdpa_forward(q, q, q, rope=_tables(8, 16))


@pytest.mark.L0
@pytest.mark.usefixtures("stand_in_kernels")
def test_forward_plan_rotates_into_the_workspace_it_reports():
    problem = _dense("forward", hq=8, hkv=2, d=72, sq=40, sk=56, causal=True)
    plan = Sm80Forward().compile(problem)
    fwd, rope = Sm80Forward().records(problem)
    assert plan.params == fwd and rope == RopeParams(dtype="bfloat16", head_dim=72, layout="bshd", inverse=False)
    rotated = 2 * (2 * 40 * 8 * 72) + 2 * (2 * 56 * 2 * 72)  # q and k in bf16
    assert rotated <= plan.workspace_bytes < rotated + 2 * 256
    plain = Sm80Forward().compile(Problem.from_call("forward", *(torch.randn(2, 40, 8, 72, dtype=torch.bfloat16)
                                                                 for _ in range(3))))
    assert plain.rope is None and plain.workspace_bytes == 0 and len(Sm80Forward().records(plain.problem)) == 1


@pytest.mark.L0
@pytest.mark.usefixtures("stand_in_kernels")
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_plan_lists_both_directions_and_adds_the_rotated_copies_to_its_workspace(deterministic):
    problem = _packed("backward", [30, 0, 17], causal=True, deterministic=deterministic)
    engine = Sm80Backward()
    *chain, rotate, transpose = engine.records(problem)
    assert not rotate.inverse and transpose.inverse and rotate.layout == "thd" and rotate.head_dim == 64
    plan = engine.compile(problem)
    assert tuple(chain) == plan.params  # the chain's records do not change with RoPE
    without = Sm80Backward().compile(dataclasses.replace(problem, has_rope=False))
    assert plan.workspace_bytes - without.workspace_bytes == plan.rope.nbytes >= 2 * (50 * 4 + 47 * 2) * 64


@pytest.mark.L0
def test_rope_thd_token_totals_and_sequence_counts_reuse_one_pass():
    engine = Sm80Backward()
    engine.compile(_packed("backward", [96, 160]))
    before = sm80_compile.ROPE_CACHE.stats()
    engine.compile(_packed("backward", [64, 256, 30], tail=0))
    Sm80Forward().compile(_packed("forward", [7, 9]))
    after = sm80_compile.ROPE_CACHE.stats()
    assert after.compiles == before.compiles and after.loads == before.loads, (before, after)
    assert after.hits == before.hits + 3


@pytest.mark.L0
def test_launch_skips_an_empty_grid_and_passes_the_pass_its_arguments():
    """No rows at all (no sequences, or dense extents of 0) would be an empty grid, which CUDA
    rejects: nothing is launched. Otherwise one launch, q and k together."""
    calls = []
    record = lambda *args: calls.append(args)  # noqa: E731  (a stand-in for the compiled pass)
    cos = sin = torch.zeros(4, 8)
    empty = torch.zeros(0, 4, 2, 16)
    sm80_compile.launch_rope(record, empty, empty, empty, empty, cos, sin)
    packed = torch.zeros(5, 2, 16)
    sm80_compile.launch_rope(record, packed, packed, packed, packed, cos, sin, cu_seqlens_q=torch.zeros(1),
                             cu_seqlens_k=torch.zeros(1), max_seqlen_q=3, max_seqlen_k=3)
    assert calls == []
    q, k = torch.zeros(1, 0, 2, 16), torch.zeros(1, 4, 2, 16)  # no query rows, but keys to rotate
    sm80_compile.launch_rope(record, q, k, q, k, cos, sin)
    assert len(calls) == 1 and calls[0][:6] == (q, k, q, k, cos, sin)
