"""The oracle, the baseline and the rule run where the tensors are: CUDA gives the CPU's answers.

Skipped without CUDA (marker ``gpu``). The reference must match its CPU run to
float64 rounding (different BLAS, same math) on a case that uses every feature,
and keep every output on the input's device.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from oracle import baseline, reference, tolerance
from suites.oracle.cases import FEATURES_BY_NAME, build

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
    base = baseline.forward(gpu.q, gpu.k, gpu.v, **options)
    base_g = baseline.backward(gpu.do, gpu.q, gpu.k, gpu.v, **options)
    verdicts = tolerance.check_forward(base, (o, lse), base, io_dtype=dtype)
    verdicts.update(tolerance.check_backward(base_g, g, base_g, io_dtype=dtype))
    assert all(v.passed for v in verdicts.values()), tolerance.summary(verdicts)
