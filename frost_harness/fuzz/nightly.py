"""``frost-fuzz``: the nightly fuzz run, under pytest-xdist, on every CPU core or GPU of the machine.

    frost-fuzz --budget 30m [--shard K/N] [--workers N] [--devices auto|none|0,1,...]
               [--regime auto|cpu|gpu] [--seed N] [--out DIR] [-- extra pytest arguments]
    frost-fuzz --merge DIR [DIR ...] --out DIR

Runs the fuzz tests of ``frost_harness/suites/fuzz`` (marker ``fuzz``; the suites that came with
the package, from the current directory: ``frost_harness.invocation``) of one regime under the
``nightly`` Hypothesis profile with ``-n WORKERS --dist each``: every worker runs every
property, each with its own seeds, so adding workers (and GPUs) adds search. The
``gpu`` regime (the default where a GPU shows) runs one worker per listed device by
default (list a device twice for two workers on it); the ``cpu`` regime one worker per
core. Every worker gets one device of the list through ``FROST_FUZZ_DEVICES``
(``frost_harness.fuzz.devices``), in either regime.

The budget is wall-clock: the run must end by ``start + budget``. A few seconds are
kept for the report; the rest is split between the fuzz tests of each worker, each run
as seeded Hypothesis chunks until its share is spent (``frost_harness.fuzz.budget``). A test stops at
its first failure, which Hypothesis shrinks and reports with a one-line reproduction.

Seeds: ``--seed`` (default: today's date as YYYYMMDD, printed) is the night's; shard K
of N mixes K in, so N machines given the same night seed and ``--shard 1/N`` ..
``N/N`` search different ground; every chunk's seed is in the fuzz log.

The run folder (default ``./frost-out/fuzz-<regime>-<timestamp>[-shardKofN]``) has the
same format as ``frost-report``'s (``frost_harness.reports.publish``), plus the chunk log; drift is
measured against the previous run of the same regime. ``--merge`` joins the run
folders of several shards (or machines) into one report. While pytest runs (its output
goes to ``pytest.log`` in the run folder) a status line shows the examples run, the
failed chunks and the time left. The verdict is ``frost-report``'s (red whenever pytest
failed); the exit status is pytest's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from frost_harness import invocation

invocation.require_extra("frost-fuzz")  # one line naming the extra, before pandas is imported below

from frost_harness.fuzz import devices  # noqa: E402
from frost_harness.reports import cli, fuzzlog, publish, records, tables, verdict  # noqa: E402

FUZZ_SUITES = invocation.SUITES / "fuzz"
REPORT_RESERVE_S = 20.0  # seconds kept at the end of the budget for the report (a fifth of short budgets)


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


def pytest_command(regime: str, workers: int, out: Path, until: float, seed: int, extra: list[str]) -> list[str]:
    """pytest on the installed fuzz suites (``frost_harness.invocation``), or on the tests
    ``extra`` names; pytest's cache stays off (a night's runs share nothing through it)."""
    marker = "fuzz and gpu" if regime == "gpu" else "fuzz and not gpu"
    options = ["-m", marker, "-q", "--frost-profile", "nightly", f"--frost-records={out / 'records'}",
               f"--junitxml={out / verdict.JUNIT_FILE}",
               f"--frost-fuzz-until={until:.3f}", f"--frost-fuzz-seed={seed}"]  # fmt: skip
    if workers > 1:
        options += ["-n", str(workers), "--dist", "each"]
    return invocation.pytest_command(options, extra, [FUZZ_SUITES])


def _fuzz(args) -> int:
    started = datetime.now()
    start = time.time()
    listed = devices.parse(args.devices)
    regime = args.regime if args.regime != "auto" else ("gpu" if listed else "cpu")
    if regime == "gpu" and not listed:
        print("frost-fuzz: the gpu regime needs a GPU (--devices found none); use --regime cpu", file=sys.stderr)
        return 2
    workers = args.workers or (len(listed) if regime == "gpu" else os.cpu_count() or 1)
    seed = run_seed(args.seed, args.shard)
    shard = "" if args.shard == (1, 1) else f"-shard{args.shard[0]}of{args.shard[1]}"
    out = (args.out or invocation.output_folder() / f"fuzz-{regime}-{started:%Y%m%d-%H%M%S}{shard}").resolve()
    until = start + args.budget - min(REPORT_RESERVE_S, args.budget / 5)
    command = pytest_command(regime, workers, out, until, seed, args.pytest_args)
    # a runner started from inside a test worker must not hand that worker's identity down
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    if listed:
        env[devices.ENV] = ",".join(listed)
    print(f"frost-fuzz: night seed {args.seed}, shard {args.shard[0]}/{args.shard[1]} (run seed {seed}); "
          f"{regime} regime, {workers} workers" + (f" on GPUs {','.join(listed)}" if listed else "")
          + f"; budget {args.budget:.0f}s; chunk seeds in {out / 'records'}/fuzz-*.jsonl", flush=True)  # fmt: skip
    print("frost-fuzz:", shlex.join(command), flush=True)  # quoted: pastes into a shell as is
    status = _run_watched(command, env, out, start + args.budget)
    meta = {
        "key": f"fuzz-{regime}", "title": f"fuzz {regime}, {started:%Y-%m-%d %H:%M}, shard "
        f"{args.shard[0]}/{args.shard[1]}, pytest exit {status}", "started": started.isoformat(),
        "pytest_exit": status, "night_seed": args.seed, "run_seed": seed, "shard": f"{args.shard[0]}/{args.shard[1]}",
        "budget_s": args.budget, "wall_s": round(time.time() - start, 1), "workers": workers,
        "devices": ",".join(listed), "command": shlex.join(command),
    }  # fmt: skip
    return _report(out, meta, status)


STATUS_EVERY_S = 30.0  # without a terminal, one status line this often


def _run_watched(command: list[str], env: dict, out: Path, end: float) -> int:
    """Run pytest with its output in ``out/pytest.log`` and a live status line here: examples,
    failed chunks and time left, summed over the workers' ``progress-*.json`` (``frost_harness.fuzz.budget``).
    On a terminal the line redraws in place; otherwise it is printed every ``STATUS_EVERY_S``.
    At the end pytest's own summary (the log's tail) follows."""
    (out / "records").mkdir(parents=True, exist_ok=True)
    log_path = out / "pytest.log"
    live = sys.stdout.isatty()
    with open(log_path, "w", encoding="utf-8") as log:
        # in the current directory: never inside site-packages
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        printed = 0.0
        while process.poll() is None:
            time.sleep(0.5)
            now = time.time()
            if live or now - printed >= STATUS_EVERY_S:
                line = status_line(out / "records", end - now)
                print(f"\r{line}\033[K" if live else line, end="" if live else "\n", flush=True)
                printed = now
    if live:
        print()
    print(f"{status_line(out / 'records', end - time.time())}; pytest's output is in {log_path}")
    tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
    print("\n".join(tail), flush=True)
    return process.returncode


def status_line(folder: Path, left_s: float) -> str:
    """``N examples, F failures, M:SS left`` from the workers' progress files in ``folder``."""
    examples = failures = 0
    for path in folder.glob("progress-*.json"):
        try:
            progress = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # being replaced this instant: next time
            continue
        examples += progress.get("examples", 0)
        failures += progress.get("failures", 0)
    left = max(0, int(left_s))
    return f"frost-fuzz: {examples} examples, {failures} failures, {left // 60}:{left % 60:02d} left"


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
    parser.add_argument("--workers", type=int, help="xdist workers (default: one per GPU, or per core)")
    parser.add_argument("--devices", default="auto", help="GPUs: auto, none, or a list like 0,1 (default auto)")
    parser.add_argument("--regime", choices=("auto", "cpu", "gpu"), default="auto",
                        help="problem sizes and device (default: gpu where a GPU shows)")
    parser.add_argument("--seed", type=int, default=int(datetime.now().strftime("%Y%m%d")),
                        help="the night's seed (default: today, YYYYMMDD)")
    parser.add_argument("--out", type=Path, help="run folder (default ./frost-out/fuzz-<regime>-<timestamp>)")
    parser.add_argument("--merge", type=Path, nargs="+", metavar="DIR", help="merge these run folders into --out")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    if args.merge:
        return _merge(args)
    invocation.check_suites("frost-fuzz")
    return _fuzz(args)


if __name__ == "__main__":
    sys.exit(main())
