"""Calls under CUDA-graph capture: no read back to the host on the served path.

CPU: the value checks that a capture skips (``validation.extents_unread``), the plan
cache serving a captured packed call from the plan its eager run made, and the errors that name
what a capture needs (``max_seqlen_*``; one eager call first). GPU: dense forward, backward and
``frost.attention`` forward+backward, and packed calls with ``max_seqlen_*``, captured with
``torch.cuda.graph`` and replayed on new values of the same tensors, equal to eager calls.
"""
from __future__ import annotations

import pytest
import torch

import frost
from frost import plans, validation
from frost.records import Options


def _packed(lengths, heads=4, dim=64, device="cpu"):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(int(cu[-1]) + 3, heads, dim, dtype=torch.bfloat16, device=device) for _ in range(3))
    return q, k, v, cu


@pytest.mark.L0
def test_extents_unread_read_shapes_and_options_only(monkeypatch):
    q, k, v, cu = _packed([5, 9, 2])
    monkeypatch.setattr(validation, "_check_int_vector", lambda *a: pytest.fail("read lengths back"))
    tensors = frost.records.Tensors(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu)
    with pytest.raises(ValueError, match="max_seqlen_q: required .* capturing"):
        validation.extents_unread("thd", tensors, Options())
    extents = validation.extents_unread("thd", tensors, Options(max_seqlen_q=9, max_seqlen_k=12))
    assert tuple(extents) == ("thd", 3, 9, 12, None, None)
    dense = frost.records.Tensors(q=torch.randn(2, 7, 4, 8), k=torch.randn(2, 5, 4, 8), v=torch.randn(2, 5, 4, 8))
    assert tuple(validation.extents_unread("bshd", dense, Options())) == ("bshd", 2, 7, 5, 7, 5)


@pytest.mark.L0
def test_a_captured_packed_call_is_served_by_the_plan_its_eager_run_made(monkeypatch):
    q, k, v, cu = _packed([5, 9, 2])
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=9, max_seqlen_k=9)
    eager = frost.sdpa_forward(q, k, v, **kw)
    frost.sdpa_forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=9)  # eager, without max_seqlen_k
    hits = plans.cache.stats().hits
    monkeypatch.setattr(validation, "capturing", lambda x: True)
    monkeypatch.setattr(validation, "_check_int_vector", lambda *a: pytest.fail("read lengths back"))
    captured = frost.sdpa_forward(q, k, v, **kw)
    assert plans.cache.stats().hits == hits + 1
    assert torch.equal(captured[0][:16], eager[0][:16])
    with pytest.raises(ValueError, match="max_seqlen_k: required"):
        frost.sdpa_forward(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=9)
    q2, k2, v2, cu2 = _packed([4, 4])
    with pytest.raises(ValueError, match="cu_seqlens_q: a packed or padded call captured .* outside the capture"):
        frost.sdpa_forward(q2, k2, v2, cu_seqlens_q=cu2, cu_seqlens_k=cu2, max_seqlen_q=4, max_seqlen_k=4)


def _capture(fn):
    """Warm up on a side stream, capture ``fn`` into a graph, return (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["dense", "packed"])
def test_forward_and_backward_capture_and_replay_like_eager(layout):
    if layout == "dense":
        q, k, v = (torch.randn(2, 200, 4, 64, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        kw = dict(causal=True)
    else:
        q, k, v, cu = _packed([100, 37, 180], device="cuda")
        kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=180, max_seqlen_k=180, causal=True)
    do = torch.randn_like(q)

    def step():
        o, lse = frost.sdpa_forward(q, k, v, **kw)
        return (o, lse, *frost.sdpa_backward(do, q, k, v, o, lse, **kw)[:3])

    graph, outputs = _capture(step)
    for source in (q, k, v, do):  # new values in the same tensors; the graph reads them on replay
        source.copy_(torch.randn_like(source))
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    rows = slice(None) if layout == "dense" else slice(0, 317)
    for name, got, want in zip(("o", "lse", "dq", "dk", "dv"), outputs, eager):
        if name == "lse" and layout == "packed":
            got, want = got[:, rows], want[:, rows]
        else:
            got, want = got[rows], want[rows]
        assert torch.equal(got, want), name


@pytest.mark.L0
@pytest.mark.gpu
def test_attention_forward_and_backward_capture_and_replay_like_eager():
    q, k, v = (torch.randn(2, 128, 4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(3))
    do = torch.randn(2, 128, 4, 64, dtype=torch.bfloat16, device="cuda")

    def step():
        out = frost.attention(q, k, v, causal=True)
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), do))

    graph, outputs = _capture(step)
    with torch.no_grad():
        for source in (q, k, v, do):
            source.copy_(torch.randn_like(source))
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(outputs, step()):
        assert torch.equal(got, want)


@pytest.mark.L0
@pytest.mark.gpu
def test_a_small_backward_workspace_is_reused_on_its_stream_only():
    """A backward plan keeps a small workspace for the next call on the same stream; another
    stream gets (and then keeps) its own, a capture always a fresh one; results never change."""
    from frost.engines.sm80 import Sm80Backward
    from frost.problem import Problem
    from frost.records import Tensors

    q, k, v, do = (torch.randn(1, 256, 4, 64, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    o, lse = frost.sdpa_forward(q, k, v, causal=True)
    problem = Problem.from_call("backward", q, k, v, o=o, lse=lse, do=do, causal=True, deterministic=True)
    plan = Sm80Backward().compile(problem)
    tensors = Tensors(q=q, k=k, v=v, o=o, lse=lse, do=do)
    first = plan.execute(tensors)
    kept = plan._kept.kept[0].data_ptr()
    again = plan.execute(tensors)
    assert plan._kept.kept[0].data_ptr() == kept
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        other = plan.execute(tensors)
        assert plan._kept.stream == side.cuda_stream and plan._kept.kept[0].data_ptr() != kept
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    before = plan._kept.kept
    with torch.cuda.graph(graph):
        captured = plan.execute(tensors)
    assert plan._kept.kept is before
    graph.replay()
    # a capture on the very stream whose buffer is kept still gets its own: the graph may replay
    # on any stream, and outlive the plan
    on_kept = torch.cuda.CUDAGraph()
    seen = []
    real_fresh = plan._kept._fresh
    plan._kept._fresh = lambda like: seen.append(1) or real_fresh(like)
    with torch.cuda.graph(on_kept, stream=side):
        captured_on_kept = plan.execute(tensors)
    plan._kept._fresh = real_fresh
    assert seen and plan._kept.kept is before
    on_kept.replay()
    torch.cuda.synchronize()
    for result in (again, other, captured, captured_on_kept):
        for got, want in zip(result[:3], first[:3]):
            assert torch.equal(got, want)
