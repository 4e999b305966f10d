"""Fixtures the SM80 suites share."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture
def cpu_target(monkeypatch):
    """Without a GPU the DSL needs a target to compile for: sm_80 (with one, the device's own)."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_80")
