"""Before a GPU fuzz run starts its workers: compile the record pool's kernels into the disk cache.

A GPU fuzz example under a params record that no process has compiled waits 4-8 s for
a JIT compile; a worker that finds the record in the disk cache loads it in about
0.05 s (``frost.kernels.disk_cache``). ``frost-fuzz`` therefore computes every record
its pool can compile (``frost_harness.fuzz.pool.records``) and hands them to the build
step of ``frost-compile`` (``frost.kernels.prebuild.build_records``: entries already
on disk are counted, not rebuilt; the rest compile in ``jobs`` spawned processes, for
this machine's GPU) before the workers start, and points the workers at that cache
(``--frost-cache-dir``). Run again on the same pool, kernel sources and DSL, it costs
only the check of the entries. The fuzz budget starts after it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from frost_harness.fuzz import pool


@dataclass(frozen=True)
class Prewarmed:
    """What a prewarm did: classes and records of the pool, and how their builds went."""

    classes: int
    records: int
    compiled: int
    present: int
    failed: int
    seconds: float
    cache: Path | None

    def line(self) -> str:
        if self.cache is None:
            return (f"no prewarm: the disk cache is disabled, so workers compile the pool's {self.records} records "
                    "themselves")  # fmt: skip
        return (f"prewarmed {self.records} records of {self.classes} record classes in {self.seconds:.1f} s: "
                f"{self.compiled} compiled, {self.present} already on disk, {self.failed} failed [cache {self.cache}]")


def prewarm(classes: tuple[pool.RecordClass, ...], jobs: int) -> Prewarmed:
    """Compile the records of ``classes`` into the disk cache (``FROST_CACHE_DIR``) in ``jobs`` processes."""
    from frost.kernels import disk_cache, prebuild

    records = pool.records(classes)
    root = disk_cache.cache_dir()
    started = time.perf_counter()
    counts = prebuild.build_records(records, jobs=jobs) if root is not None else {}
    return Prewarmed(classes=len(classes), records=len(records), compiled=counts.get("compiled", 0),
                     present=counts.get("present", 0), failed=counts.get("failed", 0),
                     seconds=time.perf_counter() - started, cache=root)  # fmt: skip
