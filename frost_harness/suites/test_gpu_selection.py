"""Nothing skips silently on a GPU run: ``-m`` expressions that select GPU tests only fail
without CUDA instead of passing as a run of skips (frost_harness/suites/conftest.py)."""
from __future__ import annotations

import subprocess

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
