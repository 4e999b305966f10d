"""The properties that are not rewrites: agreement with the oracle, determinism, routing.

Each property is a plain function ``prop(case, engine=None)`` that returns quietly or
raises ``frost_harness.fuzz.failures.PropertyFailure`` with a one-line reproduction; the Hypothesis
tests in ``frost_harness/suites/fuzz`` draw the cases, and ``python -m frost_harness.fuzz.replay`` calls the same
function on one case. ``engine=None`` checks every engine of the direction whose
``check_support`` accepts the problem (forced by name, so engines ranked below the
first acceptor are checked too); a name checks that engine alone.

- ``forward_matches_oracle`` / ``backward_matches_oracle``: the acceptance rule,
  through ``frost_harness.suites.harness.check`` (poisoned outputs, untouched packed tails, records),
  on every drawn problem: the only outputs left unjudged are those the contract's known
  limit exempts (``frost_harness.oracle.tolerance.known_limit``). An engine that raises after accepting the problem fails the property too.
- ``deterministic_backward_is_bitwise``: with ``deterministic=True`` two backward runs
  give the same bits for dq, dk, dv and dbias (SEMANTICS.md names those four).
- ``routing_is_stable``: the same problem routes the same way twice, every engine
  answers ``check_support`` with None or a non-empty reason, the decision names the
  first acceptor, and serving the call picks the routed engine (or records why its
  compile declined).

The oracle properties call ``hypothesis.target`` on the worst error/allowed ratio, so
the search climbs toward the hardest numerics.
"""
from __future__ import annotations

import math

import torch
from hypothesis import target
from hypothesis.control import currently_in_test_context

import frost
from frost import dispatch
from frost_harness.fuzz import runs
from frost_harness.fuzz.failures import PropertyFailure
from frost_harness.suites.harness import Case, check, make_inputs

# Ratios above this are failures anyway; Hypothesis's target needs a finite score.
_TARGET_CAP = 1e6


def observe(label: str, ratios) -> None:
    """``hypothesis.target`` the worst ratio (capped, NaN as the cap) inside a Hypothesis test."""
    if not currently_in_test_context():
        return
    worst = max((min(r, _TARGET_CAP) if not math.isnan(r) else _TARGET_CAP for r in ratios), default=0.0)
    target(float(worst), label=label)


def _engines(case: Case, direction: str, engine: str | None, *, deterministic: bool = False) -> list[str]:
    if engine is not None:
        return [engine]
    return runs.accepting(make_inputs(case), direction, deterministic=deterministic)


def _matches_oracle(prop: str, direction: str, case: Case, engine: str | None) -> None:
    ratios = []
    for name in _engines(case, direction, engine):
        try:
            result = check(case, engine=name, directions=(direction,))
        except Exception as error:  # an engine that accepted the problem must not raise
            raise PropertyFailure(prop, case, name, f"{type(error).__name__}: {error}") from error
        ratios += [verdict.ratio for verdict in result.verdicts.values()]
        if not result.passed:
            raise PropertyFailure(prop, case, name, "\n" + result.describe())
    observe(f"{direction} error/allowed", ratios)


def forward_matches_oracle(case: Case, engine: str | None = None) -> None:
    """Every accepting forward engine passes the acceptance rule."""
    _matches_oracle("forward_matches_oracle", "forward", case, engine)


def backward_matches_oracle(case: Case, engine: str | None = None) -> None:
    """Every accepting backward engine passes the acceptance rule (fed the oracle's o and lse)."""
    _matches_oracle("backward_matches_oracle", "backward", case, engine)


def deterministic_backward_is_bitwise(case: Case, engine: str | None = None) -> None:
    """``deterministic=True``: two backward runs of each accepting engine agree in every bit."""
    prop = "deterministic_backward_is_bitwise"
    inputs = make_inputs(case)
    forward = runs.oracle_forward(inputs)
    for name in _engines(case, "backward", engine, deterministic=True):
        first, _ = runs.run(inputs, "backward", name, deterministic=True, forward=forward)
        second, _ = runs.run(inputs, "backward", name, deterministic=True, forward=forward)
        differ = [
            grad for grad in ("dq", "dk", "dv", "dbias")
            if first[grad] is not None and not _same_bits(first[grad], second[grad])
        ]  # fmt: skip
        if differ:
            raise PropertyFailure(prop, case, name, f"two deterministic backward runs differ in {', '.join(differ)}")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def routing_is_stable(case: Case, engine: str | None = None) -> None:
    """Routing answers the same twice, with reasons, and serving follows it (``engine`` is unused)."""
    prop = "routing_is_stable"
    inputs = make_inputs(case)
    kw = inputs.keywords
    forward = None
    for direction, deterministic in (("forward", False), ("backward", False), ("backward", True)):
        first = frost.route(inputs.q, inputs.k, inputs.v, **kw, direction=direction, deterministic=deterministic)
        second = frost.route(inputs.q, inputs.k, inputs.v, **kw, direction=direction, deterministic=deterministic)
        where = f"{direction}{' deterministic' if deterministic else ''}"
        if first != second:
            raise PropertyFailure(prop, case, None, f"{where}: routed {first} then {second}")
        answers = [(e.name, e.check_support(first.problem)) for e in dispatch.ranked(first.problem)]
        for name, reason in answers:
            if reason is not None and (not isinstance(reason, str) or not reason.strip()):
                raise PropertyFailure(prop, case, name, f"{where}: declined without a reason ({reason!r})")
        acceptor = next(name for name, reason in answers if reason is None)
        if first.engine != acceptor or first.declined != tuple(answers[: len(first.declined)]):
            raise PropertyFailure(prop, case, None, f"{where}: routed {first}, but the table answers {answers}")
        if direction == "forward":
            forward = runs.oracle_forward(inputs)
        _, served = runs.run(inputs, direction, None, deterministic=deterministic, forward=forward)
        compile_declined = any(name == first.engine for name, _ in served.declined)
        if served.engine != first.engine and not compile_declined:
            raise PropertyFailure(prop, case, None, f"{where}: routed {first} but served {served}")


PROPERTIES = {
    prop.__name__: prop
    for prop in (forward_matches_oracle, backward_matches_oracle, deterministic_backward_is_bitwise, routing_is_stable)
}

