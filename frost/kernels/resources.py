"""Registers and spill (stack) bytes per compiled kernel, read from the SASS of disk-cache entries.

    python3 -m frost.kernels.resources [--records L0|all] [--arch sm_80] [--template sm80/bwd] [-j N]

Builds (or loads) the records into the disk cache as ``frost-compile`` does, then runs
``cuobjdump -res-usage`` on the device code embedded in each entry's object file and
prints one Markdown row per record: template, the record's distinguishing fields, REG,
STACK (the local frame: spills and local arrays; 0 is the goal). ``cuobjdump`` is found
on PATH or through ``$CUOBJDUMP`` (pip: ``nvidia-cuda-cuobjdump``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_ELF = b"\x7fELF"
_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)")


def cuobjdump() -> str | None:
    return os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")


def usage_of_object(payload: bytes, tool: str) -> list[tuple[int, int]]:
    """(registers, stack bytes) of each kernel in an exported object file. The device code is
    an ELF image inside the host object's fatbin; cuobjdump reads it when handed the bytes
    from its ELF header on (what follows it is ignored)."""
    found = []
    with tempfile.TemporaryDirectory(prefix="frost-res-") as scratch:
        start = payload.find(_ELF, 1)  # offset 0 is the host object's own header
        while start > 0 and not found:
            cubin = Path(scratch) / "kernel.cubin"
            cubin.write_bytes(payload[start:])
            text = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True).stdout
            found = [(int(r), int(s)) for r, s in _USAGE.findall(text)]
            start = payload.find(_ELF, start + 1)
    return found


def _fields(record) -> str:
    """The fields that tell records of one template apart (dtype and the defaults left out)."""
    shown = []
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if field.name in ("dtype",) or value is False or value == field.default:
            continue
        shown.append(field.name if value is True else f"{field.name}={value}")
    return " ".join(shown)


def report(records, arch: str) -> list[tuple[str, str, int, int]]:
    """(template, fields, registers, stack) per record, from the disk cache entries for ``arch``."""
    from frost.kernels import disk_cache
    from frost.kernels.sm80.compile import template_of

    tool = cuobjdump()
    if tool is None:
        raise RuntimeError("cuobjdump not found: put it on PATH or set $CUOBJDUMP")
    root = disk_cache.cache_dir()
    rows = []
    for record in records:
        key = disk_cache.entry_key(template_of(record), record, arch)
        obj = disk_cache.payload(disk_cache.entry_path(root, key), key)
        if obj is None:
            raise RuntimeError(f"no intact cache entry for {template_of(record)} {record!r} ({arch})")
        for registers, stack in usage_of_object(obj, tool):
            rows.append((template_of(record), _fields(record), registers, stack))
    return rows


def main(argv=None) -> int:
    from frost.kernels import prebuild

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", choices=("L0", "all"), default="L0")
    parser.add_argument("--arch", default="sm_80")
    parser.add_argument("--template", help="only records of this template, e.g. sm80/bwd")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    tasks, _ = prebuild.plan(prebuild._records(args.records, args.template), [args.arch])
    records = [record for record, _ in tasks]  # those the arch can build
    counts = prebuild.build_records(records, args.jobs, args.arch)
    if counts["failed"]:
        return 1
    print("| template | record | REG | STACK |\n|---|---|---|---|")
    for template, fields, registers, stack in report(records, args.arch):
        print(f"| {template} | {fields} | {registers} | {stack} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
