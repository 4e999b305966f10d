"""The launchers hand each compiled kernel its arguments in the order of its template's entry
point (``sdpa_fwd``, ``sdpa_bwd_pre``, ...): a compiled TVM-FFI function takes them positionally,
so an argument out of place is a wrong result or a fault on the GPU, not an error here.

CPU: the plan holds binders where its compiled kernels would be (nothing is compiled: a
record's template gives the entry point), which bind each call to the entry point's signature
(the stream aside: compiled functions launch on the current one); the bound arguments are
checked against the call's tensors, outputs and scalars.
"""
from __future__ import annotations

import inspect

import pytest
import torch

import cutlass  # noqa: F401  (a hard dependency: a missing DSL fails these suites, it does not skip them)

from frost.engines.sm80 import Sm80Backward, Sm80Forward
from frost.kernels.sm80.compile import LOG2_E, template_of
from frost.kernels.template import load_template
from frost.problem import prepare

pytestmark = pytest.mark.L0


class _Binder:
    """Stands in for the compiled kernel of ``record``; records each call's arguments by name."""

    def __init__(self, record, calls: dict):
        template = template_of(record)
        entry = getattr(load_template(template, record), "sdpa_" + template.split("/")[1])
        self.names = [name for name in inspect.signature(entry).parameters if name != "stream"]
        self.template, self.calls = template, calls

    def __call__(self, *args):
        assert len(args) == len(self.names), (self.template, len(args), self.names)
        self.calls[self.template] = dict(zip(self.names, args))


def _misbound(call: dict, **expected) -> list[str]:
    """The arguments of ``call`` that are not the very objects expected (tensors, or None)."""
    return [name for name, value in expected.items() if call[name] is not value]


def _inputs(layout: str, heads_q: int, heads_kv: int, sinks: bool):
    gen = torch.Generator().manual_seed(0)
    kw = {}
    if layout == "thd":
        q = torch.randn(150, heads_q, 64, generator=gen).bfloat16()
        k = torch.randn(170, heads_kv, 64, generator=gen).bfloat16()
        kw = dict(cu_seqlens_q=torch.tensor([0, 100, 150], dtype=torch.int32),
                  cu_seqlens_k=torch.tensor([0, 90, 170], dtype=torch.int32))
        lse = torch.zeros(heads_q, 150)
    else:
        q = torch.randn(2, 100, heads_q, 64, generator=gen).bfloat16()
        k = torch.randn(2, 130, heads_kv, 64, generator=gen).bfloat16()
        kw = dict(seqlens_q=torch.tensor([100, 60], dtype=torch.int32),
                  seqlens_k=torch.tensor([130, 7], dtype=torch.int32))
        lse = torch.zeros(2, heads_q, 100)
    if sinks:
        kw["sinks"] = torch.randn(heads_q, generator=gen)
    return q, k, torch.randn_like(k), lse, kw


BACKWARDS = {  # name: (engine, layout, heads_q, heads_kv, deterministic, call keywords)
    "default": (Sm80Backward(), "bshd", 4, 4, False, dict(causal=True)),
    "sliced": (Sm80Backward(), "thd", 4, 2, True, dict(window=(-1, 20))),
    "sliced_zeroed": (Sm80Backward(), "thd", 4, 4, True, dict(window=(30, 5))),  # a left window: bwd_pre zeroes
    "dq_pass": (Sm80Backward(dq_recompute=True), "bshd", 4, 4, True, dict(window=(30, 5))),
    "bias": (Sm80Backward(), "bshd", 4, 2, False, dict(bias=torch.randn(1, 4, 100, 130).bfloat16())),
    "split": (Sm80Backward(split=2), "thd", 8, 1, False, dict(scale=0.3)),  # SM90: summed in clusters
    "split_partials": (Sm80Backward(split=2, cluster_sum=False), "thd", 8, 1, False, dict(scale=0.3)),
}


@pytest.fixture
def calls(stand_in_kernels) -> dict:
    """Template -> the arguments of its last call, by name, for the plans built in the test."""
    calls: dict = {}
    stand_in_kernels(lambda record: _Binder(record, calls))
    return calls


@pytest.mark.parametrize("name", sorted(BACKWARDS))
def test_backward_chain_arguments_bind_to_the_entry_points(name, calls):
    engine, layout, heads_q, heads_kv, deterministic, keywords = BACKWARDS[name]
    q, k, v, lse, kw = _inputs(layout, heads_q, heads_kv, sinks=not name.startswith("split"))
    problem, t = prepare("backward", q, k, v, o=q, lse=lse, do=torch.randn_like(q), deterministic=deterministic,
                         **kw, **keywords)
    plan = engine.compile(problem)
    grads = plan.execute(t)

    pre, main = calls["sm80/bwd_pre"], calls["sm80/bwd"]
    assert not _misbound(pre, mO=t.o, mdO=t.do, mLSE=t.lse, mSinks=t.sinks, mCuSeqlensQ=t.cu_seqlens_q,
                         mSeqlensQ=t.seqlens_q)
    assert (pre["mDsinkPartial"] is None) == (t.sinks is None) and pre["max_seqlen_q"] == problem.seqlen_q
    assert not _misbound(main, mQ=t.q, mK=t.k, mV=t.v, mdO=t.do, mLSE2=pre["mLSE2"], mD=pre["mD"],
                         mCuSeqlensQ=t.cu_seqlens_q, mCuSeqlensK=t.cu_seqlens_k,
                         mSeqlensQ=t.seqlens_q, mSeqlensK=t.seqlens_k, mBias=t.bias)
    assert (main["mdBias"] is None) == (t.bias is None)  # dbias or its float32 target (sm80/bias.py)
    assert main["scale"] == problem.scale and main["scale_log2"] == pytest.approx(problem.scale * LOG2_E)
    assert (main["window_left"], main["window_right"]) == (problem.window_left, problem.window_right)
    assert (main["max_seqlen_k"], main["num_splits"]) == (problem.seqlen_k, plan.splits)
    # bwd_pre zeroes the accumulator unless the sliced dQ writes its slices whole
    assert pre["mdQaccum"] is (None if plan.params[1].dq_slice_stores else main["mdQaccum"])

    if plan.splits > 1 and not plan.params[1].split_cluster:  # partials; a cluster sum writes dk, dv itself
        assert not _misbound(calls["sm80/bwd_combine"], mdKpart=main["mdK"], mdVpart=main["mdV"], mdK=grads.dk,
                             mdV=grads.dv, mCuSeqlensK=t.cu_seqlens_k)
    else:
        assert not _misbound(main, mdK=grads.dk, mdV=grads.dv)
    if plan.params[1].reduces_dq:
        convert = calls["sm80/bwd_convert"]
        assert main["mdQaccum"] is not None
        assert not _misbound(convert, mdQaccum=main["mdQaccum"], mdQ=grads.dq, mCuSeqlensQ=t.cu_seqlens_q)
        assert (convert["scale"], convert["max_seqlen_q"]) == (problem.scale, problem.seqlen_q)
    else:
        dq_pass = calls["sm80/bwd_dq"]
        assert main["mdQaccum"] is None
        assert not _misbound(dq_pass, mQ=t.q, mK=t.k, mV=t.v, mdO=t.do, mLSE2=pre["mLSE2"], mD=pre["mD"],
                             mdQ=grads.dq, mBias=t.bias, mCuSeqlensQ=t.cu_seqlens_q, mCuSeqlensK=t.cu_seqlens_k,
                             mSeqlensQ=t.seqlens_q, mSeqlensK=t.seqlens_k)
        assert (dq_pass["window_left"], dq_pass["window_right"]) == (problem.window_left, problem.window_right)
        assert (dq_pass["scale"], dq_pass["max_seqlen_q"]) == (problem.scale, problem.seqlen_q)
        assert dq_pass["scale_log2"] == pytest.approx(problem.scale * LOG2_E)
    assert set(calls) == {template_of(r) for r in plan.params}


@pytest.mark.parametrize("layout", ["bshd", "thd"])
def test_forward_arguments_bind_to_the_entry_point(layout, calls):
    q, k, v, _, kw = _inputs(layout, 4, 2, sinks=True)
    problem, t = prepare("forward", q, k, v, window=(40, 3), scale=0.2, **kw)
    o, lse = Sm80Forward().compile(problem).execute(t)
    fwd = calls["sm80/fwd"]
    assert not _misbound(fwd, mQ=t.q, mK=t.k, mV=t.v, mO=o, mLSE=lse, mCuSeqlensQ=t.cu_seqlens_q,
                         mCuSeqlensK=t.cu_seqlens_k, mSeqlensQ=t.seqlens_q, mSeqlensK=t.seqlens_k, mSinks=t.sinks,
                         mBias=None)
    assert fwd["scale_log2"] == pytest.approx(0.2 * LOG2_E)
    assert (fwd["window_left"], fwd["window_right"], fwd["max_seqlen_q"]) == (40, 3, problem.seqlen_q)
