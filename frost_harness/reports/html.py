"""The self-contained HTML page of a run: the report's tables, and plots when matplotlib is there.

One file, ``report.html``, next to the Markdown: inline CSS, plots embedded as base64
PNG, no script and nothing fetched, so it opens from a CI artifact or a mail
attachment. Without matplotlib (the optional ``plots`` extra) the page has the tables
only and says so. Sections: the run's facts, failures (with their reproduction
lines), fuzz throughput per test and per GPU, error statistics per feature, drift
against the previous run, pass rates, routing. The verdict (``frost_harness.reports.verdict``: red
whenever pytest failed, whatever the records say) and one line per engine x direction
lead the page; every long table shows its top rows and a count of the rest.
"""
from __future__ import annotations

import base64
import html
import importlib.util
import io
import math
from datetime import datetime

import numpy as np
import pandas as pd

from frost_harness.reports import fuzzlog, tables

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #eef2f7; } tr:nth-child(even) td { background: #fafafa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.fail { color: #b00020; font-weight: 600; } .ok { color: #1b7f3b; font-weight: 600; }
.note { color: #666; font-size: 0.9em; } code { font-size: 0.85em; word-break: break-all; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.4em 0; }
"""


def _plots_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


TOP_ROWS = 20  # a long table shows its top rows and counts the rest


def _table(df: pd.DataFrame, *, limit: int | None = TOP_ROWS) -> str:
    """An HTML table of the first ``limit`` rows (None: all) and a count of the rest; numbers
    right-aligned with 3 significant digits; long cells as code."""
    if df.empty:
        return '<p class="note">none</p>'
    shown = df.head(limit) if limit else df
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    body = []
    for row in shown.itertuples(index=False):
        cells = []
        for value in row:
            if isinstance(value, (float, np.floating)):
                text = "" if math.isnan(value) else f"{value:.3g}"
                cells.append(f'<td class="num">{text}</td>')
            elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                cells.append(f'<td class="num">{value}</td>')
            else:
                text = html.escape(str(value))
                cells.append(f"<td><code>{text}</code></td>" if len(text) > 60 else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = (f'<p class="note">and {len(df) - len(shown)} more rows (the CSV files have them all)</p>'
            if len(shown) < len(df) else "")  # fmt: skip
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def _png(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


_against_oracle = tables.against_oracle


def _ratio_histograms(df: pd.DataFrame) -> str:
    """log10(error/allowed) against the oracle per engine x direction, with the failing edge at 0."""
    import matplotlib.pyplot as plt

    rows = _against_oracle(df[pd.to_numeric(df["ratio"], errors="coerce") > 0])
    if rows.empty:
        return ""
    groups = list(rows.groupby(["engine", "direction"]))
    figure, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 2.8), squeeze=False)
    for axis, ((engine, direction), group) in zip(axes[0], groups):
        axis.hist(np.log10(group["ratio"].astype(float).clip(lower=1e-6)), bins=30, color="#4a78b5")
        axis.axvline(0.0, color="#b00020", linestyle="--", linewidth=1)
        axis.set_title(f"{engine} {direction}", fontsize=9)
        axis.set_xlabel("log10 error/allowed", fontsize=8)
        axis.tick_params(labelsize=7)
    return _png(figure)


def _feature_bars(feature_stats: pd.DataFrame) -> str:
    """Max and median ratio against the oracle per feature, one panel per engine x direction."""
    import matplotlib.pyplot as plt

    feature_stats = _against_oracle(feature_stats)
    if feature_stats.empty:
        return ""
    worst = feature_stats.groupby(["engine", "direction", "group"]).agg(
        max_ratio=("max_ratio", "max"), median_ratio=("median_ratio", "median")
    ).reset_index()
    groups = list(worst.groupby(["engine", "direction"]))
    figure, axes = plt.subplots(len(groups), 1, figsize=(10, 2.6 * len(groups)), squeeze=False)
    for axis, ((engine, direction), group) in zip(axes[:, 0], groups):
        x = np.arange(len(group))
        axis.bar(x - 0.2, group["max_ratio"], width=0.4, label="max", color="#c0504d")
        axis.bar(x + 0.2, group["median_ratio"], width=0.4, label="median", color="#4a78b5")
        axis.axhline(1.0, color="#b00020", linestyle="--", linewidth=1)
        axis.set_yscale("log")  # medians sit decades below the maxima
        axis.set_ylim(bottom=1e-6)
        axis.set_xticks(x, group["group"], rotation=45, ha="right", fontsize=7)
        axis.set_title(f"{engine} {direction}: error/allowed against the oracle, per feature", fontsize=9)
        axis.legend(fontsize=7)
    figure.tight_layout()
    return _png(figure)


def _drift_scatter(drift: pd.DataFrame) -> str:
    import matplotlib.pyplot as plt

    both = drift.dropna(subset=["max_ratio", "max_ratio_before"])
    if both.empty:
        return ""
    figure, axis = plt.subplots(figsize=(4.5, 4.5))
    axis.scatter(both["max_ratio_before"], both["max_ratio"], s=10, color="#4a78b5")
    top = max(1.0, float(both[["max_ratio", "max_ratio_before"]].max().max()))
    axis.plot([0, top], [0, top], color="#888", linewidth=1)
    axis.axhline(1.0, color="#b00020", linestyle="--", linewidth=1)
    axis.set_xlabel("max error/allowed, previous run", fontsize=8)
    axis.set_ylabel("max error/allowed, this run", fontsize=8)
    return _png(figure)


def _throughput_bars(per_gpu: pd.DataFrame) -> str:
    import matplotlib.pyplot as plt

    if per_gpu.empty:
        return ""
    labels = [f"{w} (GPU {g})" if g else w for g, w in zip(per_gpu["gpu"], per_gpu["worker"])]
    figure, axis = plt.subplots(figsize=(max(4, 0.8 * len(labels)), 2.8))
    axis.bar(labels, per_gpu["examples_per_minute"].fillna(0), color="#4a78b5")
    axis.set_ylabel("examples / minute", fontsize=8)
    axis.tick_params(axis="x", labelsize=7, rotation=45)
    return _png(figure)


def _verdict_block(judged, df: pd.DataFrame) -> list[str]:
    """The page's head: the verdict in its colour, the tests behind a red one (top entries and
    a count of the rest), and one line per engine x direction (worst ratio, near misses)."""
    shown = judged.problems[:TOP_ROWS]
    rest = len(judged.problems) - len(shown)
    parts = [f"<p class='{'ok' if judged.passed else 'fail'}'>{html.escape(judged.headline)}</p>"]
    if shown:
        parts.append("<ul>" + "".join(f"<li><code>{html.escape(line)}</code></li>" for line in shown) + "</ul>")
    if rest:
        parts.append(f"<p class='note'>and {rest} more (run.json lists them all)</p>")
    lines = tables.engine_summary_lines(df)
    if lines:
        parts.append("<pre>" + html.escape("\n".join(lines)) + "</pre>")
    return parts


def render(meta: dict, df: pd.DataFrame, stats: pd.DataFrame, drift: pd.DataFrame | None,
           chunks: pd.DataFrame, *, plots: bool | None = None, verdict=None) -> str:
    """The page. ``plots=None`` draws them when matplotlib is importable. ``verdict``
    (``frost_harness.reports.verdict.Verdict``) leads the page; without one the records alone judge."""
    plots = _plots_available() if plots is None else plots
    if plots:
        import matplotlib

        matplotlib.use("Agg")
    case_df = tables.cases(df)
    failed_rows = df[~df["passed"].fillna(False).astype(bool)]
    failures = failed_rows[["property", "engine", "direction", "output", "ratio", "case", "error", "reproduce"]]
    feature_stats = stats[stats["by"] == "feature"].drop(columns=["by"])
    title = html.escape(str(meta.get("title", "frost report")))
    if verdict is None:
        from frost_harness.reports import verdict as verdicts

        cases_failed = [(r.test_id, f"CASE {r.test_id}") for r in case_df[~case_df["passed"].astype(bool)].itertuples()]
        chunks_failed = [f"FUZZ {r.test_id}" for r in fuzzlog.failures(chunks).itertuples()]
        verdict = verdicts.judge(None, None, cases_failed, chunks_failed)
    passed = int(case_df["passed"].astype(bool).sum()) if not case_df.empty else 0
    facts = {name: value for name, value in meta.items() if name not in ("verdict", "problems")}
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>",
        f"<style>{_CSS}</style></head><body><h1>{title}</h1>",
        *_verdict_block(verdict, df),
        _table(pd.DataFrame({"fact": list(facts), "value": [str(v) for v in facts.values()]}), limit=None),
        f"<p class='note'>{passed} of {len(case_df)} harness cases passed (pytest's verdict is above)</p>",
        "<pre>" + html.escape("\n".join(tables.summary_lines(df))) + "</pre>",
        "<h2>Failures</h2>", _table(failures),
    ]
    if not chunks.empty:
        per_gpu = fuzzlog.per_gpu(chunks)
        parts += ["<h2>Fuzz: examples and throughput</h2>", "<h3>Per test</h3>", _table(fuzzlog.per_test(chunks)),
                  "<h3>Per worker and GPU</h3>", _table(per_gpu), _throughput_bars(per_gpu) if plots else "",
                  "<h3>Failing chunks</h3>", _table(fuzzlog.failures(chunks))]  # fmt: skip
    parts += ["<h2>Error statistics per feature</h2>",
              "<p class='note'>error/allowed ratio of each output (1 fails); a case counts under each of its "
              "feature tags and under <i>all</i>. stats.csv has these and the per-combination groups.</p>"]  # fmt: skip
    if plots:
        parts += [_ratio_histograms(df), _feature_bars(feature_stats)]
    parts.append(_table(feature_stats.drop(columns=["reproduce"]).sort_values("max_ratio", ascending=False)))
    parts.append("<h2>Drift against the previous run</h2>")
    if drift is None:
        parts.append("<p class='note'>no previous run of this kind to compare with</p>")
    else:
        parts.append(f"<p class='note'>previous run: {html.escape(str(meta.get('previous', '')))}</p>")
        if plots:
            parts.append(_drift_scatter(drift))
        flags = drift["flag"].fillna("")
        flagged = drift[~flags.isin(["", "new group", "gone"])]
        parts.append(f"<p class='note'>{len(flagged)} flagged groups; {int((flags == 'new group').sum())} groups "
                     f"new in this run, {int((flags == 'gone').sum())} gone (drift.csv has every group)</p>")
        parts.append(_table(flagged))
    parts += ["<h2>Pass rate per engine, direction and feature group</h2>",
              _table(tables.pass_rate(case_df).sort_values("worst_ratio", ascending=False)),
              "<h2>Routing</h2>", _table(tables.routing(case_df)),
              _table(tables.declines(case_df, top=20))]  # fmt: skip
    if not plots:
        parts.append("<p class='note'>plots need matplotlib (pip install -e '.[plots]')</p>")
    parts.append(f"<p class='note'>written {datetime.now():%Y-%m-%d %H:%M}</p></body></html>")
    return "\n".join(part for part in parts if part)


def render_mutation(meta: dict, outcomes: pd.DataFrame) -> str:
    """``frost-mutate``'s page: the mutation score against its target in its colour, the run's
    facts, then every mutant (survivors and broken runs first, each with the fault it plants
    and the test that killed it)."""
    title = html.escape(str(meta.get("title", "frost-mutate")))
    killed, judged, target = meta["killed"], meta["judged"], meta["target"]
    score = killed / judged if judged else 0.0
    passed = judged > 0 and score >= target
    headline = (f"mutation score {killed} of {judged} killed ({100 * score:.0f}%), target {100 * target:.0f}%"
                + (f"; {meta['not_run']} not run" if meta.get("not_run") else ""))
    facts = {name: value for name, value in meta.items() if name not in ("title", "survivors")}
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>",
        f"<style>{_CSS}</style></head><body><h1>{title}</h1>",
        f"<p class='{'ok' if passed else 'fail'}'>{html.escape(headline)}</p>",
        _table(pd.DataFrame({"fact": list(facts), "value": [str(v) for v in facts.values()]}), limit=None),
        "<h2>Mutants</h2>", _table(outcomes, limit=None),
        f"<p class='note'>written {datetime.now():%Y-%m-%d %H:%M}</p></body></html>",
    ]
    return "\n".join(parts)
