"""The fuzz runner's chunk log as tables: examples, time and throughput per test and per GPU.

Each row of ``fuzz-<worker>.jsonl`` (``frost_harness.reports.records.FUZZ_COLUMNS``) is one chunk: one
Hypothesis run of a fuzz test under ``frost-fuzz`` with its seed, the examples it ran,
its seconds and its outcome. Throughput is examples per minute of chunk time in the
tables; ``throughput_lines`` gives the run's rate: checked examples (``frost_harness.fuzz.budget``:
judged by their property, passing or failing) per minute of the fuzzing's wall-clock
time, overall and per property, in lines that ``parse_throughput`` reads back.

The chunk log knows only the chunks; pytest's junit.xml knows every test
(``frost_harness.reports.verdict.read_junit``). ``failed_tests`` lists each test junit.xml
has failed or errored, whether or not a chunk of it failed (a pinned case, a fixture's error, a
test that never reached its first chunk), and ``outside_chunks`` each test that ran no chunk at
all (a fuzz test without ``@given`` runs once, as an ordinary test: ``frost_harness.fuzz.plugin``).
"""
from __future__ import annotations

import re

import pandas as pd

from frost_harness.reports.records import FUZZ_COLUMNS
from frost_harness.reports.verdict import JunitTests


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(FUZZ_COLUMNS))


def _summary(chunks: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    if chunks.empty:
        return pd.DataFrame(columns=[*keys, "chunks", "examples", "seconds", "examples_per_minute", "failed"])
    table = chunks.groupby(keys, dropna=False).agg(
        chunks=("chunk", "size"),
        examples=("examples", "sum"),
        seconds=("seconds", "sum"),
        failed=("outcome", lambda s: int((s != "passed").sum())),
    ).reset_index()
    table["examples_per_minute"] = 60 * table["examples"] / table["seconds"].where(table["seconds"] > 0)
    return table[[*keys, "chunks", "examples", "seconds", "examples_per_minute", "failed"]]


def per_test(chunks: pd.DataFrame) -> pd.DataFrame:
    """Chunks, examples, seconds, throughput and failed chunks per fuzz test."""
    return _summary(chunks, ["test_id"])


def per_gpu(chunks: pd.DataFrame) -> pd.DataFrame:
    """The same per worker and its GPU (``gpu`` is empty on a CPU run)."""
    return _summary(chunks.assign(gpu=chunks["gpu"].astype(object).fillna("").astype(str)), ["gpu", "worker"])


def reproduce_line(failure: str) -> str:
    """The last ``reproduce:`` command of a failure message (a property's replay command), or ""."""
    lines = [line.strip() for line in str(failure).splitlines() if line.strip().startswith("reproduce:")]
    return lines[-1].removeprefix("reproduce:").strip() if lines else ""


def failures(chunks: pd.DataFrame) -> pd.DataFrame:
    """The failing chunks: test, worker, GPU, seed, the failure's first line and its reproduction command."""
    failed = chunks[chunks["outcome"] != "passed"]
    return pd.DataFrame({
        "test_id": failed["test_id"], "worker": failed["worker"], "gpu": failed["gpu"], "chunk": failed["chunk"],
        "seed": failed["seed"].astype(str), "failure": failed["failure"].map(lambda text: str(text).splitlines()[0]),
        "reproduce": failed["failure"].map(reproduce_line),
    }).reset_index(drop=True)  # fmt: skip


def failed_tests(junit: JunitTests, chunks: pd.DataFrame) -> pd.DataFrame:
    """Every test junit.xml has failed or errored: its outcome, message and whether a chunk of it failed."""
    failed_chunks = set(failures(chunks)["test_id"])
    rows = [(case.test_id, case.outcome, case.message, case.test_id in failed_chunks)
            for case in junit.cases if case.outcome in ("failed", "error")]  # fmt: skip
    return pd.DataFrame(rows, columns=["test_id", "outcome", "message", "failing_chunk"])


def outside_chunks(junit: JunitTests, chunks: pd.DataFrame) -> pd.DataFrame:
    """Every test junit.xml has that ran no chunk: its outcome, seconds and message."""
    chunked = set(chunks["test_id"])
    rows = [(case.test_id, case.outcome, case.seconds, case.message)
            for case in junit.cases if case.test_id not in chunked]  # fmt: skip
    return pd.DataFrame(rows, columns=["test_id", "outcome", "seconds", "message"])


def property_of(test_id: str) -> str:
    """The property a fuzz test checks: ``...::test_identity_gpu[batch_permutation]`` ->
    ``batch_permutation``, ``...::test_forward_matches_oracle_gpu`` -> ``forward_matches_oracle``."""
    name = str(test_id).rsplit("::", 1)[-1]
    if name.endswith("]"):
        return name[name.index("[") + 1 : -1]
    return name.removeprefix("test_").removesuffix("_gpu")


def throughput_lines(chunks: pd.DataFrame, wall_seconds: float) -> list[str]:
    """The run's checked examples per minute of ``wall_seconds`` (the fuzzing's wall-clock time, all
    workers together), overall and per property (those add up to the overall rate), each property
    also per minute of its own chunk time (one worker's rate while it ran)."""
    minutes = max(wall_seconds, 1e-9) / 60
    total = int(chunks["examples"].sum()) if not chunks.empty else 0
    lines = [f"throughput overall: {total / minutes:.0f} checked examples/min "
             f"({total} in {wall_seconds:.1f} s of fuzzing, every worker together)"]
    if chunks.empty:
        return lines
    table = chunks.assign(property=chunks["test_id"].map(property_of)).groupby("property").agg(
        examples=("examples", "sum"), seconds=("seconds", "sum"))
    for name, row in table.sort_values("examples", ascending=False).iterrows():
        per_worker = 60 * row.examples / row.seconds if row.seconds > 0 else 0.0
        lines.append(f"throughput {name}: {row.examples / minutes:.0f} checked examples/min "
                     f"({int(row.examples)} checked; {per_worker:.0f}/min per worker while it ran)")
    return lines


_THROUGHPUT = re.compile(r"throughput (?P<name>\S+): (?P<rate>\d+(?:\.\d+)?) checked examples/min")


def parse_throughput(text: str) -> dict[str, float]:
    """``{"overall": rate, property: rate, ...}`` from text holding ``throughput_lines``' lines."""
    return {m["name"]: float(m["rate"]) for m in _THROUGHPUT.finditer(text)}
