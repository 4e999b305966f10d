"""``frost-compile``: fill the disk compile cache ahead of time, on a machine without a GPU too.

    frost-compile --records L0 --arch sm_80,sm_90 -j 4 [--cache-dir DIR] [--template sm80/fwd] [--limit N]

``--records L0`` builds the pairwise-covering subsets the L0 compile suites build
(frost/kernels/sm80/covering.py); ``all`` every record the SM80 engines can produce
(frost/kernels/sm80/space.py). Each
record is built for each ``--arch`` (cross-compiling: the DSL needs no GPU for that),
except where the record's own minimum architecture is newer than the one asked for
(then it is skipped for that arch). Entries already in the cache are loaded, not rebuilt.
``-j N`` compiles in N worker processes (spawned: the DSL's compiler is not fork-safe
once loaded). One summary line at the end; the exit status is 1 when a record failed.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context

_ARCH = re.compile(r"sm_\d+a?")


def plan(records: list, arches: list[str]) -> tuple[list[tuple[object, str]], int]:
    """(record, arch) pairs to build, and how many pairs were skipped because the record needs
    a newer architecture than the one asked for."""
    from frost.kernels.sm80.compile import arch_number, min_arch

    tasks, skipped = [], 0
    for arch in arches:
        for record in records:
            if arch_number(min_arch(record)) > arch_number(arch):
                skipped += 1
            else:
                tasks.append((record, arch))
    return tasks, skipped


def build(task: tuple[object, str]) -> tuple[str, str]:
    """Build (or load) one record for one arch in this process: ("compiled" | "present" | "failed", detail)."""
    record, arch = task
    try:
        from frost.kernels.sm80 import compile as sm80_compile

        caches = (sm80_compile.FWD_CACHE, sm80_compile.BWD_CACHE, sm80_compile.ROPE_CACHE)
        compiles = sum(c.compiles for c in caches)
        sm80_compile.compile_record(record, arch)
        return ("compiled" if sum(c.compiles for c in caches) > compiles else "present"), ""
    except Exception as error:  # one bad record must not stop the others
        return "failed", f"{arch} {record!r}: {type(error).__name__}: {error}"


def _present(root, record, arch: str) -> bool:
    from frost.kernels import disk_cache
    from frost.kernels.sm80.compile import template_of

    key = disk_cache.entry_key(template_of(record), record, arch)
    return disk_cache.present(disk_cache.entry_path(root, key), key)


def _records(which: str, template: str | None) -> list:
    from frost.kernels.sm80 import covering
    from frost.kernels.sm80.compile import BWD_TEMPLATES, FWD_TEMPLATE, ROPE_TEMPLATE, template_of

    # only the family that holds the template's records: listing the backward's space takes a minute
    family = {FWD_TEMPLATE: "fwd", ROPE_TEMPLATE: "rope", **dict.fromkeys(BWD_TEMPLATES, "bwd")}
    families = covering.FAMILIES if template is None else [family[template]] if template in family else []
    pick = covering.l0 if which == "L0" else covering.admitted
    return [r for f in families for r in pick(f) if template is None or template_of(r) == template]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="frost-compile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", choices=("L0", "all"), default="L0",
                        help="L0: the records the L0 compile suites build; all: every admitted record")
    parser.add_argument("--arch", default="sm_80", help="comma-separated targets, e.g. sm_80,sm_90")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--cache-dir", help="fill this directory instead of the user cache")
    parser.add_argument("--template", help="only records of this template, e.g. sm80/fwd or sm80/bwd_pre")
    parser.add_argument("--limit", type=int, help="build at most this many (record, arch) pairs")
    args = parser.parse_args(argv)
    args.arches = [a.strip() for a in args.arch.split(",") if a.strip()]
    bad = [a for a in args.arches if not _ARCH.fullmatch(a)]
    if bad or not args.arches:
        parser.error(f"--arch wants names like sm_80 or sm_90a, got {bad or args.arch!r}")
    if args.jobs < 1:
        parser.error("-j must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.cache_dir:
        # workers inherit the environment: this is how they find the directory
        os.environ["FROST_CACHE_DIR"] = os.path.abspath(args.cache_dir)
        os.environ.pop("FROST_DISK_CACHE", None)
    from frost.kernels import disk_cache

    root = disk_cache.cache_dir()
    if root is None:
        print("frost-compile: the disk cache is disabled (FROST_DISK_CACHE=0 or FROST_CACHE_DIR empty); "
              "pass --cache-dir", file=sys.stderr)
        return 2
    start = time.perf_counter()
    tasks, skipped = plan(_records(args.records, args.template), args.arches)
    if args.limit is not None:
        tasks = tasks[: max(args.limit, 0)]
    counts = _build_missing(root, tasks, args.jobs)
    print(f"frost-compile: {counts['compiled']} compiled, {counts['present']} already present, "
          f"{skipped} skipped (record needs a newer arch), {counts['failed']} failed "
          f"in {time.perf_counter() - start:.1f} s [{args.records}, {','.join(args.arches)}, cache {root}]")
    return 1 if counts["failed"] else 0


def build_records(records, jobs: int = 1, arch: str | None = None) -> dict[str, int]:
    """Compile ``records`` (kernel params records, repeats allowed) for ``arch`` (None: this
    process's target) into the disk cache, in up to ``jobs`` spawned workers, so that the
    compiles that follow in this process are loads: what a benchmark or a suite does before
    it times or runs.
    Returns the counts {"compiled", "present", "failed"}; failures are printed, not raised
    (the caller's own compile reports them in context)."""
    from frost.kernels import disk_cache
    from frost.kernels.sm80.compile import target_arch

    root = disk_cache.cache_dir()
    if root is None:  # nowhere to put what workers build: the caller's own compiles are all there is
        return {"compiled": 0, "present": 0, "failed": 0}
    tasks = list(dict.fromkeys((record, arch or target_arch(record)) for record in records))
    return _build_missing(root, tasks, jobs)


def _build_missing(root, tasks: list, jobs: int) -> dict[str, int]:
    """Build the (record, arch) tasks that have no intact entry under ``root``; the counts."""
    # intact entries are counted here: spawning workers (seconds each) only for what is missing
    missing = [task for task in tasks if not _present(root, *task)]
    counts = {"compiled": 0, "present": len(tasks) - len(missing), "failed": 0}
    for status, detail in _run(missing, jobs):
        counts[status] += 1
        if detail:
            print(f"frost-compile: failed {detail}", file=sys.stderr)
    return counts


def _run(tasks: list, jobs: int):
    if jobs == 1 or len(tasks) <= 1:
        yield from (build(task) for task in tasks)
        return
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=get_context("spawn")) as pool:
        for future in as_completed([pool.submit(build, task) for task in tasks]):
            yield future.result()


if __name__ == "__main__":
    sys.exit(main())
