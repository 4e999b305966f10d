"""The sanitizer grid (frost/kernels/sm80/sanitize.py): valid calls of every feature and mode.

On a CPU the grid's calls run through the CPU engines (every call must be one the contract
accepts, with finite outputs); on a GPU through the forced sm80 engines, the dQ recompute included.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from frost.kernels.sm80 import sanitize


@pytest.mark.L0
@pytest.mark.parametrize("name", list(sanitize.FEATURES))
def test_grid_calls_are_valid_on_the_cpu_engines(name):
    assert sanitize.run_feature(name, modes=("default", "deterministic"), device="cpu", engine=None) == []


@pytest.mark.L0
def test_list_names_every_feature(capsys):
    assert sanitize.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(sanitize.FEATURES)


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(sanitize.FEATURES))
def test_grid_runs_on_the_sm80_engines(name):
    assert sanitize.run_feature(name) == []


# every kernel of the sm80 engines but the split combine and the RoPE pass: the forward, the
# backward's default mode and its deterministic ones: the sliced dQ (the engine's slices, and
# two forced) and the recompute
RACECHECK_FEATURES = ("causal", "dense_d64")


@pytest.mark.L0
@pytest.mark.gpu
def test_kernels_are_race_free_under_racecheck():
    """compute-sanitizer's racecheck finds no shared-memory hazard in the kernels. A missing
    barrier before a refill of a shared tile can pass every numerical test (the refill lands
    after the lagging warp's read at the timing of the day); racecheck sees the missing
    synchronisation itself. Without the tool the test fails: L0 on a GPU machine needs it."""
    tool = sanitize.compute_sanitizer()
    if tool is None:
        pytest.fail("compute-sanitizer (CUDA toolkit) not found on PATH, under CUDA_HOME or /usr/local/cuda: "
                    "install it, or deselect this test with -k 'not racecheck'")
    command = [tool, "--tool", "racecheck", "--error-exitcode", "1", sys.executable, "-m",
               "frost.kernels.sm80.sanitize", "--only", ",".join(RACECHECK_FEATURES)]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=900)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    assert re.search(r"RACECHECK SUMMARY: 0 hazards", output), output[-6000:]
    assert f"sanitize: {len(RACECHECK_FEATURES)} features" in output, output[-6000:]


@pytest.mark.L0
def test_compute_sanitizer_is_found_under_cuda_home(tmp_path, monkeypatch):
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(sanitize, "TOOLKIT_HOMES", ())
    assert sanitize.compute_sanitizer() is None  # not executable
    tool.chmod(0o755)
    assert sanitize.compute_sanitizer() == str(tool)
