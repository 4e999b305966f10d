"""``frost-fuzz``: the nightly fuzz run, under pytest-xdist, on every CPU core or GPU of the machine.

    frost-fuzz --budget 30m [--shard K/N] [--workers N] [--devices auto|none|0,1,...]
               [--regime auto|cpu|gpu] [--seed N] [--out DIR] [--pool-size N] [--pool-seed N]
               [--cache-dir DIR] [--no-prewarm] [-- extra pytest arguments]
    frost-fuzz --merge DIR [DIR ...] --out DIR

Runs the fuzz tests of ``frost_harness/suites/fuzz`` (marker ``fuzz``; the suites that came with
the package, from the current directory: ``frost_harness.invocation``) of one regime under the
``nightly`` Hypothesis profile with ``-n WORKERS --dist each``: every worker runs every
property, each with its own seeds, so adding workers (and GPUs) adds search. Both
regimes run one worker per CPU core by default (a GPU example is mostly host work:
drawing, the harness, launches), the ``gpu`` regime (the default where a GPU shows)
at least one per listed device; every worker gets one device of the list, round robin,
through ``FROST_FUZZ_DEVICES`` (``frost_harness.fuzz.devices``).

The ``gpu`` regime searches instead of compiling: its problems come from a pool of
record classes (``frost_harness.fuzz.pool``; ``--pool-size`` classes drawn by
``--pool-seed``, default the run seed, so nights rotate through the class space), and
before the workers start the pool's params records are compiled into the disk cache
(``frost_harness.fuzz.prewarm``: ``--cache-dir``, default the user's cache; on every core;
entries already there cost nothing), which every worker then loads instead of
compiling. ``--no-prewarm`` skips it (the workers then compile what they meet).

The budget is wall-clock and starts after the prewarm (whose time and counts are
printed and kept in ``run.json``): the run's fuzzing ends by ``start + budget``, its
report within 10% more. A few seconds are kept for the report; the rest is split
between the fuzz tests of each worker, each run as seeded Hypothesis chunks until its
share is spent (``frost_harness.fuzz.budget``). A test stops at its first failure, which Hypothesis
shrinks (until half the 10% past the budget at most, the report's seconds kept) and
reports with a one-line reproduction. The summary prints the checked examples per minute,
overall and per property (``frost_harness.reports.fuzzlog.throughput_lines``).

Seeds: ``--seed`` (default: today's date as YYYYMMDD, printed) is the night's; shard K
of N mixes K in, so N machines given the same night seed and ``--shard 1/N`` ..
``N/N`` search different ground; every chunk's seed is in the fuzz log.

The run folder (default ``./frost-out/fuzz-<regime>-<timestamp>[-shardKofN]``) has the
same format as ``frost-report``'s (``frost_harness.reports.publish``), plus the chunk log; drift is
measured against the previous run of the same regime. ``--merge`` joins the run
folders of several shards (or machines) into one report. While pytest runs (its output
goes to ``pytest.log`` in the run folder) a status line shows the examples run, the tests
done of those collected and the failed ones (pytest's own progress,
``frost_harness.reports.progress``: a failure outside any chunk counts too) and the time left;
once pytest is done, the line's test counts are junit.xml's, as are ``fuzz.md``'s, which lists
every failed or errored test, chunk or not. A fuzz test without ``@given`` (a pinned case) runs
once, as an ordinary test, before the properties share the budget (``frost_harness.fuzz.plugin``).
The verdict is ``frost-report``'s (red whenever pytest failed or junit.xml lists a failed or
errored test); the exit status is pytest's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

from frost_harness import invocation

invocation.require_extra("frost-fuzz")  # one line naming the extra, before pandas is imported below

from frost_harness.fuzz import devices  # noqa: E402
from frost_harness.reports import cli, fuzzlog, progress, publish, records, tables, verdict  # noqa: E402

FUZZ_SUITES = invocation.SUITES / "fuzz"
REPORT_RESERVE_S = 20.0  # seconds kept at the end of the budget for the report (a fifth of short budgets)
# The run may end this share of the budget late, when a failure is shrinking: half of it for
# the shrinking, half for what follows it (the example in flight, the shrunk one's replay).
SHRINK_SLACK = 0.10


def parse_budget(text: str) -> float:
    """Seconds from ``"90s"``, ``"30m"``, ``"2h"`` or a bare number of seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"budget: expected e.g. 90s, 30m or 2h, got {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def parse_shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise argparse.ArgumentTypeError(f"shard: expected K/N with 1 <= K <= N, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def run_seed(night: int, shard: tuple[int, int]) -> int:
    """The seed a shard's chunks derive from: distinct for every shard of a night."""
    return night * 1000 + shard[0]


def pytest_command(regime: str, workers: int, out: Path, until: float, seed: int, extra: list[str], *,
                   shrink_until: float | None = None, pool: str | None = None,
                   cache_dir: Path | None = None) -> list[str]:
    """pytest on the installed fuzz suites (``frost_harness.invocation``), or on the tests
    ``extra`` names; pytest's cache stays off (a night's runs share nothing through it).
    ``pool`` ("SEED:SIZE") is the gpu regime's record-class pool, ``cache_dir`` the compile
    cache every worker uses (else a fresh one each)."""
    marker = "fuzz and gpu" if regime == "gpu" else "fuzz and not gpu"
    options = ["-m", marker, "-q", "--frost-profile", "nightly", f"--frost-records={out / 'records'}",
               f"--junitxml={out / verdict.JUNIT_FILE}",
               f"--frost-fuzz-until={until:.3f}", f"--frost-fuzz-seed={seed}"]  # fmt: skip
    if shrink_until is not None:
        options.append(f"--frost-fuzz-shrink-until={shrink_until:.3f}")
    if pool is not None:
        options.append(f"--frost-fuzz-pool={pool}")
    if cache_dir is not None:
        options.append(f"--frost-cache-dir={cache_dir}")
    if workers > 1:
        options += ["-n", str(workers), "--dist", "each"]
    return invocation.pytest_command(options, extra, [FUZZ_SUITES])


def _fuzz(args) -> int:
    started = datetime.now()
    listed = devices.parse(args.devices)
    regime = args.regime if args.regime != "auto" else ("gpu" if listed else "cpu")
    if regime == "gpu" and not listed:
        print("frost-fuzz: the gpu regime needs a GPU (--devices found none); use --regime cpu", file=sys.stderr)
        return 2
    workers = args.workers or max(len(listed), os.cpu_count() or 1)
    seed = run_seed(args.seed, args.shard)
    shard = "" if args.shard == (1, 1) else f"-shard{args.shard[0]}of{args.shard[1]}"
    out = (args.out or invocation.output_folder() / f"fuzz-{regime}-{started:%Y%m%d-%H%M%S}{shard}").resolve()
    meta = {"prewarm": None}
    pool_spec = cache_dir = None
    if regime == "gpu":
        from frost_harness.fuzz import pool  # here: it imports torch and frost

        pool_spec = f"{seed if args.pool_seed is None else args.pool_seed}:{args.pool_size or pool.DEFAULT_SIZE}"
        cache_dir, meta["prewarm"] = _prepare_cache(args, pool_spec)
    start = time.time()  # the budget starts here, after the prewarm
    reserve = min(REPORT_RESERVE_S, args.budget / 5)
    until = start + args.budget - reserve
    command = pytest_command(regime, workers, out, until, seed, args.pytest_args,
                             shrink_until=until + SHRINK_SLACK / 2 * args.budget, pool=pool_spec, cache_dir=cache_dir)
    # a runner started from inside a test worker must not hand that worker's identity down
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    if listed:
        env[devices.ENV] = ",".join(listed)
    print(f"frost-fuzz: night seed {args.seed}, shard {args.shard[0]}/{args.shard[1]} (run seed {seed}); "
          f"{regime} regime, {workers} workers" + (f" on GPUs {','.join(listed)}" if listed else "")
          + (f", record-class pool {pool_spec}" if pool_spec else "")
          + f"; budget {args.budget:.0f}s; chunk seeds in {out / 'records'}/fuzz-*.jsonl", flush=True)  # fmt: skip
    print("frost-fuzz:", shlex.join(command), flush=True)  # quoted: pastes into a shell as is
    status = _run_watched(command, env, out, start + args.budget)
    meta.update({
        "key": f"fuzz-{regime}", "title": f"fuzz {regime}, {started:%Y-%m-%d %H:%M}, shard "
        f"{args.shard[0]}/{args.shard[1]}, pytest exit {status}", "started": started.isoformat(),
        "pytest_exit": status, "night_seed": args.seed, "run_seed": seed, "shard": f"{args.shard[0]}/{args.shard[1]}",
        "budget_s": args.budget, "fuzz_s": round(time.time() - start, 1),
        "wall_s": round((datetime.now() - started).total_seconds(), 1), "workers": workers,
        "devices": ",".join(listed), "pool": pool_spec, "command": shlex.join(command),
    })  # fmt: skip
    return _report(out, meta, status)


def _prepare_cache(args, pool_spec: str) -> tuple[Path | None, dict | None]:
    """The compile cache the gpu workers share, filled with the pool's records unless
    ``--no-prewarm``: (its folder, or None when disabled; the prewarm's facts for run.json)."""
    from frost.kernels import disk_cache
    from frost_harness.fuzz import pool, prewarm

    if args.cache_dir is not None:  # the build step's workers and the test workers read it from here
        os.environ["FROST_CACHE_DIR"] = str(args.cache_dir.resolve())
        os.environ.pop("FROST_DISK_CACHE", None)
    cache_dir = disk_cache.cache_dir()
    if args.no_prewarm:
        print("frost-fuzz: no prewarm (--no-prewarm): workers compile the records they meet", flush=True)
        return cache_dir, None
    done = prewarm.prewarm(pool.sample(*pool.parse_spec(pool_spec)), jobs=args.prewarm_jobs or os.cpu_count() or 1)
    print(f"frost-fuzz: {done.line()}; the budget starts now", flush=True)
    return cache_dir, {"classes": done.classes, "records": done.records, "compiled": done.compiled,
                       "present": done.present, "failed": done.failed, "seconds": round(done.seconds, 1)}  # fmt: skip


def _run_watched(command: list[str], env: dict, out: Path, end: float) -> int:
    """Run pytest with its output in ``out/pytest.log`` and a live status line here
    (``frost_harness.reports.progress.run_watched``); at the end the status line again, its test
    counts now junit.xml's, and pytest's closing summary from the log."""
    (out / "records").mkdir(parents=True, exist_ok=True)
    return progress.run_watched(command, out / "pytest.log", lambda: status_line(out / "records", end - time.time()),
                                final=lambda: final_status_line(out, end - time.time()), env=env)


def _examples(folder: Path) -> int:
    """The checked examples so far, summed over the workers' ``progress-*.json`` (``frost_harness.fuzz.budget``)."""
    examples = 0
    for path in folder.glob("progress-*.json"):
        try:
            examples += json.loads(path.read_text(encoding="utf-8")).get("examples", 0)
        except (OSError, ValueError):  # being replaced this instant: the next poll reads it
            continue
    return examples


def status_line(folder: Path, left_s: float) -> str:
    """``N examples; [###  ] D/T tests, F failed; M:SS left`` while pytest runs: the workers'
    examples and pytest's own progress (``frost_harness.reports.progress``: every test, a pinned
    case or a failure outside any chunk included), from the run's records folder."""
    return f"frost-fuzz: {_examples(folder)} examples; {progress.read(folder).line()}; {progress.clock(left_s)} left"


def final_status_line(out: Path, left_s: float) -> str:
    """The status line once pytest is done: its test counts are junit.xml's, as the verdict's."""
    junit = verdict.read_junit(out / verdict.JUNIT_FILE)
    tests = junit.counts() if junit is not None else "no junit.xml (pytest's own account of the tests is missing)"
    return f"frost-fuzz: {_examples(out / 'records')} examples; {tests}; {progress.clock(left_s)} left"


def _merge(args) -> int:
    if args.out is None:
        print("frost-fuzz: --merge needs --out", file=sys.stderr)
        return 2
    out = args.out.resolve()
    (out / "records").mkdir(parents=True, exist_ok=True)
    keys = set()
    for index, folder in enumerate(args.merge):
        meta = json.loads((folder / publish.RUN_FILE).read_text(encoding="utf-8"))
        keys.add(meta["key"])
        for path in sorted((folder / "records").glob("*.jsonl*")):
            kind, rest = path.name.split("-", 1)  # e.g. records-gw0.jsonl.gz: kind records, rest gw0.jsonl.gz
            shutil.copyfile(path, out / "records" / f"{kind}-run{index}-{rest}")
    started = datetime.now()
    meta = {"key": "+".join(sorted(keys)), "title": f"fuzz, {len(args.merge)} runs merged, {started:%Y-%m-%d %H:%M}",
            "started": started.isoformat(), "merged": [str(f) for f in args.merge]}  # fmt: skip
    return _report(out, meta, 0)


# A GPU night whose cases frost's own engines judged less than this share of is no test of them
# (a missing DSL or a declining engine turns it into a native-only run): it fails.
MIN_OWN_SHARE = 0.25


def own_engine_shortfall(case_df, regime: str) -> str | None:
    """Why a GPU-regime run judged too few cases on frost's own (non-native) engines, or None."""
    if regime != "gpu":
        return None
    total = len(case_df)
    own = int((~case_df["native"].astype(bool)).sum()) if total else 0
    if total and own / total >= MIN_OWN_SHARE:
        return None
    return (f"frost's own engines judged {own} of {total} cases, under the {MIN_OWN_SHARE:.0%} a GPU run must "
            "reach (is the CuTe DSL missing, or do the sm80 engines decline?)")


def _report(out: Path, meta: dict, status: int) -> int:
    paths = publish.write_run(out, meta)
    print(f"\nfrost-fuzz: wrote {', '.join(p.name for p in paths)} to {out}")
    chunks = records.read_folder(out / "records", prefix="fuzz")
    examples = sum(row["examples"] for row in chunks)
    print(f"frost-fuzz: {examples} examples in {len(chunks)} chunks")
    if meta.get("fuzz_s"):
        for line in fuzzlog.throughput_lines(fuzzlog.frame(chunks), meta["fuzz_s"]):
            print("frost-fuzz:", line)
    for line in tables.summary_lines(tables.frame(records.read_folder(out / "records")))[:1]:
        print("frost-fuzz:", line)
    for row in fuzzlog.failures(fuzzlog.frame(chunks)).itertuples():
        print(f"frost-fuzz: FAILED {row.test_id} on {row.worker} (chunk seed {row.seed}): {row.failure}"
              + (f"\n  reproduce: {row.reproduce}" if row.reproduce else ""))  # fmt: skip
    shortfall = own_engine_shortfall(tables.cases(tables.frame(records.read_folder(out / "records"))),
                                     meta.get("key", "").removeprefix("fuzz-"))
    if shortfall:
        print(f"frost-fuzz: FAILED: {shortfall}")
        cli.print_verdict("frost-fuzz", out, status)
        return status or 1
    return cli.print_verdict("frost-fuzz", out, status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frost-fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=parse_budget, default=parse_budget("30m"), help="wall-clock budget (30m)")
    parser.add_argument("--shard", type=parse_shard, default=(1, 1), help="this machine's share K/N of the night")
    parser.add_argument("--workers", type=int, help="xdist workers (default: one per core, at least one per GPU)")
    parser.add_argument("--devices", default="auto", help="GPUs: auto, none, or a list like 0,1 (default auto)")
    parser.add_argument("--regime", choices=("auto", "cpu", "gpu"), default="auto",
                        help="problem sizes and device (default: gpu where a GPU shows)")
    parser.add_argument("--seed", type=int, default=int(datetime.now().strftime("%Y%m%d")),
                        help="the night's seed (default: today, YYYYMMDD)")
    parser.add_argument("--out", type=Path, help="run folder (default ./frost-out/fuzz-<regime>-<timestamp>)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="DIR", help="merge these run folders into --out")
    parser.add_argument("--pool-size", type=int, default=None,
                        help="gpu regime: record classes drawn for the pool (frost_harness.fuzz.pool; default "
                             "12), besides those every property needs")
    parser.add_argument("--pool-seed", type=int, help="gpu regime: the pool's seed (default: the run seed)")
    parser.add_argument("--cache-dir", type=Path, help="gpu regime: the compile cache to fill and share "
                        "(default: the user's, frost.kernels.disk_cache)")
    parser.add_argument("--no-prewarm", action="store_true", help="gpu regime: do not compile the pool first")
    parser.add_argument("--prewarm-jobs", type=int, help="processes compiling the pool (default: every core)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.merge:
        return _merge(args)
    invocation.check_suites("frost-fuzz")
    return _fuzz(args)


if __name__ == "__main__":
    sys.exit(main())
