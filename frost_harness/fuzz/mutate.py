"""``frost-mutate``: mutation testing of the SM80 kernels against the GPU suites.

    frost-mutate --list                                   # the catalogue (works without a GPU)
    frost-mutate -j 3 -n 4                                # every mutant, 3 at once, 4 xdist workers each
    frost-mutate --only mask-right-edge,dk-scale-missing --marker "L0 and gpu" frost_harness/suites/sm80

Each mutant of ``frost_harness.fuzz.mutants.CATALOGUE`` is applied to its own temporary copy of the
packages ``frost`` and ``frost_harness``, from the checkout or from site-packages (which are never
touched), and the chosen suites (paths relative to that copy's root) run against that copy with
``-x``: first the few tests most likely to kill it (``Mutant.first_tests``, a -k expression, in
one process or on ``--focus-workers``), then, unless they killed it, the whole selection on
``-n`` workers. Every run shares one compile cache on disk (``--cache-dir``, frost's own by
default): a mutant's edited templates get keys of their own (the key digests the sources), so
only they compile, once per mutant, and what the untouched templates need is loaded, e.g. from
a cache ``frost-compile`` filled ahead of time. A failing test kills the mutant (the first one
is recorded), a run past ``--timeout`` kills it as a hang, a clean pass is a survivor. Mutants
with a written equivalence argument are listed but left out of the score. The unmutated tree
runs first and must pass with tests executed, otherwise nothing is judged (a GPU-less machine
would otherwise "kill" nothing and let every mutant survive on skips). Results go to ``<out>``:
``mutants.json``, ``mutants.md``, ``run.json`` (the score, its target, the survivors) and
``report.html``.

A catalogue run can be split over several runs: ``--stop-after`` ends a run at a wall-clock
deadline (mutants it cuts are listed as not run, never as hangs), and ``--resume`` takes a
previous run's ``mutants.json``, keeps its verdicts and judges only the mutants it did not.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from frost_harness import invocation
from frost_harness.fuzz.mutants import CATALOGUE, Mutant

PACKAGES = ("frost", "frost_harness")  # all a mutant's run needs: the kernels and the suites
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis"}
DEFAULT_SUITES = ("frost_harness/suites/sm80",)


@dataclasses.dataclass
class Outcome:
    mutant: str
    category: str
    verdict: str            # killed | timed out | survived | equivalent | broken | not run
    killed_by: str = ""     # the first failing test
    seconds: float = 0.0
    detail: str = ""


def classify(returncode: int | None, output: str) -> tuple[str, str]:
    """(verdict, first failing test) of one pytest run; ``returncode`` None means it timed out.

    A kill is a test that failed or errored, as pytest's short summary lists it, in a run that
    exited non-zero: 1, or 2 when ``-x`` under xdist interrupts the session at the first failure.
    Anything else non-zero (a collection error, an internal error) is a broken run.
    """
    if returncode is None:
        return "timed out", ""
    if returncode == 0:
        return "survived", ""
    summary = output.rsplit("short test summary info", 1)[-1] if "short test summary info" in output else output
    failed = re.search(r"^(?:FAILED|ERROR) (\S+::\S+)", summary, re.MULTILINE)
    collection = re.search(r"errors? during collection", output)
    if returncode in (1, 2) and failed and not collection:
        return "killed", failed.group(1)
    return "broken", failed.group(1) if failed else f"pytest exit {returncode}"


def copy_tree(dest: Path, root: Path = invocation.ROOT) -> Path:
    """The packages' sources (no caches) from ``root`` (the checkout, or site-packages) under ``dest``."""
    def ignore(_, names):
        return [n for n in names if n in SKIP_DIRS or n.endswith(".pyc")]

    for name in PACKAGES:
        shutil.copytree(root / name, dest / name, ignore=ignore, dirs_exist_ok=True)
    return dest


def _time_left(args) -> float:
    """Seconds this run may still spend on one pytest run: the per-mutant limit or the deadline."""
    deadline = getattr(args, "deadline", None)
    return args.timeout if deadline is None else min(args.timeout, deadline - time.monotonic())


def run_suites(tree: Path, args, select: str | None = None, workers: int | None = None
               ) -> tuple[int | None, str, float]:  # fmt: skip
    """One pytest run of the chosen suites against ``tree`` (``select``: a -k expression),
    with ``workers`` xdist workers (default ``args.workers``; 1: no xdist)."""
    workers = args.workers if workers is None else workers
    options = ["-m", args.marker, "-x", "-q"] + ["-n", str(workers) if workers > 1 else "0"]
    options += ["-k", select] if select else []
    options += [f"--frost-cache-dir={args.cache_dir}"] if getattr(args, "cache_dir", "") else []
    cmd = invocation.pytest_command(options, [], [tree / suite for suite in args.suites], root=tree)
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    start = time.monotonic()
    # its own process group: a hang is killed with its xdist workers, which would otherwise go on
    # spinning on the GPU beside the next mutants
    with subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as proc:
        try:
            output, _ = proc.communicate(timeout=max(_time_left(args), 1))
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if returncode is None:
            output, _ = proc.communicate()
    return returncode, output or "", time.monotonic() - start


def judge(mutant: Mutant, args, scratch: Path) -> Outcome:
    if mutant.equivalent:
        return Outcome(mutant.name, mutant.category, "equivalent", detail=mutant.equivalent)
    tree = copy_tree(scratch / mutant.name)
    mutant.apply(tree)
    # its likeliest killers first, a few tests in one process by default (no workers to start,
    # each compiling its own copy of the records; ``--focus-workers`` spreads the compiles of a
    # focus whose tests need different records); anything but a kill there runs the whole selection
    focus_workers = getattr(args, "focus_workers", 1)
    returncode, output, seconds = run_suites(tree, args, select=mutant.first_tests, workers=focus_workers)
    verdict, first = classify(returncode, output)
    if verdict not in ("killed", "timed out"):
        returncode, output, more = run_suites(tree, args)
        verdict, first = classify(returncode, output)
        seconds += more
    shutil.rmtree(tree, ignore_errors=True)
    if verdict == "timed out" and getattr(args, "deadline", None) is not None and _time_left(args) <= 1:
        # the run's deadline cut it, not the mutant's own limit: nothing was learned about it
        return Outcome(mutant.name, mutant.category, "not run", "", round(seconds, 1), "cut by --stop-after")
    return Outcome(mutant.name, mutant.category, verdict, first, round(seconds, 1), mutant.why)


def load_previous(path: str | None) -> dict[str, Outcome]:
    """The judged outcomes (not those left unrun) of an earlier run's ``mutants.json``."""
    if not path:
        return {}
    rows = json.loads(Path(path).read_text())
    return {row["mutant"]: Outcome(**row) for row in rows if row["verdict"] != "not run"}


def score(outcomes: list[Outcome]) -> tuple[int, int]:
    """(killed, judged): hangs count as killed; equivalents and mutants not run are not judged."""
    judged = [o for o in outcomes if o.verdict not in ("equivalent", "not run")]
    return sum(o.verdict in ("killed", "timed out") for o in judged), len(judged)


TARGET = 0.95  # the share of judged mutants the L0 GPU suite should kill


def write_report(outcomes: list[Outcome], out: Path, args) -> str:
    """``mutants.json``, ``mutants.md``, ``run.json`` and ``report.html`` in ``out``; returns the
    score line."""
    import pandas as pd

    from frost_harness.reports import html

    out.mkdir(parents=True, exist_ok=True)
    (out / "mutants.json").write_text(json.dumps([dataclasses.asdict(o) for o in outcomes], indent=1))
    killed, judged = score(outcomes)
    lines = [f"# Mutation score: {killed} of {judged} killed ({100 * killed / max(judged, 1):.0f}%)", "",
             f"suites: `pytest -m \"{args.marker}\" {' '.join(args.suites)} -x`", "",
             "| mutant | category | verdict | killed by | s | fault |", "|---|---|---|---|---|---|"]
    order = {"survived": 0, "broken": 1, "timed out": 2, "killed": 3, "equivalent": 4, "not run": 5}
    ranked = sorted(outcomes, key=lambda o: (order[o.verdict], o.mutant))
    for o in ranked:
        lines.append(f"| {o.mutant} | {o.category} | {o.verdict} | {o.killed_by} | {o.seconds} | {o.detail} |")
    (out / "mutants.md").write_text("\n".join(lines) + "\n")
    meta = {
        "key": "mutate", "title": f"frost-mutate, {time.strftime('%Y-%m-%d %H:%M')}", "killed": killed,
        "judged": judged, "target": TARGET, "catalogue": len(CATALOGUE),
        "not_run": sum(o.verdict == "not run" for o in outcomes),
        "equivalent": sum(o.verdict == "equivalent" for o in outcomes),
        "survivors": [o.mutant for o in outcomes if o.verdict == "survived"],
        "suites": f"pytest -m \"{args.marker}\" {' '.join(args.suites)}",
    }  # fmt: skip
    (out / "run.json").write_text(json.dumps(meta, indent=2))
    table = pd.DataFrame([dataclasses.asdict(o) for o in ranked],
                         columns=[f.name for f in dataclasses.fields(Outcome)])  # fmt: skip
    (out / "report.html").write_text(html.render_mutation(meta, table), encoding="utf-8")
    return lines[0]


def default_cache_dir() -> str:
    """frost's compile cache directory ('' when the disk cache is off): the suite runs share it."""
    from frost.kernels import disk_cache

    return str(disk_cache.cache_dir() or "")


def baseline_verdict(log: str) -> tuple[int, str]:
    """(exit status, closing line) of a pytest log given as ``--baseline-log``: 1 where its last
    closing line counts a failure or error, or where it has none (a cut-off run). Only pytest's
    closing line is read, with or without ``-q``'s missing banner: the harness's own summary
    counts oracle cases, and says FAILED of a case whose test is an expected failure."""
    closing = re.findall(r"^(?:=+ )?((?:\d+ \w+(?: \w+)?, )*\d+ \w+(?: \w+)?) in [\d.]+s", log, re.MULTILINE)
    if not closing:
        return 1, log
    return int(bool(re.search(r"\b\d+ (?:failed|errors?)\b", closing[-1]))), closing[-1]


def list_catalogue() -> str:
    rows = [f"{m.name:26} {m.category:18} {m.path:36} {m.why}" + (" [equivalent]" if m.equivalent else "")
            for m in CATALOGUE]
    equivalent = sum(bool(m.equivalent) for m in CATALOGUE)
    return "\n".join(rows + [f"{len(CATALOGUE)} mutants ({equivalent} equivalent, left out of the score)"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="frost-mutate", description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", default=list(DEFAULT_SUITES))
    parser.add_argument("--list", action="store_true", help="print the catalogue and exit")
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument("--marker", default="L0 and gpu")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants judged at once")
    parser.add_argument("-n", "--workers", type=int, default=4, help="pytest-xdist workers per mutant")
    parser.add_argument("--focus-workers", type=int, default=1,
                        help="xdist workers for a mutant's focus tests (1: one process)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant before it counts as a hang")
    parser.add_argument("--out", default=os.environ.get("OUT") or f"frost-out/mutate-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds: start no mutant after this; the rest are listed as not run")
    parser.add_argument("--stop-after", type=float, default=None,
                        help="seconds: stop running mutants then and list them as not run (never as hangs)")
    parser.add_argument("--resume", metavar="JSON",
                        help="an earlier run's mutants.json: its verdicts are kept and only the rest judged")
    parser.add_argument("--cache-dir", default=None, metavar="DIR",
                        help="the compile cache on disk that every suite run shares (default: frost's, "
                             "FROST_CACHE_DIR or ~/.cache/frost; '' gives each suite run a fresh one)")
    parser.add_argument("--baseline-log", metavar="LOG",
                        help="a pytest log of these suites (or a superset) on this tree, run just before: "
                             "judged instead of running the unmutated suites again")
    args = parser.parse_args(argv)
    args.suites = args.suites or list(DEFAULT_SUITES)
    args.cache_dir = default_cache_dir() if args.cache_dir is None else args.cache_dir
    if args.list:
        print(list_catalogue())
        return 0
    invocation.require_extra("frost-mutate")
    invocation.check_suites("frost-mutate")
    chosen = [m for m in CATALOGUE if not args.only or m.name in args.only.split(",")]
    previous = load_previous(args.resume)
    import torch

    if not torch.cuda.is_available():
        print("frost-mutate: the suites it runs need a CUDA device and none is available", file=sys.stderr)
        return 2
    start = time.monotonic()
    args.deadline = None if args.stop_after is None else start + args.stop_after
    with tempfile.TemporaryDirectory(prefix="frost-mutate-") as scratch:
        if args.baseline_log:
            returncode, output = baseline_verdict(Path(args.baseline_log).read_text(errors="replace"))
            seconds = 0.0
        else:
            returncode, output, seconds = run_suites(copy_tree(Path(scratch) / "baseline"), args)
        if returncode != 0 or not re.search(r"\b[1-9]\d* passed", output):
            print(f"frost-mutate: the unmutated suites must pass first (exit {returncode}):\n{output[-3000:]}",
                  file=sys.stderr)
            return 2
        todo = [m for m in chosen if m.name not in previous]
        print(f"baseline passed in {seconds:.0f}s; judging {len(todo)} mutants ({len(chosen) - len(todo)} kept "
              f"from --resume), {args.jobs} at once", flush=True)

        def judge_in_budget(mutant: Mutant) -> Outcome:
            if mutant.name in previous:
                return previous[mutant.name]
            if args.budget is not None and time.monotonic() - start > args.budget:
                return Outcome(mutant.name, mutant.category, "not run", detail="past --budget")
            if args.deadline is not None and _time_left(args) <= 1:
                return Outcome(mutant.name, mutant.category, "not run", detail="past --stop-after")
            return judge(mutant, args, Path(scratch))

        outcomes = []
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            for outcome in pool.map(judge_in_budget, chosen):
                print(f"{outcome.verdict:10} {outcome.mutant} {outcome.killed_by}", flush=True)
                outcomes.append(outcome)
    print(write_report(outcomes, Path(args.out), args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
