"""The report tables, built with pandas from the harness records (``frost_harness.reports.records``).

A *case* is one (test, case, direction, engine, mode) of the records: it passed when
every output did, and its ratio is its worst output's error/allowed ratio. A case is
*routed* when dispatch chose the engine, *forced* when the test named it; routing
figures count routed cases only, pass rates count both.

- ``cases.csv.gz``: every record, one row per output (gzip-compressed CSV; pandas and
  ``zcat`` read it);
- ``routing.md``: routed cases per engine, the share served by frost's own (non-native)
  engines, the top decline reasons;
- ``pass_rate.md``: pass rate per engine x feature group;
- ``engine_summary``: per engine x direction, the worst ratio against the oracle and the
  near misses (the line each report leads with).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from frost_harness.reports.records import COLUMNS

_CASE_KEYS = ["test_id", "case", "direction", "engine", "mode"]
_PASS_RATE_COLUMNS = ["engine", "direction", "feature_group", "cases", "passed", "pass_rate", "worst_ratio"]


def frame(rows: list[dict]) -> pd.DataFrame:
    """The records as a DataFrame with every column of ``COLUMNS``."""
    return pd.DataFrame(rows, columns=list(COLUMNS))


def cases(df: pd.DataFrame) -> pd.DataFrame:
    """One row per case: passed = every output passed, ratio = the worst output's."""
    if df.empty:
        return pd.DataFrame(columns=[*_CASE_KEYS, "native", "dtype", "feature_group", "declined", "passed", "ratio",
                                     "expected"])
    grouped = df.groupby(_CASE_KEYS, sort=False, dropna=False)
    return grouped.agg(
        native=("native", "first"),
        dtype=("dtype", "first"),
        feature_group=("feature_group", "first"),
        declined=("declined", "first"),
        passed=("passed", lambda s: bool(s.astype(bool).all())),
        ratio=("ratio", "max"),
        expected=("expected", lambda s: bool(s.eq(True).any())),  # a failure its test expected; NaN: old records
    ).reset_index()


def routing(case_df: pd.DataFrame) -> pd.DataFrame:
    """Routed cases per (direction, engine) and their share of the direction."""
    routed = case_df[case_df["mode"] == "routed"]
    if routed.empty:
        return pd.DataFrame(columns=["direction", "engine", "native", "cases", "share"])
    table = routed.groupby(["direction", "engine"], dropna=False).agg(
        native=("native", "first"), cases=("test_id", "size")
    ).reset_index()
    table["share"] = table["cases"] / table.groupby("direction")["cases"].transform("sum")
    return table.sort_values(["direction", "cases"], ascending=[False, False], ignore_index=True)


def own_share(case_df: pd.DataFrame) -> tuple[int, int]:
    """(routed cases served by frost's own engines, routed cases)."""
    routed = case_df[case_df["mode"] == "routed"]
    return int((~routed["native"].astype(bool)).sum()), len(routed)


def declines(case_df: pd.DataFrame, top: int = 10) -> pd.DataFrame:
    """The most frequent (direction, engine, reason) declines over routed cases."""
    routed = case_df[(case_df["mode"] == "routed") & case_df["declined"].fillna("").astype(bool)]
    pairs = [
        (direction, *entry.split(": ", 1))
        for direction, declined in zip(routed["direction"], routed["declined"])
        for entry in declined.split(" | ")
    ]
    table = pd.DataFrame(pairs, columns=["direction", "engine", "reason"])
    if table.empty:
        return table.assign(cases=pd.Series(dtype=int))
    counted = table.value_counts().rename("cases").reset_index()
    return counted.sort_values("cases", ascending=False, ignore_index=True).head(top)


def pass_rate(case_df: pd.DataFrame) -> pd.DataFrame:
    """Per engine x direction x feature group: cases, passed, pass rate, worst ratio."""
    if case_df.empty:
        return pd.DataFrame(columns=_PASS_RATE_COLUMNS)
    table = case_df.groupby(["engine", "direction", "feature_group"], dropna=False).agg(
        cases=("passed", "size"), passed=("passed", "sum"), worst_ratio=("ratio", "max")
    ).reset_index()
    table["pass_rate"] = table["passed"] / table["cases"]
    return table[_PASS_RATE_COLUMNS]


def markdown(df: pd.DataFrame) -> str:
    """A GitHub-flavoured Markdown table (no extra dependency)."""
    def cell(value) -> str:
        if isinstance(value, float):
            return "" if pd.isna(value) else f"{value:.3g}"
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def summary_lines(df: pd.DataFrame, top: int = 5, expected: frozenset[str] = frozenset()) -> list[str]:
    """A short console summary: counts, routing, share of frost's own engines, declines, failures.
    ``expected``: test ids pytest reported as expected failures (xfail); their failed cases are
    counted and listed as such, not as failures. So are the failed cases a passing test marked
    ``allows_failed_cases`` expected (the records' ``expected`` column)."""
    case_df = cases(df)
    if case_df.empty:
        return ["no accuracy-harness cases in this run"]
    not_passed = case_df[~case_df["passed"].astype(bool)]
    as_expected = not_passed["test_id"].isin(expected) | not_passed["expected"].astype(bool)
    failed, xfailed = not_passed[~as_expected], not_passed[as_expected]
    routed_count = int((case_df["mode"] == "routed").sum())
    lines = [
        f"{len(case_df)} cases ({routed_count} routed, {len(case_df) - routed_count} forced): "
        f"{len(case_df) - len(not_passed)} passed, {len(failed)} failed"
        + (f", {len(xfailed)} failed as expected (xfail)" if len(xfailed) else ""),
    ]
    per_engine = routing(case_df)
    if not per_engine.empty:
        lines.append("routed cases per engine: " + ", ".join(
            f"{r.direction} {r.engine} {r.cases} ({r.share:.0%})" for r in per_engine.itertuples()
        ))  # fmt: skip
    own, routed = own_share(case_df)
    lines.append(f"served by frost's own engines: {own} of {routed} routed cases"
                 + (f" ({own / routed:.0%})" if routed else ""))  # fmt: skip
    top_declines = declines(case_df, top)
    if not top_declines.empty:
        lines.append("top decline reasons:")
        lines += [f"  {r.cases:4d}  {r.engine} ({r.direction}): {r.reason}" for r in top_declines.itertuples()]
    for r in failed.head(10).itertuples():
        lines.append(f"FAILED {r.test_id} [{r.direction} {r.engine}] worst ratio {r.ratio:.3g}")
    for r in xfailed.head(10).itertuples():
        lines.append(f"XFAIL {r.test_id} [{r.direction} {r.engine}] worst ratio {r.ratio:.3g} (expected)")
    return lines


ORACLE_PROPERTIES = ("grid", "forward_matches_oracle", "backward_matches_oracle")
NEAR_MISS = 0.9  # a passing case at this share of its allowance or more is a near miss


def against_oracle(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows that measure an engine against the float64 oracle (not an identity's two sides)."""
    return rows[rows["property"].astype(object).fillna("grid").replace("", "grid").isin(ORACLE_PROPERTIES)]


def engine_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per engine x direction, against the oracle: cases, failed, worst ratio with its case, and
    near misses (passing cases at ``NEAR_MISS`` of their allowance or more)."""
    columns = ["engine", "direction", "cases", "failed", "worst_ratio", "near_misses", "worst_case"]
    case_df = cases(against_oracle(df))
    case_df = case_df[pd.to_numeric(case_df["ratio"], errors="coerce").notna()]
    if case_df.empty:
        return pd.DataFrame(columns=columns)
    case_df = case_df.assign(ratio=case_df["ratio"].astype(float), passed=case_df["passed"].astype(bool))
    rows = []
    for (engine, direction), group in case_df.groupby(["engine", "direction"], sort=True):
        worst = group.loc[group["ratio"].idxmax()]
        near = int((group["passed"] & (group["ratio"] >= NEAR_MISS)).sum())
        rows.append([engine, direction, len(group), int((~group["passed"]).sum()), float(worst["ratio"]), near,
                     f"{worst['test_id']} {worst['case']}"])  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def engine_summary_lines(df: pd.DataFrame) -> list[str]:
    """One line per engine x direction: the worst error/allowed ratio and the near misses."""
    return [
        f"{r.engine} {r.direction}: {r.cases} cases, {r.failed} failed, worst ratio {r.worst_ratio:.3g}, "
        f"{r.near_misses} near misses (>= {NEAR_MISS} of the allowance)"
        for r in engine_summary(df).itertuples()
    ]


def _percent(df: pd.DataFrame, column: str) -> pd.DataFrame:
    return df.assign(**{column: df[column].map(lambda x: f"{x:.0%}")})


CASES_FILE = "cases.csv.gz"


def write_reports(df: pd.DataFrame, folder: Path, title: str) -> list[Path]:
    """Write cases.csv.gz, routing.md and pass_rate.md into ``folder``; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    case_df = cases(df)
    own, routed = own_share(case_df)
    share = f" ({own / routed:.1%})" if routed else ""
    # gzip: a fuzz run's rows (one per output of every example) run to tens of MB as plain CSV
    paths = [folder / CASES_FILE, folder / "routing.md", folder / "pass_rate.md"]
    df.to_csv(paths[0], index=False)
    paths[1].write_text(
        f"# Routing: {title}\n\n"
        f"{routed} routed cases (dispatch chose the engine); served by frost's own engines: {own}{share}.\n\n"
        f"## Routed cases per engine\n\n{markdown(_percent(routing(case_df), 'share'))}\n"
        f"## Top decline reasons\n\n{markdown(declines(case_df, top=20))}",
        encoding="utf-8",
    )
    rates = pass_rate(case_df)
    grid = rates.assign(cell=rates["passed"].astype(int).astype(str) + "/" + rates["cases"].astype(str))
    grid = grid.pivot_table(index="feature_group", columns=["engine", "direction"], values="cell", aggfunc="first")
    grid.columns = [f"{engine} {direction}" for engine, direction in grid.columns]
    paths[2].write_text(
        f"# Pass rate: {title}\n\n"
        f"{int(case_df['passed'].astype(bool).sum())} of {len(case_df)} cases passed.\n\n"
        f"## Passed / cases per feature group and engine\n\n{markdown(grid.fillna('').reset_index())}\n"
        f"## Per engine x direction x feature group\n\n{markdown(_percent(rates, 'pass_rate'))}",
        encoding="utf-8",
    )
    return paths
