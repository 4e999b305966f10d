"""The fuzz runner's chunk log as tables: examples, time and throughput per test and per GPU.

Each row of ``fuzz-<worker>.jsonl`` (``frost_harness.reports.records.FUZZ_COLUMNS``) is one chunk: one
Hypothesis run of a fuzz test under ``frost-fuzz`` with its seed, the examples it ran,
its seconds and its outcome. Throughput is examples per minute of chunk time.
"""
from __future__ import annotations

import pandas as pd

from frost_harness.reports.records import FUZZ_COLUMNS


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
