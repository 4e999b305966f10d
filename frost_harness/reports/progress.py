"""A pytest run's progress while it runs: counted inside pytest, shown by the runner that started it.

pytest side (a plugin, loaded by ``frost_harness/suites/conftest.py``): the process that sees
every test's reports (the only one, or the xdist controller, to which the workers send theirs)
keeps ``pytest-progress.json`` in the run folder (``frost_harness.reports.plugin.run_folder``),
replaced atomically at most once a second and at the end of the run:

- ``collected``: the tests to run (None until collection is done; under ``--dist each`` the
  sum of the workers' collections, since each worker runs its own);
- ``done``: tests finished (their teardown report, or the report of a crashed worker's test);
- ``failed``: tests with a failed report in any phase (a failure or an error), once per test and
  worker, as junit.xml counts them; ``collection_errors``: files that failed to collect.

Runner side (``frost-report``, ``frost-fuzz``): ``run_watched`` runs pytest with its output in a
log file and redraws a status line meanwhile (printed every ``STATUS_EVERY_S`` without a
terminal), then prints pytest's closing summary from the log (``closing_lines``); ``read``
gives the counts, ``Progress.line`` says them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from frost_harness.reports import plugin as records_plugin

FILE = "pytest-progress.json"
STATUS_EVERY_S = 30.0  # without a terminal, one status line this often
BAR_WIDTH = 24


@dataclass
class Progress:
    """The counts of ``pytest-progress.json`` (the module's docstring says what each counts)."""

    collected: int | None = None
    done: int = 0
    failed: int = 0
    collection_errors: int = 0

    def line(self) -> str:
        """``[#####     ] 120/272 tests, 2 failed``, or ``collecting`` before collection is done."""
        if self.collected is None:
            text = "collecting"
        else:
            share = min(1.0, self.done / self.collected) if self.collected else 1.0
            filled = round(share * BAR_WIDTH)
            text = f"[{'#' * filled}{' ' * (BAR_WIDTH - filled)}] {self.done}/{self.collected} tests"
        failed = self.failed + self.collection_errors
        return text + (f", {failed} failed" if failed else "")


def read(folder: Path) -> Progress:
    """The counts in ``folder``'s progress file; zeros while it is missing or being replaced."""
    try:
        return Progress(**json.loads((Path(folder) / FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return Progress()


# the pytest plugin ------------------------------------------------------------------


@pytest.hookimpl(trylast=True)  # after the records plugin has set the run folder
def pytest_configure(config):
    if hasattr(config, "workerinput"):  # an xdist worker: its reports go to the controller
        return
    counter = _Counter(records_plugin.run_folder(config) / FILE, each=config.getoption("dist", "no") == "each")
    config.pluginmanager.register(counter, "frost-progress")
    counter.write(force=True)


class _Counter:
    """The controller's hooks: every report of the run passes here."""

    def __init__(self, path: Path, each: bool):
        self.path, self.each = path, each
        self.progress = Progress()
        self.collections: dict[str, int] = {}  # xdist worker -> tests it collected
        self.failed_tests: set[tuple[str, str]] = set()  # (test id, worker)
        self.written = 0.0

    def write(self, *, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.written < 1.0:
            return
        self.written = now
        self.progress.failed = len(self.failed_tests)
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(asdict(self.progress)), encoding="utf-8")
        os.replace(partial, self.path)

    def pytest_collection_finish(self, session):  # without xdist (its controller collects nothing)
        self.progress.collected = len(session.items)
        self.write(force=True)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.collections[node.gateway.id] = len(ids)
        sizes = self.collections.values()
        self.progress.collected = sum(sizes) if self.each else max(sizes)
        self.write(force=True)

    def pytest_collectreport(self, report):
        if report.failed:
            self.progress.collection_errors += 1
            self.write()

    def pytest_runtest_logreport(self, report):
        worker = getattr(report, "node", None)  # xdist's controller: the worker that sent it
        if report.failed:
            self.failed_tests.add((report.nodeid, worker.gateway.id if worker is not None else ""))
        if report.when not in ("setup", "call"):  # teardown, or "???" for a crashed worker's test
            self.progress.done += 1
        self.write()

    def pytest_sessionfinish(self):
        self.write(force=True)


# the runner's side --------------------------------------------------------------------


def run_watched(command: list[str], log_path: Path, status: Callable[[], str], *,
                final: Callable[[], str] | None = None, env: dict | None = None) -> int:
    """Run ``command`` with its output in ``log_path`` and ``status()`` shown meanwhile: redrawn
    in place on a terminal, else printed every ``STATUS_EVERY_S``; at the end ``final()`` (default
    ``status()``) and pytest's closing summary from the log. Returns the exit status."""
    live = sys.stdout.isatty()
    with open(log_path, "w", encoding="utf-8") as log:
        # in the current directory: never inside site-packages
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        printed = 0.0
        while process.poll() is None:
            time.sleep(0.5)
            now = time.time()
            if live or now - printed >= STATUS_EVERY_S:
                line = status()
                print(f"\r{line}\033[K" if live else line, end="" if live else "\n", flush=True)
                printed = now
    if live:
        print()
    print(f"{(final or status)()}; pytest's output is in {log_path}")
    print("\n".join(closing_lines(log_path)), flush=True)
    return process.returncode


def clock(seconds: float) -> str:
    """``M:SS`` (negative: ``0:00``)."""
    minutes, seconds = divmod(max(0, int(seconds)), 60)
    return f"{minutes}:{seconds:02d}"


def closing_lines(log_path: Path, limit: int = 40) -> list[str]:
    """pytest's closing summary in its log: from frost's routing summary (the records plugin's
    section, which pytest prints after the failures' tracebacks and before its short summary) to
    the end, the last ``limit`` lines at most; the last 15 lines where that section is missing
    (pytest stopped before it)."""
    lines = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("=") and "frost routing summary" in line]
    start = starts[-1] if starts else max(0, len(lines) - 15)
    return lines[start:][-limit:]
