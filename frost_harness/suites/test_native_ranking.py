"""A native engine ranked first where it measures faster: torch-cudnn on its device families.

CPU: problems on a CUDA device string with the device's compute capability stubbed
(``frost.engines.native.compute_capability``), routed without running: on SM90 torch-cudnn
serves the problems of its contract with the measured reason in the Decision, and declines the
rest with their reasons (frost's SM80 engine then serves); on SM8x and on the CPU the table's
order stands and torch-cudnn is not asked; ``engine=`` forces frost's kernels anywhere.
GPU (SM90): torch-cudnn's forward and backward against the float64 oracle, and the route.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import frost
from frost import devices, dispatch
from frost.engines import native, sm80
from frost.problem import BiasSpec, Problem
from frost_harness.suites.harness import Case, check

BF16 = torch.bfloat16


def _problem(direction="forward", **changes) -> Problem:
    base = Problem(
        direction=direction, layout="bshd", dtype=BF16, device="cuda:0", batch=2, seqlen_q=256, seqlen_k=256,
        total_q=None, total_k=None, heads_q=8, heads_kv=2, head_dim_qk=128, head_dim_v=128, scale=128 ** -0.5,
        causal=True, causal_align="top_left", window_left=-1, window_right=0, has_seqlens=False, bias=None,
        has_sinks=False, has_rope=False, deterministic=False, strided=True, vector_aligned=True,
    )  # fmt: skip
    return dataclasses.replace(base, **changes)


@pytest.fixture
def capability(as_device):
    """Set the compute capability every CUDA device reports (to torch-cudnn's table and to the SM80
    engines' own check), an H100's figures otherwise."""
    def set_to(major: int, minor: int = 0):
        as_device(dataclasses.replace(devices.named("h100"), compute_capability=(major, minor)))

    return set_to


@pytest.mark.L0
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_cudnn_ranks_first_on_sm90_with_the_measured_reason(capability, direction):
    capability(9)
    decision = dispatch.route(_problem(direction))
    assert decision.engine == "torch-cudnn" and decision.declined == () and not decision.forced
    assert decision.ranked_first == native.CUDNN_FASTER_ON[9][128] and "SM90" in decision.ranked_first
    assert "(ranked first: torch's cuDNN attention trained" in str(decision)
    # full attention and MHA / MQA, fp16 are its problems too
    for changes in ({"causal": False, "window_right": -1}, {"heads_kv": 8}, {"heads_kv": 1}, {"dtype": torch.float16}):
        assert dispatch.route(_problem(direction, **changes)).engine == "torch-cudnn", changes
    # d64 it serves when asked, but frost's kernels measured faster there: they keep their rank
    d64 = _problem(direction, head_dim_qk=64, head_dim_v=64)
    assert dispatch.route(d64).engine.endswith("_sm80") and dispatch.route(d64, engine="torch-cudnn").engine == "torch-cudnn"


# Problems outside torch-cudnn's contract on SM90: frost's kernels serve them, with its reason.
FROST_ONLY = {
    "bottom-right": ({"seqlen_q": 128, "causal_align": "bottom_right"}, "bottom-right mask alignment"),
    "window": ({"window_left": 32}, "sliding window"),
    "padding": ({"has_seqlens": True}, "dense padding"),
    "packed": ({"layout": "thd", "total_q": 512, "total_k": 512}, "packed (THD) layout"),
    "sinks": ({"has_sinks": True}, "attention sinks"),
    "rope": ({"has_rope": True}, "fused RoPE"),
    "bias": ({"bias": BiasSpec((1, 8, 256, 256), BF16)}, "additive bias"),
    "dqk-ne-dv": ({"head_dim_v": 64}, "head_dim_qk != head_dim_v"),
    "unaligned": ({"vector_aligned": False}, "16-byte boundaries"),
}


@pytest.mark.L0
@pytest.mark.parametrize("name", FROST_ONLY)
def test_frost_serves_what_cudnn_does_not_compute_exactly(capability, name):
    capability(9)
    changes, reason = FROST_ONLY[name]
    decision = dispatch.route(_problem(**changes))
    # frost's SM80 engine, or where it declines too (unaligned rows) the next of the table
    assert decision.engine == ("torch-sdpa" if name == "unaligned" else "sdpa_fwd_sm80")
    assert decision.ranked_first is None
    assert decision.declined[0][0] == "torch-cudnn" and reason in decision.declined[0][1], decision.declined


@pytest.mark.L0
@pytest.mark.parametrize("head_dim", [64, 96, 256])
def test_head_dims_cudnn_was_not_measured_faster_on_keep_frosts_kernels_first(capability, head_dim):
    capability(9)
    decision = dispatch.route(_problem(head_dim_qk=head_dim, head_dim_v=head_dim))
    assert decision.engine == "sdpa_fwd_sm80" and decision.declined == () and decision.ranked_first is None


@pytest.mark.L0
def test_ranked_is_the_order_routing_asks(capability):
    capability(9)
    assert [e.name for e in dispatch.ranked(_problem())] == ["torch-cudnn", "sdpa_fwd_sm80", "torch-sdpa", "unfused"]
    capability(8, 6)
    assert dispatch.ranked(_problem()) == dispatch.FORWARD_ENGINES


@pytest.mark.L0
def test_deterministic_backward_stays_with_frost(capability):
    capability(9)
    decision = dispatch.route(_problem("backward", deterministic=True))
    assert decision.engine == "sdpa_bwd_sm80"
    assert decision.declined == (("torch-cudnn", "cannot run deterministic=True"),)


@pytest.mark.L0
@pytest.mark.parametrize("major, minor", [(8, 0), (8, 6), (8, 9)])
def test_sm8x_keeps_frosts_kernels_first_and_asks_cudnn_nothing(capability, major, minor):
    capability(major, minor)
    for direction in ("forward", "backward"):
        decision = dispatch.route(_problem(direction))
        assert decision.engine.endswith("_sm80") and decision.declined == () and decision.ranked_first is None


@pytest.mark.L0
def test_engine_forces_frosts_kernels_on_sm90_and_cudnn_anywhere(capability):
    capability(9)
    assert dispatch.route(_problem(), engine="sm80").engine == "sdpa_fwd_sm80"
    capability(8)
    forced = dispatch.route(_problem(), engine="torch-cudnn")
    assert (forced.engine, forced.forced, forced.ranked_first) == ("torch-cudnn", True, None)


@pytest.mark.L0
def test_cpu_routes_as_before():
    """On the CPU torch-cudnn, last in the tables, is never asked: the declines are unchanged."""
    q, k, v = (torch.randn(2, 8, 4, 16, dtype=BF16) for _ in range(3))
    decision = frost.route(q, k, v, causal=True)
    assert decision.engine == "torch-sdpa" and [name for name, _ in decision.declined] == ["sdpa_fwd_sm80"]
    with pytest.raises(ValueError, match="^engine: 'torch-cudnn' declined this problem: needs a cuda device"):
        frost.route(q, k, v, causal=True, engine="torch-cudnn")


@pytest.mark.L0
def test_table_order_puts_frosts_kernels_first_and_rebuilds_plans(capability):
    """What benchmarks of frost's kernels run in (a model's attention cannot pass ``engine=``): the
    tables' order, and plans made outside it are not reused inside (``Engine.generation``)."""
    capability(9)
    before = dispatch.Engine.generation
    with dispatch.table_order():
        assert dispatch.Engine.generation > before
        decision = dispatch.route(_problem())
        assert (decision.engine, decision.declined, decision.ranked_first) == ("sdpa_fwd_sm80", (), None)
    assert dispatch.route(_problem()).engine == "torch-cudnn"


@pytest.mark.L0
def test_cudnn_plans_bind_frosts_layouts_on_meta_tensors():
    """torch-cudnn's plans on meta tensors (torch's shape functions of the cuDNN ops): BSHD views
    in, o and lse in frost's shapes out, the backward's gradients shaped like their inputs, GQA."""
    from frost.records import Tensors

    problem = _problem(device="meta", batch=2, seqlen_q=16, seqlen_k=16)
    q = torch.empty(2, 16, 8, 128, dtype=BF16, device="meta")
    k, v = (torch.empty(2, 16, 2, 128, dtype=BF16, device="meta") for _ in range(2))
    o, lse = native.TorchCudnnForward.plan_type(problem).execute(Tensors(q, k, v))
    assert o.shape == q.shape and lse.shape == problem.lse_shape == (2, 8, 16) and lse.dtype == torch.float32
    backward = dataclasses.replace(problem, direction="backward")
    grads = native.TorchCudnnBackward.plan_type(backward).execute(Tensors(q, k, v, o, lse, torch.empty_like(o)))
    assert (grads.dq.shape, grads.dk.shape, grads.dv.shape) == (q.shape, k.shape, v.shape)


def _on_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


CUDNN_CASES = {
    "causal-gqa-d128": Case(dtype=BF16, batch=2, seqlen_q=384, seqlen_k=384, heads_q=8, heads_kv=2, head_dim_qk=128,
                            causal=True, device="cuda"),
    "full-mha-d64": Case(dtype=BF16, batch=2, seqlen_q=256, seqlen_k=320, heads_q=4, heads_kv=4, head_dim_qk=64,
                         device="cuda"),
    "causal-mqa-d64-fp16": Case(dtype=torch.float16, batch=1, seqlen_q=512, seqlen_k=512, heads_q=8, heads_kv=1,
                                head_dim_qk=64, causal=True, device="cuda"),
}


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("name", CUDNN_CASES)
def test_cudnn_engine_matches_the_oracle_on_sm90(name):
    if not _on_sm90():
        pytest.skip("torch-cudnn ranks first on SM90 only")
    case = CUDNN_CASES[name]
    result = check(case, engine="torch-cudnn")
    assert result.passed, result.describe()
    inputs = [torch.randn(case.batch, case.seqlen_q, case.heads_q, case.head_dim_qk, dtype=case.dtype, device="cuda")]
    inputs += [torch.randn(case.batch, case.seqlen_k, case.heads_kv, case.head_dim_qk, dtype=case.dtype,
                           device="cuda") for _ in range(2)]  # fmt: skip
    assert frost.route(*inputs, causal=case.causal).engine == "torch-cudnn"
