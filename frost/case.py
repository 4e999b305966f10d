"""The fields every test-case record shares, so that the three records speak one vocabulary.

``frost_harness.suites.harness.Case`` (the accuracy harness and the fuzz), ``frost_harness.suites.oracle.cases.Case``
(the oracle's tiny problems) and ``frost.kernels.sm80.check.Case`` (the kernel author's
quick loop) each describe one attention problem by its sizes and features, never by
tensors. Each derives from ``CaseFields`` and so names a concept the same way and means
the same by it; a record adds only what is its own (the harness's seeds and stress knobs,
the oracle's block size) and may change a default. It lives in frost because the check
script may not import the test harness; nothing in frost's API uses it.
"""
from __future__ import annotations

from dataclasses import dataclass

# Which of (batch, heads) a bias has; "1" broadcasts that dimension.
BIAS_PATTERNS = ("BH", "B1", "1H", "11")


@dataclass(frozen=True, kw_only=True)
class CaseFields:
    """Sizes and features of one problem, in the names of frost's API and of SEMANTICS.md."""

    layout: str = "bshd"  # "bshd" (dense; padded when lengths are given) or "thd" (packed)
    batch: int = 2  # bshd; a thd case has len(lengths_q) sequences
    seqlen_q: int = 24  # bshd extents (Sq, Sk)
    seqlen_k: int = 24
    lengths_q: tuple[int, ...] | None = None  # thd: each sequence's length; bshd: dense padding's valid lengths
    lengths_k: tuple[int, ...] | None = None
    tail_q: int = 0  # thd: rows of q past cu_seqlens_q[-1]
    tail_k: int = 0
    heads_q: int = 4
    heads_kv: int = 4
    head_dim_qk: int = 32
    head_dim_v: int | None = None  # None: head_dim_qk
    causal: bool = False
    causal_align: str = "top_left"  # or "bottom_right"
    window: tuple[int, int] = (-1, -1)  # (left, right), -1 unbounded
    bias: str | None = None  # one of BIAS_PATTERNS
    sinks: bool = False
    rope: bool = False
    scale: float | None = None  # None: 1 / sqrt(head_dim_qk)

    @property
    def dim_v(self) -> int:
        return self.head_dim_v or self.head_dim_qk

    @property
    def padded(self) -> bool:
        """Dense padding: a bshd case with valid lengths."""
        return self.layout == "bshd" and (self.lengths_q is not None or self.lengths_k is not None)
