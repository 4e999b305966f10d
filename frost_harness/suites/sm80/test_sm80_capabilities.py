"""The SM80 engines' Capabilities rows, tested on both sides of every boundary (CPU).

Problems are built from CPU tensors and then placed on a CUDA device by
``dataclasses.replace``; the compute capability is patched, so every rule of
the row and of ``sm80_decline`` is exercised without a GPU. The GPU suites
check that the accepted side really runs and matches the oracle.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from frost import devices
from frost.engines import sm80
from frost.engines.sm80 import Sm80Backward, Sm80Forward
from frost.problem import Problem

pytestmark = pytest.mark.L0
ENGINES = [Sm80Forward(), Sm80Backward()]


@pytest.fixture(autouse=True)
def _hopper(as_device):
    as_device("h200")


def _problem(engine, *, hq=4, hkv=4, dqk=64, dv=None, dtype=torch.bfloat16, device="cuda:0", q=None, **kw):
    q = torch.randn(2, 16, hq, dqk, dtype=dtype) if q is None else q
    k = torch.randn(2, 16, hkv, dqk, dtype=dtype)
    v = torch.randn(2, 16, hkv, dv or dqk, dtype=dtype)
    extra = {}
    if engine.direction == "backward":
        o = torch.randn(*q.shape[:-1], v.shape[-1], dtype=dtype)
        extra = dict(o=o, do=o, lse=torch.randn(2, hq, 16))
    problem = Problem.from_call(engine.direction, q, k, v, **extra, **kw)
    return dataclasses.replace(problem, device=device)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "accepted, rejected, reason",
    [
        (dict(), dict(device="cpu"), "needs a cuda device"),
        (dict(dqk=256), dict(dqk=264), "exceeds 256"),
        (dict(dqk=192, dv=128), dict(dqk=192, dv=264), "exceeds 256"),
        (dict(dqk=72), dict(dqk=68), "not a multiple of 8"),
        (dict(dqk=64, dv=40), dict(dqk=64, dv=36), "not a multiple of 8"),
        (dict(scale=0.1), dict(scale=-0.1), "positive scale"),
        (dict(bias=torch.zeros(1, 4, 16, 16)), dict(bias=torch.zeros(1, 4, 16, 32)[..., ::2]), "stride 1"),
        (dict(hq=8, hkv=2), dict(q=torch.randn(2, 16, 4, 68, dtype=torch.bfloat16)[..., :64]), "16-byte aligned"),
    ],
)
def test_each_boundary_accepts_one_side_and_declines_the_other(engine, accepted, rejected, reason):
    # (fp16 and bf16 are the only dtypes frost's validation lets through, so dtype has no row here)
    assert engine.check_support(_problem(engine, **accepted)) is None
    declined = engine.check_support(_problem(engine, **rejected))
    assert declined is not None and reason in declined, declined


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
@pytest.mark.parametrize("capability, accepted", [((8, 0), True), ((9, 0), True), ((7, 5), False), ((10, 0), False)])
def test_compute_capability_boundary(engine, as_device, capability, accepted):
    as_device(dataclasses.replace(devices.named("h200"), compute_capability=capability))
    declined = engine.check_support(_problem(engine))
    assert (declined is None) == accepted, declined
    if not accepted:
        assert "compute capability 8.x or 9.x" in declined


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_missing_dsl_declines(engine, monkeypatch):
    monkeypatch.setattr(sm80, "_dsl_installed", lambda: False)
    assert "nvidia-cutlass-dsl is not installed" in engine.check_support(_problem(engine))


def test_backward_accepts_deterministic_mode():
    engine = Sm80Backward()
    assert engine.check_support(_problem(engine, deterministic=True)) is None


@pytest.mark.parametrize(
    "keywords", [dict(), dict(causal=True, causal_align="bottom_right"), dict(window=(5, -1)),
                 dict(sinks=torch.zeros(4)), dict(seqlens_q=torch.tensor([3, 16], dtype=torch.int32)),
                 dict(bias=torch.zeros(1, 4, 16, 16)), dict(bias=torch.zeros(2, 1, 16, 16, dtype=torch.bfloat16)),
                 dict(bias=torch.zeros(1, 1, 16, 16), seqlens_k=torch.tensor([16, 5], dtype=torch.int32)),
                 dict(rope=(torch.ones(16, 32), torch.zeros(16, 32)), window=(3, 2))],
)
def test_every_listed_feature_is_accepted(keywords):
    for engine in ENGINES:
        assert engine.check_support(_problem(engine, **keywords)) is None


def _packed_problem(engine, **kw):
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    q = torch.randn(16, 4, 64, dtype=torch.bfloat16)
    extra = dict(o=q, do=q, lse=torch.randn(4, 16)) if engine.direction == "backward" else {}
    problem = Problem.from_call(engine.direction, q, q, q, cu_seqlens_q=cu, cu_seqlens_k=cu, **extra, **kw)
    return dataclasses.replace(problem, device="cuda:0")


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.bfloat16])
def test_bias_is_served_in_every_layout_and_lowered_by_dtype(engine, bias_dtype):
    """The rows admit a bias (float32 or the io dtype, any broadcast) dense, padded and packed;
    lowering puts its dtype into the records, and the backward's dbias target in the main one."""
    name = "float32" if bias_dtype == torch.float32 else "bfloat16"
    for problem in (_problem(engine, bias=torch.zeros(1, 4, 16, 16, dtype=bias_dtype)),
                    _packed_problem(engine, bias=torch.zeros(2, 1, 16, 16, dtype=bias_dtype))):
        assert engine.check_support(problem) is None
        records = engine.records(problem)
        assert records[0 if engine.direction == "forward" else 1].bias_dtype == name


@pytest.mark.parametrize("shape, deterministic, dbias_dtype, reduce", [
    ((2, 4, 16, 16), False, "bfloat16", False),  # no broadcast: dS stored as dbias, in its dtype
    ((2, 4, 16, 16), True, "bfloat16", False),
    ((1, 4, 16, 16), False, "float32", True),    # broadcast over B: reductions into fp32
    ((2, 1, 16, 16), True, "float32", False),    # broadcast, deterministic: fp32 partials
])
def test_backward_chooses_the_dbias_target(shape, deterministic, dbias_dtype, reduce):
    engine = Sm80Backward()
    problem = _problem(engine, bias=torch.zeros(shape, dtype=torch.bfloat16), deterministic=deterministic)
    pre, main, last = engine.records(problem)
    assert (main.bias_dtype, main.dbias_dtype, main.dbias_reduce) == ("bfloat16", dbias_dtype, reduce)
    if deterministic and not main.reduces_dq:
        assert last.bias_dtype == "bfloat16"  # the dQ recompute reads the bias too


@pytest.mark.parametrize("shape, deterministic, part, part_shape", [
    ((2, 4, 16, 16), False, None, None),
    ((1, 4, 16, 16), False, "dbias_accum", (1, 4, 16, 16)),
    ((1, 1, 16, 16), True, "dbias_partial", (2, 4, 16, 16)),
])
def test_backward_workspace_holds_the_dbias_target(shape, deterministic, part, part_shape):
    engine = Sm80Backward()
    problem = _problem(engine, bias=torch.zeros(shape, dtype=torch.bfloat16), deterministic=deterministic)
    records, splits = engine._chain(problem)
    workspace = sm80._Workspace(problem, splits, records[0], records[1])
    parts = dict(workspace.parts)
    assert not {"dbias_accum", "dbias_partial"} - {part} & set(parts)
    if part is not None:
        assert parts[part] == part_shape


def _expanded(batch, seqlen, heads, dim=64):
    """A [batch, seqlen, heads, dim] bf16 view of one row (stride 0 where expanded): the
    extents of a grid-sized problem without its memory."""
    return torch.randn(1, 1, 1, dim, dtype=torch.bfloat16).expand(batch, seqlen, heads, dim)


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
@pytest.mark.parametrize(
    "extents, accepted",
    [
        ((65535, 1, 1), True), ((65536, 1, 1), False),  # sequences: the grid's y or z
        ((1, 1, 65535), True), ((1, 1, 65536), False),  # query heads
        ((1, "65535 tiles", 1), True), ((1, "65535 tiles + 1", 1), False),  # blocks of the smallest tile
    ],
)
def test_grid_dimensions_bound_batch_heads_and_blocks(engine, extents, accepted):
    """A problem whose launch would need more than 65535 CTAs along a grid's y or z goes to
    another engine (a launch with such a grid fails) rather than to the kernels: blocks counted at
    the smallest tile of the records (the d64 forward's 128 rows, the backward pre-pass's 64)."""
    batch, seqlen, heads = extents
    if isinstance(seqlen, str):
        seqlen = 65535 * (128 if engine.direction == "forward" else 64) + seqlen.endswith("+ 1")
    x = _expanded(batch, seqlen, heads)
    extra = {}
    if engine.direction == "backward":
        extra = dict(o=x, do=x, lse=torch.zeros(1, 1, seqlen).expand(batch, heads, seqlen))
    problem = dataclasses.replace(Problem.from_call(engine.direction, x, x, x, **extra), device="cuda:0")
    declined = engine.check_support(problem)
    assert (declined is None) == accepted, declined
    if not accepted:
        assert "at most 65535" in declined
