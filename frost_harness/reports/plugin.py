"""pytest plugin: collect the harness records of a run and print the routing summary.

Loaded by the repository's frost_harness/suites/conftest.py. Each test process (the only one, "main", or
each pytest-xdist worker, "gw0", ...) appends the rows its tests recorded, stamped with
the test id, outcome, worker and the worker's ``CUDA_VISIBLE_DEVICES`` (column ``gpu``:
the physical GPU a fuzz runner gave it), and ``expected`` on the failed cases of a passing test
marked ``allows_failed_cases`` (conftest.py's markers), to ``records-<worker>.jsonl.gz`` in the run
folder (a failing fuzz test's shrinking steps reduced to its last, shrunk example); the controller merges the files at the end and prints the routing summary
(``frost_harness.reports.tables``). ``run_folder(config)`` tells other plugins where the run folder
is, for logs of their own.

The run folder is ``--frost-records DIR`` (``frost-report`` passes one and keeps it),
otherwise a temporary folder that is removed when the run ends. The controller hands
it to xdist workers through ``workerinput``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from frost_harness.reports import records

_FOLDER = pytest.StashKey[Path]()
_FILE = pytest.StashKey[Path]()
_TEMPORARY = pytest.StashKey[bool]()
_WORKER = pytest.StashKey[str]()
_WORKER_KEY = "frost_records"


def pytest_addoption(parser):
    parser.addoption(
        "--frost-records",
        default=None,
        metavar="DIR",
        help="folder for frost's per-case records (JSON lines, one file per worker); default: a temporary folder",
    )


class _XdistHooks:
    """Hands the run folder to each xdist worker."""

    def __init__(self, folder: Path):
        self.folder = folder

    def pytest_configure_node(self, node):
        node.workerinput[_WORKER_KEY] = str(self.folder)


def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        folder, name = Path(workerinput[_WORKER_KEY]), workerinput["workerid"]
    else:
        given = config.getoption("frost_records")
        folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="frost-records-"))
        folder.mkdir(parents=True, exist_ok=True)
        for stale in [*folder.glob("records-*.jsonl*"), *folder.glob("progress-*")]:
            stale.unlink()
        config.stash[_TEMPORARY] = given is None
        name = "main"
        if config.pluginmanager.hasplugin("xdist"):
            config.pluginmanager.register(_XdistHooks(folder), "frost-records-xdist")
    config.stash[_FOLDER] = folder
    config.stash[_WORKER] = name
    config.stash[_FILE] = folder / f"records-{name}.jsonl.gz"
    records.start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call":
        rows = records.last_failure_only(records.drain())
        # a passing test marked allows_failed_cases expected its failed cases (see the marker)
        allowed = report.passed and item.get_closest_marker("allows_failed_cases") is not None
        for row in rows:
            row.update(test_id=item.nodeid, outcome=report.outcome, expected=allowed and not row.get("passed"),
                       worker=item.config.stash[_WORKER], gpu=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        if rows:
            records.append_jsonl(item.config.stash[_FILE], rows)
    return report


def run_folder(config) -> Path:
    """This process's run folder (the controller's, handed to every xdist worker)."""
    return config.stash[_FOLDER]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):
        return
    from frost_harness.reports import tables  # imports pandas: late, so that collection stays quick

    rows = records.read_folder(config.stash[_FOLDER])
    terminalreporter.section("frost routing summary")
    expected = frozenset(report.nodeid for report in terminalreporter.stats.get("xfailed", []))
    for line in tables.summary_lines(tables.frame(rows), expected=expected):
        terminalreporter.write_line(line)


def pytest_unconfigure(config):
    if config.stash.get(_TEMPORARY, False):
        shutil.rmtree(config.stash[_FOLDER], ignore_errors=True)
