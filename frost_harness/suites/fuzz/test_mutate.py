"""CPU: the frost-mutate catalogue applies, covers the fault families, and the runner judges honestly.

The GPU run itself (every mutant against ``pytest -m "L0 and gpu"``) is a command, not a test;
these check what can go wrong without a GPU: a mutant whose text no longer matches its kernel
(it would silently test nothing), a mutated file that no longer parses, a checkout touched by a
run, a verdict that counts a broken run or a skip-only baseline as a pass.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from frost_harness.fuzz import mutate
from frost_harness.fuzz.mutants import CATALOGUE, Mutant

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.L0
def test_catalogue_is_large_and_covers_every_fault_family():
    assert len(CATALOGUE) >= 25
    assert len({m.name for m in CATALOGUE}) == len(CATALOGUE)
    families = {m.category for m in CATALOGUE}
    assert {"mask", "block range", "gqa", "scale", "sinks", "thd", "lse/D", "partial head dim", "race",
            "zeroing"} <= families
    # both sides of the band, in the element mask and in the block ranges
    names = {m.name for m in CATALOGUE}
    assert {"mask-right-edge", "mask-left-edge", "n-range-right", "n-range-left", "m-range-right",
            "m-range-left"} <= names


@pytest.mark.L0
@pytest.mark.parametrize("mutant", CATALOGUE, ids=lambda m: m.name)
def test_each_mutant_matches_its_kernel_once_and_still_parses(mutant: Mutant):
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.find) == 1, f"{mutant.name}: its text no longer matches {mutant.path}"
    assert mutant.find != mutant.replace
    ast.parse(text.replace(mutant.find, mutant.replace))


@pytest.mark.L0
def test_apply_writes_only_the_copy(tmp_path):
    mutant = CATALOGUE[0]
    original = (ROOT / mutant.path).read_text()
    copy = tmp_path / "tree"
    (copy / Path(mutant.path).parent).mkdir(parents=True)
    (copy / mutant.path).write_text(original)
    mutant.apply(copy)
    assert (copy / mutant.path).read_text() == original.replace(mutant.find, mutant.replace)
    assert (ROOT / mutant.path).read_text() == original
    with pytest.raises(ValueError, match="occurs 0 times"):
        mutant.apply(copy)  # applied twice: its text is gone


@pytest.mark.L0
def test_classify_counts_only_failing_tests_as_kills():
    assert mutate.classify(0, "12 passed") == ("survived", "")
    assert mutate.classify(1, "FAILED frost_harness/suites/sm80/test_bwd_gpu.py::test_x[a] - AssertionError\n1 failed") == (
        "killed", "frost_harness/suites/sm80/test_bwd_gpu.py::test_x[a]")
    assert mutate.classify(None, "") == ("timed out", "")
    assert mutate.classify(2, "Interrupted: 1 error during collection")[0] == "broken"
    assert mutate.classify(1, "no FAILED line at all")[0] == "broken"
    # -x under xdist ends the session at the first failure with exit 2: still a kill
    xdist_stop = ("FAILED s/test_bwd_gpu.py::test_y[b] - AssertionError\n"
                  "=== short test summary info ===\nFAILED s/test_bwd_gpu.py::test_y[b] - AssertionError\n"
                  "!!!!! xdist.dsession.Interrupted: stopping after 1 failures !!!!!\n1 failed, 3 passed")
    assert mutate.classify(2, xdist_stop) == ("killed", "s/test_bwd_gpu.py::test_y[b]")
    # the harness's own summary says FAILED of a case whose test is an expected failure: not a kill
    harness_only = ("FAILED s/test_bwd_gpu.py::test_z[w] [backward sdpa_bwd_sm80] worst ratio 1.04\n"
                    "=== short test summary info ===\nXFAIL s/test_bwd_gpu.py::test_z[w] - known\n"
                    "ERROR s/test_fwd_gpu.py - ImportError\nInterrupted: 1 error during collection")
    assert mutate.classify(2, harness_only)[0] == "broken"


@pytest.mark.L0
def test_score_leaves_equivalents_out_and_counts_hangs():
    outcomes = [mutate.Outcome("a", "mask", "killed"), mutate.Outcome("b", "mask", "timed out"),
                mutate.Outcome("c", "mask", "survived"), mutate.Outcome("d", "mask", "equivalent"),
                mutate.Outcome("e", "mask", "not run")]
    assert mutate.score(outcomes) == (2, 3)


@pytest.mark.L0
def test_list_works_without_a_gpu_and_a_run_refuses(capsys):
    assert mutate.main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert all(m.name in listed for m in CATALOGUE) and f"{len(CATALOGUE)} mutants" in listed
    import torch

    if not torch.cuda.is_available():
        assert mutate.main(["--only", CATALOGUE[0].name]) == 2
        assert "need a CUDA device" in capsys.readouterr().err


@pytest.mark.L0
def test_write_report(tmp_path):
    args = mutate.main.__globals__["argparse"].Namespace(marker="L0 and gpu", suites=["frost_harness/suites/sm80"])
    head = mutate.write_report([mutate.Outcome("a", "mask", "killed", "t::x", 3.0, "why"),
                                mutate.Outcome("b", "race", "survived", "", 9.0, "why")], tmp_path, args)
    assert head == "# Mutation score: 1 of 2 killed (50%)"
    table = (tmp_path / "mutants.md").read_text()
    assert table.index("| b |") < table.index("| a |")  # survivors first
    assert (tmp_path / "mutants.json").exists()
    meta = mutate.json.loads((tmp_path / "run.json").read_text())
    assert (meta["killed"], meta["judged"], meta["survivors"]) == (1, 2, ["b"])
    page = (tmp_path / "report.html").read_text()
    assert "mutation score 1 of 2 killed (50%), target 95%" in page and "class='fail'" in page
    assert page.index(">b<") < page.index(">a<")
    head = mutate.write_report([mutate.Outcome(f"m{i}", "mask", "killed", "t::x", 1.0, "why") for i in range(20)],
                               tmp_path, args)  # fmt: skip
    assert head.endswith("(100%)") and "class='ok'" in (tmp_path / "report.html").read_text()


@pytest.mark.L0
def test_a_mutant_tree_is_the_two_packages_and_runs_its_own_suites(tmp_path, monkeypatch):
    """The copy holds frost and frost_harness only (from a checkout or site-packages alike, never a
    whole site-packages), and its suites run from the copy, with the copy's settings and rootdir."""
    tree = mutate.copy_tree(tmp_path / "tree")
    assert sorted(p.name for p in tree.iterdir()) == ["frost", "frost_harness"]
    assert not list(tree.rglob("__pycache__"))
    assert (tree / CATALOGUE[0].path).read_text() == (ROOT / CATALOGUE[0].path).read_text()
    ran = {}

    class FakePopen:
        def __init__(self, cmd, **kwargs):
            ran.update(cmd=cmd, **kwargs)
            self.pid, self.returncode = -1, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def communicate(self, timeout=None):
            return "1 passed", None

    monkeypatch.setattr(mutate.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(mutate.os, "killpg", lambda pid, sig: None)
    args = mutate.main.__globals__["argparse"].Namespace(marker="L0 and gpu", suites=["frost_harness/suites/sm80"],
                                                         workers=1, timeout=5)  # fmt: skip
    assert mutate.run_suites(tree, args)[:2] == (0, "1 passed")
    cmd = ran["cmd"]
    assert cmd[cmd.index("-c") + 1] == str(tree / "frost_harness" / "suites" / "runner.ini")
    assert f"--rootdir={tree}" in cmd and cmd[-1] == str(tree / "frost_harness" / "suites" / "sm80")
    assert ran["cwd"] == tree and ran["env"]["PYTHONPATH"].startswith(str(tree))
    assert ran["start_new_session"]  # a hang is killed with its workers


@pytest.mark.L0
def test_every_suite_run_shares_the_chosen_compile_cache(tmp_path, monkeypatch):
    """``--cache-dir`` reaches each pytest run as ``--frost-cache-dir``; the default is frost's
    own cache directory, and '' leaves each suite run its fresh one."""
    seen = []
    monkeypatch.setattr(mutate.invocation, "pytest_command", lambda options, *a, **k: seen.append(options) or ["true"])
    args = mutate.main.__globals__["argparse"].Namespace(marker="L0 and gpu", suites=["s"], workers=1, timeout=5,
                                                         cache_dir=str(tmp_path / "c"))  # fmt: skip
    mutate.run_suites(tmp_path, args)
    args.cache_dir = ""
    mutate.run_suites(tmp_path, args)
    assert f"--frost-cache-dir={tmp_path / 'c'}" in seen[0]
    assert not any(o.startswith("--frost-cache-dir") for o in seen[1])
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path / "mine"))
    assert mutate.default_cache_dir() == str(tmp_path / "mine")
    monkeypatch.setenv("FROST_DISK_CACHE", "0")
    assert mutate.default_cache_dir() == ""


@pytest.mark.L0
def test_first_tests_speed_a_kill_but_never_decide_a_survivor(tmp_path, monkeypatch):
    """Every family has its first tests; a kill there ends the judging, anything else (a pass, a
    selection of no tests) runs the whole selection, which alone decides a survivor."""
    from frost_harness.fuzz.mutants import FIRST_TESTS

    assert {m.category for m in CATALOGUE} <= set(FIRST_TESTS)
    runs = []
    first = {"killed": (1, "FAILED a.py::t_first\n1 failed"), "passed": (0, "3 passed"),
             "empty": (5, "no tests ran")}  # fmt: skip

    def fake(tree, args, select=None, workers=None):
        runs.append(select)
        assert (workers == 1) == bool(select)  # the focus in one process, the whole selection on the workers
        if select:
            return (*first[state], 1.0)
        return 1, "FAILED b.py::t_full\n1 failed", 2.0

    monkeypatch.setattr(mutate, "run_suites", fake)
    monkeypatch.setattr(mutate, "copy_tree", lambda dest: dest)
    monkeypatch.setattr(Mutant, "apply", lambda self, root: None)
    mutant = next(m for m in CATALOGUE if m.category == "bias")
    for state, want in (("killed", ("a.py::t_first", [mutant.first_tests])),
                        ("passed", ("b.py::t_full", [mutant.first_tests, None])),
                        ("empty", ("b.py::t_full", [mutant.first_tests, None]))):
        runs.clear()
        outcome = mutate.judge(mutant, None, tmp_path)
        assert (outcome.verdict, outcome.killed_by, runs) == ("killed", want[0], want[1]), state


@pytest.mark.L0
def test_the_focus_runs_on_the_focus_workers_when_asked(tmp_path, monkeypatch):
    """``--focus-workers N`` spreads a focus's compiles over N xdist workers; a kill there is final."""
    runs = []
    monkeypatch.setattr(mutate, "run_suites", lambda tree, args, select=None, workers=None: (
        runs.append((select, workers)) or (1, "FAILED a.py::t_first\n1 failed", 1.0)))
    monkeypatch.setattr(mutate, "copy_tree", lambda dest: dest)
    monkeypatch.setattr(Mutant, "apply", lambda self, root: None)
    mutant = next(m for m in CATALOGUE if m.category == "bias")
    args = mutate.main.__globals__["argparse"].Namespace(focus_workers=3)
    outcome = mutate.judge(mutant, args, tmp_path)
    assert (outcome.verdict, runs) == ("killed", [(mutant.first_tests, 3)])


@pytest.mark.L0
def test_a_hang_is_killed_with_its_process_group_and_a_deadline_cut_is_not_a_verdict(tmp_path, monkeypatch):
    """A run past its limit kills every process of its group; one cut by --stop-after is 'not run'
    (nothing was learned), never 'timed out', which would count as a kill."""
    import sys
    import time

    script = tmp_path / "hang.py"  # a parent whose child outlives it unless the group is killed
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    script.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])\ntime.sleep(60)\n")
    monkeypatch.setattr(mutate.invocation, "pytest_command", lambda *a, **k: [sys.executable, str(script)])
    killed = []
    real_killpg = mutate.os.killpg
    monkeypatch.setattr(mutate.os, "killpg", lambda pid, sig: (killed.append(pid), real_killpg(pid, sig)))
    args = mutate.main.__globals__["argparse"].Namespace(marker="gpu", suites=["x"], workers=1, timeout=3.0,
                                                         deadline=None)  # fmt: skip
    returncode, _, seconds = mutate.run_suites(tmp_path, args)
    assert returncode is None and 2.5 < seconds < 30 and killed
    child_pid = int(pid_file.read_text())
    for _ in range(50):  # the child, in the killed group too, is gone (or a zombie awaiting its reaper)
        status = Path(f"/proc/{child_pid}/status")
        if not status.exists() or "\tZ" in status.read_text():
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the hung run's child survived the kill")

    monkeypatch.setattr(mutate, "copy_tree", lambda dest: dest)
    monkeypatch.setattr(Mutant, "apply", lambda self, root: None)
    monkeypatch.setattr(mutate, "run_suites", lambda tree, a, select=None, workers=None: (None, "", 1.0))
    args.deadline = time.monotonic()  # reached
    assert mutate.judge(CATALOGUE[0], args, tmp_path).verdict == "not run"
    args.deadline = None
    assert mutate.judge(CATALOGUE[0], args, tmp_path).verdict == "timed out"


@pytest.mark.L0
def test_resume_keeps_judged_verdicts_only(tmp_path):
    rows = [mutate.Outcome("a", "mask", "killed", "t::x"), mutate.Outcome("b", "mask", "not run"),
            mutate.Outcome("c", "race", "survived")]
    path = tmp_path / "mutants.json"
    path.write_text(mutate.json.dumps([mutate.dataclasses.asdict(o) for o in rows]))
    kept = mutate.load_previous(str(path))
    assert sorted(kept) == ["a", "c"] and kept["a"].killed_by == "t::x"
    assert mutate.load_previous(None) == {}


@pytest.mark.L0
def test_each_focus_selects_a_few_l0_gpu_tests():
    """A mutant's focus must name tests that exist (one that selects nothing sends the mutant
    straight to the whole suite) and stay small (its compiles are what a kill costs)."""
    import subprocess
    import sys

    from _pytest.mark.expression import Expression

    files = [f"frost_harness/suites/sm80/test_{name}_gpu.py" for name in ("fwd", "bwd", "hdim", "rope")]
    files.append("frost_harness/suites/sm80/test_sanitize_grid.py")  # the racecheck test
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "L0", "-p", "no:cacheprovider",
                             *files], cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    ids = [line for line in listed.splitlines() if "::" in line]
    assert len(ids) > 100

    def selected(expression: str) -> list[str]:
        compiled = Expression.compile(expression)
        hits = []
        for node_id in ids:
            path, name = node_id.split("::", 1)
            names = [*path.split("/"), name, name.split("[", 1)[0], "L0", "gpu"]

            def match(sub: str, /, **kwargs) -> bool:
                return any(sub.lower() in n.lower() for n in names)

            if compiled.evaluate(match):
                hits.append(node_id)
        return hits

    for mutant in CATALOGUE:
        hits = selected(mutant.first_tests)
        assert 1 <= len(hits) <= 16, f"{mutant.name}: its focus {mutant.first_tests!r} selects {len(hits)} tests"


@pytest.mark.L0
@pytest.mark.parametrize("log,verdict", [
    ("....\n369 passed, 29 warnings in 267.86s (0:04:27)\n", 0),  # -q: no banner around the closing line
    ("===== 12 passed, 1 xfailed in 3.1s =====\n", 0),
    ("== 3 failed, 366 passed in 2.0s ==\n", 1),
    ("1 error in 0.5s\n", 1),
    # the harness's summary counts oracle cases and is not pytest's verdict; a run cut off has none
    ("338 cases (334 routed, 4 forced): 330 passed, 8 failed\n", 1),
    ("338 cases: 338 passed, 0 failed\n5 passed, 2 failed in 9.0s\n", 1),
])
def test_a_baseline_log_passes_only_on_pytests_closing_line_without_failures(log, verdict):
    """``--baseline-log``: the unmutated run is judged by pytest's closing line, with or without
    ``-q``; a log without one (a run that was cut off) or with failures or errors does not pass."""
    assert mutate.baseline_verdict(log)[0] == verdict
