"""Every property by name, and ``run``: how a Hypothesis test hands one drawn case to one.

The names are those of the reproduction commands (``python -m fuzz.replay NAME ...``)
and of the ``property`` column of the report rows. ``run`` wraps a property call with
what a fuzz example needs around it: the run's time budget (``fuzz.budget``) and the
property's name stamped on the report rows the example leaves.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fuzz import budget, identities, properties
from reports import records
from suites.harness import Case

PROPERTIES: dict[str, Callable[..., None]] = {
    **properties.PROPERTIES,
    **{name: partial(identities.check_identity, identity) for name, identity in identities.IDENTITIES.items()},
}


def run(name: str, case: Case, engine: str | None = None) -> None:
    """Check property ``name`` on ``case`` as one fuzz example."""
    budget.before_example()
    try:
        with records.stamped(property=name):
            PROPERTIES[name](case, engine)
    except BaseException:
        budget.example_failed()
        raise
