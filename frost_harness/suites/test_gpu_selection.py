"""Nothing skips silently on a GPU run: ``-m`` expressions that select GPU tests only fail
without CUDA instead of passing as a run of skips (frost_harness/suites/conftest.py)."""
from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
import torch

from frost_harness import invocation
from frost_harness.suites import conftest


@pytest.mark.L0
@pytest.mark.parametrize("markexpr, gpu_only", [
    ("L0 and gpu", True), ("gpu", True), ("(L0 or L1) and gpu", True), ("fuzz and gpu", True),
    ("L0", False), ("L0 and not gpu", False), ("gpu or L1", False), ("", False), ("fuzz and not gpu", False),
])
def test_selects_only_gpu_tests(markexpr, gpu_only):
    assert conftest.selects_only_gpu_tests(markexpr) is gpu_only


@pytest.mark.L0
def test_a_gpu_only_run_without_cuda_is_a_usage_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the GPU-only run is legitimate here")
    command = invocation.pytest_command(["-m", "L0 and gpu", "-q"], [], [invocation.SUITES / "test_graph_capture.py"])
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]  # pytest's usage-error exit
    assert "CUDA is not available" in done.stdout + done.stderr


class _Metafunc:
    """What ``parametrize_sweeps`` reads of pytest's Metafunc: the test, its marks, the run's ``-m``."""

    def __init__(self, name: str, marks: set[str], markexpr: str):
        self.function = SimpleNamespace(__name__=name)
        self.definition = SimpleNamespace(iter_markers=lambda: [pytest.Mark(m, (), {}) for m in marks])
        self.config = SimpleNamespace(getoption=lambda name, default=None: markexpr)
        self.parametrized: list = []

    def parametrize(self, argname, values, ids=None):
        self.parametrized.append((argname, values))


@pytest.mark.L0
@pytest.mark.parametrize("markexpr, marks, selectable", [
    ("L0 and gpu", {"L0"}, False), ("L0 and gpu", {"L1", "usefixtures"}, False), ("L0", {"L1"}, False),
    ("L0", {"L0", "usefixtures"}, True), ("", {"L1"}, True), ("not gpu", {"L1"}, True), ("L1 or fuzz", {"L1"}, True),
])
def test_compile_sweeps_list_their_records_only_for_a_run_that_can_select_them(markexpr, marks, selectable):
    """``conftest.can_select`` evaluates the run's ``-m`` on a test's marks; a compile sweep
    (``params_space.parametrize_sweeps``) enumerates its records only where that holds, else
    parametrizes nothing (pytest's empty set, deselected by the same ``-m``); other tests are left
    alone."""
    from frost_harness.suites.sm80.params_space import parametrize_sweeps

    calls = []

    def records():
        calls.append(1)
        return ["a", "b"]

    metafunc = _Metafunc("test_sweep", marks, markexpr)
    assert conftest.can_select(metafunc.config, marks) is selectable
    parametrize_sweeps(metafunc, {"test_sweep": records}, str)
    assert metafunc.parametrized == [("params", ["a", "b"] if selectable else [])] and len(calls) == selectable
    other = _Metafunc("test_other", marks, markexpr)
    parametrize_sweeps(other, {"test_sweep": records}, str)
    assert other.parametrized == [] and len(calls) == selectable
