"""Per-case records: the rows the accuracy harness produces and the reports read.

A row is a flat dict, one per (test case, direction, output); ``COLUMNS`` lists its
keys in report order. The harness calls ``add`` while a test runs; the pytest plugin
(``frost_harness.reports.plugin``) has called ``start`` and, after each test, ``drain``s the rows,
stamps them with the test id, outcome, worker, the worker's GPU (its
``CUDA_VISIBLE_DEVICES``) and whether a failed case was expected by its passing test, and appends them as JSON lines to its worker's file of the
run folder (``records-<worker>.jsonl.gz``: compact JSON, gzip-compressed; a fuzz run
records thousands of examples, and a failing one only once, ``last_failure_only``). Outside a pytest run with the plugin nothing
collects and ``add`` drops the row. ``stamped(property=...)`` adds fields to every row
added inside it (the fuzz properties name themselves this way; rows of the fixed
suites have no property).

A run folder may hold other JSON-lines logs beside the records, read with
``read_folder(folder, prefix)``: the fuzz runner writes one row per Hypothesis chunk
to ``fuzz-<worker>.jsonl`` (``FUZZ_COLUMNS``).
"""
from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from pathlib import Path

COLUMNS = (
    "test_id", "outcome", "expected", "worker", "gpu", "property", "case", "direction", "mode", "engine", "native", "dtype",
    "device", "layout", "feature_group", "features", "output", "passed", "ratio", "ratio_max",
    "ratio_l2", "err_max", "allowed_max", "nonfinite", "declined", "problem", "error", "reproduce",
)  # fmt: skip

FUZZ_COLUMNS = (
    "test_id", "worker", "gpu", "chunk", "seed", "examples", "seconds", "outcome", "failure",
)  # fmt: skip

_pending: list[dict] | None = None
_stamp: dict = {}


def start() -> None:
    """Begin collecting rows in this process."""
    global _pending
    _pending = []


def add(row: dict) -> None:
    if _pending is not None:
        _pending.append({**_stamp, **row})


@contextmanager
def stamped(**fields):
    """Rows added inside the block carry ``fields`` (a row's own values win)."""
    global _stamp
    before = _stamp
    _stamp = {**before, **fields}
    try:
        yield
    finally:
        _stamp = before


def drain() -> list[dict]:
    """The rows added since the last drain."""
    if _pending is None:
        return []
    rows = list(_pending)
    _pending.clear()
    return rows


def _open(path: Path, mode: str):
    """A text file, gzip-compressed when its name ends in ``.gz`` (appends add gzip members,
    which a reader sees as one stream)."""
    path = Path(path)
    return gzip.open(path, mode + "t", encoding="utf-8") if path.suffix == ".gz" else open(path, mode, encoding="utf-8")


def append_jsonl(path: Path, rows: list[dict]) -> None:
    with _open(path, "a") as f:
        f.write("".join(json.dumps(row, default=str, separators=(",", ":")) + "\n" for row in rows))


def read_folder(folder: Path, prefix: str = "records") -> list[dict]:
    """Every row of every worker file (``<prefix>-*.jsonl``, or ``.jsonl.gz``) in a run folder."""
    rows = []
    paths = sorted([*Path(folder).glob(f"{prefix}-*.jsonl"), *Path(folder).glob(f"{prefix}-*.jsonl.gz")])
    for path in paths:
        with _open(path, "r") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def last_failure_only(rows: list[dict]) -> list[dict]:
    """One test's rows with the failing examples reduced to the last one.

    Hypothesis runs a failing property again and again while it shrinks the example,
    and replays the smallest one last; each run records its rows. A report needs the
    failure once, shrunk: rows of every failing (property, case, engine, direction)
    but the last are dropped (passing examples stay, they are the search's coverage).
    """
    def key(row):
        return row.get("property"), row.get("case"), row.get("engine"), row.get("direction")

    failing = [key(row) for row in rows if not row.get("passed")]
    if len(set(failing)) < 2:
        return rows
    drop = set(failing) - {failing[-1]}
    return [row for row in rows if key(row) not in drop]
