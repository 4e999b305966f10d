"""Which GPU each fuzz worker uses: one device per pytest-xdist worker, via CUDA_VISIBLE_DEVICES.

The runner (``frost-fuzz``) passes the device list to every test process in the
environment variable ``FROST_FUZZ_DEVICES`` ("0,1,2,3"). Each xdist worker ("gw0",
"gw1", ...) takes entry ``k mod len(devices)`` for worker ``gwk`` and sets
``CUDA_VISIBLE_DEVICES`` to it before anything initializes CUDA (``frost_harness.fuzz.plugin`` does
it in ``pytest_configure``; xdist sets ``PYTEST_XDIST_WORKER`` before that), so in
every worker ``cuda`` / ``cuda:0`` is its own GPU and the cases need no device index.
A list may repeat an entry ("0,0,1,1") to put two workers on each GPU. The report
rows carry the value in their ``gpu`` column.
"""
from __future__ import annotations

import os
import re
from collections.abc import MutableMapping, Sequence

ENV = "FROST_FUZZ_DEVICES"


def parse(spec: str) -> list[str]:
    """``"auto"`` (the GPUs this machine shows), ``"none"`` or ``""`` (no GPU), or ``"0,1,..."``."""
    spec = spec.strip()
    if spec == "auto":
        return detect()
    if spec in ("", "none"):
        return []
    devices = [entry.strip() for entry in spec.split(",")]
    if not all(devices):
        raise ValueError(f"devices: expected 'auto', 'none' or a comma-separated list like '0,1', got {spec!r}")
    return devices


def detect() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else every CUDA device torch sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [entry.strip() for entry in visible.split(",") if entry.strip() and entry.strip() != "-1"]
    import torch  # here: the runner needs torch only to count devices

    return [str(index) for index in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def for_worker(worker: str | None, devices: Sequence[str]) -> str:
    """The device of xdist worker ``gwK`` (round robin); a run without xdist (None, "main") takes the first."""
    if not devices:
        raise ValueError("no devices to assign")
    match = re.fullmatch(r"gw(\d+)", worker or "")
    return devices[int(match.group(1)) % len(devices) if match else 0]


def assign(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Set this process's ``CUDA_VISIBLE_DEVICES`` from ``FROST_FUZZ_DEVICES``; return it (None: no list)."""
    devices = parse(environ.get(ENV, "none"))
    if not devices:
        return None
    device = for_worker(environ.get("PYTEST_XDIST_WORKER"), devices)
    environ["CUDA_VISIBLE_DEVICES"] = device
    return device
