"""Guard regions around the buffers an engine writes (its outputs and its workspace), checked after the launch.

``guarded(name, shape, dtype, device, fill)`` allocates one byte buffer: ``GUARD_BYTES``
of sentinel, then the body (a view of ``shape`` and ``dtype`` that the engine is handed,
filled with ``fill``), then sentinel again (``GUARD_BYTES`` and the few bytes that round
the body up to a whole 32-bit word). The sentinel repeats the word ``SENTINEL``: as
float32 a NaN with a payload, as int32 a large positive number (a counter an engine
forgot to zero is not spun on forever), and not a value an engine that writes zeros,
its own results or a neighbour's rows past an end would reproduce. ``damage`` names
every buffer whose guards changed, with how many guard bytes before and after it did,
so a write past the end of dq reads "dq: ..." and not a wrong number somewhere else.

A workspace body left with ``fill=None`` holds the sentinel too: scratch memory is
garbage to an engine, which must not count on it being zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

GUARD_BYTES = 256  # a multiple of 16: the body keeps the allocation's alignment (16-byte vector stores)
SENTINEL = 0x7FC0DEAD


@dataclass
class Guarded:
    """One guarded buffer: ``raw`` (uint8) holds guard, ``body``, guard; ``stop`` ends the body."""

    name: str
    raw: torch.Tensor
    body: torch.Tensor
    stop: int  # byte offset of the first guard byte after the body

    def damage(self) -> str | None:
        """None while both guards hold the sentinel; else which of them changed, and how much."""
        expected = _pattern(self.raw.numel(), self.raw.device)
        changed = self.raw != expected
        before = int(changed[:GUARD_BYTES].sum())
        after = int(changed[self.stop:].sum())
        if not (before or after):
            return None
        return (f"{self.name}: the engine wrote outside it ({before} of the {GUARD_BYTES} guard bytes "
                f"before it and {after} of the {self.raw.numel() - self.stop} after it changed)")


def _pattern(nbytes: int, device) -> torch.Tensor:
    """``nbytes`` (a multiple of 4) of the repeated sentinel word, as uint8."""
    word = torch.tensor([SENTINEL], dtype=torch.int64).to(torch.int32)  # 0x7FC0DEAD fits int32
    return word.repeat(nbytes // 4).view(torch.uint8).to(device)


def guarded(name: str, shape, dtype: torch.dtype, device, fill: float | None = math.nan) -> Guarded:
    """A guarded buffer whose body has ``shape`` and ``dtype`` and holds ``fill`` (None: the sentinel)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    stop = GUARD_BYTES + nbytes
    raw = _pattern(stop + GUARD_BYTES + (-nbytes) % 4, device)
    body = raw[GUARD_BYTES:stop].view(dtype).view(tuple(shape))
    if fill is not None:
        body.fill_(fill)
    return Guarded(name, raw, body, stop)


def damage(buffers: list[Guarded]) -> list[str]:
    """One line per buffer whose guards changed."""
    return [line for line in (buffer.damage() for buffer in buffers) if line is not None]
