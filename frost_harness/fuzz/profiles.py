"""The Hypothesis profiles of frost's fuzz suites: ``ci``, ``dev`` and ``nightly``.

- ``ci``: part of L0. Derandomized (every run draws the same examples, so L0 is
  stable), no example database, a handful of examples per property, no deadline
  (a CPU under load is slow, and that is not a failure).
- ``dev``: a person looking for bugs: random examples, 100 per property, failing
  examples kept in the database under ``frost-out/hypothesis-db`` of the current directory
  (beside the runners' run folders; ignored by git; never inside an installed package)
  and replayed first next time, the ``@reproduce_failure`` blob printed.
- ``nightly``: the ``frost-fuzz`` runner's: random seeds (the runner picks and logs
  them per chunk, see ``frost_harness.fuzz.budget``), ``max_examples`` per chunk, the database as
  ``dev``, health checks for slow examples off (a GPU example may compile a kernel), and
  no ``explain`` phase: it runs after shrinking, outside the budget's shrink deadline,
  under a line tracer that slows every example it replays (measured: a CPU run of a
  60 s budget overran it by 3 s with it).

Selection, strongest first: pytest's ``--frost-profile NAME``, Hypothesis's own
``--hypothesis-profile NAME``, the environment variable ``FROST_FUZZ_PROFILE``
(a test-only setting, ARCHITECTURE rule 5), else ``ci``.
"""
from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

ENV = "FROST_FUZZ_PROFILE"
DEFAULT = "ci"
DATABASE = Path.cwd() / "frost-out" / "hypothesis-db"  # where frost-report / frost-fuzz write their runs

_SLOW = [HealthCheck.too_slow, HealthCheck.filter_too_much]


def _profiles() -> dict[str, dict]:
    database = DirectoryBasedExampleDatabase(str(DATABASE))
    return {
        "ci": dict(max_examples=50, derandomize=True, database=None, deadline=None, print_blob=False,
                   suppress_health_check=[HealthCheck.too_slow]),
        "dev": dict(max_examples=100, database=database, deadline=None, print_blob=True),
        "nightly": dict(max_examples=200, database=database, deadline=None, print_blob=True,
                        suppress_health_check=_SLOW, phases=[p for p in Phase if p is not Phase.explain]),
    }  # fmt: skip


PROFILES = ("ci", "dev", "nightly")


def register() -> None:
    """Register the three profiles with Hypothesis (loading none)."""
    for name, values in _profiles().items():
        settings.register_profile(name, **values)


def load(name: str) -> None:
    if name not in PROFILES:
        raise ValueError(f"unknown fuzz profile {name!r}; expected one of {PROFILES}")
    settings.load_profile(name)
