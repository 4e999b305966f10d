"""Error statistics of a run and their drift against the previous run.

The statistic of a report row is its error/allowed ratio (``ratio``: the worse of the
acceptance rule's two ratios, > 1 fails). ``error_stats`` groups the rows with a ratio
by property x engine x direction x output x group and gives the number of rows
(``cases``), how many failed (``failures``), the median, 90th percentile and maximum
ratio, and the case with the maximum (with its reproduction). Groups come two ways
(column ``by``):

- ``feature``: every feature tag of the problem on its own (a row counts once under
  each of its tags), plus ``all``: a few dozen groups even for a fuzz run, whose
  feature combinations number in the hundreds;
- ``feature_group``: the exact combination, as the pass-rate table has it.

Rows of the fixed suites have no property; they appear as ``grid``. Rows without a
ratio (an engine that raised) are left to the failure list of the report.

``drift(now, before)`` joins two runs' statistics on the group keys and shows how the
median and maximum ratio moved, so an output creeping toward its allowance shows
before it fails. A group is flagged when it newly fails, when its maximum crossed
``NEAR`` (close to failing) from below, or when its median grew by more than
``GROWTH`` (a factor); groups present in one run only are listed as such.
"""
from __future__ import annotations

import pandas as pd

KEYS = ["property", "engine", "direction", "output", "by", "group"]
STAT_COLUMNS = [*KEYS, "cases", "failures", "median_ratio", "p90_ratio", "max_ratio", "worst_case", "reproduce"]
NEAR = 0.8
GROWTH = 1.5


def _rows_with_ratio(df: pd.DataFrame) -> pd.DataFrame:
    rows = df[pd.to_numeric(df["ratio"], errors="coerce").notna()].copy()
    rows["ratio"] = rows["ratio"].astype(float)
    rows["passed"] = rows["passed"].astype(bool)
    rows["property"] = rows["property"].astype(object).fillna("").replace("", "grid")
    return rows


def error_stats(df: pd.DataFrame) -> pd.DataFrame:
    """Statistics per property x engine x direction x output x group (``by``: feature, feature_group)."""
    rows = _rows_with_ratio(df)
    if rows.empty:
        return pd.DataFrame(columns=STAT_COLUMNS)
    tags = rows["features"].astype(object).fillna("").map(lambda text: text.split() or ["dense"])
    per_feature = rows.assign(group=tags.map(lambda t: [*t, "all"]), by="feature").explode("group")
    per_combination = rows.assign(group=rows["feature_group"], by="feature_group")
    both = pd.concat([per_feature, per_combination], ignore_index=True)
    grouped = both.groupby(KEYS, sort=True, dropna=False)
    stats = grouped.agg(
        cases=("ratio", "size"),
        failures=("passed", lambda s: int((~s).sum())),
        median_ratio=("ratio", "median"),
        p90_ratio=("ratio", lambda s: s.quantile(0.9)),
        max_ratio=("ratio", "max"),
    ).reset_index()
    worst = both.loc[grouped["ratio"].idxmax().values, [*KEYS, "case", "reproduce"]]
    worst = worst.rename(columns={"case": "worst_case"})
    table = stats.merge(worst, on=KEYS, how="left")[STAT_COLUMNS]
    # The reproduction lines are the bulk of the file (a fuzz run has hundreds of feature
    # combinations, each naming a whole Case): keep them for the per-feature groups, which
    # the report shows; a combination's worst case is still named.
    table["reproduce"] = table["reproduce"].astype(object).where(table["by"] == "feature", "")
    return table


def drift(now: pd.DataFrame, before: pd.DataFrame) -> pd.DataFrame:
    """``now`` and ``before`` statistics side by side, with the changes and a flag; flagged first."""
    columns = ["cases", "failures", "median_ratio", "max_ratio"]
    joined = now[[*KEYS, *columns]].merge(
        before[[*KEYS, *columns]], on=KEYS, how="outer", suffixes=("", "_before"), indicator=True
    )
    joined["median_change"] = joined["median_ratio"] / joined["median_ratio_before"]
    joined["max_change"] = joined["max_ratio"] - joined["max_ratio_before"]

    def flag(row) -> str:
        if row["_merge"] == "left_only":
            return "new group"
        if row["_merge"] == "right_only":
            return "gone"
        if row["failures"] > 0 and row["failures_before"] == 0:
            return "new failures"
        if row["max_ratio"] >= NEAR > row["max_ratio_before"]:
            return f"max crossed {NEAR}"
        if row["median_ratio_before"] > 0 and row["median_change"] > GROWTH:
            return f"median x{row['median_change']:.2g}"
        return ""

    joined["flag"] = joined.apply(flag, axis=1) if not joined.empty else pd.Series(dtype=str)
    order = joined["flag"].isin(["", "new group", "gone"])
    joined = joined.assign(_order=order).sort_values(["_order", "max_change"], ascending=[True, False])
    return joined.drop(columns=["_merge", "_order"]).reset_index(drop=True)
