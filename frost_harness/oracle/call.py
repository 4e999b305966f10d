"""One attention call's options, checked once and shared by the reference and the baseline.

``Call.of`` takes the keywords of ``frost_harness.oracle.reference.forward`` (the keywords
of frost's API), validates what the oracle would otherwise misread and
returns a frozen record: the per-sequence layout, the visibility rule, the
scale and the optional bias / sinks / rope tensors as given (each consumer
casts them to its own precision).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from frost_harness.oracle.masking import Visibility
from frost_harness.oracle.rope import check_rope
from frost_harness.oracle.segments import Layout, check_bias, check_sinks, split


@dataclass(frozen=True)
class Call:
    layout: Layout
    visibility: Visibility
    scale: float
    bias: Tensor | None
    sinks: Tensor | None
    rope: tuple[Tensor, Tensor] | None
    block_q: int

    @classmethod
    def of(cls, q: Tensor, k: Tensor, v: Tensor, *, scale=None, causal=False, causal_align="top_left",
           window=(-1, -1), seqlens_q=None, seqlens_k=None, cu_seqlens_q=None, cu_seqlens_k=None,
           max_seqlen_q=None, max_seqlen_k=None, bias=None, sinks=None, rope=None,
           block_q=256) -> Call:
        layout = split(q, k, v, seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q,
                       cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
        visibility = Visibility.from_args(causal, causal_align, window)
        if int(block_q) < 1:
            raise ValueError(f"block_q must be >= 1, got {block_q}")
        if bias is not None:
            check_bias(bias, layout)
        if sinks is not None:
            check_sinks(sinks, layout)
        if rope is not None:
            check_rope(rope, q.shape[-1], max(layout.max_sq, layout.max_sk))
            rope = tuple(rope)
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
        return cls(layout, visibility, scale, bias, sinks, rope, int(block_q))
