"""Fixtures the SM80 suites share."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture
def cpu_target(monkeypatch):
    """Without a GPU the DSL needs a target to compile for: sm_80 (with one, the device's own)."""
    if not torch.cuda.is_available():
        monkeypatch.setenv("CUTE_DSL_ARCH", "sm_80")


@pytest.fixture
def stand_in_kernels(monkeypatch):
    """The SM80 plans built in the test hold a stand-in where each record's compiled kernel would
    be (the engines compile through ``compile_fwd`` and ``compile_record``), so that a test of a
    plan's records, workspace or launches compiles nothing: the record itself, or ``make(record)``
    after the returned ``install(make)``."""
    from frost.kernels.sm80 import compile as sm80_compile

    def install(make):
        monkeypatch.setattr(sm80_compile, "compile_fwd", make)
        monkeypatch.setattr(sm80_compile, "compile_record", make)

    install(lambda record: record)
    return install
