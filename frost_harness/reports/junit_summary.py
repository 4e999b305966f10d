"""Console lines from pytest's junit.xml beyond the verdict: the slowest tests, and the GPU tests.

``frost-report`` prints them at the end of a run (``frost_harness.reports.cli``), from the
test cases ``frost_harness.reports.verdict.read_junit`` reads: each test's time (setup, call
and teardown) and, for the tests marked ``gpu`` (junit.xml's ``gpu`` property), whether it ran
and, if it was skipped, why, grouped by reason so that a GPU run that skipped its GPU tests
says so in one line per reason.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from frost_harness.reports.verdict import JunitCase, JunitTests

SLOWEST = 20
LISTED_PER_REASON = 10  # test functions named under one skip reason (a CPU run skips every GPU test)


def slowest_lines(junit: JunitTests, count: int = SLOWEST) -> list[str]:
    """The ``count`` slowest tests, slowest first, with their seconds and outcome."""
    ranked = sorted(junit.cases, key=lambda case: case.seconds, reverse=True)[:count]
    if not ranked:
        return []
    return [f"slowest {len(ranked)} tests (setup + call + teardown):"] + [
        f"  {case.seconds:8.2f} s  {case.test_id} ({case.outcome})" for case in ranked
    ]


def gpu_lines(junit: JunitTests) -> list[str]:
    """Which GPU tests ran (per test function, with their outcomes) and which were skipped, per
    reason; nothing when the run selected no GPU test."""
    gpu = [case for case in junit.cases if case.gpu]
    if not gpu:
        return []
    ran = [case for case in gpu if case.outcome != "skipped"]
    skipped = [case for case in gpu if case.outcome == "skipped"]
    lines = [f"GPU tests: {len(gpu)} selected, {len(ran)} ran, {len(skipped)} skipped"]
    for function, cases in _grouped(ran, lambda case: _function(case.test_id)).items():
        outcomes = Counter(case.outcome for case in cases)
        lines.append(f"  ran {function}: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items())))
    for reason, cases in _grouped(skipped, lambda case: case.message).items():
        functions = sorted(Counter(_function(case.test_id) for case in cases).items())
        lines.append(f"  skipped {len(cases)}: {reason}")
        lines += [f"    {function} ({n})" for function, n in functions[:LISTED_PER_REASON]]
        if len(functions) > LISTED_PER_REASON:
            lines.append(f"    and {len(functions) - LISTED_PER_REASON} more test functions")
    return lines


def _grouped(cases: list[JunitCase], key) -> dict[str, list[JunitCase]]:
    groups = defaultdict(list)
    for case in cases:
        groups[key(case)].append(case)
    return dict(sorted(groups.items()))


def _function(test_id: str) -> str:
    """``path.py::test_x[param]`` -> ``path.py::test_x``."""
    return test_id.split("[", 1)[0]
