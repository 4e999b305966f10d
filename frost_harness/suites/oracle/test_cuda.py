"""The oracle, the baseline and the rule run where the tensors are: CUDA gives the CPU's answers.

Skipped without CUDA (marker ``gpu``). The reference must match its CPU run to
float64 rounding (different BLAS, same math) on a case that uses every feature,
and keep every output on the input's device. The rule, run on CUDA, judges an engine
independent of the oracle and of the baseline (``frost_harness.suites.oracle.independent``; the
baseline judged by its own allowance could not fail) and gives the verdicts the same
rule gives on CPU for the same numbers.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from frost_harness.oracle import baseline, reference, tolerance
from frost_harness.suites.oracle import independent
from frost_harness.suites.oracle.cases import FEATURES_BY_NAME, build

pytestmark = [pytest.mark.L0, pytest.mark.gpu]


def _on(problem, device):
    """The same problem with every tensor (rope tables and cu_seqlens too) on ``device``."""
    def move(x):
        if isinstance(x, tuple):
            return tuple(move(t) for t in x)
        return x.to(device) if isinstance(x, torch.Tensor) else x
    return replace(problem, q=move(problem.q), k=move(problem.k), v=move(problem.v), do=move(problem.do),
                   options={name: move(value) for name, value in problem.options.items()})


@pytest.mark.parametrize("name", ["packed_everything", "padded_everything"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_cuda_matches_cpu(name, dtype):
    p = build(FEATURES_BY_NAME[name], seed=71, dtype=dtype)
    gpu = _on(p, "cuda")
    options = gpu.options
    o, lse = reference.forward(gpu.q, gpu.k, gpu.v, **options)
    g = reference.backward(gpu.do, gpu.q, gpu.k, gpu.v, **options)
    o_cpu, lse_cpu = reference.forward(p.q, p.k, p.v, **p.options)
    g_cpu = reference.backward(p.do, p.q, p.k, p.v, **p.options)
    assert o.is_cuda and lse.is_cuda and g.dq.is_cuda and g.dbias.is_cuda and g.dsinks.is_cuda
    for got, want in ((o, o_cpu), (lse, lse_cpu), *((getattr(g, n), getattr(g_cpu, n)) for n in
                                                     ("dq", "dk", "dv", "dbias", "dsinks"))):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-12, atol=1e-13, equal_nan=True)


def _truth(p):
    """The oracle's and the baseline's outputs of problem ``p``, as dicts of the rule's names."""
    ref = dict(zip(("o", "lse"), reference.forward(p.q, p.k, p.v, **p.options)))
    base = dict(zip(("o", "lse"), baseline.forward(p.q, p.k, p.v, **p.options)))
    ref.update(reference.backward(p.do, p.q, p.k, p.v, **p.options).as_dict())
    base.update(baseline.backward(p.do, p.q, p.k, p.v, **p.options).as_dict())
    return ref, base


def _named(outputs, grads) -> dict:
    return {"o": outputs[0], "lse": outputs[1], **grads._asdict()}


def _moved(named: dict, device) -> dict:
    return {name: None if x is None else x.to(device) for name, x in named.items()}


@pytest.mark.parametrize("name", ["packed_everything", "padded_everything"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rule_on_cuda_judges_an_independent_engine_as_on_cpu(name, dtype):
    p = build(FEATURES_BY_NAME[name], seed=72, dtype=dtype)
    gpu = _on(p, "cuda")
    got = _named(*independent.run(gpu))
    assert got["o"].is_cuda and got["dq"].is_cuda
    ref, base = _truth(gpu)
    on_gpu = tolerance.check(got, ref, base, io_dtype=dtype)
    assert all(v.passed for v in on_gpu.values()), tolerance.summary(on_gpu)
    assert set(on_gpu) == {"o", "lse", "dq", "dk", "dv", "dbias", "dsinks"}
    # the same numbers judged on CPU: the same verdicts, to float64 rounding
    on_cpu = tolerance.check(_moved(got, "cpu"), _moved(ref, "cpu"), _moved(base, "cpu"), io_dtype=dtype)
    for out, v in on_gpu.items():
        assert (v.passed, v.compared, v.worst_index) == (on_cpu[out].passed, on_cpu[out].compared,
                                                         on_cpu[out].worst_index), (v, on_cpu[out])
        assert v.ratio == pytest.approx(on_cpu[out].ratio, rel=1e-9, abs=1e-15), (v, on_cpu[out])
