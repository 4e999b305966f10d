"""Every property by name, and ``run``: how a Hypothesis test hands one drawn case to one.

A property that meets any other exception (an engine that raises on a problem it
accepted, a rewrite frost rejects) fails with a ``PropertyFailure`` too, so every
failure carries its reproduction command.

The names are those of the reproduction commands (``python -m frost_harness.fuzz.replay NAME ...``)
and of the ``property`` column of the report rows. ``run`` wraps a property call with
what a fuzz example needs around it: the count the time budget keeps (``frost_harness.fuzz.budget``), the
property's name stamped on the report rows the example leaves, and one CPU thread for
torch: the problems are small, and torch's intra-op threads cost more than they give
(measured on 2 cores: 25 packed-identity examples took 42 s with torch's default 2
threads, 5 s with 1).
"""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from frost_harness.fuzz import budget, identities, kvcache, properties
from frost_harness.fuzz.failures import PropertyFailure
from frost_harness.reports import records
from frost_harness.suites.harness import Case


def _explained(name: str, prop: Callable[..., None]) -> Callable[..., None]:
    """The property, with any other exception (an engine or a rewrite that raises) as a PropertyFailure."""
    def checked(case: Case, engine: str | None = None) -> None:
        try:
            prop(case, engine)
        except PropertyFailure:
            raise
        except Exception as error:
            raise PropertyFailure(name, case, engine, f"{type(error).__name__}: {error}") from error

    return checked


PROPERTIES: dict[str, Callable[..., None]] = {
    name: _explained(name, prop)
    for name, prop in {
        **properties.PROPERTIES,
        **{name: partial(identities.check_identity, identity) for name, identity in identities.IDENTITIES.items()},
        **kvcache.PROPERTIES,
    }.items()
}


def run(name: str, case: Case, engine: str | None = None) -> None:
    """Check property ``name`` on ``case`` as one fuzz example (counted as checked once judged)."""
    budget.example_started()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with records.stamped(property=name):
            PROPERTIES[name](case, engine)
    except PropertyFailure:
        budget.example_finished()  # judged, and failed
        budget.example_failed()
        raise
    except BaseException:
        budget.example_failed()
        raise
    else:
        budget.example_finished()
    finally:
        torch.set_num_threads(threads)
