"""Hypothesis strategies that build valid attention problems from the whole of SEMANTICS.md.

A drawn problem is a ``frost_harness.suites.harness.Case``: sizes, layout, masks and features, plus
the seed its tensors are drawn from (``frost_harness.suites.harness.make_inputs``). Shrinking a
failure therefore shrinks the problem a person reads (fewer heads, shorter sequences,
features switched off, seed 0), and the failing Case's repr replays it exactly.

What the strategies cover:

- dtype fp16 / bf16;
- heads: MHA, GQA with group 2, 4 or 8, MQA;
- head dims: mostly multiples of 8 up to 128 (64 on the CPU), odd multiples (24,
  40, ...) included, so the SM80 engines accept many problems on a GPU; sometimes
  any size, for the native engines; ``Dqk != Dv`` in about a third of the draws;
- layouts: dense (``Sq != Sk`` both ways, and equal), dense padding (valid lengths
  0 .. S), packed THD (random lengths including zero, one very long sequence among
  short ones, rows past ``cu_seqlens[-1]``);
- masks: none, causal top-left / bottom-right, windows with each side unbounded,
  0, small, or wider than the sequence;
- bias of every broadcast pattern (``BH``, ``B1``, ``1H``, ``11``), float32 or the io
  dtype, standard deviation up to 30 (300 in forward-only draws), with -inf holes;
- RoPE, sinks (standard deviation up to 20), a custom ``scale`` (zero and negative too),
  queries scaled up to 16x to stress the softmax, non-contiguous inputs.

Each optional feature is drawn for a third or a quarter of the problems, so that plain
problems (which torch-sdpa and the SM80 engines accept) stay common.

Every drawn problem's unread rows hold NaN, on every device (``frost_harness.suites.harness.make_inputs``
poisons padded and packed-tail rows and bias of padded positions), so every property
also checks that garbage there changes nothing.

Two size regimes (``REGIMES``): ``cpu`` keeps an example well under a second on one
core (sequences up to 24, one long packed sequence up to 64, 8 heads, head dims up to
64); ``gpu`` goes to a few hundred rows, one packed sequence of up to 2048, 16 heads
and head dims up to 128, on ``device="cuda"``.

The ``gpu`` regime searches instead of compiling: each problem first draws a record
class from the run's pool (``frost_harness.fuzz.pool``: dtype, head-dim flavor and
whether each head dim fills it, layout, bounded window sides and alignment, sinks, a
bias and its dtype, RoPE at one head dim, grouped heads: the facts that change a
compiled kernel) and then everything that stays
a runtime value under it (sizes, head counts and dims within the flavor, window widths,
scales, seeds, and the features frost's engines decline). Window widths are drawn
against the problem's extents, so that a side the class bounds stays bounded (below the
longest extent) and an unbounded one is -1 or at least that extent (which frost reads
as no bound); a dense class with the bottom-right alignment draws ``Sq != Sk`` (with
``Sq == Sk`` both alignments are the same problem, the top-left class's). So a run
compiles at most the pool's records, which ``frost-fuzz`` compiles before it starts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from frost.case import BIAS_PATTERNS
from frost_harness.fuzz import pool
from frost_harness.suites.harness import Case

DTYPES = (torch.bfloat16, torch.float16)
# Multiples of 8 up to 128 (the SM80 engines' rule), listed odd multiples first so that
# shrinking moves toward 8 through them rather than skipping them.
HEAD_DIMS_8 = (8, 24, 40, 56, 72, 88, 104, 120, 16, 32, 48, 64, 80, 96, 112, 128)
GROUPS = (2, 4, 8)


@dataclass(frozen=True)
class Regime:
    """Sizes of one regime: where the problems run and how large they get."""

    device: str
    max_batch: int  # dense batch; packed problems have up to max_batch + 2 sequences
    max_seqlen: int  # a dense extent or an ordinary packed sequence
    long_seqlen: int  # the one very long packed sequence among short ones
    max_heads_q: int
    max_head_dim: int
    max_tail: int  # packed rows past cu_seqlens[-1]
    record_classes: bool = False  # draw a record class of the pool first (frost_harness.fuzz.pool)


REGIMES = {
    "cpu": Regime("cpu", max_batch=3, max_seqlen=24, long_seqlen=64, max_heads_q=8, max_head_dim=64, max_tail=4),
    "gpu": Regime("cuda", max_batch=4, max_seqlen=384, long_seqlen=2048, max_heads_q=16, max_head_dim=pool.MAX_HEAD_DIM,
                  max_tail=9, record_classes=True),
}


# -1 / 0 / +1 modulo every tile the SM80 dispatch chooses (64 and 128 rows): sequence ends,
# bottom-right offsets (Sk - Sq) and window sides drawn here land on a tile's first or last row
# or key, where block-range decisions flip (a planted off-by-one there survived the L0 grid).
TILE_EDGES = (63, 64, 65, 127, 128, 129)


def _tile_edges(regime: Regime, limit: int | None = None) -> list[int]:
    return [e for e in TILE_EDGES if e <= (regime.max_seqlen if limit is None else limit)]


def _extent(draw, regime: Regime) -> int:
    """A sequence extent (0 is legal): often tiny or a tile edge, otherwise anything in range."""
    edges = [0, 1, 2, *_tile_edges(regime)]
    return draw(st.one_of(st.sampled_from(edges), st.integers(0, regime.max_seqlen)))


def _key_extent(draw, regime: Regime, seqlen_q: int, distinct: bool = False) -> int:
    """Sk: the queries' own extent, any extent, or one whose bottom-right offset Sk - Sq is a
    tile edge (either sign); ``distinct``: never ``seqlen_q`` (one key more or less instead)."""
    choice = draw(st.integers(0, 3))
    offsets = [o for e in _tile_edges(regime) for o in (e, -e) if 0 <= seqlen_q + o <= regime.max_seqlen]
    if choice == 0:
        seqlen_k = seqlen_q
    elif choice == 1 and offsets:
        seqlen_k = seqlen_q + draw(st.sampled_from(offsets))
    else:
        seqlen_k = _extent(draw, regime)
    if distinct and seqlen_k == seqlen_q:
        seqlen_k += 1 if seqlen_q < regime.max_seqlen else -1
    return seqlen_k


def _heads(draw, regime: Regime, kinds: tuple[str, ...] = ("mha", "gqa", "mqa")) -> tuple[int, int]:
    """(Hq, Hkv) of one of ``kinds``: MHA, GQA or MQA."""
    kind = draw(st.sampled_from(kinds))
    if kind == "mha":
        heads = draw(st.integers(1, 4))
        return heads, heads
    if kind == "mqa":
        return draw(st.integers(2, min(8, regime.max_heads_q))), 1
    group = draw(st.sampled_from(GROUPS))
    heads_kv = draw(st.integers(2, max(2, regime.max_heads_q // group)))
    return heads_kv * group, heads_kv


def _head_dim(draw, regime: Regime, *, even: bool) -> int:
    if draw(st.integers(0, 4)):  # 4 in 5: a multiple of 8
        return draw(st.sampled_from([d for d in HEAD_DIMS_8 if d <= regime.max_head_dim]))
    dim = draw(st.integers(1, regime.max_head_dim - 1))
    return dim + dim % 2 if even else dim


def _packed_lengths(draw, regime: Regime, min_count: int) -> tuple[int, ...]:
    count = draw(st.integers(min_count, max(min_count, regime.max_batch + 2)))
    pattern = draw(st.sampled_from(("random", "one_long", "zeros_between")))
    if pattern == "one_long":
        lengths = [draw(st.integers(0, 4)) for _ in range(count)]
        lengths[draw(st.integers(0, count - 1))] = draw(st.integers(regime.max_seqlen, regime.long_seqlen))
    else:
        lengths = [_extent(draw, regime) for _ in range(count)]
        if pattern == "zeros_between":
            lengths = [0 if i % 2 else n for i, n in enumerate(lengths)]
    return tuple(lengths)


def _valid_lengths(draw, batch: int, extent: int) -> tuple[int, ...]:
    """Dense padding's valid lengths: often empty or full, otherwise anything in 0 .. extent."""
    return tuple(draw(st.one_of(st.sampled_from((0, extent)), st.integers(0, extent))) for _ in range(batch))


def _layout(draw, regime: Regime, kind: str | None, min_batch: int, distinct: bool = False) -> dict:
    """Fields of one layout kind ("dense", "padded", "thd"; drawn when None); ``distinct``: a
    dense problem's ``Sq != Sk``."""
    kind = kind or draw(st.sampled_from(("dense", "padded", "thd")))
    if kind == "thd":
        lengths_q = _packed_lengths(draw, regime, min_batch)
        same = draw(st.booleans())  # self-attention: the keys have the queries' lengths
        lengths_k = lengths_q if same else tuple(_extent(draw, regime) for _ in lengths_q)
        tails = st.one_of(st.just(0), st.integers(1, regime.max_tail))
        return {"layout": "thd", "lengths_q": lengths_q, "lengths_k": lengths_k,
                "tail_q": draw(tails), "tail_k": draw(tails)}  # fmt: skip
    batch = draw(st.integers(min_batch, max(min_batch, regime.max_batch)))
    seqlen_q = _extent(draw, regime)
    seqlen_k = _key_extent(draw, regime, seqlen_q, distinct and kind == "dense")
    fields = {"batch": batch, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k}
    if kind == "padded":
        fields.update(lengths_q=_valid_lengths(draw, batch, seqlen_q), lengths_k=_valid_lengths(draw, batch, seqlen_k))
    return fields


def _mask(draw, regime: Regime, right_bounded: bool) -> dict:
    """No mask, causal, or a window; ``right_bounded`` keeps a finite right edge (causal or window)."""
    kind = draw(st.sampled_from(("causal", "window") if right_bounded else ("none", "causal", "window")))
    if kind == "none":
        return {}
    align = draw(st.sampled_from(("top_left", "bottom_right")))
    wide = regime.long_seqlen + 1
    near = [st.integers(1, 8)] + ([st.sampled_from(_tile_edges(regime))] if _tile_edges(regime) else [])
    side = st.one_of(st.sampled_from((-1, 0)), *near, st.integers(wide, 2 * wide))
    left = draw(side)
    if kind == "causal":
        return {"causal": True, "causal_align": align, "window": (left, draw(st.sampled_from((-1, 0))))}
    right = draw(st.one_of(st.just(0), *near) if right_bounded else side)
    return {"causal_align": align, "window": (left, right)}


def _bias(draw, dtype: torch.dtype, *, max_scale: float, cls: pool.RecordClass | None = None) -> dict:
    """A bias in a third of the draws (with a record class: as the class says, in its dtype)."""
    if cls.bias is None if cls else draw(st.integers(0, 2)):
        return {}
    scales = [s for s in (1.0, 0.25, 4.0, 30.0, 300.0) if s <= max_scale]
    return {
        "bias": draw(st.sampled_from(BIAS_PATTERNS)),
        "bias_dtype": cls.bias_dtype if cls else draw(st.sampled_from((torch.float32, dtype))),
        "bias_scale": draw(st.sampled_from(scales)),
        "bias_holes": draw(st.booleans()),
    }


# Case fields a record class decides in the gpu regime: a fixed value there would leave the pool.
_CLASS_FIELDS = frozenset({"dtype", "lengths_q", "lengths_k", "heads_q", "heads_kv", "head_dim_qk",
                           "head_dim_v", "causal", "causal_align", "window", "bias", "bias_dtype",
                           "rope"})  # fmt: skip


@st.composite
def cases(draw, regime: str = "cpu", *, direction: str = "forward", **fixed) -> Case:
    """A Case of ``regime`` ("cpu" or "gpu"; the gpu regime draws a record class first).

    ``direction="backward"`` keeps the bias at 30 standard deviations or less (larger
    ones leave nearly every softmax row peaked). ``fixed``
    constrains the draw: ``layout`` ("dense", "padded" or "thd"), ``heads="grouped"``
    (GQA or MQA only), ``min_batch`` (sequences), ``mask="right_bounded"`` (causal or
    a window with a finite right edge), and any Case field given as a value
    (``sinks=True``) replaces the drawn one (in the gpu regime ``sinks`` picks the class,
    and the fields a class decides cannot be fixed).
    """
    size = REGIMES[regime]
    cls = _record_class(draw, fixed) if size.record_classes else None
    dtype = cls.torch_dtype if cls else draw(st.sampled_from(DTYPES))
    kind = cls.layout if cls else fixed.pop("layout", None)
    layout = _layout(draw, size, kind, fixed.pop("min_batch", 1), distinct=bool(cls and cls.bottom_right))
    grouped = cls.grouped if cls else fixed.pop("heads", None) == "grouped"
    heads_q, heads_kv = _heads(draw, size, ("gqa", "mqa") if grouped else ("mha",) if cls else ("mha", "gqa", "mqa"))
    rope = cls.rope is not None if cls else draw(st.integers(0, 3)) == 0
    head_dim_qk, head_dim_v = _class_head_dims(draw, size, cls, rope) if cls else _head_dims(draw, size, rope)
    right_bounded = fixed.pop("mask", None) == "right_bounded"  # (a class's mask is the class's)
    mask = _class_mask(draw, size, cls, layout) if cls else _mask(draw, size, right_bounded)
    fields = dict(
        dtype=dtype, device=size.device, **layout, heads_q=heads_q, heads_kv=heads_kv,
        head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, **mask,
        **_bias(draw, dtype, max_scale=30.0 if direction == "backward" else 300.0, cls=cls),
        rope=rope, strided=draw(st.integers(0, 3)) == 0, seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip
    if cls.sinks if cls else draw(st.integers(0, 2)) == 0:
        fields.update(sinks=True, sink_scale=draw(st.sampled_from((2.0, 0.5, 20.0))))
    if draw(st.integers(0, 3)) == 0:
        # zero and negative scales are legal (SEMANTICS.md); an engine honors or declines them
        fields["scale"] = draw(st.sampled_from((0.3, 1.0, 0.05, 2.0, -0.5, 0.0, -2.0)))
    fields["logit_scale"] = draw(st.sampled_from((1.0, 4.0, 16.0)))
    fields.update(fixed)
    if fields.get("bias_holes") and layout.get("layout") != "thd" and min(layout["seqlen_q"], layout["seqlen_k"]) == 0:
        fields["bias_holes"] = False  # the harness punches its -inf row into a non-empty bias
    return Case(**fields)


def _head_dims(draw, regime: Regime, rope: bool) -> tuple[int, int]:
    head_dim_qk = _head_dim(draw, regime, even=rope)
    return head_dim_qk, head_dim_qk if draw(st.integers(0, 2)) else _head_dim(draw, regime, even=False)


# the record-class draws of the gpu regime ----------------------------------------------


def _record_class(draw, fixed: dict) -> pool.RecordClass:
    """A class of the active pool that meets the constraints in ``fixed`` (consumed from it)."""
    constraints = {name: fixed.pop(name) for name in ("layout", "heads", "mask", "sinks") if name in fixed}
    if _CLASS_FIELDS & fixed.keys():
        raise ValueError(f"the gpu regime draws {sorted(_CLASS_FIELDS & fixed.keys())} from a record class; "
                         "constrain them through layout, heads, mask or sinks")  # fmt: skip
    candidates = [cls for cls in pool.active() if pool.matches(cls, constraints)]
    if not candidates:
        raise ValueError(f"no record class of the pool meets {constraints}: "
                         "add them to frost_harness.fuzz.pool.demands")
    return draw(st.sampled_from(candidates))


def _class_head_dims(draw, regime: Regime, cls: pool.RecordClass, rope: bool) -> tuple[int, int]:
    """Head dims of the class's flavor (head_dim_qk its RoPE's when it has one), as often equal
    as in the cpu regime; 1 in 5 draws makes one or both not a multiple of 8 (frost's engines
    decline it: a native-engine problem)."""
    head_dim_qk = cls.rope or draw(st.sampled_from(_shrink_order(cls.head_dims_qk())))
    fitting = _shrink_order(v for v in cls.head_dims()[1] if cls.admits_head_dims(head_dim_qk, v))
    same = head_dim_qk in fitting and draw(st.integers(0, 2)) > 0
    head_dim_v = head_dim_qk if same else draw(st.sampled_from(fitting))
    if draw(st.integers(0, 4)) == 0:
        which = draw(st.sampled_from(("qk", "v", "both")))
        head_dim_qk = _off_multiple(draw, regime, even=rope) if which != "v" else head_dim_qk
        head_dim_v = _off_multiple(draw, regime, even=False) if which != "qk" else head_dim_v
    return head_dim_qk, head_dim_v


def _shrink_order(dims) -> list[int]:
    """``dims`` in HEAD_DIMS_8's order (odd multiples of 8 first: shrinking walks through them)."""
    dims = set(dims)
    return [d for d in HEAD_DIMS_8 if d in dims]


def _off_multiple(draw, regime: Regime, *, even: bool) -> int:
    """A head dim below the regime's largest that is not a multiple of 8 (even for RoPE)."""
    rest = draw(st.sampled_from((2, 4, 6) if even else (1, 2, 3, 4, 5, 6, 7)))
    return 8 * draw(st.integers(0, regime.max_head_dim // 8 - 1)) + rest


def _class_mask(draw, regime: Regime, cls: pool.RecordClass, layout: dict) -> dict:
    """Window sides the class bounds below the widest extent (else -1 or at least it: no bound,
    as frost reads it), in its alignment; causal spelled either way when the right side is 0."""
    if layout.get("layout") == "thd":
        extents = (*layout["lengths_q"], *layout["lengths_k"])
        same_extents = False
    else:
        extents = (layout["seqlen_q"], layout["seqlen_k"])
        same_extents = "lengths_q" not in layout and layout["seqlen_q"] == layout["seqlen_k"]
    widest = max(*extents, 1)
    left = draw(_bounded_side(regime, widest) if cls.left else _unbounded_side(regime, widest))
    right = draw(_bounded_side(regime, widest) if cls.right else _unbounded_side(regime, widest))
    if cls.bottom_right:
        align = "bottom_right"
    elif same_extents or not (cls.left or cls.right):  # both alignments are this one problem
        align = draw(st.sampled_from(("top_left", "bottom_right")))
    else:
        align = "top_left"
    if right == 0 and draw(st.booleans()):
        return {"causal": True, "causal_align": align, "window": (left, draw(st.sampled_from((-1, 0))))}
    return {"causal_align": align, "window": (left, right)}


def _bounded_side(regime: Regime, widest: int) -> st.SearchStrategy[int]:
    """0 .. widest - 1: often 0, small, a tile edge or the last bounded width."""
    top = widest - 1
    near = [st.integers(1, min(8, top))] if top >= 1 else []
    edges = _tile_edges(regime, top)
    return st.one_of(st.just(0), *near, *([st.sampled_from(edges)] if edges else []), st.just(top),
                     st.integers(0, top))  # fmt: skip


def _unbounded_side(regime: Regime, widest: int) -> st.SearchStrategy[int]:
    """-1, or a width at least the widest extent (the first such, or far beyond)."""
    return st.one_of(st.just(-1), st.just(widest), st.integers(widest, 2 * (regime.long_seqlen + 1)))


def backward_cases(regime: str = "cpu", **fixed) -> st.SearchStrategy[Case]:
    """``cases`` for backward properties. Nothing is filtered out: every drawn problem is
    judged, and only the outputs the contract's known limit exempts go unjudged, per output
    (``frost_harness.oracle.tolerance.known_limit``); ``python -m frost_harness.fuzz.limits`` measures the shares."""
    return cases(regime, direction="backward", **fixed)
