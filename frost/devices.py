"""Device profiles: the facts of a GPU that frost's plans depend on, and which one is in force.

A plan of the SM80 engines (the kernels' tiles, a GQA group's split, the deterministic dQ's
slices, launch orders, the workspace) is made for a device: its compute capability (whether
SM90's instructions and clusters exist), the shared memory a block may opt in to (which tiles
fit), its SMs (how many CTAs fill it) and its L2. ``DeviceProfile`` holds those facts;
``PROFILES`` names the parts frost knows, from the vendors' figures
(``shared_memory_per_block_optin`` and friends as ``torch.cuda.get_device_properties``
reports them).

``profile_for(device)`` is the profile a plan for a problem on ``device`` is made for:

- the forced one, when one is: ``FROST_DEVICE_PROFILE=NAME`` in the environment (read once,
  at the first plan), or ``use(NAME)`` / ``use(None)`` at run time, which wins over it. A
  forced profile makes every plan on any machine, a CPU included, the one that device would
  get; on a GPU the kernels then run the records another part would get (how the smaller
  parts' records are proven on an H100), provided the GPU at hand can run them
  (``runs_on``: its shared memory and instructions cover the profile's);
- else a CUDA device's own profile, read from torch (``from_properties``);
- else (a CPU problem: plans for cross-compiled records) the H100's.

Changing the forced profile invalidates every kept plan (``frost.plans``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator

ENV = "FROST_DEVICE_PROFILE"
_MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """The figures of one GPU that plans read (per block and per SM, as the CUDA runtime reports them)."""

    name: str
    compute_capability: tuple[int, int]
    smem_per_block_optin: int   # bytes of shared memory one CTA may opt in to
    smem_per_sm: int            # bytes of shared memory per SM
    sm_count: int
    l2_bytes: int
    max_threads_per_sm: int
    registers_per_sm: int = 65536  # 32-bit registers: 64K on every SM8x and SM90 part

    @property
    def sm90(self) -> bool:
        """Whether SM90's instructions exist (red.global.add.v2/v4.f32, clusters, distributed shared memory)."""
        return self.compute_capability >= (9, 0)

    @property
    def arch(self) -> str:
        """The architecture frost compiles this device's records for: SASS built for sm_80 runs on
        every 8.x part, sm_90's only on 9.x."""
        return "sm_90" if self.sm90 else "sm_80"

    def runs_on(self, device: "DeviceProfile") -> str | None:
        """None when ``device`` can run every record made for this profile, else why not: its
        instructions and its opt-in shared memory must cover the profile's."""
        if self.sm90 and not device.sm90:
            return f"records for {self.name} use SM90 instructions, which {device.name} lacks"
        if device.smem_per_block_optin < self.smem_per_block_optin:
            return (f"records for {self.name} take up to {self.smem_per_block_optin} B of shared memory per block; "
                    f"{device.name} allows {device.smem_per_block_optin} B")
        return None


def _part(name, cc, optin_kib, sm_kib, sms, l2_mib, threads) -> DeviceProfile:
    return DeviceProfile(name, cc, optin_kib * 1024, sm_kib * 1024, sms, l2_mib * _MIB, threads)


# The parts frost plans for (compute capability; opt-in shared memory per block and shared memory
# per SM, KiB; SMs; L2, MiB; threads per SM). 8.6 and 8.9 parts opt in to 99 KiB (101,376 B)
# and run 1,536 threads per SM; 8.0 parts 163 KiB (166,912 B); 9.0 parts 227 KiB (232,448 B).
PROFILES: dict[str, DeviceProfile] = {p.name: p for p in (
    _part("a100", (8, 0), 163, 164, 108, 40, 2048),
    _part("a30", (8, 0), 163, 164, 56, 24, 2048),
    _part("a10", (8, 6), 99, 100, 72, 6, 1536),
    _part("a40", (8, 6), 99, 100, 84, 6, 1536),
    _part("a6000", (8, 6), 99, 100, 84, 6, 1536),
    _part("rtx3090", (8, 6), 99, 100, 82, 6, 1536),
    _part("l4", (8, 9), 99, 100, 58, 48, 1536),
    _part("l40s", (8, 9), 99, 100, 142, 96, 1536),
    _part("rtx4090", (8, 9), 99, 100, 128, 72, 1536),
    _part("h100", (9, 0), 227, 228, 132, 50, 2048),
    _part("h200", (9, 0), 227, 228, 132, 50, 2048),
)}
CPU_DEFAULT = "h100"  # a CPU problem's plans: the records cross-compiled for the H100 / H200


def named(name: str) -> DeviceProfile:
    """The named profile; ValueError listing the known names otherwise."""
    try:
        return PROFILES[name.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"device profile {name!r} is not known; known: {', '.join(PROFILES)}") from None


def from_properties(props, name: str | None = None) -> DeviceProfile:
    """A profile from ``torch.cuda.get_device_properties``' record."""
    return DeviceProfile(
        name=name or props.name, compute_capability=(props.major, props.minor),
        smem_per_block_optin=props.shared_memory_per_block_optin,
        smem_per_sm=props.shared_memory_per_multiprocessor, sm_count=props.multi_processor_count,
        l2_bytes=props.L2_cache_size, max_threads_per_sm=props.max_threads_per_multi_processor,
        registers_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
    )


@functools.lru_cache(maxsize=None)
def of_device(device: str) -> DeviceProfile:
    """A CUDA device's own profile (``"cuda"`` or ``"cuda:N"``)."""
    import torch

    return from_properties(torch.cuda.get_device_properties(torch.device(device)))


_UNSET = object()
_forced: object = _UNSET  # _UNSET: the environment decides (read once); None: none; else the profile


def forced() -> DeviceProfile | None:
    """The profile every plan is made for, if one is forced (``use`` or ``FROST_DEVICE_PROFILE``)."""
    global _forced
    if _forced is _UNSET:
        name = os.environ.get(ENV, "").strip()
        _forced = named(name) if name else None
    return _forced


def use(name: str | DeviceProfile | None) -> DeviceProfile | None:
    """Force plans for the named profile (a ``DeviceProfile`` too), or with None for each
    device's own again; returns the profile forced before. Kept plans are dropped."""
    from frost.engines.base import Engine

    global _forced
    before = forced()
    _forced = named(name) if isinstance(name, str) else name
    Engine.generation += 1  # plans made for the previous profile are stale (frost.plans)
    return before


@contextlib.contextmanager
def profile(name: str | DeviceProfile | None) -> Iterator[DeviceProfile | None]:
    """``use(name)`` within a ``with`` block, the previous profile restored after it."""
    before = use(name)
    try:
        yield forced()
    finally:
        use(before)


def profile_for(device: str) -> DeviceProfile:
    """The profile a plan for a problem on ``device`` is made for (module docstring)."""
    chosen = forced()
    if chosen is not None:
        return chosen
    if device.startswith("cuda"):
        return of_device(device)
    return PROFILES[CPU_DEFAULT]
