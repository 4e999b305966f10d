"""The oracle stays usable at model sizes on a small CPU (L1: it takes tens of seconds).

B=1, H=8, S=4096, D=128 forward plus backward in float64, with the machine's
own thread count (two cores in CI): the issue requires well under a minute.
Measured: 14.6 s on the 2-core CPU machine (forward 3.6 s, backward 11.0 s;
24 s while another test run shared the cores), 1.2 s on 16 cores; about 75% of
it is the seven float64 matmuls (~240 GFLOP: two in the forward, five in the
backward, which recomputes the logits).
"""
from __future__ import annotations

import time

import pytest
import torch

from frost_harness.oracle import reference

pytestmark = pytest.mark.L1

BUDGET_S = 60.0


def test_s4096_forward_plus_backward_within_a_minute():
    gen = torch.Generator().manual_seed(61)
    q, k, v, do = (torch.randn(1, 4096, 8, 128, generator=gen).to(torch.bfloat16) for _ in range(4))
    start = time.perf_counter()
    o, lse = reference.forward(q, k, v)
    mid = time.perf_counter()
    grads = reference.backward(do, q, k, v)
    end = time.perf_counter()
    print(f"\noracle B=1 H=8 S=4096 D=128 on {torch.get_num_threads()} threads: "
          f"forward {mid - start:.1f} s, backward {end - mid:.1f} s, total {end - start:.1f} s")
    assert end - start < BUDGET_S
    assert torch.isfinite(o).all() and torch.isfinite(grads.dq).all()
    # Spot-check a few rows against a direct dense computation of just those rows.
    rows = torch.tensor([0, 1234, 4095])
    logits = torch.einsum("ihd,jhd->hij", q[0, rows].double(), k[0].double()) / 128 ** 0.5
    torch.testing.assert_close(o[0, rows], torch.einsum("hij,jhd->ihd", logits.softmax(-1), v[0].double()))
    torch.testing.assert_close(lse[0, :, rows], logits.logsumexp(-1))
