"""``frost-report``: run one test level and write its report.

    frost-report --level L0 [--out DIR] [-n WORKERS] [-- extra pytest arguments]

Runs pytest from the repository root on the level (a level includes the ones below
it: L1 runs L0 and L1) with the records plugin writing into ``DIR/records``, then
writes the report into ``DIR`` (default ``frost-out/<level>-<timestamp>/``, ignored by
git): ``cases.csv``, ``routing.md``, ``pass_rate.md``, error statistics
(``stats.csv``), drift against the previous run of the same level (``drift.md``) and
``report.html`` (``reports.publish`` lists them), prints where, and a short summary.
The exit status is pytest's: the report is written either way.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from reports import publish, records, tables

LEVELS = ("L0", "L1", "L2")
ROOT = Path(__file__).resolve().parent.parent


def marker_expression(level: str) -> str:
    """The pytest ``-m`` expression of a level and the levels below it."""
    return " or ".join(LEVELS[: LEVELS.index(level) + 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="frost-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--level", choices=LEVELS, default="L0", help="test level to run (default L0)")
    parser.add_argument("--out", type=Path, help="output folder (default frost-out/<level>-<timestamp>)")
    parser.add_argument("-n", "--workers", help="pytest-xdist workers, e.g. 2 or auto (default: no xdist)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    started = datetime.now()
    out = (args.out or ROOT / "frost-out" / f"{args.level}-{started:%Y%m%d-%H%M%S}").resolve()
    command = [sys.executable, "-m", "pytest", "-m", marker_expression(args.level), "-q",
               f"--frost-records={out / 'records'}"]  # fmt: skip
    if args.workers:
        command += ["-n", args.workers]
    command += args.pytest_args
    print("frost-report:", " ".join(command), flush=True)
    status = subprocess.call(command, cwd=ROOT)

    title = f"level {args.level}, {started:%Y-%m-%d %H:%M}, pytest exit {status}"
    meta = {"key": args.level, "title": title, "started": started.isoformat(), "pytest_exit": status,
            "command": " ".join(command)}  # fmt: skip
    paths = publish.write_run(out, meta)
    print(f"\nfrost-report: wrote {', '.join(p.name for p in paths)} to {out}")
    lines = tables.summary_lines(tables.frame(records.read_folder(out / "records")))  # routing: pytest's summary
    for line in lines:
        if line == lines[0] or line.startswith(("served by", "FAILED")):
            print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
