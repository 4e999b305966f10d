"""``frost-report``: run one test level and write its report.

    frost-report --level L0 [--out DIR] [-n WORKERS] [-- extra pytest arguments]

Runs pytest on the level (a level includes the ones below it: L1 runs L0 and L1) over the
suites that came with the package (``frost_harness/suites``: in the checkout, or in
site-packages), from the current directory, so it works from any directory
(``frost_harness.invocation`` says how). Test paths among the extra arguments run instead
of the whole suites; they are relative to the current directory (``frost_harness/suites/...``
from a checkout's root), absolute, or modules with ``--pyargs``. The records plugin writes
into ``DIR/records``, then the report goes into ``DIR`` (default
``./frost-out/<level>-<timestamp>/``, ignored by git): pytest's ``junit.xml``,
``cases.csv.gz``, ``routing.md``, ``pass_rate.md``, error statistics (``stats.csv``), drift
against the previous run of the same level (``drift.md``) and ``report.html``
(``frost_harness.reports.publish`` lists them), prints where, and a short summary.
While pytest runs, its output goes to ``DIR/pytest.log`` and a progress line shows the tests
done of those collected, the failed ones and the time elapsed (``frost_harness.reports.progress``);
at the end come pytest's closing summary (from the log), the slowest 20 tests and, when the run
selected GPU tests, which of them ran and which were skipped and why
(``frost_harness.reports.junit_summary``). The verdict is red whenever pytest's exit status is
non-zero or any test failed, errored or was not collected, or nothing was collected at all
(``frost_harness.reports.verdict``), and the tests behind it are listed. The exit status is
pytest's (1 if pytest said 0 but the records hold a failure); the report is written either way.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

from frost_harness import invocation

invocation.require_extra("frost-report")  # one line naming the extra, before pandas is imported below

from frost_harness.reports import junit_summary, progress, publish, records, tables, verdict  # noqa: E402

LEVELS = ("L0", "L1", "L2")


def marker_expression(level: str) -> str:
    """The pytest ``-m`` expression of a level and the levels below it."""
    return " or ".join(LEVELS[: LEVELS.index(level) + 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frost-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--level", choices=LEVELS, default="L0", help="test level to run (default L0)")
    parser.add_argument("--out", type=Path, help="output folder (default ./frost-out/<level>-<timestamp>)")
    parser.add_argument("-n", "--workers", help="pytest-xdist workers, e.g. 2 or auto (default: no xdist)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    invocation.check_suites("frost-report")

    started = datetime.now()
    out = (args.out or invocation.output_folder() / f"{args.level}-{started:%Y%m%d-%H%M%S}").resolve()
    options = ["-m", marker_expression(args.level), "-q", f"--frost-records={out / 'records'}",
               f"--junitxml={out / verdict.JUNIT_FILE}"]  # fmt: skip
    if args.workers:  # idle workers take queued tests from busy ones: the compile tests are uneven
        options += ["-n", args.workers, "--dist", "worksteal"]
    command = invocation.pytest_command(options, args.pytest_args, [invocation.SUITES],
                                        cache_dir=invocation.output_folder() / "pytest-cache")
    print("frost-report:", shlex.join(command), flush=True)  # quoted: pastes into a shell as is
    (out / "records").mkdir(parents=True, exist_ok=True)
    start = time.time()

    def status_line() -> str:
        return f"frost-report: {progress.read(out / 'records').line()}, {progress.clock(time.time() - start)} elapsed"

    status = progress.run_watched(command, out / "pytest.log", status_line)

    title = f"level {args.level}, {started:%Y-%m-%d %H:%M}, pytest exit {status}"
    meta = {"key": args.level, "title": title, "started": started.isoformat(), "pytest_exit": status,
            "command": shlex.join(command)}  # fmt: skip
    paths = publish.write_run(out, meta)
    print(f"\nfrost-report: wrote {', '.join(p.name for p in paths)} to {out}")
    df = tables.frame(records.read_folder(out / "records"))
    for line in tables.engine_summary_lines(df):
        print("frost-report:", line)
    junit = verdict.read_junit(out / verdict.JUNIT_FILE)
    if junit is not None:
        for line in junit_summary.slowest_lines(junit) + junit_summary.gpu_lines(junit):
            print("frost-report:", line)
    return print_verdict("frost-report", out, status)


def print_verdict(prog: str, out: Path, status: int) -> int:
    """Print the run's verdict (from run.json) and the tests behind a red one; return the
    exit status: pytest's, or 1 where pytest said 0 but the verdict is red."""
    meta = json.loads((out / publish.RUN_FILE).read_text(encoding="utf-8"))
    print(f"{prog}: {meta['verdict']}")
    problems = meta.get("problems", [])
    for line in problems[:20]:
        print(f"{prog}:   {line}")
    if len(problems) > 20:
        print(f"{prog}:   and {len(problems) - 20} more (run.json lists them all)")
    red = meta["verdict"].startswith("FAILED")
    return status if status or not red else 1


if __name__ == "__main__":
    sys.exit(main())
