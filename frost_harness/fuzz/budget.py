"""The wall-clock budget of a fuzz run: each test's share of it, its chunks and their seeds.

Hypothesis stops a test after ``max_examples``; it has no clock. Under ``frost-fuzz``
the plugin (``frost_harness.fuzz.plugin``) turns the run's deadline into a share per fuzz test
(what is left, divided by the fuzz tests this worker has yet to start) and runs each
test as a series of *chunks*: one Hypothesis run of the profile's ``max_examples``
with its own seed, again and again until the share is spent. Inside a chunk,
``example_started`` raises ``ShareSpent`` once the share is spent: a
``unittest.SkipTest``, which Hypothesis re-raises at once without shrinking (its rule
for skip exceptions), and which the plugin catches as the chunk's normal end. So a
chunk overshoots the share by one example at most. It is never raised before the
chunk's first example ran, nor once an example failed (the shrinker must be able to
replay it). Rejecting examples (``hypothesis.reject``) instead was tried: Hypothesis
gives up on a run only after about 100 invalid examples per valid one, and each still
draws its problem, so a chunk overshot by minutes.

Shrinking has a clock of its own: Hypothesis stops shrinking after
``MAX_SHRINKING_SECONDS`` (five minutes, counted from the first shrink, a module setting
it documents as one to patch). ``example_failed`` sets it, at the first failure of a
chunk (just before shrinking starts), to what is left until ``shrink_until`` (the runner
passes its deadline plus 5% of the budget, the other half of the 10% it may run late
being for what follows), so a failure found late in the run is reported partly shrunk
rather than late; the overshoot is the example running at that time and the replay of
the shrunk one (the ``nightly`` profile has no ``explain`` phase after it). Each chunk
starts with it reset.

Counting: ``examples`` and ``examples_total`` count *checked* examples, those the
property judged (it returned or raised its failure: ``example_finished``). An example
the share ends before it starts is not drawn into a property at all, so it is not one.

A fuzz test without ``@given`` (a pinned case: one fixed problem) is no property: it has no
share, no chunks and no seed, and its check is not a search example. The plugin runs it once
inside ``suspended()``, where the hooks below see no budget (so ``example_started`` cannot
end it as a spent share, and the examples counted stay the search's).

Seeds: a chunk's seed is a hash of the run's seed (the night's seed and the shard),
the worker, the test id and the chunk number, so every chunk of every worker and shard
explores different ground, and each is written to the run folder's fuzz log.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import unittest

from hypothesis.internal.conjecture import engine as _hypothesis_engine

SHRINK_SECONDS_DEFAULT = float(_hypothesis_engine.MAX_SHRINKING_SECONDS)  # Hypothesis's own: five minutes


@dataclass
class Budget:
    until: float  # time.time() when the whole run must stop starting examples
    seed: int  # the run's seed: the night's seed combined with the shard
    worker: str  # "main" or the xdist worker id
    share_end: float = float("inf")  # when the running test's share ends
    examples: int = 0  # examples checked in the running chunk
    failed: bool = False  # an example of the running chunk failed
    progress: Path | None = None  # where this worker's running totals go, for the runner's status line
    examples_total: int = 0  # examples checked in this worker, every test and chunk
    shrink_until: float | None = None  # when shrinking a failure must stop too (None: ``until``)
    _written: float = 0.0  # time.time() of the last progress write

    def chunk_seed(self, test_id: str, chunk: int) -> int:
        text = f"{self.seed}:{self.worker}:{test_id}:{chunk}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")

    def start_test(self, tests_left: int) -> None:
        """A fuzz test starts: its share is what is left, split over the tests still to run."""
        now = time.time()
        self.share_end = now + max(0.0, self.until - now) / max(1, tests_left)

    def start_chunk(self) -> None:
        self.examples, self.failed = 0, False
        _limit_shrinking(self)

    def share_spent(self) -> bool:
        return time.time() >= self.share_end

    def write_progress(self, *, force: bool = False) -> None:
        """This worker's checked examples into ``progress`` (JSON, replaced atomically), at most
        once a second unless forced: the ``frost-fuzz`` runner reads them for its live status line
        (the tests done and failed come from pytest's own progress, ``frost_harness.reports.progress``)."""
        now = time.time()
        if self.progress is None or (not force and now - self._written < 1.0):
            return
        self._written = now
        partial = self.progress.with_suffix(".tmp")
        partial.write_text(json.dumps({"worker": self.worker, "examples": self.examples_total}), encoding="utf-8")
        os.replace(partial, self.progress)


_active: Budget | None = None


def activate(budget: Budget | None) -> None:
    global _active
    _active = budget
    if budget is None:
        _hypothesis_engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS_DEFAULT


def active() -> Budget | None:
    return _active


@contextmanager
def suspended() -> Iterator[None]:
    """No budget inside the block: a single run (a fuzz test without ``@given``) is neither ended
    by a spent share nor counted among the checked examples."""
    global _active
    saved, _active = _active, None
    try:
        yield
    finally:
        _active = saved


class ShareSpent(unittest.SkipTest):
    """The running fuzz test's share of the time is spent: the chunk ends here."""


def example_started() -> None:
    """Called at the start of every fuzz example: ends the chunk when the share is spent (see above)."""
    budget = _active
    if budget is not None and budget.examples and not budget.failed and budget.share_spent():
        raise ShareSpent("frost-fuzz: this test's share of the time budget is spent")


def example_finished() -> None:
    """Called once the property judged the example (it held or failed): counts it as checked."""
    budget = _active
    if budget is None:
        return
    budget.examples += 1
    budget.examples_total += 1
    budget.write_progress()


def example_failed() -> None:
    """An example failed: Hypothesis shrinks it next, until ``shrink_until`` at most."""
    if _active is not None:
        first = not _active.failed
        _active.failed = True
        if first:
            _limit_shrinking(_active)



def _limit_shrinking(budget: Budget) -> float:
    """Set Hypothesis's shrinking limit to what is left until the budget's ``shrink_until`` (at
    most its default); return it."""
    end = budget.until if budget.shrink_until is None else budget.shrink_until
    seconds = max(0.0, min(SHRINK_SECONDS_DEFAULT, end - time.time()))
    _hypothesis_engine.MAX_SHRINKING_SECONDS = seconds
    return seconds


def shrink_note() -> str:
    """For a failing chunk's report: the shrinking limit its failure had, when the budget set it."""
    seconds = _hypothesis_engine.MAX_SHRINKING_SECONDS
    if _active is None or seconds >= SHRINK_SECONDS_DEFAULT:
        return ""
    return (f"; shrinking was limited to {seconds:.0f} s by the run's budget (Hypothesis's warning of "
            "'more than five minutes' means this limit)")
