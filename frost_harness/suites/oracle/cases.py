"""Tiny, seeded attention problems for the oracle suites: one ``Case`` per feature or combination.

A ``Case`` names a problem shape and its features; ``build(case, seed, dtype)``
turns it into fresh random tensors (never zeros) and the keyword options of
``frost_harness.oracle.reference.forward``. Shapes stay tiny so that gradcheck and the
row-by-row transcription in ``frost_harness/suites/oracle/naive.py`` run in milliseconds;
``block_q`` defaults to 2 so every case crosses query-block boundaries.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from frost.case import BIAS_PATTERNS, CaseFields
from frost_harness.oracle.reference import valid_rows_mask

@dataclass(frozen=True, kw_only=True)
class Case(CaseFields):
    """A problem's shape and features (``frost.case.CaseFields``, with tiny defaults); the
    tensors come from ``build``. ``name`` comes first and positionally."""

    name: str = field(kw_only=False)
    seqlen_q: int = 4
    seqlen_k: int = 5
    heads_q: int = 2
    heads_kv: int = 2
    head_dim_qk: int = 4
    rope_table: bool = False  # with rope: arbitrary cos / sin values instead of a rotary table
    block_q: int = 2  # the oracle's query rows per block

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Problem:
    """Tensors of one case; ``options`` are the keywords of frost_harness.oracle.reference.forward."""

    case: Case
    q: Tensor
    k: Tensor
    v: Tensor
    do: Tensor
    options: dict

    @property
    def differentiable(self) -> dict[str, Tensor]:
        """Name -> input the backward differentiates (q, k, v and bias/sinks when present)."""
        named = {"q": self.q, "k": self.k, "v": self.v}
        for name in ("bias", "sinks"):
            if self.options.get(name) is not None:
                named[name] = self.options[name]
        return named

    @property
    def valid_q(self) -> Tensor:
        """Bool over q's leading dim: False on packed rows no sequence owns."""
        return valid_rows_mask(self.q.shape[0], self.options.get("cu_seqlens_q"))

    @property
    def valid_k(self) -> Tensor:
        return valid_rows_mask(self.k.shape[0], self.options.get("cu_seqlens_k"))

    def with_inputs(self, **tensors) -> Problem:
        """The same problem with some of q, k, v, do, bias, sinks replaced."""
        options = dict(self.options)
        for name in ("bias", "sinks"):
            if name in tensors:
                options[name] = tensors.pop(name)
        return replace(self, options=options, **tensors)


def rope_tables(kind: str, positions: int, half: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """float32 ``(cos, sin) [positions, half]``; "table" breaks cos^2 + sin^2 = 1 on purpose."""
    if kind == "angles":
        inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
        angles = torch.arange(positions, dtype=torch.float64).unsqueeze(1) * inv_freq
        return angles.cos().float(), angles.sin().float()
    cos, sin = (torch.rand(positions, half, generator=gen, dtype=torch.float64) * 2 - 1 for _ in range(2))
    return cos.float(), sin.float()


def _randn(gen: torch.Generator, *shape) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def build(case: Case, seed: int = 0, dtype: torch.dtype = torch.float64) -> Problem:
    """Random inputs for ``case``: q/k/v/do in ``dtype``, rope tables in float32, bias and sinks in
    float32, or float64 when ``dtype`` is (gradcheck differentiates them too)."""
    gen = torch.Generator().manual_seed(seed)
    side = torch.float64 if dtype == torch.float64 else torch.float32
    options = {"causal": case.causal, "causal_align": case.causal_align, "window": case.window,
               "scale": case.scale, "block_q": case.block_q}
    if case.layout == "thd":
        starts_q = [0]
        starts_k = [0]
        for n_q, n_k in zip(case.lengths_q, case.lengths_k):
            starts_q.append(starts_q[-1] + n_q)
            starts_k.append(starts_k[-1] + n_k)
        options["cu_seqlens_q"] = torch.tensor(starts_q, dtype=torch.int32)
        options["cu_seqlens_k"] = torch.tensor(starts_k, dtype=torch.int32)
        rows_q = (starts_q[-1] + case.tail_q,)
        rows_k = (starts_k[-1] + case.tail_k,)
        batch, max_q, max_k = len(case.lengths_q), max(case.lengths_q), max(case.lengths_k)
        bias_rows = (max_q + 1, max_k + 2)  # larger than needed: indexed by in-sequence positions
    else:
        rows_q, rows_k = (case.batch, case.seqlen_q), (case.batch, case.seqlen_k)
        batch, max_q, max_k = case.batch, case.seqlen_q, case.seqlen_k
        bias_rows = (case.seqlen_q, case.seqlen_k)
        if case.padded:
            options["seqlens_q"] = torch.tensor(case.lengths_q, dtype=torch.int32)
            options["seqlens_k"] = torch.tensor(case.lengths_k, dtype=torch.int32)
    q = _randn(gen, *rows_q, case.heads_q, case.head_dim_qk)
    k = _randn(gen, *rows_k, case.heads_kv, case.head_dim_qk)
    v = _randn(gen, *rows_k, case.heads_kv, case.dim_v)
    do = _randn(gen, *rows_q, case.heads_q, case.dim_v)
    if case.bias is not None:
        shape = (batch if case.bias[0] == "B" else 1, case.heads_q if case.bias[1] == "H" else 1, *bias_rows)
        options["bias"] = _randn(gen, *shape).to(side)
    if case.sinks:
        options["sinks"] = _randn(gen, case.heads_q).to(side)
    if case.rope:
        kind = "table" if case.rope_table else "angles"
        options["rope"] = rope_tables(kind, max(max_q, max_k) + 1, case.head_dim_qk // 2, gen)
    return Problem(case, q.to(dtype), k.to(dtype), v.to(dtype), do.to(dtype), options)


# Every feature of SEMANTICS.md alone, then the combinations that interact.
FEATURES = (
    Case("mha"),
    Case("gqa", heads_q=4, heads_kv=2),
    Case("mqa", heads_q=4, heads_kv=1),
    Case("dqk_ne_dv", head_dim_qk=6, head_dim_v=4),
    Case("custom_scale", scale=0.37),
    Case("causal_top_left", seqlen_q=4, seqlen_k=6, causal=True),
    Case("causal_top_left_sq_gt_sk", seqlen_q=6, seqlen_k=4, causal=True),
    Case("causal_bottom_right_sq_lt_sk", seqlen_q=3, seqlen_k=6, causal=True, causal_align="bottom_right"),
    Case("causal_bottom_right_sq_gt_sk", seqlen_q=6, seqlen_k=3, causal=True, causal_align="bottom_right"),
    Case("window_left", seqlen_q=6, seqlen_k=6, window=(2, -1)),
    Case("window_right", seqlen_q=6, seqlen_k=6, window=(-1, 1)),
    Case("window_both", seqlen_q=6, seqlen_k=7, window=(1, 2)),
    Case("window_zero", seqlen_q=6, seqlen_k=4, window=(0, 0)),
    Case("window_larger_than_sequence", seqlen_q=4, seqlen_k=5, window=(50, 60)),
    Case("causal_window_left", seqlen_q=6, seqlen_k=6, causal=True, window=(2, -1)),
    *(Case(f"bias_{shape}", bias=shape) for shape in BIAS_PATTERNS),
    Case("rope", rope=True),
    Case("rope_general_table", rope=True, rope_table=True),
    Case("sinks", sinks=True),
    Case("padded", seqlen_q=5, seqlen_k=6, lengths_q=(5, 2), lengths_k=(3, 6)),
    Case("padded_empty", seqlen_q=4, seqlen_k=5, lengths_q=(0, 3), lengths_k=(4, 0), sinks=True),
    Case("packed", layout="thd", lengths_q=(3, 4), lengths_k=(4, 2)),
    Case("packed_zero_length_and_tail", layout="thd", lengths_q=(3, 0, 4, 2), lengths_k=(2, 3, 0, 4),
         tail_q=2, tail_k=2),
    # Combinations that interact.
    Case("gqa_window_sinks", heads_q=4, heads_kv=2, seqlen_q=6, seqlen_k=6, window=(1, 1), sinks=True),
    Case("mqa_causal_bottom_right_sinks", heads_q=4, heads_kv=1, seqlen_q=3, seqlen_k=5, causal=True,
         causal_align="bottom_right", sinks=True),
    Case("rope_bias", rope=True, bias="BH"),
    Case("rope_table_bias_gqa", rope=True, rope_table=True, bias="1H", heads_q=4, heads_kv=2),
    Case("bottom_right_window_sq_gt_sk", seqlen_q=7, seqlen_k=4, window=(1, 0), causal_align="bottom_right"),
    Case("bottom_right_window_both_sq_gt_sk_bias", seqlen_q=6, seqlen_k=4, window=(2, 1), causal_align="bottom_right",
         bias="B1"),
    Case("packed_everything", layout="thd", lengths_q=(3, 0, 5), lengths_k=(4, 2, 0), tail_q=1, tail_k=1, heads_q=4,
         heads_kv=2, head_dim_qk=6, head_dim_v=4, causal=True, causal_align="bottom_right", window=(2, -1), bias="BH",
         sinks=True, rope=True, scale=0.6),
    Case("padded_everything", seqlen_q=5, seqlen_k=6, lengths_q=(5, 1), lengths_k=(3, 6), heads_q=4,
         heads_kv=1, causal=True, causal_align="bottom_right", bias="1H", sinks=True, rope=True, rope_table=True),
    Case("sinks_bias_window_zero", seqlen_q=5, seqlen_k=5, window=(0, 0), bias="11", sinks=True),
)

FEATURES_BY_NAME = {case.name: case for case in FEATURES}
