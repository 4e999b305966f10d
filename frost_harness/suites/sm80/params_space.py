"""The compile suites' records: ``RecordSweep`` and ``parametrize_sweeps``. The admitted SM80
params space lives in the package (``frost/kernels/sm80/space.py``, its L0 subsets in
``covering.py``) because ``frost-compile`` needs it and an installed package must not import
the test suites; a suite's records are enumerated on first use, once per process, and listed
only for a run that can select their tests."""
from __future__ import annotations

from typing import Callable

from frost.kernels.sm80 import covering
from frost_harness.suites import conftest


class RecordSweep:
    """A compile suite's records of one family (``covering.FAMILIES``): every admitted record
    (``every``), the L0 pairwise-covering subset (``l0``) and the L1 rest."""

    def __init__(self, family: str):
        self.family = family

    @property
    def every(self) -> tuple:
        return covering.admitted(self.family)

    @property
    def l0(self) -> tuple:
        return covering.l0(self.family)

    def rest(self) -> list:
        chosen = set(self.l0)
        return [p for p in self.every if p not in chosen]


def parametrize_sweeps(metafunc, sweeps: dict[str, Callable[[], list]], ids) -> None:
    """``pytest_generate_tests`` of a compile suite: the test named in ``sweeps`` gets its records as
    ``params`` where the run's ``-m`` can select it (``conftest.can_select``), else none (pytest's
    empty parameter set, which that ``-m`` deselects): an L0 or GPU run lists no L1 sweep, and a
    GPU run does not enumerate the space at all."""
    records = sweeps.get(metafunc.function.__name__)
    if records is not None:
        marks = {mark.name for mark in metafunc.definition.iter_markers()}
        metafunc.parametrize("params", records() if conftest.can_select(metafunc.config, marks) else [], ids=ids)
