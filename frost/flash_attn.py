"""FlashAttention-2's function API on frost: ``flash_attn_func`` and ``flash_attn_varlen_func``.

Code written for the ``flash_attn`` package switches by an import
(``from frost import flash_attn_func, flash_attn_varlen_func``), and a module that exposes
them serves as a Hugging Face hub kernel: transformers wraps a kernel module's
``flash_attn_varlen_func`` in its flash-attention path. Both functions are differentiable
(``frost.attention``) and trace under ``torch.compile``.

FA2's arguments in frost's contract (SEMANTICS.md):

- q, k, v: ``[B, S, H, D]`` (``flash_attn_func``) or packed ``[T, H, D]`` with int32
  ``cu_seqlens_q`` / ``cu_seqlens_k`` and ``max_seqlen_q`` / ``max_seqlen_k``
  (``flash_attn_varlen_func``): frost's BSHD and THD layouts as they are.
- ``causal`` and ``window_size=(left, right)`` are aligned to the bottom right, per sequence
  (FA2 >= 2.1): ``causal_align="bottom_right"``. A negative side is unbounded (-1); with
  ``causal`` the right side is 0, as FA2 sets it.
- ``softmax_scale`` is ``scale`` (default ``1/sqrt(D)``); ``deterministic`` is the backward's.
- ``return_attn_probs=True`` returns ``(out, softmax_lse, None)``: lse ``[B, H, Sq]`` or
  ``[H, T]``, float32, natural log, FA2's shapes; FA2's third output (the probabilities, with
  the dropout pattern) is not materialized. lse carries no gradient, as in FA2.
- ``dropout_p`` must be 0, ``softcap`` 0, ``alibi_slopes`` and ``block_table`` None: frost has
  none of them yet, and a ValueError names the argument.
- ``s_aux`` (keyword-only, beyond FA2's signature): per-head attention sinks, frost's
  ``sinks``; transformers passes it to kernels whose function takes it (gpt-oss), and drops
  it silently for those whose function does not.
- A query row that sees no key gets ``out = 0`` and ``lse = -inf`` (FA2 writes +inf there).
- ``max_seqlen_*`` given as a 0-dim tensor (transformers does so when it derives them from
  ``position_ids``) is read on the host, or, while torch.compile traces, left to frost to
  find at run time.
"""
from __future__ import annotations

import torch
from torch import Tensor

from frost.ops import attention


def flash_attn_func(
    q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None,
    causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
    alibi_slopes: Tensor | None = None, deterministic: bool = False, return_attn_probs: bool = False,
    *, s_aux: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor, None]:  # fmt: skip
    """FA2's ``flash_attn_func``: q ``[B, Sq, Hq, D]``, k and v ``[B, Sk, Hkv, D]``; returns out
    ``[B, Sq, Hq, Dv]``, or ``(out, softmax_lse, None)`` with ``return_attn_probs``."""
    _refuse_absent_features(dropout_p, softcap, alibi_slopes, None)
    out = attention(q, k, v, **_keywords(softmax_scale, causal, window_size, deterministic, s_aux),
                    return_lse=return_attn_probs)  # fmt: skip
    return (*out, None) if return_attn_probs else out


def flash_attn_varlen_func(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
    max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: float | None = None, causal: bool = False,
    window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Tensor | None = None,
    deterministic: bool = False, return_attn_probs: bool = False, block_table: Tensor | None = None,
    *, s_aux: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor, None]:  # fmt: skip
    """FA2's ``flash_attn_varlen_func``: packed q ``[Tq, Hq, D]``, k and v ``[Tk, Hkv, D]``, the
    sequences by int32 ``cu_seqlens_q`` / ``cu_seqlens_k`` ``[B + 1]``; returns out ``[Tq, Hq, Dv]``,
    or ``(out, softmax_lse, None)`` with ``return_attn_probs``."""
    _refuse_absent_features(dropout_p, softcap, alibi_slopes, block_table)
    out = attention(
        q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=_longest(max_seqlen_q),
        max_seqlen_k=_longest(max_seqlen_k), **_keywords(softmax_scale, causal, window_size, deterministic, s_aux),
        return_lse=return_attn_probs,
    )  # fmt: skip
    return (*out, None) if return_attn_probs else out


def _refuse_absent_features(dropout_p, softcap, alibi_slopes, block_table) -> None:
    if dropout_p != 0:
        raise ValueError(f"dropout_p: frost has no attention dropout; expected 0.0, got {dropout_p!r}")
    if softcap != 0:
        raise ValueError(f"softcap: frost has no logit softcapping yet; expected 0.0, got {softcap!r}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: frost has no ALiBi yet; expected None")
    if block_table is not None:
        raise ValueError("block_table: frost has no paged KV cache yet; expected None")


def _keywords(softmax_scale, causal, window_size, deterministic, s_aux) -> dict:
    """frost.attention's keywords for FA2's: bottom-right windows, negative sides unbounded."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size: expected a (left, right) pair of ints, got {window_size!r}")
    left, right = (-1 if isinstance(side, int) and not isinstance(side, bool) and side < 0 else side
                   for side in window_size)  # fmt: skip
    if causal is True:  # FA2 sets the right side to 0 under causal; a bad causal reaches validation as given
        right = 0
    return dict(scale=softmax_scale, causal=causal, causal_align="bottom_right", window=(left, right),
                deterministic=deterministic, sinks=None if s_aux is None else s_aux.float())  # fmt: skip


def _longest(value):
    """A ``max_seqlen_*`` argument as frost takes it: an int (or SymInt); a tensor is read on the
    host as FA2 reads it, except while torch.compile traces (None: frost finds it at run time)."""
    if isinstance(value, Tensor):
        return None if torch.compiler.is_compiling() else int(value)
    return value
