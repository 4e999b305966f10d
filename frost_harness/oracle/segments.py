"""How a call's tensors split into sequences: the one place that knows the layouts.

Both the float64 reference and the same-precision baseline work one sequence
at a time. This module turns the layout arguments of SEMANTICS.md (dense BSHD,
dense with ``seqlens`` padding, packed THD with ``cu_seqlens``) into a tuple of
``Segment`` records, each saying where sequence b's rows live in q/o, k/v and
lse, and how many of them are valid. It also owns the output conventions of
rows that no sequence owns:

- dense padded query rows: ``o = 0``, ``lse = -inf``, zero gradients (the
  contract); padded keys: ``dk = dv = 0``;
- packed rows past ``cu_seqlens[-1]``: the contract leaves them untouched, so
  they have no defined value; the oracle fills them with NaN (o, lse, dq past
  ``cu_seqlens_q[-1]``; dk, dv past ``cu_seqlens_k[-1]``). NaN marks "do not
  compare" for ``frost_harness.oracle.tolerance`` and cannot be mistaken for a real value.

Validation here is deliberately light (shapes the oracle would otherwise
misread); the full validation of user input belongs to frost.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch
from torch import Tensor


@dataclass(frozen=True)
class Segment:
    """One sequence: index tuples that select its rows, and its valid lengths.

    ``q_index`` selects its ``[sq, Hq, *]`` rows from q, o and do; ``k_index``
    its ``[sk, Hkv, *]`` rows from k and v; ``lse_index`` its ``[Hq, sq]``
    block of lse. ``batch`` is b, the index into a bias of batch size B.
    """

    batch: int
    sq: int
    sk: int
    q_index: tuple
    k_index: tuple
    lse_index: tuple


@dataclass(frozen=True)
class Layout:
    """The sequences of one call and the shapes of its outputs."""

    packed: bool
    batch: int
    hq: int
    hkv: int
    rows_q: int  # Sq (dense) or Tq (packed)
    rows_k: int  # Sk (dense) or Tk (packed)
    owned_q: int  # rows before this belong to some sequence: cu_seqlens_q[-1], or rows_q when dense
    owned_k: int
    segments: tuple[Segment, ...]

    @property
    def group(self) -> int:
        """Query heads per kv head (Hq // Hkv)."""
        return self.hq // self.hkv

    @property
    def max_sq(self) -> int:
        return max((s.sq for s in self.segments), default=0)

    @property
    def max_sk(self) -> int:
        return max((s.sk for s in self.segments), default=0)

    def o_shape(self, dv: int) -> tuple[int, ...]:
        if self.packed:
            return (self.rows_q, self.hq, dv)
        return (self.batch, self.rows_q, self.hq, dv)

    def lse_shape(self) -> tuple[int, ...]:
        if self.packed:
            return (self.hq, self.rows_q)
        return (self.batch, self.hq, self.rows_q)

    def new_rows(self, shape, fill: float, *, dtype, device) -> Tensor:
        """An output buffer: ``fill`` in dense padding, NaN in packed rows no sequence owns.

        Every row a segment owns is overwritten by the caller, so for packed
        input only the tail past ``cu_seqlens[-1]`` keeps the NaN.
        """
        value = float("nan") if self.packed else fill
        return torch.full(shape, value, dtype=dtype, device=device)


def _lengths(arg: Tensor | None, name: str, batch: int, full: int) -> list[int]:
    if arg is None:
        return [full] * batch
    if arg.dim() != 1 or arg.numel() != batch:
        raise ValueError(f"{name} must have shape [B] = [{batch}], got {tuple(arg.shape)}")
    lengths = [int(x) for x in arg.tolist()]
    if any(n < 0 or n > full for n in lengths):
        raise ValueError(f"{name} values must lie in [0, {full}], got {lengths}")
    return lengths


def _offsets(cu: Tensor, name: str, total: int) -> list[int]:
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must have shape [B+1], got {tuple(cu.shape)}")
    offsets = [int(x) for x in cu.tolist()]
    if offsets[0] != 0 or any(b < a for a, b in pairwise(offsets)) or offsets[-1] > total:
        raise ValueError(f"{name} must start at 0, not decrease and end <= {total}, got {offsets}")
    return offsets


def split(q: Tensor, k: Tensor, v: Tensor, *, seqlens_q=None, seqlens_k=None,
          cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None) -> Layout:
    """Check the layout arguments and cut the call into per-sequence segments.

    ``max_seqlen_q``/``max_seqlen_k`` (frost's hints for packed input) are
    accepted so that a caller can pass frost's keywords unchanged; the oracle
    only checks that they bound every sequence length.
    """
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
    packed = cu_seqlens_q is not None
    if packed and (seqlens_q is not None or seqlens_k is not None):
        raise ValueError("seqlens_q/seqlens_k are for the dense layout; packed input uses cu_seqlens")
    rank = 3 if packed else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            layout = "packed [T, H, D]" if packed else "dense [B, S, H, D]"
            raise ValueError(f"{name} must be {layout}, got shape {tuple(t.shape)}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must agree in all but the last dim, got {tuple(k.shape)} "
                         f"and {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share Dqk, got {q.shape[-1]} and {k.shape[-1]}")
    hq, hkv = q.shape[-2], k.shape[-2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"Hq ({hq}) must be a multiple of Hkv ({hkv})")

    if packed:
        starts_q = _offsets(cu_seqlens_q, "cu_seqlens_q", q.shape[0])
        starts_k = _offsets(cu_seqlens_k, "cu_seqlens_k", k.shape[0])
        if len(starts_q) != len(starts_k):
            raise ValueError("cu_seqlens_q and cu_seqlens_k must have the same length B+1")
        batch, rows_q, rows_k = len(starts_q) - 1, q.shape[0], k.shape[0]
        owned_q, owned_k = starts_q[-1], starts_k[-1]
        segments = tuple(
            Segment(b, starts_q[b + 1] - starts_q[b], starts_k[b + 1] - starts_k[b],
                    (slice(starts_q[b], starts_q[b + 1]),),
                    (slice(starts_k[b], starts_k[b + 1]),),
                    (slice(None), slice(starts_q[b], starts_q[b + 1])))
            for b in range(batch))
    else:
        if k.shape[0] != q.shape[0]:
            raise ValueError(f"q and k must share B, got {q.shape[0]} and {k.shape[0]}")
        batch, rows_q, rows_k = q.shape[0], q.shape[1], k.shape[1]
        owned_q, owned_k = rows_q, rows_k
        lens_q = _lengths(seqlens_q, "seqlens_q", batch, rows_q)
        lens_k = _lengths(seqlens_k, "seqlens_k", batch, rows_k)
        segments = tuple(
            Segment(b, lens_q[b], lens_k[b], (b, slice(0, lens_q[b])), (b, slice(0, lens_k[b])),
                    (b, slice(None), slice(0, lens_q[b])))
            for b in range(batch))

    layout = Layout(packed, batch, hq, hkv, rows_q, rows_k, owned_q, owned_k, segments)
    for name, bound, longest in (("max_seqlen_q", max_seqlen_q, layout.max_sq),
                                 ("max_seqlen_k", max_seqlen_k, layout.max_sk)):
        if bound is not None and int(bound) < longest:
            raise ValueError(f"{name}={int(bound)} is shorter than the longest sequence ({longest})")
    return layout


def check_bias(bias: Tensor, layout: Layout) -> None:
    """Bias is ``[B|1, Hq|1, Sq, Sk]`` (dense) or ``[B|1, Hq|1, >=max Sq_b, >=max Sk_b]`` (packed)."""
    if bias.dim() != 4 or bias.shape[0] not in (1, layout.batch) or bias.shape[1] not in (1, layout.hq):
        raise ValueError(f"bias must be [B|1, Hq|1, Sq, Sk] with B={layout.batch}, Hq={layout.hq}, "
                         f"got {tuple(bias.shape)}")
    if layout.packed:
        if bias.shape[2] < layout.max_sq or bias.shape[3] < layout.max_sk:
            raise ValueError(f"packed bias must cover the longest sequences ({layout.max_sq}, "
                             f"{layout.max_sk}), got {tuple(bias.shape)}")
    elif tuple(bias.shape[2:]) != (layout.rows_q, layout.rows_k):
        raise ValueError(f"dense bias must end in (Sq, Sk) = ({layout.rows_q}, {layout.rows_k}), "
                         f"got {tuple(bias.shape)}")


def bias_index(bias: Tensor, seg: Segment) -> tuple:
    """Index of sequence ``seg``'s ``[Hq|1, sq, sk]`` block of bias (and of dbias)."""
    return (seg.batch if bias.shape[0] > 1 else 0, slice(None), slice(0, seg.sq), slice(0, seg.sk))


def check_sinks(sinks: Tensor, layout: Layout) -> None:
    if sinks.shape != (layout.hq,):
        raise ValueError(f"sinks must have shape [Hq] = [{layout.hq}], got {tuple(sinks.shape)}")


def valid_rows_mask(num_rows: int, cu_seqlens: Tensor | None = None) -> Tensor:
    """Bool ``[num_rows]``: True for the rows a packed sequence owns (rows < ``cu_seqlens[-1]``).

    The oracle's outputs are NaN on the other rows (see the module docstring);
    with ``cu_seqlens=None`` (dense input) every row is valid.
    """
    if cu_seqlens is None:
        return torch.ones(num_rows, dtype=torch.bool)
    return torch.arange(num_rows, device=cu_seqlens.device) < cu_seqlens[-1]
