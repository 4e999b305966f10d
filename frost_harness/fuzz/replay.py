"""Replay one problem through one property: the command every fuzz failure prints.

    python -m frost_harness.fuzz.replay PROPERTY 'Case(...)' [--engine NAME]

``Case(...)`` is the repr of a ``frost_harness.suites.harness.Case`` (``torch`` and ``Case`` are the
only names it may use); its seed fixes the tensors, so the replay is the exact problem
the fuzz run found. Prints the failure and exits 1, or prints that the property holds.
"""
from __future__ import annotations

import argparse
import sys

import torch

from frost_harness.fuzz.catalog import PROPERTIES
from frost_harness.fuzz.failures import PropertyFailure
from frost_harness.suites.harness import Case


def parse_case(text: str) -> Case:
    """A Case from its repr; anything else is a ValueError."""
    try:
        case = eval(text, {"__builtins__": {}}, {"torch": torch, "Case": Case})  # noqa: S307 - a test tool's own repr
    except Exception as error:
        raise ValueError(f"not a Case repr: {text!r} ({error})") from error
    if not isinstance(case, Case):
        raise ValueError(f"not a Case repr: {text!r}")
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m frost_harness.fuzz.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("property", choices=sorted(PROPERTIES))
    parser.add_argument("case", help="the Case repr a failure printed")
    parser.add_argument("--engine", help="check this engine alone (default: every engine that accepts)")
    args = parser.parse_args(argv)
    case = parse_case(args.case)
    try:
        PROPERTIES[args.property](case, args.engine)
    except PropertyFailure as failure:
        print(failure)
        return 1
    print(f"{args.property} holds for {case.id}" + (f" on {args.engine}" if args.engine else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
