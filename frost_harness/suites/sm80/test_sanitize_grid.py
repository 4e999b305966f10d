"""The sanitizer grid (frost/kernels/sm80/sanitize.py): valid calls of every feature and mode.

On a CPU the grid's calls run through the CPU engines (every call must be one the contract
accepts, with finite outputs); on a GPU through the forced sm80 engines, the dQ recompute included.
"""
from __future__ import annotations

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
def test_rotated_mode_runs_on_the_unmasked_features():
    import dataclasses

    import torch

    from frost.problem import prepare

    applies = set()
    for name in sanitize.FEATURES:
        t, keywords = sanitize._inputs(name, torch.Generator().manual_seed(0), "cpu")
        problem, _ = prepare("forward", t["q"], t["k"], t["v"], **keywords)  # facts only: as a backward
        if sanitize.rotated_walk_applies(dataclasses.replace(problem, direction="backward", deterministic=True)):
            applies.add(name)
    masked = {n for n, (_, kw, _) in sanitize.FEATURES.items() if {"causal", "window"} & set(kw)}
    assert applies and not applies & masked
    assert {"dense_d64", "dense_d128_fp16", "partial_hdim", "strided"} <= applies
