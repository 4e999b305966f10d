"""CPU: every kernel of the SM80 backward chain compiles (CUTE_DSL_ARCH=sm_80) for every
params combination the engine can produce (a pairwise-covering subset in L0, all in L1);
packed token totals and sequence counts reuse one compiled chain; the compiled head-dim
tile is always the flavor the adapter selected."""
from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")

from frost.engines.sm80 import Sm80Backward  # noqa: E402
from frost.kernels.sm80 import compile as sm80_compile  # noqa: E402
from frost.kernels.sm80.config import BwdDqParams, BwdParams, BwdPreParams  # noqa: E402
from frost.problem import Problem  # noqa: E402
from suites.sm80.params_space import admitted_bwd_params, covering_subset  # noqa: E402

ALL = admitted_bwd_params()
SUBSET = covering_subset(ALL)
SUBSET_SET = set(SUBSET)
COMPILE = {BwdPreParams: sm80_compile.compile_bwd_pre, BwdParams: sm80_compile.compile_bwd,
           BwdDqParams: sm80_compile.compile_bwd_dq}  # fmt: skip


def _id(p) -> str:
    return type(p).__name__ + "-" + "-".join(str(v) for v in dataclasses.astuple(p))


@pytest.fixture(autouse=True)
def _cpu_target(monkeypatch):
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_80")


@pytest.mark.L0
@pytest.mark.parametrize("params", SUBSET, ids=_id)
def test_bwd_chain_compiles_covering_subset(params):
    assert COMPILE[type(params)](params) is not None


@pytest.mark.L1
@pytest.mark.parametrize("params", [p for p in ALL if p not in SUBSET_SET], ids=_id)
def test_bwd_chain_compiles_every_admitted_combination(params):
    assert COMPILE[type(params)](params) is not None


@pytest.mark.L0
def test_admitted_chain_covers_every_kernel_and_mode():
    kinds = {type(p) for p in ALL}
    assert kinds == {BwdPreParams, BwdParams, BwdDqParams}
    assert {p.deterministic for p in ALL if isinstance(p, BwdParams)} == {False, True}
    assert all(p.validate() is p for p in ALL)


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
    chain_length = 3 if deterministic else 2
    assert after.compiles == before.compiles, "a new token total recompiled part of the chain"
    assert after.hits == before.hits + chain_length
    engine.compile(_packed_problem([64, 100, 30], deterministic=deterministic))
    assert sm80_compile.BWD_CACHE.stats().compiles == after.compiles, "a new number of sequences recompiled"


@pytest.mark.L0
@pytest.mark.parametrize("head_dim, flavor, tile", [(64, "d64", 64), (40, "d64", 64), (128, "d128", 128),
                                                     (72, "d128", 128)])
def test_compiled_head_dim_tile_is_the_selected_flavor(head_dim, flavor, tile):
    plan = Sm80Backward().compile(_packed_problem([33, 70], head_dim=head_dim, deterministic=True, sinks=True))
    assert all(p.flavor == flavor and p.tile_hdim == tile for p in plan.params), plan.params
    # and the artifacts that were compiled for it are keyed by exactly those records
    keys = {key[1] for key in sm80_compile.BWD_CACHE.keys()}
    assert set(plan.params) <= keys


@pytest.mark.L0
def test_vector_dq_atomics_compile_for_sm90_and_refuse_the_deterministic_mode(monkeypatch):
    """The SM90 variant (red.global.add.v2.f32 on dQ pairs) traces and compiles for sm_90;
    with deterministic=True there are no atomics and the record says so."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90")
    default = next(p for p in SUBSET if isinstance(p, BwdParams) and not p.deterministic)
    assert sm80_compile.compile_bwd(dataclasses.replace(default, vector_dq_atomics=True)) is not None
    with pytest.raises(ValueError, match="no dQ atomics"):
        dataclasses.replace(default, deterministic=True, vector_dq_atomics=True).validate()
