"""A run folder's report: everything ``frost-report`` and ``frost-fuzz`` write into it.

A run folder holds ``records/`` (the pytest plugin's JSON-lines files: one
``records-<worker>.jsonl.gz`` per test process, and ``fuzz-<worker>.jsonl`` chunk logs
under ``frost-fuzz``) and, after ``write_run``:

- ``junit.xml``: pytest's own account of every test (the runners pass ``--junitxml``);
- ``run.json``: the run's facts (``key`` names its kind, e.g. ``L0`` or ``fuzz-cpu``;
  ``started``; the pytest exit status; the runner's settings; the verdict and the tests
  behind a red one, ``frost_harness.reports.verdict``);
- ``cases.csv.gz``, ``routing.md``, ``pass_rate.md`` (``frost_harness.reports.tables``);
- ``stats.csv``: error statistics (``frost_harness.reports.stats.error_stats``);
- ``drift.md`` / ``drift.csv``: the statistics against the previous run of the same
  key, the newest sibling folder (same parent) that started earlier and has a
  ``stats.csv``; absent when there is none;
- ``fuzz.md`` (fuzz runs): examples, time and throughput per test and per GPU; pytest's counts
  of the tests (junit.xml), every failed or errored test, chunk or not, the tests that ran outside
  any chunk, and the failing chunks;
- ``report.html``: all of it on one self-contained page (``frost_harness.reports.html``).
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from frost_harness.reports import fuzzlog, html, records, stats, tables, verdict

RUN_FILE = "run.json"


def previous_run(folder: Path, key: str, started: str) -> Path | None:
    """The newest sibling run of the same ``key`` that started before ``started`` and has statistics."""
    candidates = []
    for sibling in folder.resolve().parent.iterdir():
        meta_path = sibling / RUN_FILE
        if sibling == folder.resolve() or not meta_path.is_file() or not (sibling / "stats.csv").is_file():
            continue
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("key") == key and meta.get("started", "") < started:
            candidates.append((meta["started"], sibling))
    return max(candidates)[1] if candidates else None


def write_run(folder: Path, meta: dict, *, plots: bool | None = None) -> list[Path]:
    """Write the report files of ``folder`` from its records; ``meta`` needs ``key``, ``started``, ``title``."""
    folder = Path(folder)
    df = tables.frame(records.read_folder(folder / "records"))
    chunks = fuzzlog.frame(records.read_folder(folder / "records", prefix="fuzz"))
    paths = tables.write_reports(df, folder, meta["title"])
    now = stats.error_stats(df)
    now.to_csv(folder / "stats.csv", index=False)
    paths.append(folder / "stats.csv")
    previous = previous_run(folder, meta["key"], meta["started"])
    drift = None
    if previous is not None:
        meta = {**meta, "previous": str(previous)}
        drift = stats.drift(now, pd.read_csv(previous / "stats.csv"))
        drift.to_csv(folder / "drift.csv", index=False)
        paths += [folder / "drift.csv", _write_drift(folder / "drift.md", drift, previous, meta["title"])]
    junit = verdict.read_junit(folder / verdict.JUNIT_FILE)
    if not chunks.empty or (junit is not None and meta["key"].startswith("fuzz")):  # a fuzz run, chunks or not
        paths.append(_write_fuzz(folder / "fuzz.md", chunks, junit, meta))
    judged = judge_run(folder, meta, df, chunks)
    meta = {**meta, "verdict": judged.headline, "problems": judged.problems}
    (folder / RUN_FILE).write_text(json.dumps(meta, indent=2, default=str), encoding="utf-8")
    paths.append(folder / RUN_FILE)
    page = folder / "report.html"
    page.write_text(html.render(meta, df, now, drift, chunks, plots=plots, verdict=judged), encoding="utf-8")
    paths.append(page)
    return paths


def judge_run(folder: Path, meta: dict, df: pd.DataFrame, chunks: pd.DataFrame) -> verdict.Verdict:
    """The run's verdict (``frost_harness.reports.verdict``) from pytest's exit status, junit.xml and the records.
    A merged report (no ``pytest_exit``) is judged on the records alone."""
    junit = verdict.read_junit(folder / verdict.JUNIT_FILE)
    failed = tables.cases(df)
    failed = failed[~failed["passed"].astype(bool) & ~failed["expected"].astype(bool)]  # see allows_failed_cases
    lines = [(r.test_id, f"CASE {r.test_id} [{r.direction} {r.engine}] worst ratio {r.ratio:.3g}")
             for r in failed.itertuples()]  # fmt: skip
    chunk_lines = [f"FUZZ {r.test_id} on {r.worker} (chunk seed {r.seed}): {r.failure}"
                   for r in fuzzlog.failures(chunks).itertuples()]  # fmt: skip
    return verdict.judge(meta.get("pytest_exit"), junit, lines, chunk_lines)


def _write_drift(path: Path, drift: pd.DataFrame, previous: Path, title: str) -> Path:
    flagged = drift[~drift["flag"].fillna("").isin(["", "new group", "gone"])]
    new, gone = int((drift["flag"] == "new group").sum()), int((drift["flag"] == "gone").sum())
    path.write_text(
        f"# Drift: {title}\n\nAgainst {previous}. {len(flagged)} flagged groups; {new} groups new in this run, "
        f"{gone} gone (drift.csv has every group).\n\n{tables.markdown(flagged.head(100))}",
        encoding="utf-8",
    )
    return path


def _write_fuzz(path: Path, chunks: pd.DataFrame, junit: verdict.JunitTests | None, meta: dict) -> Path:
    # the runner's rates (frost_harness.fuzz.nightly): over the fuzzing's wall-clock time, prewarm not included
    rates = fuzzlog.throughput_lines(chunks, meta["fuzz_s"]) if meta.get("fuzz_s") else []
    prewarm = meta.get("prewarm")
    facts = [f"- {line}" for line in rates] + ([f"- prewarm (before the budget): {prewarm}"] if prewarm else [])
    tests = (f"pytest (junit.xml): {junit.counts()}." if junit is not None
             else "No junit.xml: pytest's account of the tests is missing (a merged report has none).")
    examples = f"{int(chunks['examples'].sum())} examples in {len(chunks)} chunks."
    sections = [f"# Fuzz: {meta['title']}\n\n{examples} {tests}\n"]
    if facts:
        sections.append("\n".join(facts) + "\n")
    if junit is not None:
        sections += [f"## Failed and errored tests\n\n{tables.markdown(fuzzlog.failed_tests(junit, chunks))}",
                     f"## Tests outside chunks\n\n{tables.markdown(fuzzlog.outside_chunks(junit, chunks))}"]
    sections += [f"## Per test\n\n{tables.markdown(fuzzlog.per_test(chunks))}",
                 f"## Per worker and GPU\n\n{tables.markdown(fuzzlog.per_gpu(chunks))}",
                 f"## Failing chunks\n\n{tables.markdown(fuzzlog.failures(chunks))}"]
    path.write_text("\n".join(sections), encoding="utf-8")
    return path
