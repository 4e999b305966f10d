"""The admitted SM80 params space, for the compile suites: it lives in the package
(``frost/kernels/sm80/space.py``) because ``frost-compile`` needs it and an installed package
must not import the test suites. ``RecordSweep`` and ``parametrize_sweeps``: a compile suite's
records, enumerated on first use and listed only for a run that can select their tests."""
from __future__ import annotations

import functools
from typing import Callable

from frost.kernels.sm80.space import (  # noqa: F401
    HEAD_DIMS, LAYOUTS, WINDOWS, admitted_bwd_params, admitted_fwd_params, all_records, covering_subset,
    l0_records,
)
from frost_harness.suites import conftest


class RecordSweep:
    """A compile suite's records, enumerated once, when a test first needs them: every admitted
    record (``every``), the L0 pairwise-covering subset (``l0``; of ``l0_space`` where L0 draws
    from a narrower space) and the L1 rest."""

    def __init__(self, admitted: Callable[[], list], l0_space: Callable[[], list] | None = None):
        self._admitted = admitted
        self._l0_space = l0_space

    @functools.cached_property
    def every(self) -> list:
        return self._admitted()

    @functools.cached_property
    def l0(self) -> list:
        return covering_subset(self._l0_space() if self._l0_space else self.every)

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
