"""Compile-time identity of the SM80 RoPE pass (``sm80/rope``): the ``RopeParams`` record.

A record of its own, beside ``config.py``'s attention records, because RoPE changes no code
of the attention kernels: the pass rotates q and k into the plan's workspace before the
forward (and the backward chain), and rotates dq and dk back after the backward, so the
attention records, and their compile keys, stay as they are for a call with ``rope=``.

The head dim is static here (the attention kernels take it at run time within a flavor):
it fixes the split point ``D / 2`` between the halves, the vector width of the global
accesses and the threads per row, so the kernel has no column predicates and no
per-element index arithmetic. The cost is one artifact per even head dim in use (a small
kernel: see ``rope.py``).
"""
from __future__ import annotations

import dataclasses

from frost.kernels.sm80.config import DTYPES, HEAD_DIM_MULTIPLE, LAYOUTS

MAX_HEAD_DIM = 256
TARGET_THREADS = 128  # a CTA covers as many whole token rows as fit in this many threads


@dataclasses.dataclass(frozen=True)
class RopeParams:
    """Everything that changes the generated code of ``sm80/rope``."""

    dtype: str      # "float16" | "bfloat16": q, k (and the rotated copies) in the io dtype
    head_dim: int   # Dqk: a multiple of 8 up to 256
    layout: str     # "bshd" (dense, any strides) | "thd" (packed with cu_seqlens)
    inverse: bool   # apply the transpose of the rotation (sin negated): dq, dk back to unrotated q, k

    @property
    def half(self) -> int:
        return self.head_dim // 2

    @property
    def vector(self) -> int:
        """Elements per global access: 8 (16 bytes) when both halves start 16-byte aligned,
        else 4 (8 bytes; a head dim that is a multiple of 8 but not of 16 puts x2 at 8 bytes)."""
        return 8 if self.half % 8 == 0 else 4

    @property
    def threads_per_row(self) -> int:
        """Threads sharing one (token, head) row: each owns a vector of x1 and the matching one of x2."""
        return self.half // self.vector

    @property
    def tokens_per_cta(self) -> int:
        return max(1, TARGET_THREADS // self.threads_per_row)

    @property
    def num_threads(self) -> int:
        return self.tokens_per_cta * self.threads_per_row

    def validate(self) -> "RopeParams":
        def bad(rule: str):
            raise ValueError(f"RopeParams {self}: {rule}")

        if self.dtype not in DTYPES or self.layout not in LAYOUTS:
            bad("dtype and layout must be known values")
        if not 0 < self.head_dim <= MAX_HEAD_DIM or self.head_dim % HEAD_DIM_MULTIPLE:
            bad(f"head_dim must be a positive multiple of {HEAD_DIM_MULTIPLE} up to {MAX_HEAD_DIM}")
        return self


def rope_params_for(*, dtype: str, head_dim: int, layout: str) -> tuple[RopeParams, RopeParams]:
    """(rotation, transpose) records of a problem: the forward uses the first, the backward both."""
    rotate = RopeParams(dtype=dtype, head_dim=head_dim, layout=layout, inverse=False).validate()
    return rotate, dataclasses.replace(rotate, inverse=True)
