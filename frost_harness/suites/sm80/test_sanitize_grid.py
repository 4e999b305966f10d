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


@pytest.mark.L0
def test_the_ordered_mode_takes_each_walk_on_the_grid():
    """The ordered dQ walks the unmasked features rotated and the right-bounded ones (causal,
    right windows) diagonally, so the grid's ordered mode runs every walk; the shared mode runs
    the shared one beside both."""
    import dataclasses

    import torch

    from frost.problem import prepare

    walks = {}
    for name in sanitize.FEATURES:
        t, keywords = sanitize._inputs(name, torch.Generator().manual_seed(0), "cpu")
        problem, _ = prepare("forward", t["q"], t["k"], t["v"], **keywords)  # facts only: as a backward
        walks[name] = sanitize.ordered_dq_walk(dataclasses.replace(problem, direction="backward",
                                                                      deterministic=True))
    masked = {n for n, (_, kw, _) in sanitize.FEATURES.items() if {"causal", "window"} & set(kw)}
    assert {walks[n] for n in masked} == {"diagonal"}  # every masked feature has a right bound
    assert {walks[n] for n in set(walks) - masked} == {"rotated"}
    assert {"dense_d64", "dense_d128_fp16", "partial_hdim", "strided"} <= set(walks) - masked


# every kernel of the sm80 engines but the split combine and the RoPE pass: the forward, the
# backward's default, sliced (deterministic) and recompute modes, the ordered dQ with warp turns
# on the diagonal walk (causal) and the rotated one (dense), and with CTA turns on the shared walk
# (forced on both)
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
