"""The plan cache (``frost.plans``): repeated calls reuse their plan, anything that changes
the Problem misses, values are still checked on every call, and the ledger counts a
call only once it has been served."""
from __future__ import annotations

import pytest
import torch

import frost
from frost import dispatch, plans
from frost.dispatch import ledger
from frost.engines.base import Plan
from frost.engines.native import TORCH_SDPA_CAPABILITIES, UnfusedForward

BF16 = torch.bfloat16


def _dense(batch=2, sq=8, sk=8, hq=4, hkv=2, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, s, h, d, generator=gen).to(BF16) for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))


def _packed(lengths_q=(3, 7), lengths_k=(6, 8), seed=1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lengths_q), 4, 16, generator=gen).to(BF16)
    k, v = (torch.randn(sum(lengths_k), 2, 16, generator=gen).to(BF16) for _ in range(2))
    return q, k, v, {"cu_seqlens_q": _cumulative(lengths_q), "cu_seqlens_k": _cumulative(lengths_k)}


def _cumulative(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


@pytest.fixture(autouse=True)
def _fresh_cache():
    plans.cache.clear()


def _counts():
    stats = plans.cache.stats()
    return stats.hits, stats.misses


@pytest.mark.L0
def test_repeated_call_reuses_its_plan_and_gives_the_same_result():
    q, k, v = _dense()
    hits, misses = _counts()
    first = frost.sdpa_forward(q, k, v, causal=True)
    assert _counts() == (hits, misses + 1)
    mark = ledger.mark()
    # new tensors, same signature: a hit that reads the new values
    q2, k2, v2 = _dense(seed=5)
    second = frost.sdpa_forward(q2, k2, v2, causal=True)
    again = frost.sdpa_forward(q, k, v, causal=True)
    assert _counts() == (hits + 2, misses + 1)
    assert not torch.equal(second[0], first[0])
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    decisions = ledger.since(mark)
    assert len(decisions) == 2 and all(d.engine == "torch-sdpa" and d.problem.causal for d in decisions)


@pytest.mark.L0
def test_whatever_changes_the_problem_misses():
    q, k, v = _dense()
    frost.sdpa_forward(q, k, v)
    variants = {
        "scale": ((q, k, v), {"scale": 0.5}),
        "causal": ((q, k, v), {"causal": True}),
        "window": ((q, k, v), {"window": (2, 0)}),
        "engine": ((q, k, v), {"engine": "unfused"}),
        "sinks": ((q, k, v), {"sinks": torch.zeros(4)}),
        "dtype": ((q.half(), k.half(), v.half()), {}),
        "shape": (_dense(sq=9), {}),
        "strides": ((q.transpose(1, 2).contiguous().transpose(1, 2), k, v), {}),
    }
    mark = ledger.mark()
    for name, (args, keywords) in variants.items():
        _, misses = _counts()
        frost.sdpa_forward(*args, **keywords)
        assert _counts()[1] == misses + 1, name
    problems = [d.problem for d in ledger.since(mark)]
    assert problems[0].scale == 0.5 and problems[1].causal and problems[2].window_left == 2
    assert problems[3].dtype == BF16 and problems[5].dtype == torch.float16 and problems[7].strided


@pytest.mark.L0
def test_data_pointer_alignment_is_part_of_the_signature():
    storage = torch.randn(2 * 8 * 4 * 16 + 1).to(BF16)
    aligned = storage[:-1].view(2, 8, 4, 16)
    shifted = storage[1:].view(2, 8, 4, 16)  # 2 bytes off: same shape and strides
    _, k, v = _dense(hkv=4)
    mark = ledger.mark()
    frost.sdpa_forward(aligned, k, v)
    _, misses = _counts()
    frost.sdpa_forward(shifted, k, v)
    assert _counts()[1] == misses + 1
    first, second = ledger.since(mark)
    assert first.problem.vector_aligned and not second.problem.vector_aligned


@pytest.mark.L0
def test_packed_longest_sequence_is_read_from_the_values_on_every_call():
    q, k, v, cu = _packed((3, 7), (6, 8))
    mark = ledger.mark()
    o_first, _ = frost.sdpa_forward(q, k, v, **cu)
    # same shapes and dtypes, other lengths: the Problem's seqlen must follow the values
    q, k, v, cu_other = _packed((8, 2), (10, 4))
    hits, _ = _counts()
    o_other, _ = frost.sdpa_forward(q, k, v, **cu_other)
    o_repeat, _ = frost.sdpa_forward(q, k, v, **cu_other)
    assert _counts()[0] == hits + 1  # the repeat, not the first call with other lengths
    torch.testing.assert_close(o_other, o_repeat, rtol=0, atol=0)
    problems = [d.problem for d in ledger.since(mark)]
    assert [(p.seqlen_q, p.seqlen_k) for p in problems] == [(7, 8), (8, 10), (8, 10)]


VALUE_CASES = {
    "cu-start": ({"cu_seqlens_q": torch.tensor([2, 3, 10], dtype=torch.int32)}, "cu_seqlens_q: must start at 0"),
    "cu-order": ({"cu_seqlens_k": torch.tensor([0, 9, 6], dtype=torch.int32)}, "cu_seqlens_k: must be non-decreasing"),
    "cu-end": ({"cu_seqlens_q": torch.tensor([0, 3, 11], dtype=torch.int32)}, "cu_seqlens_q: ends at 11"),
    "max-seqlen": ({"max_seqlen_q": 6}, "max_seqlen_q: 6 is less than the longest sequence \\(7\\)"),
}  # fmt: skip


@pytest.mark.L0
@pytest.mark.parametrize("name", VALUE_CASES)
def test_bad_values_raise_even_when_the_signature_was_served(name):
    changes, message = VALUE_CASES[name]
    q, k, v, cu = _packed((3, 7), (6, 8))
    warm = {**cu, "max_seqlen_q": 9} if "max_seqlen_q" in changes else cu
    frost.sdpa_forward(q, k, v, **warm)
    frost.sdpa_forward(q, k, v, **warm)
    before = ledger.mark()
    with pytest.raises(ValueError, match="^" + message):
        frost.sdpa_forward(q, k, v, **{**warm, **changes})
    assert ledger.mark() == before


@pytest.mark.L0
def test_dense_padding_values_are_checked_on_a_hit():
    q, k, v = _dense()
    good = torch.tensor([3, 8], dtype=torch.int32)
    frost.sdpa_forward(q, k, v, seqlens_q=good)
    hits, _ = _counts()
    o, lse = frost.sdpa_forward(q, k, v, seqlens_q=good)
    assert _counts()[0] == hits + 1
    assert torch.isneginf(lse[0, :, 3:]).all() and (o[0, 3:] == 0).all()
    with pytest.raises(ValueError, match="^seqlens_q: values must lie in \\[0, 8\\]"):
        frost.sdpa_forward(q, k, v, seqlens_q=torch.tensor([3, 9], dtype=torch.int32))


@pytest.mark.L0
def test_a_hit_reads_values_only_where_there_are_some(monkeypatch):
    """A dense call without seqlens has no values to read: its hits skip check_values (the
    extents are its shapes'); with seqlens, or packed, every hit reads them."""
    from frost import validation

    reads = []
    check_values = validation.check_values
    monkeypatch.setattr(validation, "check_values", lambda *a: reads.append(a[0]) or check_values(*a))
    q, k, v = _dense()
    seqlens = torch.tensor([3, 8], dtype=torch.int32)
    pq, pk, pv, packed = _packed()
    calls = [lambda: frost.sdpa_forward(q, k, v), lambda: frost.sdpa_forward(q, k, v, seqlens_k=seqlens),
             lambda: frost.sdpa_forward(pq, pk, pv, **packed)]
    for call in calls:
        call()  # a miss: the full validation
    assert reads == []
    hits, _ = _counts()
    first = [call() for call in calls]
    assert _counts()[0] == hits + 3 and reads == ["bshd", "thd"]
    for call, before in zip(calls, first):
        torch.testing.assert_close(call(), before, rtol=0, atol=0)


@pytest.mark.L0
def test_a_traced_hit_reads_values_only_where_the_launch_needs_them(monkeypatch):
    """A call traced by torch.compile (``check_lengths=False``): its first call validates fully,
    its hits read no values where the launch needs none (dense padding, packed with both
    max_seqlen_*), and only the lengths (unchecked) where it does (packed without them)."""
    from frost import validation
    from frost.records import Options, Tensors

    reads = []
    read = validation._check_int_vector
    monkeypatch.setattr(validation, "_check_int_vector", lambda name, *a: reads.append(name) or read(name, *a))
    traced = Options(causal=True, check_lengths=False)
    q, k, v = _dense()
    pq, pk, pv, packed = _packed()
    calls = {
        "padded": (Tensors(q, k, v, seqlens_k=torch.tensor([3, 8], dtype=torch.int32)), traced),
        "packed, longest given": (Tensors(pq, pk, pv, **packed), traced._replace(max_seqlen_q=7, max_seqlen_k=8)),
        "packed": (Tensors(pq, pk, pv, **packed), traced),
    }
    expected = {"padded": [], "packed, longest given": [], "packed": ["cu_seqlens_q", "cu_seqlens_k"]}
    for name, (tensors, options) in calls.items():
        first = plans.cache.serve("forward", tensors, options)
        assert reads, name  # the first call of a signature is validated in full
        reads.clear()
        torch.testing.assert_close(plans.cache.serve("forward", tensors, options), first, rtol=0, atol=0)
        assert reads == expected[name], name
        reads.clear()
    # unchecked: a bad value on a traced hit is not caught (a CUDA-graph replay's trust), a checked call's is
    bad = Tensors(q, k, v, seqlens_k=torch.tensor([3, 9], dtype=torch.int32))
    plans.cache.serve("forward", bad, traced)
    with pytest.raises(ValueError, match="^seqlens_k: values must lie in"):
        plans.cache.serve("forward", bad, traced._replace(check_lengths=True))


@pytest.mark.L0
def test_trailing_empty_sequences_are_not_launched():
    """cu_seqlens with room for more sequences (zero-length ones at its end, as a traced caller
    builds it with a slot per token): the problem launches the sequences before them, the
    results are those of the short cu_seqlens, and the rows past its end stay untouched."""
    pq, pk, pv, packed = _packed(lengths_q=(3, 7), lengths_k=(3, 7))
    roomy = torch.tensor([0, 3, 10, 10, 10, 10], dtype=torch.int32)
    route = frost.route(pq, pk, pv, cu_seqlens_q=roomy, cu_seqlens_k=roomy, causal=True)
    assert route.problem.batch == 2
    mark = ledger.mark()
    got = frost.sdpa_forward(pq, pk, pv, cu_seqlens_q=roomy, cu_seqlens_k=roomy, causal=True)
    assert ledger.since(mark)[0].problem.batch == 2
    expected = frost.sdpa_forward(pq, pk, pv, **packed, causal=True)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # an empty sequence before a non-empty one stays: it is not trailing
    gap = torch.tensor([0, 3, 3, 10, 10], dtype=torch.int32)
    assert frost.route(pq, pk, pv, cu_seqlens_q=gap, cu_seqlens_k=gap).problem.batch == 3


@pytest.mark.L0
@pytest.mark.parametrize("engine", ["torch-sdpa", "unfused"])
def test_the_functional_api_records_no_graph(engine):
    """sdpa_forward / sdpa_backward are not differentiable: on inputs that require grad (they
    then run under no_grad) and on inputs that do not (no_grad skipped), nothing records a graph."""
    q, k, v = _dense()
    do = torch.randn(2, 8, 4, 16).to(BF16)
    for wants_grad in (False, True):
        q, k, v = (x.detach().requires_grad_(wants_grad) for x in (q, k, v))
        o, lse = frost.sdpa_forward(q, k, v, causal=True, engine=engine)
        grads = frost.sdpa_backward(do, q, k, v, o, lse, causal=True)
        for x in (o, lse, *grads[:3]):
            assert not x.requires_grad and x.grad_fn is None


@pytest.mark.L0
def test_out_is_checked_on_a_hit():
    q, k, v = _dense()
    frost.sdpa_forward(q, k, v)
    o, lse = torch.empty(2, 8, 4, 16, dtype=BF16), torch.empty(2, 4, 8)
    frost.sdpa_forward(q, k, v, out=(o, lse))
    with pytest.raises(ValueError, match="^out.lse: expected shape"):
        frost.sdpa_forward(q, k, v, out=(o, torch.empty(2, 8, 4)))


@pytest.mark.L0
def test_an_engine_setting_changed_rebuilds_the_plan(monkeypatch):
    q, k, v = _dense()
    frost.sdpa_forward(q, k, v, engine="unfused")
    engine = next(e for e in dispatch.engines("forward") if e.name == "unfused")
    compiled = []
    monkeypatch.setattr(engine, "compile", lambda problem: compiled.append(problem) or UnfusedForward().compile(problem))
    frost.sdpa_forward(q, k, v, engine="unfused")
    assert len(compiled) == 1


class _RaisingPlan(Plan):
    def execute(self, tensors, *, out=None, workspace=None):
        raise RuntimeError("launch failed")


class _Raising(UnfusedForward):
    name = "raising"
    capabilities = TORCH_SDPA_CAPABILITIES

    def compile(self, problem):
        return _RaisingPlan(problem)


@pytest.mark.L0
def test_ledger_counts_a_call_only_once_it_was_served(monkeypatch):
    monkeypatch.setattr(dispatch, "FORWARD_ENGINES", (_Raising(), *dispatch.FORWARD_ENGINES))
    q, k, v = _dense()
    before = ledger.snapshot()
    for _ in range(2):  # the full path, then the cached plan
        with pytest.raises(RuntimeError, match="launch failed"):
            frost.sdpa_forward(q, k, v)
    after = ledger.snapshot()
    assert after.total == before.total
    assert after.by_engine.get(("forward", "raising"), 0) == 0
    mark = ledger.mark()
    frost.sdpa_forward(q, k, v, engine="torch-sdpa")
    assert [d.engine for d in ledger.since(mark)] == ["torch-sdpa"]


@pytest.mark.L0
def test_a_replaced_engine_table_is_used_at_once(monkeypatch):
    q, k, v = _dense()
    frost.sdpa_forward(q, k, v)
    monkeypatch.setattr(dispatch, "FORWARD_ENGINES", (UnfusedForward(),))
    mark = ledger.mark()
    frost.sdpa_forward(q, k, v)
    (decision,) = ledger.since(mark)
    assert decision.engine == "unfused" and decision.declined == ()


@pytest.mark.L0
def test_cache_is_bounded():
    small = plans.PlanCache(capacity=2)
    q, k, v = _dense()
    for scale in (0.1, 0.2, 0.3):
        small.serve("forward", frost.problem.Tensors(q, k, v), frost.problem.Options(scale=scale))
    assert small.stats() == plans.CacheStats(hits=0, misses=3, entries=2)
    small.serve("forward", frost.problem.Tensors(q, k, v), frost.problem.Options(scale=0.3))
    assert small.stats().hits == 1
