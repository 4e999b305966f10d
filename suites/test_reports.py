"""The records, the report tables, the pytest plugin under xdist and the frost-report CLI."""
from __future__ import annotations

import pandas as pd
import pytest

from reports import cli, records, tables


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
    assert [p.name for p in paths] == ["cases.csv", "routing.md", "pass_rate.md"]
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
    records.append_jsonl(tmp_path / "records-gw1.jsonl", ROWS[2:])
    (tmp_path / "other.jsonl").write_text('{"ignored": true}\n')
    assert records.read_folder(tmp_path) == ROWS


@pytest.mark.L0
def test_level_expressions():
    assert [cli.marker_expression(level) for level in cli.LEVELS] == ["L0", "L0 or L1", "L0 or L1 or L2"]


@pytest.mark.L0
def test_frost_report_under_xdist(tmp_path, capfd):
    """The CLI end to end on a small selection with two xdist workers: both workers' records merge."""
    selection = ["suites/test_native_engines.py", "-k", "dense-bf16 or thd-empty-tails or sinks-window-gqa", "-p",
                 "no:cacheprovider"]  # fmt: skip
    status = cli.main(["--level", "L0", "--out", str(tmp_path), "-n", "2", "--", *selection])
    printed = capfd.readouterr().out
    assert status == 0, printed
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == ["records-gw0.jsonl", "records-gw1.jsonl"]
    df = pd.read_csv(tmp_path / "cases.csv")
    assert df["test_id"].nunique() == 6 and df["passed"].all()
    assert set(df["worker"]) == {"gw0", "gw1"}
    assert set(df["engine"]) == {"torch-sdpa", "unfused"}
    assert "frost routing summary" in printed and "12 cases (6 routed, 6 forced): 12 passed, 0 failed" in printed
    assert "torch-sdpa (forward): unsupported: packed (THD) layout with cu_seqlens" in printed
    assert (tmp_path / "routing.md").exists() and (tmp_path / "pass_rate.md").exists()
