"""Routing: which engine serves a problem, why the others declined, and the ledger.

Representative problems assert the engine chosen and the exact decline reasons; the
Capabilities rows are checked on both sides of each boundary (ARCHITECTURE rule 2);
forced engines, ``Declined`` from compile, and the ledger's snapshot / reset / since.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import frost
from frost import dispatch
from frost.dispatch import ledger
from frost.engines.base import Capabilities, Declined, Engine
from frost.engines.native import (
    TORCH_SDPA_BACKWARD_CAPABILITIES,
    TORCH_SDPA_CAPABILITIES,
    TorchSdpaBackward,
    TorchSdpaForward,
    UnfusedBackward,
    UnfusedForward,
)
from frost.problem import FEATURES, Problem

BF16 = torch.bfloat16
THD_REASON = "unsupported: packed (THD) layout with cu_seqlens"
# frost's SM80 engines rank first and decline every CPU problem with this reason
SM80_ON_CPU = {
    "forward": ("sdpa_fwd_sm80", "needs a cuda device, got cpu"),
    "backward": ("sdpa_bwd_sm80", "needs a cuda device, got cpu"),
}


def _tensors(batch=2, sq=8, sk=8, hq=4, hkv=4, dqk=16, dv=None, dtype=BF16):
    q = torch.randn(batch, sq, hq, dqk, dtype=dtype)
    k = torch.randn(batch, sk, hkv, dqk, dtype=dtype)
    v = torch.randn(batch, sk, hkv, dv or dqk, dtype=dtype)
    return q, k, v


def _packed(lengths=(3, 5)):
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q, k, v = (torch.randn(total, 4, 16, dtype=BF16) for _ in range(3))
    return q, k, v, {"cu_seqlens_q": cu, "cu_seqlens_k": cu}


ROUTES = {
    "dense": ({}, {}, "torch-sdpa", ()),
    "causal-gqa": ({"hq": 8, "hkv": 2}, {"causal": True}, "torch-sdpa", ()),
    "bias": ({}, {"bias": torch.zeros(1, 4, 8, 8)}, "torch-sdpa", ()),
    "bottom-right-sq<sk": ({"sq": 4, "sk": 8}, {"causal": True, "causal_align": "bottom_right"}, "torch-sdpa", ()),
    "bottom-right-sq>sk": ({"sq": 8, "sk": 4}, {"causal": True, "causal_align": "bottom_right"}, "unfused",
                           (("torch-sdpa", "bottom-right alignment with Sq > Sk leaves query rows without keys"),)),
    "window": ({}, {"window": (2, 2)}, "unfused", (("torch-sdpa", "unsupported: sliding window"),)),
    "sinks": ({}, {"sinks": torch.zeros(4)}, "unfused", (("torch-sdpa", "unsupported: attention sinks"),)),
    "rope": ({}, {"rope": (torch.ones(8, 8), torch.zeros(8, 8))}, "unfused", (("torch-sdpa", "unsupported: fused RoPE"),)),
    "padding": ({}, {"seqlens_q": torch.tensor([3, 8], dtype=torch.int32)}, "unfused",
                (("torch-sdpa", "unsupported: dense padding (seqlens_q / seqlens_k)"),)),
    "dqk-ne-dv": ({"dv": 32}, {}, "unfused", (("torch-sdpa", "unsupported: head_dim_qk != head_dim_v"),)),
    "sinks-window": ({}, {"sinks": torch.zeros(4), "window": (2, 0)}, "unfused",
                     (("torch-sdpa", "unsupported: sliding window; attention sinks"),)),
}  # fmt: skip
# Where the backward routes differently: torch's CPU flash backward gives no mask gradient.
BACKWARD_ROUTES = {"bias": ("unfused", (("torch-sdpa", "unsupported: additive bias"),))}


@pytest.mark.L0
@pytest.mark.parametrize("name", ROUTES)
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_route_picks_engine_with_reasons(name, direction):
    shape, keywords, engine, declined = ROUTES[name]
    if direction == "backward":
        engine, declined = BACKWARD_ROUTES.get(name, (engine, declined))
    decision = frost.route(*_tensors(**shape), **keywords, direction=direction)
    declined = (SM80_ON_CPU[direction], *declined)
    assert (decision.engine, decision.declined, decision.direction) == (engine, declined, direction)
    assert decision.native and not decision.forced


@pytest.mark.L0
def test_packed_routes_to_unfused():
    q, k, v, keywords = _packed()
    decision = frost.route(q, k, v, **keywords)
    assert decision.engine == "unfused"
    assert decision.declined == (SM80_ON_CPU["forward"], ("torch-sdpa", THD_REASON))
    assert str(decision) == (
        f"forward -> unfused [declined: sdpa_fwd_sm80: {SM80_ON_CPU['forward'][1]}; torch-sdpa: {THD_REASON}]"
    )


@pytest.mark.L0
def test_route_runs_and_records_nothing():
    before = ledger.snapshot()
    frost.route(*_tensors())
    assert ledger.snapshot().total == before.total


@pytest.mark.L0
def test_forced_engine_that_declines_raises_with_its_reason():
    q, k, v, keywords = _packed()
    with pytest.raises(ValueError, match=re.escape(f"engine: 'torch-sdpa' declined this problem: {THD_REASON}")):
        frost.sdpa_forward(q, k, v, **keywords, engine="torch-sdpa")
    with pytest.raises(ValueError, match="^engine: 'torch-sdpa' declined"):
        frost.route(q, k, v, **keywords, engine="torch-sdpa", direction="backward")


@pytest.mark.L0
def test_unknown_engine_raises():
    known = "'sdpa_fwd_sm80', 'sm80', 'torch-sdpa', 'unfused', 'torch-cudnn'"
    with pytest.raises(ValueError, match=f"^engine: unknown forward engine 'sm99' \\(known: {known}\\)"):
        frost.sdpa_forward(*_tensors(), engine="sm99")


@pytest.mark.L0
def test_forced_engine_is_used_and_marked_forced():
    mark = ledger.mark()
    frost.sdpa_forward(*_tensors(), engine="unfused")
    (decision,) = ledger.since(mark)
    assert (decision.engine, decision.forced, decision.declined) == ("unfused", True, ())


@pytest.mark.L0
def test_ledger_counts_snapshot_and_reset():
    ledger.reset()
    q, k, v = _tensors()
    o, lse = frost.sdpa_forward(q, k, v)
    frost.sdpa_forward(q, k, v, sinks=torch.zeros(4))
    frost.sdpa_backward(torch.randn_like(o), q, k, v, o, lse)
    snap = ledger.snapshot()
    assert snap.total == 3
    assert snap.by_engine == {("forward", "torch-sdpa"): 1, ("forward", "unfused"): 1, ("backward", "torch-sdpa"): 1}
    sm80 = {(direction, *SM80_ON_CPU[direction]): count for direction, count in (("forward", 2), ("backward", 1))}
    assert snap.declines == {("forward", "torch-sdpa", "unsupported: attention sinks"): 1, **sm80}
    assert [d.engine for d in snap.recent] == ["torch-sdpa", "unfused", "torch-sdpa"]
    assert [d.engine for d in ledger.since(1)] == ["unfused", "torch-sdpa"]
    ledger.reset()
    empty = ledger.snapshot()
    assert (empty.total, empty.by_engine, empty.declines, empty.recent) == (0, {}, {}, ())


@pytest.mark.L0
def test_ledger_keeps_a_bounded_window():
    small = dispatch.Ledger(keep=2)
    problem = frost.Problem.from_call("forward", *_tensors())
    for name in ("a", "b", "c"):
        small.record(dispatch.Decision(problem, name, True, (), False))
    snap = small.snapshot()
    assert snap.total == 3 and [d.engine for d in snap.recent] == ["b", "c"]
    assert [d.engine for d in small.since(0)] == ["b", "c"]


class _DecliningAtCompile(Engine):
    name = "picky"
    direction = "forward"
    native = False
    capabilities = TORCH_SDPA_CAPABILITIES

    def compile(self, problem):
        raise Declined("no tile config fits")


class _Broken(_DecliningAtCompile):
    name = "broken"

    def compile(self, problem):
        raise RuntimeError("bug in lowering")


@pytest.mark.L0
def test_declined_from_compile_moves_on_and_is_recorded(monkeypatch):
    monkeypatch.setattr(dispatch, "FORWARD_ENGINES", (_DecliningAtCompile(), *dispatch.FORWARD_ENGINES))
    mark = ledger.mark()
    frost.sdpa_forward(*_tensors())
    (decision,) = ledger.since(mark)
    assert decision.engine == "torch-sdpa"
    assert decision.declined == (("picky", "no tile config fits"), SM80_ON_CPU["forward"])
    with pytest.raises(ValueError, match="^engine: 'picky' declined this problem: no tile config fits"):
        frost.sdpa_forward(*_tensors(), engine="picky")


@pytest.mark.L0
def test_other_engine_exceptions_propagate(monkeypatch):
    monkeypatch.setattr(dispatch, "FORWARD_ENGINES", (_Broken(), *dispatch.FORWARD_ENGINES))
    with pytest.raises(RuntimeError, match="bug in lowering"):
        frost.sdpa_forward(*_tensors())


def _problem(**facts) -> Problem:
    """A dense bf16 CPU forward problem with some facts replaced."""
    return dataclasses.replace(frost.Problem.from_call("forward", *_tensors()), **facts)


# One problem per feature tag, built from facts; the torch-sdpa row accepts exactly its features.
FEATURE_PROBLEMS = {
    "thd": {"layout": "thd", "total_q": 16, "total_k": 16},
    "padding": {"has_seqlens": True},
    "gqa": {"heads_kv": 2},
    "mqa": {"heads_kv": 1},
    "causal": {"causal": True, "window_right": 0},
    "bottom_right": {"causal": True, "window_right": 0, "causal_align": "bottom_right"},
    "window": {"window_left": 3},
    "bias": {"bias": frost.problem.BiasSpec((1, 1, 8, 8), torch.float32)},
    "sinks": {"has_sinks": True},
    "rope": {"has_rope": True},
    "dqk_ne_dv": {"head_dim_v": 32},
    "strided": {"strided": True},
}


@pytest.mark.L0
def test_every_feature_tag_has_a_problem():
    assert set(FEATURE_PROBLEMS) == set(FEATURES)


@pytest.mark.L0
@pytest.mark.parametrize("tag", FEATURE_PROBLEMS)
@pytest.mark.parametrize(
    "engine, fallback, row",
    [(TorchSdpaForward(), UnfusedForward(), TORCH_SDPA_CAPABILITIES),
     (TorchSdpaBackward(), UnfusedBackward(), TORCH_SDPA_BACKWARD_CAPABILITIES)],
    ids=["forward", "backward"],
)  # fmt: skip
def test_torch_sdpa_rows_accept_exactly_their_features(tag, engine, fallback, row):
    problem = _problem(direction=engine.direction, **FEATURE_PROBLEMS[tag])
    assert tag in problem.features
    reason = engine.check_support(problem)
    if tag in row.features:
        assert reason is None
    else:
        assert reason is not None and FEATURES[tag] in reason
    assert fallback.check_support(problem) is None


@pytest.mark.L0
def test_torch_sdpa_boundaries():
    sdpa = TorchSdpaForward()
    assert sdpa.check_support(_problem(dtype=torch.float16)) is None
    assert sdpa.check_support(_problem(dtype=torch.float32)) == "dtype torch.float32 is not supported"
    assert sdpa.check_support(_problem(device="meta")) == "needs a cpu or cuda device, got meta"
    assert sdpa.check_support(_problem(seqlen_k=0)) == "empty sequences (Sq or Sk is 0)"
    bottom_right = {"causal": True, "window_right": 0, "causal_align": "bottom_right"}
    assert sdpa.check_support(_problem(**bottom_right, seqlen_q=8, seqlen_k=8)) is None
    assert "Sq > Sk" in sdpa.check_support(_problem(**bottom_right, seqlen_q=9, seqlen_k=8))
    cuda = {"device": "cuda:0"}
    assert sdpa.check_support(_problem(**cuda, head_dim_qk=24, head_dim_v=24)) is None
    assert "multiples of 8" in sdpa.check_support(_problem(**cuda, head_dim_qk=20, head_dim_v=20))
    assert sdpa.check_support(_problem(head_dim_qk=20, head_dim_v=20)) is None  # CPU: any head dim
    io_bias = frost.problem.BiasSpec((1, 1, 8, 8), BF16)
    fp32_bias = frost.problem.BiasSpec((1, 1, 8, 8), torch.float32)
    assert sdpa.check_support(_problem(**cuda, bias=io_bias)) is None
    assert "io dtype" in sdpa.check_support(_problem(**cuda, bias=fp32_bias))
    backward = TorchSdpaBackward()
    assert backward.check_support(_problem(direction="backward", deterministic=True)) is None
    assert backward.check_support(_problem(direction="backward", **cuda)) == "needs a cpu device, got cuda:0"
    assert backward.check_support(_problem()) == "serves the backward, not the forward"


@pytest.mark.L0
def test_capabilities_generic_rules():
    row = Capabilities(
        dtypes=frozenset({BF16}), layouts=frozenset({"bshd", "thd"}), features=frozenset({"causal", "dqk_ne_dv"}),
        device_types=frozenset({"cuda"}), head_dim_multiple=8, max_head_dim=128, deterministic=False,
    )  # fmt: skip
    cuda = {"device": "cuda:0"}
    assert row.decline_reason(_problem(**cuda)) is None
    assert row.decline_reason(_problem()) == "needs a cuda device, got cpu"
    assert row.decline_reason(_problem(**cuda, dtype=torch.float16)) == "dtype torch.float16 is not supported"
    assert row.decline_reason(_problem(**cuda, head_dim_qk=128, head_dim_v=128)) is None
    assert row.decline_reason(_problem(**cuda, head_dim_qk=136, head_dim_v=136)) == "head_dim_qk=136 exceeds 128"
    assert row.decline_reason(_problem(**cuda, head_dim_v=12)) == "head_dim_v=12 is not a multiple of 8"
    assert row.decline_reason(_problem(**cuda, **FEATURE_PROBLEMS["thd"])) is None
    assert row.decline_reason(_problem(**cuda, has_sinks=True, has_rope=True)) == (
        "unsupported: attention sinks; fused RoPE"
    )
    assert row.decline_reason(_problem(**cuda, direction="backward", deterministic=True)) == (
        "cannot run deterministic=True"
    )
    dense_only = dataclasses.replace(row, layouts=frozenset({"bshd"}))
    assert dense_only.decline_reason(_problem(**cuda, **FEATURE_PROBLEMS["thd"])) == THD_REASON
