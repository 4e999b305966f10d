"""pytest plugin of the fuzz suites: profile, GPU per worker, time budget and chunk log.

Loaded by the repository's frost_harness/suites/conftest.py, in every test process:

- registers the Hypothesis profiles (``frost_harness.fuzz.profiles``) and loads the one selected
  (``--frost-profile`` / ``--hypothesis-profile`` / ``FROST_FUZZ_PROFILE`` / ``ci``);
- in each xdist worker (or a run without xdist) sets ``CUDA_VISIBLE_DEVICES`` from the
  runner's device list (``frost_harness.fuzz.devices``), before any test module imports torch;
- activates the record-class pool the ``gpu`` regime draws from
  (``frost_harness.fuzz.pool``): ``--frost-fuzz-pool SEED:SIZE``, else the default pool;
- with ``--frost-fuzz-until EPOCH`` (the ``frost-fuzz`` runner passes it, with
  ``--frost-fuzz-seed`` and ``--frost-fuzz-shrink-until``) runs every Hypothesis property marked ``fuzz`` as chunks
  until its share of the time is spent (``frost_harness.fuzz.budget``), bounds the shrinking of a failure by
  ``--frost-fuzz-shrink-until``, skips properties that would start after the
  deadline, and appends one row per chunk (test, worker, GPU, seed, examples,
  seconds, outcome, failure message) to ``fuzz-<worker>.jsonl`` in the run folder
  of ``frost_harness.reports.plugin``, and keeps ``progress-<worker>.json`` there (examples
  so far) for the runner's live status line. A failing chunk's seed is also
  shown in the test's report.

A test marked ``fuzz`` without ``@given`` (a pinned case: one fixed problem a night once
failed on) is a single run under the budget, an ordinary test: no share, no chunk, no seed
(Hypothesis rejects a seed on a test that is not a property), and its check is not counted
among the search's examples (``budget.suspended``). The single runs go first, before the
properties split the time that is left, so the deadline never skips them; under
``--dist each`` (every worker runs every test) only the first worker, ``gw0``, runs them,
since a fixed problem gives the same verdict on every worker. Their outcomes are pytest's
like any test's: junit.xml and the reports count them (``frost_harness.reports.publish``).
"""
from __future__ import annotations

import inspect
import os
import time

import pytest
from hypothesis import is_hypothesis_test

from frost_harness.fuzz import budget, devices, profiles
from frost_harness.reports import plugin as records_plugin
from frost_harness.reports import records

_FUZZ_TESTS_LEFT = pytest.StashKey[int]()


def pytest_addoption(parser):
    group = parser.getgroup("frost fuzz")
    group.addoption("--frost-profile", choices=profiles.PROFILES, default=None,
                    help=f"Hypothesis profile of the fuzz suites (default: ${profiles.ENV} or {profiles.DEFAULT})")
    group.addoption("--frost-fuzz-until", type=float, default=None, metavar="EPOCH",
                    help="run fuzz tests in seeded chunks until this time.time() (the frost-fuzz runner sets it)")
    group.addoption("--frost-fuzz-seed", type=int, default=0, metavar="N",
                    help="the run's seed from which every chunk's seed derives (with --frost-fuzz-until)")
    group.addoption("--frost-fuzz-shrink-until", type=float, default=None, metavar="EPOCH",
                    help="a failure found before --frost-fuzz-until shrinks until this time at most (default: that)")
    group.addoption("--frost-fuzz-pool", default=None, metavar="SEED:SIZE",
                    help="the record-class pool the gpu regime draws from (frost_harness.fuzz.pool; default 0:"
                         "DEFAULT_SIZE)")  # fmt: skip


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    xdist_controller = os.environ.get("PYTEST_XDIST_WORKER") is None and config.getoption("dist", "no") != "no"
    if not xdist_controller:
        devices.assign()
    elif config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_XdistHooks(config.getoption("dist") == "each"), "frost-fuzz-xdist")
    profiles.register()
    chosen = config.getoption("frost_profile") or (
        None if config.getoption("hypothesis_profile", None) else os.environ.get(profiles.ENV, profiles.DEFAULT)
    )
    if chosen:
        profiles.load(chosen)
    spec = config.getoption("frost_fuzz_pool", None)
    if spec:
        from frost_harness.fuzz import pool  # here: after CUDA_VISIBLE_DEVICES is set (it imports torch)

        pool.activate(pool.sample(*pool.parse_spec(spec)))


_EACH_KEY = "frost_fuzz_dist_each"


class _XdistHooks:
    """Tells each xdist worker whether every worker runs every test (``--dist each``; a worker's
    own ``dist`` option reads "no")."""

    def __init__(self, each: bool):
        self.each = each

    def pytest_configure_node(self, node):
        node.workerinput[_EACH_KEY] = self.each


def _is_single_run(item) -> bool:
    return item.get_closest_marker("fuzz") is not None and not is_hypothesis_test(getattr(item, "obj", None))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under a budget: the single runs first (on ``gw0`` only under ``--dist each``), then the rest."""
    if config.getoption("frost_fuzz_until") is None:
        return
    single = [item for item in items if _is_single_run(item)]
    rest = [item for item in items if not _is_single_run(item)]
    workerinput = getattr(config, "workerinput", {})
    if single and workerinput.get(_EACH_KEY) and workerinput["workerid"] != "gw0":
        config.hook.pytest_deselected(items=single)
        single = []
    items[:] = single + rest
    config.stash[_FUZZ_TESTS_LEFT] = sum(item.get_closest_marker("fuzz") is not None for item in rest)


def pytest_sessionstart(session):
    until = session.config.getoption("frost_fuzz_until")
    if until is not None:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        progress = records_plugin.run_folder(session.config) / f"progress-{worker}.json"
        budget.activate(budget.Budget(until=until, seed=session.config.getoption("frost_fuzz_seed"), worker=worker,
                                      progress=progress,
                                      shrink_until=session.config.getoption("frost_fuzz_shrink_until")))  # fmt: skip


def pytest_sessionfinish(session):
    budget.activate(None)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Under a budget, a fuzz property runs as seeded chunks until its share of the time is spent;
    a fuzz test without ``@given`` runs once, outside the budget."""
    active = budget.active()
    if active is None or pyfuncitem.get_closest_marker("fuzz") is None:
        return None
    test = pyfuncitem.obj
    arguments = {name: pyfuncitem.funcargs[name] for name in inspect.signature(test).parameters}
    if not is_hypothesis_test(test):
        with budget.suspended():
            test(**arguments)
        return True
    config = pyfuncitem.config
    left = config.stash.get(_FUZZ_TESTS_LEFT, 1)
    config.stash[_FUZZ_TESTS_LEFT] = left - 1
    if time.time() >= active.until:
        pytest.skip("frost-fuzz: the run's time budget is spent")
    active.start_test(left)
    log = records_plugin.run_folder(config) / f"fuzz-{active.worker}.jsonl"
    chunk = 0
    while chunk == 0 or not active.share_spent():
        seed = active.chunk_seed(pyfuncitem.nodeid, chunk)
        # What hypothesis.seed() sets; that decorator would also switch the example database off.
        test._hypothesis_internal_use_seed = seed
        active.start_chunk()
        started, outcome, failure = time.time(), "passed", ""
        try:
            test(**arguments)
        except budget.ShareSpent:
            pass
        except BaseException as error:
            outcome, failure = "failed", f"{type(error).__name__}: {error}"[:4000]
            pyfuncitem.add_report_section("call", "frost-fuzz", f"failing chunk {chunk}: seed {seed}"
                                                                 + budget.shrink_note())
            raise
        finally:
            records.append_jsonl(log, [{
                "test_id": pyfuncitem.nodeid, "worker": active.worker,
                "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""), "chunk": chunk, "seed": seed,
                "examples": active.examples, "seconds": round(time.time() - started, 3),
                "outcome": outcome, "failure": failure,
            }])  # fmt: skip
            active.write_progress(force=True)
        chunk += 1
    return True
