"""Zero-size problems through the SM80 engines: the contract's result, and no empty-grid launch.

CUDA rejects a launch with a zero grid extent, so the launchers skip every kernel whose grid
would be empty (no sequence, no query rows, no key rows). CPU: which kernels of the chain a
zero extent skips (recorders where the compiled kernels would be: nothing is compiled), and an
all-empty packed batch served end to end without a kernel. GPU: dense Sq = 0 and Sk = 0, forward and backward, against
the float64 oracle's closed forms (o = 0, lse = -inf, zero gradients).
"""
from __future__ import annotations

import pytest
import torch

import cutlass  # noqa: E402,F401  (a hard dependency: a missing DSL fails these suites, it does not skip them)

import frost  # noqa: E402
from frost.engines.sm80 import Sm80Backward, Sm80Forward  # noqa: E402
from frost.kernels.sm80 import compile as sm80_compile  # noqa: E402
from frost.problem import prepare  # noqa: E402


class _Recorder:
    def __init__(self, record, calls):
        self.record, self.calls = record, calls

    def __call__(self, *args):
        self.calls.append(self.record)


@pytest.fixture
def launches(stand_in_kernels) -> list:
    """The records whose kernels the plans built in the test launched, in order."""
    calls: list = []
    stand_in_kernels(lambda record: _Recorder(record, calls))
    return calls


@pytest.mark.L0
@pytest.mark.parametrize("deterministic", [False, True])
def test_zero_extents_skip_exactly_the_kernels_with_empty_grids(deterministic, launches):
    def launched(sq: int, sk: int) -> list:
        q = torch.randn(2, sq, 4, 64, dtype=torch.bfloat16)
        k = torch.randn(2, sk, 4, 64, dtype=torch.bfloat16)
        problem, tensors = prepare("backward", q, k, k, o=q, lse=torch.zeros(2, 4, sq), do=q,
                                   deterministic=deterministic)
        plan = Sm80Backward().compile(problem)
        launches.clear()
        plan.execute(tensors)
        return [plan.params.index(record) for record in launches]

    assert launched(64, 64) == [0, 1, 2]  # bwd_pre, bwd, bwd_convert or bwd_dq
    assert launched(0, 64) == [1]  # writes dk = dv = 0
    assert launched(64, 0) == [0, 2]  # writes dq = 0


@pytest.mark.L0
def test_all_empty_packed_batch_launches_nothing_and_returns_zeros(launches):
    q = torch.randn(5, 4, 64, dtype=torch.bfloat16)
    cu = torch.zeros(3, dtype=torch.int32)
    kw = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, sinks=torch.randn(4))
    problem, tensors = prepare("forward", q, q, q, **kw)
    o, lse = Sm80Forward().compile(problem).execute(tensors)
    assert o.abs().sum() == 0 and lse.abs().sum() == 0  # rows past cu_seqlens[-1]: the zero fill
    problem, tensors = prepare("backward", q, q, q, o=q, lse=torch.zeros(4, 5), do=q, **kw)
    grads = Sm80Backward().compile(problem).execute(tensors)
    for name in ("dq", "dk", "dv", "dsinks"):
        assert getattr(grads, name).abs().sum() == 0, name
    assert launches == []


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("sq, sk", [(0, 70), (90, 0)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_dense_zero_extents_on_the_gpu_give_the_contracts_result(sq, sk, deterministic):
    q = torch.randn(2, sq, 4, 64, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(2, sk, 2, 64, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    sinks = torch.randn(4, device="cuda")
    o, lse = frost.sdpa_forward(q, k, v, sinks=sinks, engine="sdpa_fwd_sm80")
    assert o.shape == (2, sq, 4, 64) and torch.all(o == 0)
    # no key: lse is the sink's logit. The kernel carries row maxima in log2 units (x * log2 e) and
    # converts back (* ln 2): a round trip of two fp32 roundings, so equality holds to 2 ulp only
    torch.testing.assert_close(lse, sinks[None, :, None].expand_as(lse), rtol=2 ** -22, atol=0)
    do = torch.randn_like(q)
    grads = frost.sdpa_backward(do, q, k, v, o, lse, sinks=sinks, deterministic=deterministic,
                                engine="sdpa_bwd_sm80")
    for name in ("dq", "dk", "dv"):
        g = getattr(grads, name)
        assert not torch.isnan(g).any() and torch.all(g == 0), name
    assert torch.all(grads.dsinks == 0)


@pytest.mark.L0
def test_copy_rows_leaves_packed_rows_past_the_last_sequence_untouched():
    """The split sum and the staging copy write packed outputs through a device-side row mask
    (no host read of cu_seqlens, so they can be captured in a CUDA graph)."""
    dst = torch.full((6, 2, 3), float("nan"))
    src = torch.randn(6, 2, 3)
    sm80_compile.copy_rows(dst, src, torch.tensor([0, 2, 4], dtype=torch.int32))
    assert torch.equal(dst[:4], src[:4]) and torch.isnan(dst[4:]).all()
    sm80_compile.copy_rows(dst, src)
    assert torch.equal(dst, src)
