"""How much of what the strategies draw the acceptance rule judges: the measurement behind
"no filter hides a bug".

No strategy filters a problem out and no property skips one: every drawn problem is
judged, forward and backward, determinism and identities included, under the rule as
SEMANTICS.md states it (rule 2 from 64 compared elements). The one thing left unjudged
is the contract's known limit, per output and never per problem: dq, dk and dbias of a
problem whose every softmax row sees exactly one key and no sink
(``frost_harness.oracle.tolerance.known_limit``); dv and dsinks of such a problem are judged, and NaN
or Inf in an exempt output still fails.

This module draws problems from a regime's backward strategy, builds their inputs on the
CPU (nothing runs, so the ``gpu`` regime is measured here too) and counts the problems
judged in full, those with an exempt output, and each output's judged share:

    python -m frost_harness.fuzz.limits --regime cpu --draws 2000

Measured on 2,000 derandomized draws of each regime. Before (a filter dropped every
backward problem with fewer than 64 gradient elements or fewer than 16 softmax rows
spread by 1e-2): 26.2% of the ``cpu`` problems and 62.8% of the ``gpu`` ones were
judged, none of the others at all. After: 100% of both are judged, in every output
for 90.2% (``cpu``) and 95.7% (``gpu``, which draws a record class first:
``frost_harness.fuzz.pool``, default pool); the rest have dq, dk (and dbias) exempt and
dv (and dsinks) judged. On 2026-12-03, the strategies as they are then: 90.2% (``cpu``) and
96.2% (``gpu``); with the known limit in effect also exempt (rows one-hot in float32:
``tolerance.ONE_KEY_IN_EFFECT``) 89.8% and 96.2%.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, settings

from frost_harness.fuzz import runs, strategies
from frost_harness.suites.harness import Case, make_inputs


@dataclass
class Shares:
    """Counts over drawn problems: judged in full, with an exempt output, and per output."""

    problems: int = 0
    fully_judged: int = 0
    outputs: collections.Counter = field(default_factory=collections.Counter)  # name -> problems having it
    judged: collections.Counter = field(default_factory=collections.Counter)  # name -> problems judging it

    def add(self, present: list[str], exempt: dict[str, str]) -> None:
        self.problems += 1
        self.fully_judged += not any(name in exempt for name in present)
        self.outputs.update(present)
        self.judged.update(name for name in present if name not in exempt)

    def describe(self) -> str:
        share = self.fully_judged / max(1, self.problems)
        lines = [f"{self.problems} problems: every output judged in {self.fully_judged} ({share:.1%}), "
                 f"at least one output judged in all of them (dv always is)"]
        lines += [f"  {name}: judged in {self.judged[name]} of {count} ({self.judged[name] / count:.1%})"
                  for name, count in self.outputs.items()]
        return "\n".join(lines)


def draw(regime: str, count: int) -> list[Case]:
    """``count`` derandomized draws of the regime's backward strategy (Hypothesis's generate phase only)."""
    drawn: list[Case] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategies.backward_cases(regime))
    def collect(case):
        drawn.append(case)

    collect()
    return drawn


def backward_outputs(case: Case) -> list[str]:
    """The gradients a problem's backward returns."""
    return ["dq", "dk", "dv"] + (["dbias"] if case.bias else []) + (["dsinks"] if case.sinks else [])


def measure(cases: list[Case]) -> Shares:
    shares = Shares()
    for case in cases:
        inputs = make_inputs(dataclasses.replace(case, device="cpu", poison=False))
        shares.add(backward_outputs(case), runs.known_limit(inputs))
    return shares


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", choices=sorted(strategies.REGIMES), default="cpu")
    parser.add_argument("--draws", type=int, default=2000)
    args = parser.parse_args(argv)
    print(f"{args.regime}: {measure(draw(args.regime, args.draws)).describe()}")


if __name__ == "__main__":
    main()
