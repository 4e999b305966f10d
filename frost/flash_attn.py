"""FlashAttention-2's function API on frost: ``flash_attn_func``, ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache``.

Code written for the ``flash_attn`` package switches by an import
(``from frost import flash_attn_func, flash_attn_varlen_func``), and a module that exposes
them serves as a Hugging Face hub kernel: transformers wraps a kernel module's
``flash_attn_varlen_func`` in its flash-attention path. The first two are differentiable
(``frost.attention``) and trace under ``torch.compile``; ``flash_attn_with_kvcache`` is forward
only, as in FA2 (``frost.attention_with_kvcache``).

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
- ``dropout_p`` must be 0, ``softcap`` 0, ``alibi_slopes`` None, and ``flash_attn_varlen_func``'s
  ``block_table`` None: frost has none of them yet, and a ValueError names the argument.
- ``s_aux`` (keyword-only, beyond FA2's signature): per-head attention sinks, frost's
  ``sinks``; transformers passes it to kernels whose function takes it (gpt-oss), and drops
  it silently for those whose function does not.
- A query row that sees no key gets ``out = 0`` and ``lse = -inf`` (FA2 writes +inf there).
- ``max_seqlen_*`` given as a 0-dim tensor (transformers does so when it derives them from
  ``position_ids``) is read on the host, or, while torch.compile traces, left to frost to
  find at run time.

``flash_attn_with_kvcache`` on ``frost.attention_with_kvcache``: k / v appended in place at
``cache_seqlens`` (an int or int32 ``[B]``; None: every sequence fills the cache, and nothing
may be appended), ``block_table`` (pages of a multiple of 64 rows; FA2 asks for 256) and
``cache_batch_idx`` as FA2 takes them. ``rotary_cos`` / ``rotary_sin`` ``[S, rotary_dim / 2]`` in
any float dtype are the rotation's tables (cast to float32) as FA2 applies them: the first
``rotary_dim`` dims rotated, pairs ``(2i, 2i + 1)`` with ``rotary_interleaved`` (FA2's default),
else ``(i, i + rotary_dim / 2)``; k's rows at ``cache_seqlens + i``, q's too with causal or a
window, else every row of q at ``cache_seqlens``. ``cache_leftpad`` masks each sequence's rows
before it (positions, as in FA2, stay the rows' own). ``num_splits`` is a hint for kernels that
split the keys, taken and ignored.
"""
from __future__ import annotations

import torch
from torch import Tensor

from frost import kvcache
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


def flash_attn_with_kvcache(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Tensor | None = None, v: Tensor | None = None,
    rotary_cos: Tensor | None = None, rotary_sin: Tensor | None = None, cache_seqlens: Tensor | int | None = None,
    cache_batch_idx: Tensor | None = None, cache_leftpad: Tensor | None = None, block_table: Tensor | None = None,
    softmax_scale: float | None = None, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0, rotary_interleaved: bool = True, alibi_slopes: Tensor | None = None, num_splits: int = 0,
    return_softmax_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """FA2's ``flash_attn_with_kvcache``: q ``[B, Sq, Hq, D]`` over a cache ``[B_cache, S_cache, Hkv, D]``
    or pages ``[pages, page_size, Hkv, D]`` with ``block_table``, k and v appended in place first;
    returns out ``[B, Sq, Hq, Dv]``, or ``(out, softmax_lse)`` with ``return_softmax_lse``. Forward
    only. ``num_splits`` is accepted and ignored."""
    _refuse_absent_features(0.0, softcap, alibi_slopes, None)
    left, right = _window(causal, window_size)
    rotary = _rotary(q, k, rotary_cos, rotary_sin, rotary_interleaved, causal is True or (left, right) != (-1, -1))
    if cache_seqlens is None:
        if k is not None:
            raise ValueError("cache_seqlens: required when k and v are appended (the rows they go to)")
        cache_seqlens = _full_cache(k_cache, block_table)
    options = kvcache.attention_options(softmax_scale, causal, (left, right))
    return kvcache.step(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_batch_idx, cache_leftpad, rotary,
                        options, None, None, return_softmax_lse)  # fmt: skip


def _rotary(q, k, rotary_cos, rotary_sin, interleaved, masked) -> kvcache.Rotary | None:
    """FA2's rotary arguments as the KV-cache call's rotation: its tables (``[S, rotary_dim / 2]``,
    any float dtype) in float32; without causal or a window every query row at ``cache_seqlens``."""
    if rotary_cos is None and rotary_sin is None:
        return None
    if rotary_cos is None or rotary_sin is None:
        raise ValueError(f"{'rotary_cos' if rotary_cos is None else 'rotary_sin'}: rotary_cos and rotary_sin "
                         "come together")  # fmt: skip
    if k is None:
        raise ValueError("rotary_cos: rotates the appended k (and q at its positions); it needs k and v, as in FA2")
    if not isinstance(interleaved, bool):
        raise ValueError(f"rotary_interleaved: expected a bool, got {interleaved!r}")
    for name, table in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(table, Tensor) or not table.is_floating_point() or table.dim() != 2:
            raise ValueError(f"{name}: expected a float tensor [S, rotary_dim / 2]")
        if isinstance(q, Tensor) and 2 * table.shape[1] > q.shape[-1]:
            raise ValueError(f"{name}: rotary_dim {2 * table.shape[1]} exceeds the head dim {q.shape[-1]}")
    return kvcache.Rotary(rotary_cos.float(), rotary_sin.float(), interleaved, q_at_first_position=not masked)


def _full_cache(k_cache, block_table) -> int | None:
    """The rows one sequence holds when the cache is full: FA2's meaning of ``cache_seqlens=None``
    (None where the shapes cannot tell; frost.attention_with_kvcache then names the argument)."""
    if not isinstance(k_cache, Tensor) or k_cache.dim() != 4:
        return None
    if block_table is None:
        return k_cache.shape[1]
    if not isinstance(block_table, Tensor) or block_table.dim() != 2:
        return None
    return block_table.shape[1] * k_cache.shape[1]


def _refuse_absent_features(dropout_p, softcap, alibi_slopes, block_table) -> None:
    if dropout_p != 0:
        raise ValueError(f"dropout_p: frost has no attention dropout; expected 0.0, got {dropout_p!r}")
    if softcap != 0:
        raise ValueError(f"softcap: frost has no logit softcapping yet; expected 0.0, got {softcap!r}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: frost has no ALiBi yet; expected None")
    if block_table is not None:
        raise ValueError("block_table: frost reads a paged KV cache in flash_attn_with_kvcache only; expected None")


def _keywords(softmax_scale, causal, window_size, deterministic, s_aux) -> dict:
    """frost.attention's keywords for FA2's: bottom-right windows, negative sides unbounded."""
    return dict(scale=softmax_scale, causal=causal, causal_align="bottom_right", window=_window(causal, window_size),
                deterministic=deterministic, sinks=None if s_aux is None else s_aux.float())  # fmt: skip


def _window(causal, window_size) -> tuple:
    """FA2's ``window_size`` as frost's window: a negative side is unbounded (-1), and causal sets
    the right side to 0, as FA2 does."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise ValueError(f"window_size: expected a (left, right) pair of ints, got {window_size!r}")
    left, right = (-1 if isinstance(side, int) and not isinstance(side, bool) and side < 0 else side
                   for side in window_size)  # fmt: skip
    if causal is True:  # a bad causal reaches validation as given
        right = 0
    return left, right


def _longest(value):
    """A ``max_seqlen_*`` argument as frost takes it: an int (or SymInt); a tensor is read on the
    host as FA2 reads it, except while torch.compile traces (None: frost finds it at run time)."""
    if isinstance(value, Tensor):
        return None if torch.compiler.is_compiling() else int(value)
    return value
