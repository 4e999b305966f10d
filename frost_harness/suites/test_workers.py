"""The xdist workers of one run (frost_harness/suites/conftest.py): they share the run's fresh
compile cache, handed over by the controller, and run torch on their share of the cores."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from frost_harness.suites import conftest


def _worker_config(workerinput: dict, cache_dir: str | None = None):
    return SimpleNamespace(workerinput=workerinput, addinivalue_line=lambda name, line: None,
                           getoption=lambda name, default=None: cache_dir if name == "frost_cache_dir" else default)


@pytest.mark.L0
@pytest.mark.parametrize("workers", [1, 2, 64])
def test_a_worker_takes_the_runs_compile_cache_and_its_share_of_the_cores(workers, monkeypatch, tmp_path):
    node = SimpleNamespace(workerinput={"workerid": "gw1", "workercount": workers})
    conftest._XdistHooks(str(tmp_path / "run")).pytest_configure_node(node)
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path / "mine"))
    threads = torch.get_num_threads()
    try:
        conftest.pytest_configure(_worker_config(node.workerinput))
        assert os.environ["FROST_CACHE_DIR"] == str(tmp_path / "run")
        assert torch.get_num_threads() == max(1, len(os.sched_getaffinity(0)) // workers)
        conftest.pytest_configure(_worker_config(node.workerinput, cache_dir=str(tmp_path / "given")))
        assert os.environ["FROST_CACHE_DIR"] == str(tmp_path / "given")  # --frost-cache-dir wins
    finally:
        torch.set_num_threads(threads)
    assert conftest._test_cache_dir is None or os.path.isdir(conftest._test_cache_dir)  # the run's own, untouched
