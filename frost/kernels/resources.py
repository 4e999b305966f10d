"""Registers and spill (stack) bytes per compiled kernel, read from the SASS of disk-cache entries.

    python3 -m frost.kernels.resources [--records L0|all] [--arch sm_80] [--template sm80/bwd] [-j N]
    python3 -m frost.kernels.resources --profiles [-j N]

Builds (or loads) the records into the disk cache as ``frost-compile`` does, then runs
``cuobjdump -res-usage`` on the device code embedded in each entry's object file and
prints one Markdown row per record: template, the record's distinguishing fields, REG,
STACK (the local frame: spills and local arrays; 0 is the goal). ``cuobjdump`` is found
on PATH or through ``$CUOBJDUMP`` (pip: ``nvidia-cuda-cuobjdump``).

``--profiles`` prints the README's table of supported GPUs instead: per class of the named parts
(frost/devices.py: opt-in shared memory per block and SM90) and head-dim flavor, the forward's
and the backward main kernel's tiles (default and deterministic mode, on a bf16 causal problem),
their shared memory, and registers / stack from the SASS built for the class's architecture.
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


FLAVOR_HEAD_DIMS = {"d64": (64, 64), "d128": (128, 128), "d192x128": (192, 128), "d192": (192, 192),
                    "d256": (256, 256)}


def profile_records(name: str) -> dict[str, tuple]:
    """flavor -> (forward, backward main, deterministic backward main) records planned for the
    named profile, on a bf16 causal problem (B2, S2048, 8 heads)."""
    import torch

    from frost import devices
    from frost.engines.sm80 import Sm80Backward, Sm80Forward
    from frost.problem import Problem

    rows = {}
    with devices.profile(name):
        for flavor, (dqk, dv) in FLAVOR_HEAD_DIMS.items():
            q, k, v = (torch.empty(2, 2048, 8, d, dtype=torch.bfloat16, device="meta") for d in (dqk, dqk, dv))
            problem = Problem.from_call("forward", q, k, v, causal=True)
            backward = dataclasses.replace(problem, direction="backward")  # the records read facts only
            deterministic = dataclasses.replace(backward, deterministic=True)
            rows[flavor] = (Sm80Forward().records(problem)[0], Sm80Backward().records(backward)[1],
                            Sm80Backward().records(deterministic)[1])
    return rows


def _tile(record) -> str:
    stages = getattr(record, "qdo_stages", 2)
    single = ", Q/dO single-buffered" if stages == 1 else ""
    return f"{record.tile_m}x{record.tile_n}, {record.num_warps} warps{single}"


def profile_table(jobs: int) -> list[str]:
    """The README's "Supported GPUs" rows (``--profiles``): one per class of parts and flavor."""
    from frost import devices
    from frost.kernels import prebuild

    classes: dict[tuple[int, bool], list[str]] = {}
    for name, part in devices.PROFILES.items():
        classes.setdefault((part.smem_per_block_optin, part.sm90), []).append(name)
    lines = ["| parts (opt-in smem / block) | flavor | forward tile | smem | REG/STACK | backward tile | smem "
             "| REG/STACK | deterministic REG/STACK |", "|---|---|---|---|---|---|---|---|---|"]
    for (smem, _), names in sorted(classes.items(), reverse=True):
        arch = devices.named(names[0]).arch
        records = profile_records(names[0])
        flat = [r for trio in records.values() for r in trio]
        if prebuild.build_records(flat, jobs, arch)["failed"]:
            raise RuntimeError(f"a record of {names[0]} failed to build for {arch}")
        usage = {record: f"{reg}/{stack}" for record, (_, _, reg, stack) in zip(flat, report(flat, arch))}
        for flavor, (fwd, bwd, det) in records.items():
            lines.append(f"| {', '.join(names)} ({smem:,} B) | {flavor} | {_tile(fwd)} | {fwd.smem_bytes():,} "
                         f"| {usage[fwd]} | {_tile(bwd)} | {bwd.smem_bytes():,} | {usage[bwd]} | {usage[det]} |")
    return lines


def main(argv=None) -> int:
    from frost.kernels import prebuild

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", choices=("L0", "all"), default="L0")
    parser.add_argument("--arch", default="sm_80")
    parser.add_argument("--template", help="only records of this template, e.g. sm80/bwd")
    parser.add_argument("-j", "--jobs", type=int, default=1)
    parser.add_argument("--profiles", action="store_true", help="the supported-GPUs table (module docstring)")
    args = parser.parse_args(argv)
    if args.profiles:
        print("\n".join(profile_table(args.jobs)))
        return 0
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
