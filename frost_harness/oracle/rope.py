"""Fused rotary embedding (SEMANTICS.md step 1) and its transpose for the backward.

``rot(x, p) = concat(x1*cos[p] - x2*sin[p], x2*cos[p] + x1*sin[p])`` with
``x1, x2`` the two halves of the head dim, positions counted from 0 within
each sequence. The gradient with respect to the unrotated input is the
*transpose* of that linear map, ``concat(g1*cos + g2*sin, g2*cos - g1*sin)``;
it equals the inverse rotation only when ``cos^2 + sin^2 == 1``, and the
contract (and so the oracle) uses the transpose for any table.
"""
from __future__ import annotations

import torch
from torch import Tensor


def check_rope(rope, dqk: int, positions: int) -> None:
    """``rope`` is ``(cos, sin)``, each ``[max_pos >= positions, Dqk // 2]``."""
    if not isinstance(rope, (tuple, list)) or len(rope) != 2:
        raise ValueError("rope must be a (cos, sin) pair")
    if dqk % 2:
        raise ValueError(f"rope needs an even Dqk, got {dqk}")
    for name, table in zip(("cos", "sin"), rope):
        if table.dim() != 2 or table.shape[1] != dqk // 2 or table.shape[0] < positions:
            raise ValueError(f"rope {name} must be [max_pos >= {positions}, {dqk // 2}], "
                             f"got {tuple(table.shape)}")


def rotate(x: Tensor, cos: Tensor, sin: Tensor, *, transpose: bool = False) -> Tensor:
    """Rotate ``x [S, H, D]`` by the first S rows of the ``[max_pos, D/2]`` tables.

    Computes in the promoted dtype of x and the tables; callers pick it by
    casting beforehand (float64 in the oracle, float32 in the baseline).
    """
    rows = x.shape[0]
    c = cos[:rows].unsqueeze(1)
    s = sin[:rows].unsqueeze(1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    if transpose:
        s = -s
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
