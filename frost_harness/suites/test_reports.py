"""The records, the report tables, error statistics, drift, the HTML page, the pytest plugin under xdist and the CLI."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from frost_harness.invocation import SUITES
from frost_harness.reports import cli, fuzzlog, html, junit_summary, progress, publish, records, stats, tables, verdict


def _row(test_id, engine, passed, *, direction="forward", mode="routed", native=True, group="dense",
         declined="", output="o", ratio=0.5):  # fmt: skip
    return {"test_id": test_id, "outcome": "passed" if passed else "failed", "case": test_id,
            "direction": direction, "mode": mode, "engine": engine, "native": native, "dtype": "bf16",
            "feature_group": group, "output": output, "passed": passed, "ratio": ratio, "declined": declined}  # fmt: skip


ROWS = [
    _row("t1", "sm80", True, native=False, declined=""),
    _row("t1", "sm80", True, native=False, output="lse", ratio=0.9),
    _row("t2", "unfused", False, group="thd", declined="sm80: unsupported: attention sinks | torch-sdpa: x", ratio=1.5),
    _row("t2", "unfused", True, group="thd", output="lse", declined="sm80: unsupported: attention sinks | torch-sdpa: x"),
    _row("t3", "unfused", True, mode="forced", group="thd"),
    _row("t4", "torch-sdpa", True, direction="backward", declined="sm80: needs a cuda device, got cpu", output="dq"),
]


@pytest.mark.L0
def test_case_tables():
    df = tables.frame(ROWS)
    cases = tables.cases(df)
    assert len(cases) == 4
    t2 = cases[cases["test_id"] == "t2"].iloc[0]
    assert not t2["passed"] and t2["ratio"] == 1.5
    routing = tables.routing(cases)
    assert routing[["direction", "engine", "cases"]].values.tolist() == [
        ["forward", "sm80", 1], ["forward", "unfused", 1], ["backward", "torch-sdpa", 1]
    ]
    assert tables.own_share(cases) == (1, 3)
    declines = tables.declines(cases)
    assert declines.values.tolist()[0] == ["forward", "sm80", "unsupported: attention sinks", 1]
    rates = tables.pass_rate(cases)
    unfused = rates[(rates["engine"] == "unfused") & (rates["feature_group"] == "thd")].iloc[0]
    assert (unfused["cases"], unfused["passed"], unfused["pass_rate"]) == (2, 1, 0.5)


@pytest.mark.L0
def test_summary_and_markdown():
    lines = tables.summary_lines(tables.frame(ROWS))
    assert lines[0] == "4 cases (3 routed, 1 forced): 3 passed, 1 failed"
    assert "served by frost's own engines: 1 of 3 routed cases (33%)" in lines
    assert any(line.startswith("FAILED t2") for line in lines)
    assert tables.summary_lines(tables.frame([])) == ["no accuracy-harness cases in this run"]
    text = tables.markdown(pd.DataFrame({"a": [1.23456, float("nan")], "b": ["x|y", "z"]}))
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1.23 | x\\|y |", "|  | z |"]


@pytest.mark.L0
def test_write_reports(tmp_path):
    paths = tables.write_reports(tables.frame(ROWS), tmp_path, "unit")
    assert [p.name for p in paths] == ["cases.csv.gz", "routing.md", "pass_rate.md"]
    assert len(pd.read_csv(paths[0])) == len(ROWS)
    routing = paths[1].read_text()
    assert "served by frost's own engines: 1 (33.3%)" in routing and "unsupported: attention sinks" in routing
    pass_rate = paths[2].read_text()
    assert "| thd |" in pass_rate and "1/2" in pass_rate
    empty = tables.write_reports(tables.frame([]), tmp_path / "empty", "empty")
    assert all(p.exists() for p in empty)


@pytest.mark.L0
def test_records_merge_worker_files(tmp_path):
    records.append_jsonl(tmp_path / "records-gw0.jsonl", ROWS[:2])
    records.append_jsonl(tmp_path / "records-gw1.jsonl.gz", ROWS[2:])
    (tmp_path / "other.jsonl").write_text('{"ignored": true}\n')
    assert records.read_folder(tmp_path) == ROWS


@pytest.mark.L0
def test_level_expressions():
    assert [cli.marker_expression(level) for level in cli.LEVELS] == ["L0", "L0 or L1", "L0 or L1 or L2"]


@pytest.mark.L0
def test_frost_report_under_xdist(tmp_path, capfd):
    """The CLI end to end on a small selection with two xdist workers: both workers' records merge."""
    selection = [str(SUITES / "test_native_engines.py"), "-k", "dense-bf16 or thd-empty-tails or sinks-window-gqa", "-p",
                 "no:cacheprovider"]  # fmt: skip
    status = cli.main(["--level", "L0", "--out", str(tmp_path), "-n", "2", "--", *selection])
    printed = capfd.readouterr().out
    assert status == 0, printed
    assert sorted(p.name for p in (tmp_path / "records").glob("records-*")) == ["records-gw0.jsonl.gz",
                                                                               "records-gw1.jsonl.gz"]
    df = pd.read_csv(tmp_path / "cases.csv.gz")
    assert df["test_id"].nunique() == 6 and df["passed"].all()
    assert set(df["worker"]) == {"gw0", "gw1"}
    assert set(df["engine"]) == {"torch-sdpa", "unfused"}
    assert "frost routing summary" in printed and "12 cases (6 routed, 6 forced): 12 passed, 0 failed" in printed
    assert "torch-sdpa (forward): unsupported: packed (THD) layout with cu_seqlens" in printed
    assert (tmp_path / "routing.md").exists() and (tmp_path / "pass_rate.md").exists()
    # the progress line once pytest is done (both workers' tests), then the slowest tests from junit.xml
    assert f"frost-report: [{'#' * progress.BAR_WIDTH}] 6/6 tests, " in printed
    assert "frost-report: slowest 6 tests (setup + call + teardown):" in printed and "GPU tests" not in printed


# error statistics, drift, the run folder and its HTML page -----------------------------

FUZZ_ROWS = [
    {**_row("f1", "unfused", True, ratio=0.2), "property": "forward_matches_oracle", "features": "thd causal",
     "feature_group": "thd+causal", "reproduce": "python -m frost_harness.fuzz.replay a"},
    {**_row("f2", "unfused", True, ratio=0.6), "property": "forward_matches_oracle", "features": "thd",
     "feature_group": "thd", "reproduce": "python -m frost_harness.fuzz.replay b"},
    {**_row("f3", "unfused", False, ratio=3.0), "property": "forward_matches_oracle", "features": "causal",
     "feature_group": "causal", "reproduce": "python -m frost_harness.fuzz.replay c"},
    {**_row("g1", "torch-sdpa", True, ratio=0.1), "features": "", "feature_group": "dense"},
    {**_row("e1", "unfused", False, ratio=None), "output": "*", "error": "RuntimeError: boom"},
]  # fmt: skip


@pytest.mark.L0
def test_error_stats_per_feature_and_combination():
    stat = stats.error_stats(tables.frame(FUZZ_ROWS))
    by_feature = stat[(stat["by"] == "feature") & (stat["engine"] == "unfused")].set_index("group")
    assert by_feature.loc["all", ["cases", "failures", "max_ratio"]].tolist() == [3, 1, 3.0]
    assert by_feature.loc["thd", ["cases", "failures", "median_ratio", "max_ratio"]].tolist() == [2, 0, 0.4, 0.6]
    assert by_feature.loc["causal", ["worst_case", "reproduce"]].tolist() == ["f3", "python -m frost_harness.fuzz.replay c"]
    grid = stat[stat["engine"] == "torch-sdpa"]
    assert set(grid["property"]) == {"grid"} and set(grid["group"]) == {"dense", "all"}
    assert set(stat[stat["by"] == "feature_group"]["group"]) == {"thd+causal", "thd", "causal", "dense"}
    assert stats.error_stats(tables.frame([])).empty


@pytest.mark.L0
def test_drift_flags_what_moved():
    keys = dict(property="p", engine="e", direction="forward", output="o", by="feature")
    def stat(group, median, maximum, failures=0):
        return {**keys, "group": group, "cases": 10, "failures": failures, "median_ratio": median, "max_ratio": maximum}
    before = pd.DataFrame([stat("a", 0.1, 0.5), stat("b", 0.1, 0.5), stat("c", 0.1, 0.5), stat("d", 0.1, 0.5),
                           stat("gone", 0.1, 0.2)])  # fmt: skip
    now = pd.DataFrame([stat("a", 0.1, 0.5), stat("b", 0.3, 0.6), stat("c", 0.1, 0.9), stat("d", 0.1, 2.0, 1),
                        stat("new", 0.1, 0.1)])  # fmt: skip
    flags = dict(zip(stats.drift(now, before)["group"], stats.drift(now, before)["flag"]))
    assert flags == {"a": "", "b": "median x3", "c": "max crossed 0.8", "d": "new failures", "new": "new group",
                     "gone": "gone"}  # fmt: skip
    assert list(stats.drift(now, before)["group"][:3]) == ["d", "c", "b"]  # flagged first, largest rise first


def _run_folder(parent, name, rows, started):
    folder = parent / name
    (folder / "records").mkdir(parents=True, exist_ok=True)
    records.append_jsonl(folder / "records" / "records-gw0.jsonl", rows)
    meta = {"key": "fuzz-cpu", "title": name, "started": started}
    return folder, publish.write_run(folder, meta, plots=False)


@pytest.mark.L0
def test_run_folder_report_with_drift(tmp_path):
    first, paths = _run_folder(tmp_path, "first", FUZZ_ROWS[:2], "2026-01-01T00:00:00")
    assert [p.name for p in paths] == ["cases.csv.gz", "routing.md", "pass_rate.md", "stats.csv", "run.json",
                                       "report.html"]  # fmt: skip
    (tmp_path / "second" / "records").mkdir(parents=True)
    records.append_jsonl(tmp_path / "second" / "records" / "fuzz-gw0.jsonl", [
        {"test_id": "t::a", "worker": "gw0", "gpu": "3", "chunk": 0, "seed": 11, "examples": 30, "seconds": 6.0,
         "outcome": "passed", "failure": ""},
        {"test_id": "t::b", "worker": "gw0", "gpu": "3", "chunk": 0, "seed": 12, "examples": 2, "seconds": 1.0,
         "outcome": "failed", "failure": "PropertyFailure: b failed\ncase: x\nreproduce: python -m frost_harness.fuzz.replay b"},
    ])  # fmt: skip
    second, paths = _run_folder(tmp_path, "second", FUZZ_ROWS, "2026-01-02T00:00:00")
    assert {"drift.md", "drift.csv", "fuzz.md"} <= {p.name for p in paths}
    assert publish.previous_run(second, "fuzz-cpu", "2026-01-02T00:00:00") == first.resolve()
    assert publish.previous_run(first, "fuzz-cpu", "2026-01-01T00:00:00") is None
    assert "new failures" in (second / "drift.md").read_text()
    fuzz_md = (second / "fuzz.md").read_text()
    assert "32 examples in 2 chunks" in fuzz_md and "| 3 | gw0 | 2 | 32 | 7 | 274 | 1 |" in fuzz_md
    assert "python -m frost_harness.fuzz.replay b" in fuzz_md
    page = (second / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<img" not in page and "plots need matplotlib" in page
    for text in ("Failures", "RuntimeError: boom", "python -m frost_harness.fuzz.replay c", "Error statistics per feature",
                 "Drift against the previous run", "new failures", "Per worker and GPU"):  # fmt: skip
        assert text in page, text


@pytest.mark.L0
def test_html_plots_are_embedded(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots extra (matplotlib) is not installed")
    df = tables.frame(FUZZ_ROWS)
    page = html.render({"title": "plots"}, df, stats.error_stats(df), None, fuzzlog.frame([]), plots=True)
    assert page.count('<img alt="plot" src="data:image/png;base64,') == 2 and "http" not in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.L1
@pytest.mark.skipif(_chromium() is None, reason="no chromium to render the page (apt-get install chromium)")
def test_html_report_renders_in_headless_chromium(tmp_path):
    """A real browser opens report.html: the DOM has the report's sections and a screenshot is drawn."""
    folder, _ = _run_folder(tmp_path, "run", FUZZ_ROWS, "2026-01-01T00:00:00")
    page = (folder / "report.html").as_uri()
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    dom = subprocess.run([*browser, "--dump-dom", page], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for text in ("Failures", "Error statistics per feature", "python -m frost_harness.fuzz.replay c", "Routing"):
        assert text in dom.stdout, text
    shot = tmp_path / "report.png"
    subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1280,1600", page],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


# the verdict: pytest's account, not the records alone ---------------------------------

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="1"
 skipped="1" tests="4"><testcase classname="suites.test_x" name="test_ok" time="0.1"/>
<testcase classname="suites.test_x" name="test_bad[a-1]" time="0.1"><failure message="assert 1 == 2&#10;more">
trace</failure></testcase><testcase classname="" name="suites/test_broken.py" time="0"><error
 message="collection failure">ImportError</error></testcase><testcase classname="suites.test_x" name="test_skip"
 time="0"><properties><property name="gpu" value="1"/></properties><skipped message="no"/></testcase>
<testcase classname="suites.test_x" name="test_limit[w0]" time="0.1"><skipped
 type="pytest.xfail" message="known limit"/></testcase></testsuite></testsuites>"""


@pytest.mark.L0
def test_junit_is_read_test_by_test(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    junit = verdict.read_junit(tmp_path / "junit.xml")
    assert (junit.total, junit.skipped) == (5, 2)
    assert junit.xfailed == {"suites/test_x.py::test_limit[w0]"}
    assert junit.failed == [("suites/test_x.py::test_bad[a-1]", "assert 1 == 2")]
    assert junit.errors == [("suites/test_broken.py", "collection failure")]
    assert [(c.test_id, c.outcome, c.message, c.gpu) for c in junit.cases] == [
        ("suites/test_x.py::test_ok", "passed", "", False),
        ("suites/test_x.py::test_bad[a-1]", "failed", "assert 1 == 2", False),
        ("suites/test_broken.py", "error", "collection failure", False),
        ("suites/test_x.py::test_skip", "skipped", "no", True),  # marked gpu
        ("suites/test_x.py::test_limit[w0]", "xfailed", "known limit", False)]
    assert junit.counts() == "5 tests: 1 passed, 1 failed, 1 errors, 2 skipped"
    assert verdict.read_junit(tmp_path / "missing.xml") is None


def _case(test_id, outcome="passed", seconds=1.0, message="", gpu=False):
    return verdict.JunitCase(test_id, outcome, seconds, message, gpu)


@pytest.mark.L0
def test_slowest_tests_and_gpu_tests_from_junit():
    cases = [_case(f"t.py::test_{k}", seconds=k) for k in range(25)] + [
        _case("g.py::test_fwd[a]", gpu=True), _case("g.py::test_fwd[b]", "failed", gpu=True),
        _case("g.py::test_bwd[a]", "skipped", message="needs a CUDA device", gpu=True),
        _case("g.py::test_bwd[b]", "skipped", message="needs a CUDA device", gpu=True),
        _case("g.py::test_racecheck", "skipped", message="no compute-sanitizer", gpu=True)]  # fmt: skip
    junit = verdict.JunitTests(total=len(cases), cases=cases)
    slowest = junit_summary.slowest_lines(junit)
    assert len(slowest) == 21 and slowest[0] == "slowest 20 tests (setup + call + teardown):"
    assert slowest[1].split() == ["24.00", "s", "t.py::test_24", "(passed)"] and "test_5 " in slowest[-1]
    assert junit_summary.gpu_lines(junit) == [
        "GPU tests: 5 selected, 2 ran, 3 skipped",
        "  ran g.py::test_fwd: 1 failed, 1 passed",
        "  skipped 2: needs a CUDA device",
        "    g.py::test_bwd (2)",
        "  skipped 1: no compute-sanitizer",
        "    g.py::test_racecheck (1)",
    ]
    assert junit_summary.gpu_lines(verdict.JunitTests(total=1, cases=cases[:1])) == []  # no GPU test selected


@pytest.mark.L0
def test_progress_line():
    assert progress.Progress().line() == "collecting"
    assert progress.Progress(collected=8, done=2).line() == f"[{'#' * 6}{' ' * 18}] 2/8 tests"
    assert progress.Progress(collected=8, done=8, failed=1, collection_errors=1).line().endswith("8/8 tests, 2 failed")
    assert progress.Progress(collected=0).line() == f"[{'#' * 24}] 0/0 tests"
    assert progress.clock(125.7) == "2:05" and progress.clock(-4) == "0:00"


REPORTED_MODULE = """
import pytest

pytestmark = pytest.mark.L0


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 2])
def test_on_gpu(n):
    pass


def test_passes():
    pass


def test_fails():
    assert False, "injected"
"""


@pytest.mark.L0
def test_frost_report_with_a_failing_test_is_red_and_says_which_gpu_tests_ran(tmp_path, capfd):
    """A failing test makes frost-report red; its progress line counts every test, and the GPU tests
    it selected are listed as run or skipped, with the reason (on a CPU: no CUDA device)."""
    (tmp_path / "test_reported.py").write_text(REPORTED_MODULE)
    status = cli.main(["--level", "L0", "--out", str(tmp_path / "out"), "--", str(tmp_path / "test_reported.py"),
                       "-p", "frost_harness.suites.conftest", f"--rootdir={tmp_path}", "-p", "no:cacheprovider"])
    printed = capfd.readouterr().out
    assert status == 1, printed
    assert "frost-report: FAILED: pytest exit 1 (tests failed); 1 tests failed, 0 errored" in printed
    assert "frost-report:   FAILED test_reported.py::test_fails: AssertionError: injected" in printed
    assert progress.read(tmp_path / "out" / "records") == progress.Progress(collected=4, done=4, failed=1)
    assert f"frost-report: [{'#' * progress.BAR_WIDTH}] 4/4 tests, 1 failed, " in printed
    assert "frost-report: slowest 4 tests (setup + call + teardown):" in printed
    import torch

    ran = 2 if torch.cuda.is_available() else 0
    assert f"frost-report: GPU tests: 2 selected, {ran} ran, {2 - ran} skipped" in printed
    assert ran or "frost-report:   skipped 2: needs a CUDA device\nfrost-report:     test_reported.py::test_on_gpu (2)" in printed


@pytest.mark.L0
def test_verdict_is_red_whenever_pytest_is():
    green_junit = verdict.JunitTests(total=3)
    assert verdict.judge(0, green_junit, [], []).passed
    # every harness case passed, but pytest failed a test of its own: red, and the test named
    failing = verdict.JunitTests(total=3, failed=[("suites/test_a.py::test_b", "assert False")])
    judged = verdict.judge(1, failing, [], [])
    assert not judged.passed and judged.headline.startswith("FAILED: pytest exit 1 (tests failed)")
    assert judged.problems == ["FAILED suites/test_a.py::test_b: assert False"]
    # pytest errored before running anything: "0 of 0" must not read green
    assert not verdict.judge(5, verdict.JunitTests(), [], []).passed
    assert "no tests were collected" in verdict.judge(5, verdict.JunitTests(), [], []).headline
    assert not verdict.judge(0, None, [], []).passed, "a run without junit.xml is not green"
    assert not verdict.judge(4, None, [], []).passed
    # a failed case of a test junit already lists is not listed twice
    cases = [("suites/test_a.py::test_b", "CASE suites/test_a.py::test_b [forward unfused] worst ratio 2")]
    assert verdict.judge(1, failing, cases, []).problems == judged.problems
    assert not verdict.judge(None, None, [], ["FUZZ t on gw0"]).passed  # a merged report: records judge
    # a failed case of an expected failure (xfail: a documented limit) is not a problem; of any other test it is
    limit = [("suites/test_x.py::test_limit[w0]", "CASE suites/test_x.py::test_limit[w0] [backward sm80] worst ratio 1.04")]
    xfail_junit = verdict.JunitTests(total=3, skipped=1, xfailed={"suites/test_x.py::test_limit[w0]"})
    assert verdict.judge(0, xfail_junit, limit, []).passed
    assert not verdict.judge(0, verdict.JunitTests(total=3), limit, []).passed


@pytest.mark.L0
def test_report_page_leads_with_the_verdict_and_engine_lines(tmp_path):
    folder = tmp_path / "run"
    (folder / "records").mkdir(parents=True)
    passing = [_row("suites/t.py::t1", "unfused", True, ratio=0.95), _row("suites/t.py::t2", "unfused", True)]
    records.append_jsonl(folder / "records" / "records-gw0.jsonl.gz", passing)
    (folder / "junit.xml").write_text(JUNIT)
    publish.write_run(folder, {"key": "L0", "title": "t", "started": "2026-01-01", "pytest_exit": 1}, plots=False)
    page = (folder / "report.html").read_text()
    head = page[: page.index("<table>")]
    assert "<p class='fail'>FAILED: pytest exit 1" in head and "suites/test_x.py::test_bad[a-1]" in head
    assert "suites/test_broken.py" in head
    assert "unfused forward: 2 cases, 0 failed, worst ratio 0.95, 1 near misses (&gt;= 0.9 of the allowance)" in head
    meta = json.loads((folder / "run.json").read_text())
    assert meta["verdict"].startswith("FAILED") and len(meta["problems"]) == 2


@pytest.mark.L0
def test_long_tables_show_their_top_rows_and_count_the_rest():
    text = html._table(pd.DataFrame({"a": range(html.TOP_ROWS + 7)}))
    assert text.count("<tr>") == html.TOP_ROWS + 1 and "and 7 more rows" in text
    assert "more rows" not in html._table(pd.DataFrame({"a": range(3)}))


@pytest.mark.L0
def test_a_shrinking_failure_is_kept_once_shrunk():
    def row(case, passed, output="o"):
        return {"property": "p", "case": case, "engine": "unfused", "direction": "forward", "output": output,
                "passed": passed}  # fmt: skip

    rows = [row("big", True), row("fail-1", False), row("fail-1", True, "lse"), row("ok", True),
            row("fail-2", False), row("fail-3", False), row("fail-3", True, "lse")]  # fmt: skip
    kept = records.last_failure_only(rows)
    assert [r["case"] for r in kept] == ["big", "ok", "fail-3", "fail-3"]
    assert records.last_failure_only(rows[:3]) == rows[:3]


@pytest.mark.L0
def test_frost_report_with_nothing_collected_is_red(tmp_path, capfd):
    status = cli.main(["--level", "L0", "--out", str(tmp_path), "--", str(SUITES / "test_reports.py"), "-k",
                       "no_such_test", "-p", "no:cacheprovider"])  # fmt: skip
    printed = capfd.readouterr().out
    assert status == 5
    assert (tmp_path / "junit.xml").exists()
    assert "frost-report: FAILED: pytest exit 5 (no tests were collected)" in printed
    echoed = next(line for line in printed.splitlines() if line.startswith("frost-report: /"))
    # the echoed command pastes into a shell: the marker expression stays one word
    words = shlex.split(echoed.removeprefix("frost-report: "))
    assert words[words.index("-m", 3):][:3] == ["-m", "L0", "-q"]


@pytest.mark.L0
def test_console_summary_counts_expected_failures_apart():
    """pytest's xfailed tests' failed cases are 'failed as expected', listed as XFAIL, not FAILED."""
    rows = [_row(f"t.py::test_{name}", "sm80", ok, native=False, direction="backward", output="dq", ratio=ratio)
            for name, ok, ratio in (("a", True, 0.2), ("limit", False, 1.04), ("bad", False, 3.0))]  # fmt: skip
    lines = tables.summary_lines(tables.frame(rows), expected=frozenset({"t.py::test_limit"}))
    assert lines[0].endswith("1 passed, 1 failed, 1 failed as expected (xfail)"), lines[0]
    assert any(line.startswith("FAILED t.py::test_bad") for line in lines)
    assert any(line.startswith("XFAIL t.py::test_limit") for line in lines)
    assert not any(line.startswith("FAILED t.py::test_limit") for line in lines)


_NO_CHUNKS = pd.DataFrame(columns=list(records.FUZZ_COLUMNS))


@pytest.mark.L0
def test_failed_cases_a_passing_test_allowed_are_expected_and_no_others():
    """A passing test marked allows_failed_cases (a Hypothesis example marked xfail inside it, which
    pytest reports as a pass) expected its failed cases: counted apart, and the verdict stays green.
    A failed case of any other passing test turns it red: that test forgot to assert its verdict."""
    allowed = {**_row("t.py::test_property", "torch-sdpa", False, direction="backward", output="dk", ratio=2.56),
               "outcome": "passed", "expected": True}
    unasserted = {**_row("t.py::test_forgot", "unfused", False, ratio=3.0), "outcome": "passed"}
    lines = tables.summary_lines(tables.frame([allowed, _row("t.py::test_a", "sm80", True)]))
    assert lines[0].endswith("1 passed, 0 failed, 1 failed as expected (xfail)"), lines[0]
    assert any(line.startswith("XFAIL t.py::test_property") for line in lines)
    assert publish.judge_run(Path("/nonexistent"), {}, tables.frame([allowed]), _NO_CHUNKS).passed
    judged = publish.judge_run(Path("/nonexistent"), {}, tables.frame([allowed, unasserted]), _NO_CHUNKS)
    assert not judged.passed and judged.problems == [
        "CASE t.py::test_forgot [forward unfused] worst ratio 3"], judged.problems
