"""The rule a metamorphic identity is judged by, and the report rows it leaves.

An identity runs one engine on a problem A (the drawn Case) and on a rewritten
problem B that must give the same outputs (after mapping B's outputs back into A's
layout). Both sides are rounded computations, so the comparison needs a tolerance;
the choice made here:

- **Tolerance from the baseline's errors.** ``agree`` applies the acceptance rule of
  SEMANTICS.md with A's output in the place of the float64 truth and the allowance
  taken from the same-precision baseline's error against the float64 oracle of A,
  doubled: ``|B - A| <= 2 * (k * max|X_lp - X64|) + floor`` per element, the L2 rule
  likewise. If both sides are acceptable answers (each within one allowance of the
  truth), they lie within two of each other, whatever their rounding paths: the
  rewrite itself may round differently (GQA's repeated heads round dk and dv per
  query head before the sum; a permuted batch sums dsinks in another order; B may
  have to run on another engine when A's declines it, as sm80 declines the bias of
  the sink-as-key and logit-shift rewrites). A mapping or masking bug on one side
  shows as an error far beyond that. The factor 1 was tried first and failed on
  correct engines (GQA dv of a one-row problem: L2 ratio 1.4, a rounding-path
  difference).
- Positions the oracle leaves undefined (packed rows past ``cu_seqlens[-1]``) are
  skipped; positions where A itself is NaN or Inf against a finite truth fail here,
  since they cannot serve as a reference.
- ``bitwise`` is the stricter rule for what must not move at all (a causal prefix's
  forward when only keys it cannot see change).

Each verdict becomes one report row (``frost_harness.reports.records``), like the harness's rows,
with the identity's side as its ``property``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from frost import dispatch
from frost.problem import FEATURES, Problem
from frost_harness.oracle import tolerance
from frost_harness.oracle.tolerance import Verdict
from frost_harness.reports import records
from frost_harness.suites.harness import Case

FACTOR = 2.0  # two acceptable answers lie within twice the allowance of each other
_SHORT = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def agree(got: Mapping, want: Mapping, reference: Mapping, baseline: Mapping, *, io_dtype: torch.dtype,
          exclude: Mapping | None = None, exempt: Mapping[str, str] | None = None,
          slack: Mapping[str, torch.Tensor] | None = None) -> dict[str, Verdict]:
    """Verdicts of B (``got``) against A (``want``), one per output present in both and the reference;
    ``exempt`` as in ``frost_harness.oracle.tolerance.check`` (the known limit of A's problem).
    ``slack``: per output, an absolute error per element that B's spelling adds by itself (its
    outputs live at other magnitudes than A's), added to the allowance's deviations."""
    refs, bases, outs, unusable = {}, {}, {}, {}
    for name, x64 in reference.items():
        if x64 is None or got.get(name) is None or want.get(name) is None:
            continue
        x64 = x64.double()
        a = want[name].to(device=x64.device, dtype=torch.float64)
        broken = int((~torch.isfinite(a) & torch.isfinite(x64)).sum())
        if broken:
            inf = math.inf
            unusable[name] = Verdict(name, False, inf, 0.0, inf, inf, 0.0, inf, broken,
                                     note="the reference side is NaN or Inf where the truth is finite")
            continue
        refs[name] = torch.where(torch.isnan(x64), x64, a)
        deviation = FACTOR * (baseline[name].to(device=x64.device, dtype=torch.float64) - x64)
        if slack and name in slack:  # the allowance reads only |base - reference|
            deviation = deviation.abs() + slack[name].to(device=x64.device, dtype=torch.float64)
        bases[name] = a + deviation
        outs[name] = got[name]
    return tolerance.check(outs, refs, bases, io_dtype=io_dtype, exclude=exclude, exempt=exempt) | unusable


def bitwise(got: torch.Tensor, want: torch.Tensor, keep: torch.Tensor) -> int:
    """How many positions selected by ``keep`` (bool, broadcastable) differ in their bits."""
    keep = keep.expand_as(want)
    a = want.contiguous().view(torch.uint8).view(*want.shape, want.element_size())
    b = got.contiguous().view(torch.uint8).view(*got.shape, got.element_size())
    return int(((a != b).any(dim=-1) & keep).sum())


def record(prop: str, case: Case, engine: str, problem: Problem, verdicts: Mapping[str, Verdict],
           reproduce: str, error: str = "") -> None:
    """One report row per verdict of an identity's side (``prop``)."""
    for verdict in verdicts.values():
        records.add({
            "property": prop, "case": case.id, "direction": problem.direction, "mode": "forced",
            "engine": engine, "native": _native(problem.direction, engine), "dtype": _SHORT[case.dtype],
            "device": problem.device, "layout": problem.layout, "feature_group": problem.feature_group,
            "features": " ".join(tag for tag in FEATURES if tag in problem.features), "problem": problem.describe(),
            "output": verdict.name, "passed": verdict.passed and not error, "ratio": verdict.ratio,
            "ratio_max": verdict.ratio_max, "ratio_l2": verdict.ratio_l2, "err_max": verdict.err_max,
            "allowed_max": verdict.allowed_max, "nonfinite": verdict.nonfinite, "declined": "",
            "error": error, "reproduce": reproduce,
        })  # fmt: skip


def _native(direction: str, engine: str) -> bool:
    return next(e.native for e in dispatch.engines(direction) if e.name == engine)
