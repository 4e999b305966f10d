"""Which keys a query row may see: causal alignment and sliding windows.

SEMANTICS.md step 3. Key j is visible to query i of a sequence with valid
lengths (sq, sk) iff ``j < sk`` and

- ``left < 0`` or ``j >= i + delta - left``,
- ``right < 0`` or ``j <= i + delta + right``,

with ``delta = 0`` (top-left) or ``sk - sq`` (bottom-right), and ``causal``
meaning ``right = 0``. Both bounds grow with i, so a block of query rows sees
a contiguous key range; the oracle visits only that range (this is what keeps
causal and windowed calls cheap) and builds an explicit mask only for blocks
that straddle a window edge.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ALIGNMENTS = ("top_left", "bottom_right")


@dataclass(frozen=True)
class Visibility:
    """The visibility rule of one call; -1 means unbounded on that side."""

    left: int
    right: int
    bottom_right: bool

    @classmethod
    def from_args(cls, causal: bool, causal_align: str, window) -> Visibility:
        if causal_align not in ALIGNMENTS:
            raise ValueError(f"causal_align must be one of {ALIGNMENTS}, got {causal_align!r}")
        if window is None:
            window = (-1, -1)
        left, right = (int(w) for w in window)
        if left < -1 or right < -1:
            raise ValueError(f"window values must be >= -1, got {tuple(window)}")
        if causal:
            right = 0
        return cls(left, right, causal_align == "bottom_right")

    def delta(self, sq: int, sk: int) -> int:
        return sk - sq if self.bottom_right else 0

    def key_range(self, i0: int, i1: int, sq: int, sk: int) -> tuple[int, int]:
        """Half-open range [j0, j1) holding every key visible to some row in [i0, i1)."""
        delta = self.delta(sq, sk)
        j0 = 0 if self.left < 0 else min(sk, max(0, i0 + delta - self.left))
        j1 = sk if self.right < 0 else min(sk, max(0, i1 - 1 + delta + self.right + 1))
        return j0, max(j0, j1)

    def block_mask(self, i0: int, i1: int, j0: int, j1: int, sq: int, sk: int,
                   device) -> Tensor | None:
        """Bool ``[i1-i0, j1-j0]``, True where visible; None when every pair is visible.

        Keys are assumed to lie below ``sk`` (``key_range`` guarantees it).
        """
        delta = self.delta(sq, sk)
        # The tightest constraints in the block sit at its last row (left edge)
        # and at its first row (right edge); if both hold, all pairs are visible.
        left_ok = self.left < 0 or j0 >= i1 - 1 + delta - self.left
        right_ok = self.right < 0 or j1 - 1 <= i0 + delta + self.right
        if j1 <= j0 or (left_ok and right_ok):
            return None
        rows = torch.arange(i0, i1, device=device).unsqueeze(1) + delta
        cols = torch.arange(j0, j1, device=device).unsqueeze(0)
        visible = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool, device=device)
        if self.left >= 0:
            visible &= cols >= rows - self.left
        if self.right >= 0:
            visible &= cols <= rows + self.right
        return visible
