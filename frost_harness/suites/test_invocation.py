"""The runners work from any directory (``frost_harness.invocation``): they run the suites that
came with the package, write under the current directory's ``frost-out``, read no foreign
configuration, and a run that finds nothing to test is red. Without the harness extra or the
suites they stop with one line.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from frost_harness import invocation
from frost_harness.invocation import ROOT, SUITES


@pytest.mark.L0
def test_without_test_paths_the_installed_suites_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside the checkout: nothing here to collect
    command = invocation.pytest_command(["-m", "L0"], ["-k", "dense", "-p", "no:randomly"], [SUITES])
    assert command[-1] == str(SUITES) and SUITES.is_absolute()
    assert command[command.index("-c") + 1] == str(SUITES / "runner.ini") and f"--rootdir={ROOT}" in command
    # paths the user names replace the default, whether they exist relative to here or absolutely
    (tmp_path / "mine").mkdir()
    assert invocation.pytest_command([], ["mine"], [SUITES])[-1] == "mine"
    assert invocation.pytest_command([], [f"{SUITES / 'test_plans.py'}::test_x"], [SUITES])[-1].endswith("::test_x")
    assert invocation.pytest_command([], ["--pyargs", "frost_harness.suites.test_plans"], [SUITES])[-1] == (
        "frost_harness.suites.test_plans")
    # a path that is an option's value is no selection; nor are the runner's own options
    assert invocation.pytest_command(["--junitxml", "mine"], ["--deselect", "mine"], [SUITES])[-1] == str(SUITES)


@pytest.mark.L0
def test_frost_report_from_a_directory_outside_the_checkout(tmp_path):
    """``frost-report`` started in an empty directory that holds a hostile pytest.ini: it runs the
    package's suites (a tiny selection) with their conftest, writes ./frost-out there, and says
    PASSED with the tests it ran; then a selection that collects nothing there is red."""
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --no-such-option\n")  # must not be read
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    selection = [str(SUITES / "test_native_engines.py"), "-k", "dense-bf16"]
    report = [sys.executable, "-m", "frost_harness.reports.cli", "--level", "L0", "--"]
    done = subprocess.run(report + selection, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = list((tmp_path / "frost-out").glob("L0-*"))
    assert len(runs) == 1, list((tmp_path / "frost-out").iterdir())
    meta = json.loads((runs[0] / "run.json").read_text())
    assert meta["verdict"].startswith("PASSED: ") and not meta["verdict"].startswith("PASSED: 0 tests"), meta["verdict"]
    junit = (runs[0] / "junit.xml").read_text()
    assert 'classname="frost_harness.suites.test_native_engines"' in junit  # ids as in the checkout
    assert (runs[0] / "cases.csv.gz").stat().st_size > 0
    assert not (tmp_path / ".pytest_cache").exists()  # pytest's cache went under frost-out too

    nothing = report[:-1] + ["--out", str(tmp_path / "red"), "--", str(SUITES / "test_native_engines.py"), "-k",
                             "no_such_test"]  # fmt: skip
    done = subprocess.run(nothing, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 5, done.stdout[-3000:]
    assert json.loads((tmp_path / "red" / "run.json").read_text())["verdict"].startswith("FAILED: pytest exit 5")


@pytest.mark.L0
def test_runners_stop_with_one_line_without_the_extra_or_the_suites(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if the harness extra were not installed
    assert invocation.missing_extra() == ["pandas"]
    with pytest.raises(SystemExit, match=r"frost-report: needs frost's harness extra \(pandas missing\): "
                                         r"pip install 'frost\[harness\]'"):  # fmt: skip
        invocation.require_extra("frost-report")
    with pytest.raises(SystemExit, match="frost-fuzz: the test suites are missing from"):
        invocation.check_suites("frost-fuzz", root=tmp_path)
    invocation.check_suites("frost-fuzz")  # this installation has them
