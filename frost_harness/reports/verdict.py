"""The verdict of a run: green only when pytest says every test passed and the records agree.

The harness records count only the cases that reach the oracle; a test that fails an
assertion of its own, errors in a fixture, or never gets collected leaves no record,
so a report that read the records alone would call such a run green. The verdict reads
pytest's own account as well:

- the exit status ``frost-report`` / ``frost-fuzz`` got from pytest (``run.json``'s
  ``pytest_exit``; 0 is the only green one, 5 means nothing was collected);
- ``junit.xml`` (pytest's ``--junitxml``, written into every run folder): every test
  that failed or errored, collection errors included, by name;
- the records: a case that failed the acceptance rule, or a failing fuzz chunk. A failed case of
  a test pytest reports as an expected failure (xfail: a documented known limit) is expected,
  not a problem; its test xpassing strictly would be a failure in junit.xml. So is a failed case
  that a passing test marked ``allows_failed_cases`` expected (a Hypothesis example marked
  xfail, which pytest reports as a pass): ``publish.judge_run`` leaves it out. A failed case of
  any other passing test stays a problem: that test forgot to assert its verdict.

``judge`` returns a ``Verdict``: ``passed``, a headline and the tests to look at.
"""
from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

JUNIT_FILE = "junit.xml"
GPU_PROPERTY = "gpu"  # a junit.xml property of every test marked gpu (frost_harness/suites/conftest.py)

# pytest's exit codes (pytest.ExitCode), for the headline
_EXIT_MEANING = {1: "tests failed", 2: "interrupted", 3: "internal error", 4: "usage error",
                 5: "no tests were collected"}  # fmt: skip


@dataclass(frozen=True)
class JunitCase:
    """One test case of junit.xml (one per test and xdist worker under ``--dist each``)."""

    test_id: str
    outcome: str  # "passed", "failed", "error", "skipped" or "xfailed"
    seconds: float  # setup, call and teardown
    message: str  # the first line of a failure's, error's or skip's message; "" for a pass
    gpu: bool  # marked gpu


@dataclass
class JunitTests:
    """pytest's account of a run, from junit.xml."""

    total: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (test id, first line of the message)
    errors: list[tuple[str, str]] = field(default_factory=list)  # errors, collection errors included
    skipped: int = 0  # xfailed included (junit writes an expected failure as skipped)
    xfailed: set[str] = field(default_factory=set)  # test ids of the expected failures
    cases: list[JunitCase] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return self.total - len(self.failed) - len(self.errors) - self.skipped

    def counts(self) -> str:
        """``T tests: P passed, F failed, E errors, S skipped``, the counts pytest's summary gives."""
        return (f"{self.total} tests: {self.passed} passed, {len(self.failed)} failed, {len(self.errors)} errors, "
                f"{self.skipped} skipped")


def read_junit(path: Path) -> JunitTests | None:
    """The tests of a junit.xml; None when the file is missing or unreadable (a crashed run)."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    tests = JunitTests()
    for case in root.iter("testcase"):
        tests.total += 1
        name = _test_id(case)
        outcome, message = "passed", ""
        for kind, bucket in (("failure", tests.failed), ("error", tests.errors)):
            found = case.find(kind)
            if found is not None:
                outcome, message = ("failed" if kind == "failure" else "error"), _first_line(found, kind)
                bucket.append((name, message))
        skipped = case.find("skipped")
        if skipped is not None:
            tests.skipped += 1
            outcome, message = "skipped", _first_line(skipped, "skipped")
            if skipped.get("type") == "pytest.xfail":
                tests.xfailed.add(name)
                outcome = "xfailed"
        gpu = any(prop.get("name") == GPU_PROPERTY for prop in case.iter("property"))
        tests.cases.append(JunitCase(name, outcome, float(case.get("time") or 0), message, gpu))
    return tests


def _first_line(element, default: str) -> str:
    message = (element.get("message") or default).strip() or default
    return message.splitlines()[0][:300]


def _test_id(case) -> str:
    """``path/to/test_x.py::test_name[param]`` from junit's dotted classname and name."""
    classname, name = case.get("classname", ""), case.get("name", "")
    if not classname:  # a collection error: the name is the module's path
        return name
    parts = classname.split(".")
    module = next((i for i in range(len(parts), 0, -1) if parts[i - 1].startswith("test_")), len(parts))
    path = "/".join(parts[:module]) + ".py"
    return "::".join([path, *parts[module:], name])


@dataclass
class Verdict:
    passed: bool
    headline: str
    problems: list[str]  # one line per test or chunk to look at


def judge(exit_status: int | None, junit: JunitTests | None, failed_cases: list[tuple[str, str]],
          failed_chunks: list[str]) -> Verdict:  # fmt: skip
    """Green only if pytest exited 0, junit.xml lists tests and none failed or errored, and no
    recorded case or fuzz chunk failed. ``exit_status`` None: a merged report (no pytest).
    ``failed_cases``: (test id, line) per failed harness case."""
    problems = []
    reasons = []
    if exit_status not in (None, 0):
        reasons.append(f"pytest exit {exit_status} ({_EXIT_MEANING.get(exit_status, 'failed')})")
    if junit is None and exit_status is not None:
        reasons.append("no junit.xml: pytest's own account of the tests is missing")
    if junit is not None:
        if junit.total == 0:
            reasons.append("junit.xml lists no tests")
        if junit.failed or junit.errors:
            reasons.append(f"{len(junit.failed)} tests failed, {len(junit.errors)} errored")
        problems += [f"FAILED {name}: {message}" for name, message in junit.failed]
        problems += [f"ERROR {name}: {message}" for name, message in junit.errors]
    expected = junit.xfailed if junit else set()
    failed_cases = [(test_id, line) for test_id, line in failed_cases if test_id not in expected]
    if failed_cases:
        reasons.append(f"{len(failed_cases)} harness cases failed")
        listed = {name for name, _ in junit.failed + junit.errors} if junit else set()
        problems += [line for test_id, line in failed_cases if test_id not in listed]
    if failed_chunks:
        reasons.append(f"{len(failed_chunks)} fuzz chunks failed")
        problems += failed_chunks
    if reasons:
        return Verdict(False, "FAILED: " + "; ".join(reasons), problems)
    counted = f"{junit.total} tests passed or skipped ({junit.skipped} skipped)" if junit else "merged runs"
    return Verdict(True, f"PASSED: {counted}", problems)
