"""The plain records a call's layers pass along: the tensors of a call (Tensors), its
non-tensor keywords as given (Options) and what a backward returns (Grads).

They sit below both ``frost.validation`` and ``frost.problem`` and import neither, so
validation can read them without importing the module that builds Problems.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

# The tensor fields of Tensors, in argument order (the order validation reports them in).
TENSOR_FIELDS = (
    "q", "k", "v", "o", "lse", "do", "seqlens_q", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k",
    "bias", "sinks", "rope_cos", "rope_sin",
)  # fmt: skip


# slots and not frozen: built on every call, and a frozen dataclass's __init__ costs a
# object.__setattr__ per field. Plans only read it; nobody hashes it.
@dataclass(eq=False, slots=True)
class Tensors:
    """The tensors of one call, as plans read them. Not hashed; treat as read-only.

    After ``frost.problem.prepare``, dense padding always comes as both ``seqlens_q``
    and ``seqlens_k`` (a missing one is filled with the full length), and RoPE as
    ``rope_cos`` / ``rope_sin``.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    do: torch.Tensor | None = None
    seqlens_q: torch.Tensor | None = None
    seqlens_k: torch.Tensor | None = None
    cu_seqlens_q: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    rope_cos: torch.Tensor | None = None
    rope_sin: torch.Tensor | None = None


class Grads(NamedTuple):
    """What a backward returns; None where the input is absent (no bias, no sinks)."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    dbias: torch.Tensor | None = None
    dsinks: torch.Tensor | None = None


class Options(NamedTuple):
    """The non-tensor keywords of a call, as given (``window`` already split into two ints)."""

    scale: float | None = None
    causal: bool = False
    causal_align: str = "top_left"
    window: tuple[int, int] = (-1, -1)
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None
    deterministic: bool = False
    bias_grad: bool = True  # backward: whether dbias is computed (False: dbias None, its work skipped)
    # False for a call traced by torch.compile, and for frost.kvcache's forward (whose caller checks
    # its lengths where they may be read): once its signature was validated, seqlens / cu_seqlens
    # are read back only where the launch needs their values (frost.validation.check_values)
    check_lengths: bool = True
