"""Output and workspace canaries: the harness notices an engine that writes outside its buffers.

``frost_harness.suites.canaries`` guards each output and the workspace; the harness checks the guards
after every launch. Planted bugs (an engine that writes one element past dq, one before
lse, one past its workspace) must fail the check with the buffer's name; honest engines
must leave every guard intact.
"""
from __future__ import annotations

import pytest
import torch

import frost.engines.native as native
from frost_harness.reports import records
from frost_harness.suites import canaries
from frost_harness.suites.harness import Case, GuardDamaged, check

pytestmark = pytest.mark.L0


@pytest.fixture
def planted(monkeypatch):
    """A planted bug's failures are this test's expectation, not report rows."""
    monkeypatch.setattr(records, "add", lambda row: None)
    return monkeypatch


def _beside(x: torch.Tensor, offset: int) -> torch.Tensor:
    """A one-element view at ``offset`` elements from the start of ``x``'s storage span (past its
    end for ``offset = x.numel()``, before its start for -1): where a faulty engine would write."""
    return torch.as_strided(x, (1,), (1,), x.storage_offset() + offset)


def test_guarded_buffer_hands_out_an_aligned_body_and_reports_each_side():
    buffer = canaries.guarded("dq", (3, 5, 7), torch.float16, "cpu")
    assert buffer.body.shape == (3, 5, 7) and buffer.body.dtype == torch.float16 and buffer.body.is_contiguous()
    assert buffer.body.isnan().all() and buffer.body.data_ptr() % 16 == buffer.raw.data_ptr() % 16
    assert buffer.damage() is None
    _beside(buffer.body, buffer.body.numel()).fill_(0.0)
    assert "dq:" in buffer.damage() and "0 of the 256 guard bytes before it and 2 of" in buffer.damage()
    again = canaries.guarded("lse", (4,), torch.float32, "cpu")
    _beside(again.body, -1).fill_(1.0)
    assert "lse:" in again.damage() and "4 of the 256 guard bytes before it" in again.damage()
    assert canaries.damage([buffer, again, canaries.guarded("dk", (2,), torch.float32, "cpu")]) == [
        buffer.damage(), again.damage()]


def test_workspace_body_holds_the_sentinel_not_zeros():
    space = canaries.guarded("workspace", (64,), torch.uint8, "cpu", fill=None)
    assert space.body.view(torch.int32).eq(canaries.SENTINEL).all()
    assert space.body.view(torch.float32).isnan().all()
    assert canaries.guarded("workspace", (0,), torch.uint8, "cpu", fill=None).damage() is None


OUTPUT_NAMES = {"forward": ("o", "lse"), "backward": ("dq", "dk", "dv", "dbias", "dsinks")}
PLANS = {"forward": native._UnfusedForwardPlan, "backward": native._UnfusedBackwardPlan}


def _write_beside(direction: str, name: str, offset, planted):
    """Plant: after the unfused plan ran, write one element next to output ``name`` (or the workspace)."""
    real = PLANS[direction].execute

    def execute(self, tensors, *, out=None, workspace=None):
        result = real(self, tensors, out=out, workspace=workspace)
        target = workspace if name == "workspace" else dict(zip(OUTPUT_NAMES[direction], result))[name]
        _beside(target, offset(target)).fill_(0)
        return result

    planted.setattr(PLANS[direction], "execute", execute)


@pytest.mark.parametrize("direction, name, offset", [
    ("backward", "dq", lambda x: x.numel()),
    ("backward", "dv", lambda x: x.numel()),
    ("forward", "lse", lambda x: -1),
    ("forward", "o", lambda x: x.numel()),
    ("backward", "workspace", lambda x: x.numel()),
])
def test_harness_names_the_buffer_an_engine_wrote_past(direction, name, offset, planted):
    _write_beside(direction, name, offset, planted)
    with pytest.raises(GuardDamaged, match=rf"unfused \({direction}\): {name}: the engine wrote outside it"):
        check(Case(heads_q=4, heads_kv=2), engine="unfused", directions=(direction,))


@pytest.mark.parametrize("engine", [None, "unfused"])
def test_honest_engines_leave_every_guard_intact(engine):
    """Packed with tails, bias and sinks: every output and the workspace, routed and forced."""
    case = Case(layout="thd", lengths_q=(5, 0, 9), lengths_k=(7, 3, 0), tail_q=2, tail_k=1, bias="BH", sinks=True)
    result = check(case, engine=engine)
    assert result.passed, result.describe()
    assert set(result.verdicts) == {"o", "lse", "dq", "dk", "dv", "dbias", "dsinks"}
