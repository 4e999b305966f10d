"""Running one problem for a property: which engines accept it, their outputs, the oracle's.

A problem here is a ``frost_harness.suites.harness.Inputs`` (tensors plus frost keywords), so a
property can run the harness's own inputs of a Case or a rewritten copy of them.
Outputs travel as dicts keyed by the acceptance rule's names: ``o``, ``lse`` for the
forward; ``dq``, ``dk``, ``dv`` and, where present, ``dbias``, ``dsinks`` for the
backward. Engines run through the harness (NaN-poisoned outputs, the routing
ledger); the backward is always fed the oracle's o and lse rounded to their io dtypes,
as the harness does, so it is judged on its own.
"""
from __future__ import annotations

import torch

import frost
import frost_harness.oracle.baseline
import frost_harness.oracle.reference
import frost_harness.oracle.tolerance
from frost import dispatch
from frost.dispatch import Decision
from frost.problem import Problem
from frost_harness.suites.harness import Inputs, backward_feed, run_backward, run_forward


def problem_of(inputs: Inputs, direction: str, *, deterministic: bool = False) -> Problem:
    """The Problem frost builds for these inputs in ``direction``."""
    return frost.route(
        inputs.q, inputs.k, inputs.v, **inputs.keywords, direction=direction, deterministic=deterministic
    ).problem


def accepting(inputs: Inputs, direction: str, *, deterministic: bool = False) -> list[str]:
    """Names of the engines of ``direction`` whose ``check_support`` accepts the problem, by rank."""
    problem = problem_of(inputs, direction, deterministic=deterministic)
    return [e.name for e in dispatch.engines(direction) if e.check_support(problem) is None]


def oracle_forward(inputs: Inputs) -> dict[str, torch.Tensor]:
    """The float64 reference's ``o`` and ``lse``."""
    o, lse = frost_harness.oracle.reference.forward(inputs.q, inputs.k, inputs.v, **inputs.keywords)
    return {"o": o, "lse": lse}


def baseline_forward(inputs: Inputs) -> dict[str, torch.Tensor]:
    o, lse = frost_harness.oracle.baseline.forward(inputs.q, inputs.k, inputs.v, **inputs.keywords)
    return {"o": o, "lse": lse}


def oracle_backward(inputs: Inputs) -> dict[str, torch.Tensor | None]:
    grads = frost_harness.oracle.reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **inputs.keywords)
    return grads.as_dict()


def baseline_backward(inputs: Inputs) -> dict[str, torch.Tensor | None]:
    grads = frost_harness.oracle.baseline.backward(inputs.do, inputs.q, inputs.k, inputs.v, **inputs.keywords)
    return grads.as_dict()


def known_limit(inputs: Inputs) -> dict[str, str]:
    """The backward outputs the contract's known limit exempts for these inputs (``frost_harness.oracle.tolerance``)."""
    return frost_harness.oracle.tolerance.known_limit(inputs.q, inputs.k, inputs.v, **inputs.keywords)


def rounded(forward: dict[str, torch.Tensor], inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's (o, lse) as an engine's backward takes them: o in the io dtype, lse in
    float32, NaN in padded query rows where the inputs are poisoned (``harness.backward_feed``)."""
    return backward_feed(inputs, forward["o"], forward["lse"])


def run(inputs: Inputs, direction: str, engine: str | None, *, deterministic: bool = False,
        forward: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor | None], Decision]:
    """One engine's outputs for the problem (``engine=None``: routed) and the decision that served it.

    The backward needs ``forward``, the oracle's forward of these inputs.
    """
    if direction == "forward":
        o, lse, decision = run_forward(inputs, engine=engine)
        return {"o": o, "lse": lse}, decision
    o, lse = rounded(forward, inputs)
    grads, decision = run_backward(inputs, o, lse, engine=engine, deterministic=deterministic)
    return dict(grads._asdict()), decision
