"""The suites' pytest wiring: test levels, the GPU marker and frost's records plugin.

It lives beside the suites, not at the repository root, so that it travels with the wheel:
``pytest -m L0`` in a checkout and ``frost-report`` on an installed package load the same
file, and it registers the markers itself (a run from site-packages reads no pyproject.toml).

Every test must carry exactly one level marker (L0, L1 or L2); an unmarked
test is a collection error, so nothing silently drops out of every level.
Tests marked ``gpu`` are skipped with a reason when CUDA is unavailable, unless the run
asked for GPU tests only (``-m "L0 and gpu"``): then a missing or broken CUDA is a usage
error, not a green run of skips.
``frost_harness.reports.plugin`` collects the accuracy harness's per-case records and prints
the routing summary at the end of the run (also under pytest-xdist);
``frost_harness.reports.progress`` keeps the run's progress (tests done of those collected,
failed) in the run folder for the runners' status line. Every GPU test carries the junit.xml
property ``gpu`` (``frost_harness.reports.verdict.GPU_PROPERTY``), so the reports can say which
GPU tests ran and which skipped, and why.
``frost_harness.fuzz.plugin`` selects the Hypothesis profile of the fuzz suites (``ci`` unless
told otherwise), gives each xdist worker its GPU and runs the ``frost-fuzz`` budget.
Each run gets a fresh, empty compile cache directory on disk (``FROST_CACHE_DIR``), so no
test depends on what the user's cache holds and the compile suites really compile; its
xdist workers share it, so a record one worker compiled is a load in the others (tests
about the disk cache point it elsewhere). The one exception is ``--frost-cache-dir DIR``:
every process uses that cache (``frost-fuzz`` passes the one it filled with the record
pool's kernels, so its GPU workers load them instead of compiling:
``frost_harness.fuzz.prewarm``). An xdist worker runs torch on its share of the CPU cores:
two workers of two threads each on two cores spend their time waiting on each other.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from frost_harness.reports.verdict import GPU_PROPERTY

pytest_plugins = ("frost_harness.reports.plugin", "frost_harness.reports.progress", "frost_harness.fuzz.plugin")

LEVELS = ("L0", "L1", "L2")
MARKERS = (
    "L0: fast gate, minutes on a CPU",
    "L1: the wider grid",
    "L2: the full sweep",
    "gpu: needs CUDA; skipped cleanly without it",
    "fuzz: a Hypothesis property of frost_harness/suites/fuzz (what the frost-fuzz runner selects)",
    "allows_failed_cases(reason): the test passes with failed harness cases it expects (a Hypothesis example "
    "marked xfail, which pytest reports as a pass); the reports count them as expected, not as failures",
)
_CACHE_KEY = "frost_cache_dir"  # the run's compile cache, in each xdist worker's workerinput
_test_cache_dir: str | None = None


def pytest_addoption(parser):
    parser.addoption("--frost-cache-dir", default=None, metavar="DIR",
                     help="the compile cache on disk of every test process (default: a fresh empty one each)")


class _XdistHooks:
    """Hands the run's compile cache to each xdist worker."""

    def __init__(self, cache_dir: str):
        self.cache_dir = cache_dir

    def pytest_configure_node(self, node):
        node.workerinput[_CACHE_KEY] = self.cache_dir


def pytest_configure(config):
    global _test_cache_dir
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    shared = config.getoption("frost_cache_dir", None)
    workerinput = getattr(config, "workerinput", None)
    if shared:
        cache_dir = os.path.abspath(shared)
    elif workerinput is not None:
        cache_dir = workerinput[_CACHE_KEY]  # the controller's: it removes the directory
    else:
        cache_dir = _test_cache_dir = tempfile.mkdtemp(prefix="frost-test-cache-")
    os.environ["FROST_CACHE_DIR"] = cache_dir
    os.environ.pop("FROST_DISK_CACHE", None)  # the suites run with the disk cache on, wherever they run
    if workerinput is None:
        if config.pluginmanager.hasplugin("xdist"):
            config.pluginmanager.register(_XdistHooks(cache_dir), "frost-cache-xdist")
    else:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workerinput["workercount"]))


def pytest_unconfigure(config):
    if _test_cache_dir is not None:
        shutil.rmtree(_test_cache_dir, ignore_errors=True)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _mark_expression(markexpr: str):
    """``-m``'s expression, compiled; None when there is none or it is malformed (pytest reports a
    malformed one itself)."""
    if not markexpr:
        return None
    from _pytest.mark.expression import Expression

    try:
        return Expression.compile(markexpr)
    except Exception:
        return None


def _selects(expression, marks) -> bool:
    return expression.evaluate(lambda name, **kwargs: name in marks)


def selects_only_gpu_tests(markexpr: str) -> bool:
    """Whether a ``-m`` expression can select a test only if it is marked ``gpu``."""
    expression = _mark_expression(markexpr)
    if expression is None:
        return False
    kinds = ((), ("fuzz",))
    without_gpu = any(_selects(expression, (level, *kind)) for level in LEVELS for kind in kinds)
    with_gpu = any(_selects(expression, (level, "gpu", *kind)) for level in LEVELS for kind in kinds)
    return with_gpu and not without_gpu


def can_select(config, marks: set[str]) -> bool:
    """Whether the run's ``-m`` expression can select a test that carries ``marks`` (no expression:
    every test). The compile suites list their records only for a run that can select them
    (``pytest_generate_tests``): a few hundred thousand parameters, which a run that deselects them
    would otherwise spend minutes listing."""
    expression = _mark_expression(config.getoption("markexpr", ""))
    return expression is None or _selects(expression, marks)


def pytest_collection_modifyitems(config, items):
    unmarked = []
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    has_cuda = None
    for item in items:
        levels = [m for m in LEVELS if item.get_closest_marker(m) is not None]
        if len(levels) != 1:
            unmarked.append(f"{item.nodeid} (levels: {levels or 'none'})")
        if item.get_closest_marker("gpu") is not None:
            item.user_properties.append((GPU_PROPERTY, "1"))
            if has_cuda is None:
                has_cuda = _cuda_available()
            if not has_cuda:
                item.add_marker(skip_gpu)
    if unmarked:
        raise pytest.UsageError(
            "every test needs exactly one level marker (L0, L1 or L2):\n  " + "\n  ".join(unmarked)
        )
    markexpr = config.getoption("markexpr", "")
    if selects_only_gpu_tests(markexpr) and not _cuda_available():
        raise pytest.UsageError(
            f"-m {markexpr!r} selects GPU tests only, but CUDA is not available (no device, or it failed to "
            "initialize): every test would skip"
        )


@pytest.fixture
def as_device(monkeypatch):
    """``as_device(part)``: every CUDA device of the test is that part (a ``frost.devices`` profile
    or its name), with no profile forced (``FROST_DEVICE_PROFILE`` included), so that plans for
    ``cuda`` problems are made for it on any machine; restored after the test."""
    from frost import devices
    from frost.engines.base import Engine

    def set_to(part):
        part = devices.named(part) if isinstance(part, str) else part
        monkeypatch.setattr(devices, "of_device", lambda device: part)
        monkeypatch.setattr(devices, "_forced", None)
        Engine.generation += 1  # plans kept for the previous device are stale
        return part

    yield set_to
    Engine.generation += 1
