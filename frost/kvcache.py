"""The KV-cache call: ``attention_with_kvcache``, one step of incremental decoding.

A serving loop keeps each sequence's keys and values in a cache and, at every step, appends
the new tokens' k and v and attends its new queries over everything cached. This module owns
that call (SEMANTICS.md, "The KV-cache call"):

1. checks, always and before anything is written: the shapes, dtypes and devices of every
   argument (a ValueError naming it), and what the closing forward would reject (q, scale,
   causal, window, sinks, out), so a rejected call leaves the cache as it was;
2. checks of values (``cache_seqlens`` within the cache, the ``block_table`` entries a sequence
   uses, ``cache_batch_idx``, ``cache_leftpad``), which read tensors back to the host, only where reading is
   allowed: not while a CUDA graph is being captured, not while torch.compile traces, so a decode
   step can be captured and replayed with new ``cache_seqlens``;
3. the append: k rotated by ``rope`` at its positions, then k and v written in place into rows
   ``cache_seqlens[b] ..`` of sequence b's cache (through the block table when paged), with
   index operations only (no host synchronisation);
4. q rotated at its positions (row i of sequence b at ``cache_seqlens[b] + i``, as in
   FlashAttention-2: q's rows are the newest tokens; ``Rotary`` holds FA2's other rules);
5. frost's forward (``frost.api.serve``, the path of ``frost.sdpa_forward``; the operator of
   ``frost.ops`` while torch.compile traces) over the keys each sequence sees (``gather``) with
   ``seqlens_k = cache_seqlens + S_new`` and the mask aligned to the bottom right, the rows before
   ``cache_leftpad`` masked by a key bias.

A contiguous cache is attended as it is. A paged cache, and a contiguous one indexed by
``cache_batch_idx`` (one page per sequence), is first copied into a contiguous view of each
sequence's pages by ``gather``; the kernels will read pages through the table instead, behind
this same call. The call is forward only: nothing here is differentiable (it runs under
``torch.no_grad``), and the caches are written in place.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from frost import api, ops, validation
from frost.problem import split_rope, split_window
from frost.records import Options, Tensors

# A page holds a multiple of the kernels' 64-row key tile, so that no tile straddles two pages
# (FlashAttention-2 asks for multiples of 256).
PAGE_MULTIPLE = 64

# What an entry of each table names, for messages.
_TABLE_ENTRIES = {"block_table": "a page of k_cache", "cache_batch_idx": "a sequence (dim 0) of k_cache"}


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """Where row p of sequence b lives: row ``p % page_size`` of page ``table[b, p // page_size]``
    of k_cache and v_cache; ``table`` None: row p of sequence b of a contiguous cache."""

    table: Tensor | None  # [B, pages] int32: block_table, or cache_batch_idx as [B, 1]
    table_name: str  # the argument that gave the table ("" without one)
    page_size: int  # rows per page (a contiguous cache: its rows per sequence)
    pages: int  # k_cache.shape[0]: the pages (sequences) the table may name
    capacity: int  # rows one sequence can hold
    new_rows: int  # S_new: rows of k and v appended (0 without)


@dataclass(frozen=True, slots=True)
class Rotary:
    """How the call rotates: frost's float32 tables ``cos`` / ``sin`` ``[max_pos, R/2]`` rotate the
    first R dims of the head dim (R <= D; the rest pass through), pairing dims ``(i, i + R/2)``
    (frost's ``rot``) or, ``interleaved``, ``(2i, 2i + 1)``; q's rows sit at ``cache_seqlens + i``
    (the newest tokens), or all at ``cache_seqlens`` with ``q_at_first_position`` (FlashAttention-2's
    rule for a call without causal or a window)."""

    cos: Tensor
    sin: Tensor
    interleaved: bool = False
    q_at_first_position: bool = False


def attention_with_kvcache(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, *, cache_seqlens: Tensor | int,
    k: Tensor | None = None, v: Tensor | None = None, block_table: Tensor | None = None,
    cache_batch_idx: Tensor | None = None, cache_leftpad: Tensor | None = None,
    rope: tuple[Tensor, Tensor] | None = None, rope_interleaved: bool = False, causal: bool = False, window: tuple[int, int] = (-1, -1),
    sinks: Tensor | None = None, scale: float | None = None, out: tuple[Tensor, Tensor] | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """Append k and v to the cache in place, then attend q over each sequence's cached keys:
    ``o``, or ``(o, lse)`` with ``return_lse``. Forward only (not differentiable).

    q ``[B, Sq, Hq, D]``; a contiguous cache ``[B, S_cache, Hkv, D]`` (``Dv`` for v_cache), or a
    paged one ``[pages, page_size, Hkv, D]`` with int32 ``block_table [B, max_pages]`` (page_size
    a multiple of 64); ``cache_seqlens``: int32 ``[B]``, or an int for every sequence, the rows
    each sequence holds before the append; ``k`` / ``v`` ``[B, S_new, Hkv, D]``, both or neither;
    ``cache_batch_idx`` (contiguous cache only): int32 ``[B]``, the cache sequence of each row of q
    (default: row b's); ``cache_leftpad``: int32 ``[B]``, the first row each sequence attends (the
    rows before it are masked; positions stay the rows' own). ``rope=(cos, sin)`` (float32 ``[>= capacity + max(0, Sq - S_new), R/2]``,
    frost's convention over the first R <= D dims; ``rope_interleaved`` pairs dims 2i and 2i + 1
    instead of i and i + R/2) rotates the appended k and q at their positions and needs k and v.
    ``causal`` / ``window`` are aligned to the bottom right over ``cache_seqlens + S_new`` keys;
    ``sinks``, ``scale`` and ``out=(o, lse)`` as in ``frost.sdpa_forward``.
    """
    cos, sin = split_rope(rope)
    rotary = None if cos is None and sin is None else Rotary(cos, sin, rope_interleaved)
    return step(q, k_cache, v_cache, cache_seqlens, k, v, block_table, cache_batch_idx, cache_leftpad, rotary,
                attention_options(scale, causal, window), sinks, out, return_lse)  # fmt: skip


def attention_options(scale, causal, window) -> Options:
    """The closing forward's keywords: aligned to the bottom right; the lengths are checked by the
    call itself where they may be read, so the forward does not read them again."""
    return Options(scale, causal, "bottom_right", split_window(window), check_lengths=False)


def step(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens, k, v, block_table, cache_batch_idx,
         cache_leftpad, rotary: Rotary | None, options: Options, sinks, out,
         return_lse: bool) -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """``attention_with_kvcache`` with its rotation as a ``Rotary`` and its attention keywords as
    ``Options`` (``frost.flash_attn_with_kvcache`` calls this with FlashAttention-2's rotation)."""
    layout = _check_layout(q, k_cache, v_cache, k, v, block_table, cache_batch_idx)
    lengths = _check_lengths(cache_seqlens, layout, q)
    _check_rotary(rotary, layout, q, k)
    if cache_leftpad is not None:
        _check_table("cache_leftpad", cache_leftpad, q, 1)
    out = _check_attention(q, k_cache, v_cache, layout, sinks, options, out)
    if _reads_values(q):
        if isinstance(cache_seqlens, Tensor):
            _check_length_values(lengths, layout)
        if layout.table is not None:
            _check_table_values(lengths, layout)
        if cache_leftpad is not None and bool(((cache_leftpad < 0) | (cache_leftpad > lengths)).any()):
            raise ValueError("cache_leftpad: each entry must lie in [0, cache_seqlens[b]] (the rows a sequence "
                             "held before the call start there)")  # fmt: skip
    with torch.no_grad():
        if k is not None:
            positions = _positions(lengths, layout.new_rows)
            if rotary is not None:
                k = _rotate(k, rotary, positions)
            _append(layout, k_cache, v_cache, positions, k, v)
        if rotary is not None:
            q = _rotate(q, rotary, _positions(lengths, 1 if rotary.q_at_first_position else q.shape[1]))
        seqlens_k = lengths + layout.new_rows
        bias = None if cache_leftpad is None else _leftpad_bias(cache_leftpad, layout.capacity, q.shape[1])
        o, lse = _attend(q, gather(k_cache, layout), gather(v_cache, layout), seqlens_k, bias, sinks, options, out)
    return (o, lse) if return_lse else o


def gather(cache: Tensor, layout: CacheLayout) -> Tensor:
    """The keys (or values) each sequence sees, ``[B, capacity, Hkv, D]``: a contiguous cache as it
    is; otherwise its pages copied in each sequence's order (index operations, capture-safe).

    Table entries past a sequence's rows may hold anything (the value checks read only the pages
    a sequence uses): they are clamped into range, and the rows they bring lie past
    ``seqlens_k``, which the forward never reads.
    """
    if layout.table is None:
        return cache
    pages = layout.table.clamp(0, layout.pages - 1)
    return cache[pages].flatten(1, 2)


def _check_tensor(name: str, x, device: torch.device | None, dims: int) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if device is not None and x.device != device:
        raise ValueError(f"{name}: on {x.device} but q is on {device} (mixed devices)")
    if x.dim() != dims:
        raise ValueError(f"{name}: expected {dims} dims, got shape {tuple(x.shape)}")


def _check_layout(q, k_cache, v_cache, k, v, block_table, cache_batch_idx) -> CacheLayout:
    """The shape, dtype and device checks of q, the caches, k / v and the tables; the layout."""
    _check_tensor("q", q, None, 4)
    if q.dtype not in validation.IO_DTYPES:
        raise ValueError(f"q: dtype {q.dtype} is not supported (frost takes torch.float16 or torch.bfloat16)")
    batch, heads_q, head_dim = q.shape[0], q.shape[2], q.shape[3]
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, cache, q.device, 4)
        if cache.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {cache.dtype} does not match q's {q.dtype}")
        validation.check_stride(name, cache)
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} does not match k_cache's {tuple(k_cache.shape)} "
                         "in every dim but the head dim")  # fmt: skip
    heads_kv = k_cache.shape[2]
    if heads_kv < 1 or heads_q % heads_kv:
        raise ValueError(f"k_cache: Hq={heads_q} is not a multiple of Hkv={heads_kv}")
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]} does not match q's {head_dim}")
    new_rows = _check_new_rows(k, v, k_cache, v_cache, batch)
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx: only for a contiguous cache (a paged cache maps sequences to "
                             "pages with block_table)")  # fmt: skip
        _check_table("block_table", block_table, q, 2)
        page_size = k_cache.shape[1]
        if page_size == 0 or page_size % PAGE_MULTIPLE:
            raise ValueError(f"k_cache: the pages of a paged cache (dim 1) must hold a multiple of {PAGE_MULTIPLE} "
                             f"rows, got {page_size}")  # fmt: skip
        return CacheLayout(block_table, "block_table", page_size, k_cache.shape[0],
                           block_table.shape[1] * page_size, new_rows)  # fmt: skip
    rows = k_cache.shape[1]
    if cache_batch_idx is not None:
        _check_table("cache_batch_idx", cache_batch_idx, q, 1)
        return CacheLayout(cache_batch_idx[:, None], "cache_batch_idx", rows, k_cache.shape[0], rows, new_rows)
    if k_cache.shape[0] != batch:
        raise ValueError(f"k_cache: batch {k_cache.shape[0]} does not match q's {batch} (a paged cache "
                         "needs block_table, a reordered one cache_batch_idx)")  # fmt: skip
    return CacheLayout(None, "", rows, k_cache.shape[0], rows, new_rows)


def _check_new_rows(k, v, k_cache: Tensor, v_cache: Tensor, batch: int) -> int:
    """k and v, both or neither, ``[B, S_new, Hkv, D]`` / ``Dv``; returns S_new (0 without)."""
    if (k is None) != (v is None):
        missing, given = ("v", "k") if v is None else ("k", "v")
        raise ValueError(f"{missing}: required with {given} (k and v are appended together)")
    if k is None:
        return 0
    for name, x, cache in (("k", k, k_cache), ("v", v, v_cache)):
        _check_tensor(name, x, k_cache.device, 4)
        if x.dtype != k_cache.dtype:
            raise ValueError(f"{name}: dtype {x.dtype} does not match q's {k_cache.dtype}")
        want = (batch, k.shape[1], cache.shape[2], cache.shape[3])
        if tuple(x.shape) != want:
            raise ValueError(f"{name}: expected shape {want} ([B, S_new, Hkv, head dim] of q and {name}_cache), "
                             f"got {tuple(x.shape)}")  # fmt: skip
        validation.check_stride(name, x)
    return k.shape[1]


def _check_table(name: str, table, q: Tensor, dims: int) -> None:
    _check_tensor(name, table, q.device, dims)
    if table.dtype != torch.int32:
        raise ValueError(f"{name}: dtype must be torch.int32, got {table.dtype}")
    if table.shape[0] != q.shape[0]:
        raise ValueError(f"{name}: has {table.shape[0]} rows but q's batch is {q.shape[0]}")


def _check_lengths(cache_seqlens, layout: CacheLayout, q: Tensor) -> Tensor:
    """``cache_seqlens``: an int32 ``[B]`` tensor (its values are checked apart, where they may be
    read), or an int, checked here; returns the lengths as a tensor."""
    most = layout.capacity - layout.new_rows
    if isinstance(cache_seqlens, Tensor):
        _check_tensor("cache_seqlens", cache_seqlens, q.device, 1)
        if cache_seqlens.dtype != torch.int32:
            raise ValueError(f"cache_seqlens: dtype must be torch.int32, got {cache_seqlens.dtype}")
        if cache_seqlens.shape[0] != q.shape[0]:
            raise ValueError(f"cache_seqlens: expected {q.shape[0]} entries (q's batch), got {cache_seqlens.shape[0]}")
        return cache_seqlens
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int):
        raise ValueError(f"cache_seqlens: expected an int32 tensor [B] or an int, got {cache_seqlens!r}")
    if not 0 <= cache_seqlens <= most:
        raise ValueError(_length_message(layout, cache_seqlens, cache_seqlens))
    return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)


def _length_message(layout: CacheLayout, low: int, high: int) -> str:
    return (f"cache_seqlens: values must lie in [0, {layout.capacity - layout.new_rows}] (a sequence holds "
            f"{layout.capacity} rows and {layout.new_rows} are appended), got min {low}, max {high}")  # fmt: skip


def _check_rotary(rotary: Rotary | None, layout: CacheLayout, q: Tensor, k) -> None:
    """The rotation's tables: frost's float32 ``[max_pos, R/2]`` with R even and at most the head
    dim, covering every position the call may rotate (k's last at ``capacity - 1``, q's at
    ``capacity - S_new + Sq - 1``)."""
    if rotary is None:
        return
    if k is None:
        raise ValueError("rope: rotates the appended k and q at their positions; it needs k and v")
    if not isinstance(rotary.interleaved, bool):
        raise ValueError(f"rope_interleaved: expected a bool, got {rotary.interleaved!r}")
    for table in (rotary.cos, rotary.sin):
        if table is not None:
            _check_tensor("rope", table, q.device, 2)
    rotated = 2 * (rotary.cos if rotary.cos is not None else rotary.sin).shape[1]
    if not 0 < rotated <= q.shape[-1]:
        raise ValueError(f"rope: tables of {rotated // 2} columns rotate {rotated} dims; expected 1 to "
                         f"{q.shape[-1] // 2} columns (at most the head dim {q.shape[-1]})")  # fmt: skip
    needed = layout.capacity + max(0, q.shape[1] - layout.new_rows)
    # checked as frost's rope over the R dims it rotates
    validation.check_rope(Tensors(q[..., :rotated], q, q, rope_cos=rotary.cos, rope_sin=rotary.sin), needed)


def _check_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, layout: CacheLayout, sinks, options: Options,
                     out) -> tuple[Tensor, Tensor] | None:  # fmt: skip
    """What the closing forward would reject (q, scale, causal, window, sinks), checked by
    ``frost.validation`` on stand-ins shaped as the keys and values it will see, and ``out``
    (no overlap with q or the caches); returns ``out`` normalized."""
    shape = (q.shape[0], layout.capacity, k_cache.shape[2])
    keys = k_cache.new_empty(k_cache.shape[3]).expand(*shape, k_cache.shape[3])
    values = v_cache.new_empty(v_cache.shape[3]).expand(*shape, v_cache.shape[3])
    validation.validate("forward", Tensors(q, keys, values, sinks=sinks), options)
    return validation.check_out("forward", out, Tensors(q, k_cache, v_cache, sinks=sinks))


def _reads_values(q: Tensor) -> bool:
    """Whether values may be read back to the host: not during a CUDA-graph capture, not while
    torch.compile traces, not on the meta device (which holds none)."""
    return not (validation.capturing(q) or torch.compiler.is_compiling() or q.is_meta)


def _check_length_values(lengths: Tensor, layout: CacheLayout) -> None:
    values = lengths.tolist()
    low, high = min(values, default=0), max(values, default=0)
    if low < 0 or high > layout.capacity - layout.new_rows:
        raise ValueError(_length_message(layout, low, high))


def _check_table_values(lengths: Tensor, layout: CacheLayout) -> None:
    """The table entries of the pages each sequence uses (its ``cache_seqlens + S_new`` rows) name
    pages of k_cache; entries past them are never read."""
    table = layout.table
    used_pages = (lengths.long() + layout.new_rows + layout.page_size - 1) // layout.page_size
    used = torch.arange(table.shape[1], device=table.device)[None, :] < used_pages[:, None]
    bad = used & ((table < 0) | (table >= layout.pages))
    if bool(bad.any()):
        b, j = bad.nonzero()[0].tolist()
        where = f"[{b}, {j}]" if layout.table_name == "block_table" else f"[{b}]"
        raise ValueError(f"{layout.table_name}: entry {where} = {int(table[b, j])} is not "
                         f"{_TABLE_ENTRIES[layout.table_name]} (0 .. {layout.pages - 1})")  # fmt: skip


def _positions(lengths: Tensor, rows: int) -> Tensor:
    """``[B, rows]``: the positions ``cache_seqlens[b] + i`` of rows i of sequence b."""
    return lengths.long()[:, None] + torch.arange(rows, device=lengths.device)


def _rotate(x: Tensor, rotary: Rotary, positions: Tensor) -> Tensor:
    """``x`` ``[B, S, H, D]`` with row i of sequence b rotated at ``positions[b, i]`` (``[B, S]``, or
    ``[B, 1]`` for every row): the first R dims by ``rotary``'s pairs (SEMANTICS.md's ``rot`` for
    the halves), in float32, rounded to x's dtype (the cache holds the io dtype)."""
    rotated = 2 * rotary.cos.shape[1]
    c, s = rotary.cos[positions].unsqueeze(2), rotary.sin[positions].unsqueeze(2)
    part = x[..., :rotated].float()
    if rotary.interleaved:
        x1, x2 = part[..., 0::2], part[..., 1::2]
        turned = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    else:
        x1, x2 = part.chunk(2, dim=-1)
        turned = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((turned.to(x.dtype), x[..., rotated:]), dim=-1)


def _append(layout: CacheLayout, k_cache: Tensor, v_cache: Tensor, positions: Tensor, k: Tensor, v: Tensor) -> None:
    """k and v written in place at ``positions`` (index_put_: no host synchronisation)."""
    if layout.table is None:
        index = (torch.arange(k.shape[0], device=k.device)[:, None], positions)
    else:
        index = (layout.table.gather(1, positions // layout.page_size), positions % layout.page_size)
    k_cache.index_put_(index, k)
    v_cache.index_put_(index, v)


def _leftpad_bias(leftpad: Tensor, capacity: int, seqlen_q: int) -> Tensor:
    """float32 ``[B, 1, Sq, capacity]``, -inf at the rows before each sequence's ``cache_leftpad`` and 0
    elsewhere: one row per sequence, stride 0 over the queries (nothing copied per query)."""
    before = torch.arange(capacity, device=leftpad.device)[None, :] < leftpad[:, None]
    row = torch.zeros(before.shape, dtype=torch.float32, device=leftpad.device).masked_fill(before, float("-inf"))
    return row[:, None, None, :].expand(-1, 1, seqlen_q, -1)


def _attend(q: Tensor, keys: Tensor, values: Tensor, seqlens_k: Tensor, bias, sinks, options: Options, out):
    """frost's forward over the gathered keys: ``frost.api.serve`` (the lengths were checked above
    where they could be read, so the forward reads them back only for a new plan:
    ``check_lengths=False``); while torch.compile traces, the ``frost::sdpa_forward`` operator."""
    if not torch.compiler.is_compiling():
        return api.serve("forward", Tensors(q, keys, values, seqlens_k=seqlens_k, bias=bias, sinks=sinks), options,
                         None, out)  # fmt: skip
    o, lse = ops.attention(q, keys, values, seqlens_k=seqlens_k, bias=bias, sinks=sinks, scale=options.scale,
                           causal=options.causal, causal_align=options.causal_align, window=options.window,
                           return_lse=True)  # fmt: skip
    if out is None:
        return o, lse
    out[0].copy_(o)
    out[1].copy_(lse)
    return out
