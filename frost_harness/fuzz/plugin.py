"""pytest plugin of the fuzz suites: profile, GPU per worker, time budget and chunk log.

Loaded by the repository's frost_harness/suites/conftest.py, in every test process:

- registers the Hypothesis profiles (``frost_harness.fuzz.profiles``) and loads the one selected
  (``--frost-profile`` / ``--hypothesis-profile`` / ``FROST_FUZZ_PROFILE`` / ``ci``);
- in each xdist worker (or a run without xdist) sets ``CUDA_VISIBLE_DEVICES`` from the
  runner's device list (``frost_harness.fuzz.devices``), before any test module imports torch;
- activates the record-class pool the ``gpu`` regime draws from
  (``frost_harness.fuzz.pool``): ``--frost-fuzz-pool SEED:SIZE``, else the default pool;
- with ``--frost-fuzz-until EPOCH`` (the ``frost-fuzz`` runner passes it, with
  ``--frost-fuzz-seed`` and ``--frost-fuzz-shrink-until``) runs every test marked ``fuzz`` as chunks until its share of
  the time is spent (``frost_harness.fuzz.budget``), bounds the shrinking of a failure by
  ``--frost-fuzz-shrink-until``, skips fuzz tests that would start after the
  deadline, and appends one row per chunk (test, worker, GPU, seed, examples,
  seconds, outcome, failure message) to ``fuzz-<worker>.jsonl`` in the run folder
  of ``frost_harness.reports.plugin``, and keeps ``progress-<worker>.json`` there (examples and failed
  chunks so far) for the runner's live status line. A failing chunk's seed is also
  shown in the test's report.
"""
from __future__ import annotations

import inspect
import os
import time

import pytest

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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    config.stash[_FUZZ_TESTS_LEFT] = sum(item.get_closest_marker("fuzz") is not None for item in items)


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
    """Under a budget, a fuzz test runs as seeded chunks until its share of the time is spent."""
    active = budget.active()
    if active is None or pyfuncitem.get_closest_marker("fuzz") is None:
        return None
    config = pyfuncitem.config
    left = config.stash.get(_FUZZ_TESTS_LEFT, 1)
    config.stash[_FUZZ_TESTS_LEFT] = left - 1
    if time.time() >= active.until:
        pytest.skip("frost-fuzz: the run's time budget is spent")
    active.start_test(left)
    test = pyfuncitem.obj
    arguments = {name: pyfuncitem.funcargs[name] for name in inspect.signature(test).parameters}
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
            active.chunks_failed += 1
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
