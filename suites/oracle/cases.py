"""Tiny, seeded attention problems for the oracle suites: one ``Case`` per feature or combination.

A ``Case`` names a problem shape and its features; ``build(case, seed, dtype)``
turns it into fresh random tensors (never zeros) and the keyword options of
``oracle.reference.forward``. Shapes stay tiny so that gradcheck and the
row-by-row transcription in ``suites/oracle/naive.py`` run in milliseconds;
``block_q`` defaults to 2 so every case crosses query-block boundaries.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from oracle.reference import valid_rows_mask

BIAS_SHAPES = ("11", "B1", "1H", "BH")


@dataclass(frozen=True)
class Case:
    """A problem's shape and features; the tensors come from ``build``."""

    name: str
    batch: int = 2
    sq: int = 4  # dense rows (ignored when packed)
    sk: int = 5
    hq: int = 2
    hkv: int = 2
    dqk: int = 4
    dv: int = 4
    layout: str = "dense"  # dense | padded (seqlens) | packed (cu_seqlens)
    lens_q: tuple[int, ...] | None = None  # valid lengths per sequence (padded, packed)
    lens_k: tuple[int, ...] | None = None
    tail: int = 0  # packed rows past cu_seqlens[-1]
    causal: bool = False
    align: str = "top_left"
    window: tuple[int, int] = (-1, -1)
    bias: str | None = None  # one of BIAS_SHAPES: which of (B, H) the bias has
    sinks: bool = False
    rope: str | None = None  # "angles" (a real rotary table) or "table" (arbitrary values)
    scale: float | None = None
    block_q: int = 2

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Problem:
    """Tensors of one case; ``options`` are the keywords of oracle.reference.forward."""

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
    options = {"causal": case.causal, "causal_align": case.align, "window": case.window,
               "scale": case.scale, "block_q": case.block_q}
    if case.layout == "packed":
        starts_q = [0]
        starts_k = [0]
        for n_q, n_k in zip(case.lens_q, case.lens_k):
            starts_q.append(starts_q[-1] + n_q)
            starts_k.append(starts_k[-1] + n_k)
        options["cu_seqlens_q"] = torch.tensor(starts_q, dtype=torch.int32)
        options["cu_seqlens_k"] = torch.tensor(starts_k, dtype=torch.int32)
        rows_q = (starts_q[-1] + case.tail,)
        rows_k = (starts_k[-1] + case.tail,)
        batch, max_q, max_k = len(case.lens_q), max(case.lens_q), max(case.lens_k)
        bias_rows = (max_q + 1, max_k + 2)  # larger than needed: indexed by in-sequence positions
    else:
        rows_q, rows_k = (case.batch, case.sq), (case.batch, case.sk)
        batch, max_q, max_k = case.batch, case.sq, case.sk
        bias_rows = (case.sq, case.sk)
        if case.layout == "padded":
            options["seqlens_q"] = torch.tensor(case.lens_q, dtype=torch.int32)
            options["seqlens_k"] = torch.tensor(case.lens_k, dtype=torch.int32)
    q = _randn(gen, *rows_q, case.hq, case.dqk)
    k = _randn(gen, *rows_k, case.hkv, case.dqk)
    v = _randn(gen, *rows_k, case.hkv, case.dv)
    do = _randn(gen, *rows_q, case.hq, case.dv)
    if case.bias is not None:
        shape = (batch if case.bias[0] == "B" else 1, case.hq if case.bias[1] == "H" else 1, *bias_rows)
        options["bias"] = _randn(gen, *shape).to(side)
    if case.sinks:
        options["sinks"] = _randn(gen, case.hq).to(side)
    if case.rope is not None:
        options["rope"] = rope_tables(case.rope, max(max_q, max_k) + 1, case.dqk // 2, gen)
    return Problem(case, q.to(dtype), k.to(dtype), v.to(dtype), do.to(dtype), options)


# Every feature of SEMANTICS.md alone, then the combinations that interact.
FEATURES = (
    Case("mha"),
    Case("gqa", hq=4, hkv=2),
    Case("mqa", hq=4, hkv=1),
    Case("dqk_ne_dv", dqk=6, dv=4),
    Case("custom_scale", scale=0.37),
    Case("causal_top_left", sq=4, sk=6, causal=True),
    Case("causal_top_left_sq_gt_sk", sq=6, sk=4, causal=True),
    Case("causal_bottom_right_sq_lt_sk", sq=3, sk=6, causal=True, align="bottom_right"),
    Case("causal_bottom_right_sq_gt_sk", sq=6, sk=3, causal=True, align="bottom_right"),
    Case("window_left", sq=6, sk=6, window=(2, -1)),
    Case("window_right", sq=6, sk=6, window=(-1, 1)),
    Case("window_both", sq=6, sk=7, window=(1, 2)),
    Case("window_zero", sq=6, sk=4, window=(0, 0)),
    Case("window_larger_than_sequence", sq=4, sk=5, window=(50, 60)),
    Case("causal_window_left", sq=6, sk=6, causal=True, window=(2, -1)),
    *(Case(f"bias_{shape}", bias=shape) for shape in BIAS_SHAPES),
    Case("rope", rope="angles"),
    Case("rope_general_table", rope="table"),
    Case("sinks", sinks=True),
    Case("padded", sq=5, sk=6, layout="padded", lens_q=(5, 2), lens_k=(3, 6)),
    Case("padded_empty", sq=4, sk=5, layout="padded", lens_q=(0, 3), lens_k=(4, 0), sinks=True),
    Case("packed", layout="packed", lens_q=(3, 4), lens_k=(4, 2)),
    Case("packed_zero_length_and_tail", layout="packed", lens_q=(3, 0, 4, 2), lens_k=(2, 3, 0, 4),
         tail=2),
    # Combinations that interact.
    Case("gqa_window_sinks", hq=4, hkv=2, sq=6, sk=6, window=(1, 1), sinks=True),
    Case("mqa_causal_bottom_right_sinks", hq=4, hkv=1, sq=3, sk=5, causal=True,
         align="bottom_right", sinks=True),
    Case("rope_bias", rope="angles", bias="BH"),
    Case("rope_table_bias_gqa", rope="table", bias="1H", hq=4, hkv=2),
    Case("bottom_right_window_sq_gt_sk", sq=7, sk=4, window=(1, 0), align="bottom_right"),
    Case("bottom_right_window_both_sq_gt_sk_bias", sq=6, sk=4, window=(2, 1), align="bottom_right",
         bias="B1"),
    Case("packed_everything", layout="packed", lens_q=(3, 0, 5), lens_k=(4, 2, 0), tail=1, hq=4,
         hkv=2, dqk=6, dv=4, causal=True, align="bottom_right", window=(2, -1), bias="BH",
         sinks=True, rope="angles", scale=0.6),
    Case("padded_everything", layout="padded", sq=5, sk=6, lens_q=(5, 1), lens_k=(3, 6), hq=4,
         hkv=1, causal=True, align="bottom_right", bias="1H", sinks=True, rope="table"),
    Case("sinks_bias_window_zero", sq=5, sk=5, window=(0, 0), bias="11", sinks=True),
)

FEATURES_BY_NAME = {case.name: case for case in FEATURES}
