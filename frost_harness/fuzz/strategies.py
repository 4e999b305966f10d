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
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from frost.case import BIAS_PATTERNS
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


REGIMES = {
    "cpu": Regime("cpu", max_batch=3, max_seqlen=24, long_seqlen=64, max_heads_q=8, max_head_dim=64, max_tail=4),
    "gpu": Regime("cuda", max_batch=4, max_seqlen=384, long_seqlen=2048, max_heads_q=16, max_head_dim=128, max_tail=9),
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


def _key_extent(draw, regime: Regime, seqlen_q: int) -> int:
    """Sk: the queries' own extent, any extent, or one whose bottom-right offset Sk - Sq is a
    tile edge (either sign)."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return seqlen_q
    offsets = [o for e in _tile_edges(regime) for o in (e, -e) if 0 <= seqlen_q + o <= regime.max_seqlen]
    if choice == 1 and offsets:
        return seqlen_q + draw(st.sampled_from(offsets))
    return _extent(draw, regime)


def _heads(draw, regime: Regime, grouped: bool) -> tuple[int, int]:
    """(Hq, Hkv): MHA, GQA or MQA; ``grouped`` leaves MHA out."""
    kind = draw(st.sampled_from(("gqa", "mqa") if grouped else ("mha", "gqa", "mqa")))
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


def _layout(draw, regime: Regime, kind: str | None, min_batch: int) -> dict:
    """Fields of one layout kind ("dense", "padded", "thd"; drawn when None)."""
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
    seqlen_k = _key_extent(draw, regime, seqlen_q)
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


def _bias(draw, dtype: torch.dtype, *, max_scale: float) -> dict:
    if draw(st.integers(0, 2)):
        return {}
    scales = [s for s in (1.0, 0.25, 4.0, 30.0, 300.0) if s <= max_scale]
    return {
        "bias": draw(st.sampled_from(BIAS_PATTERNS)),
        "bias_dtype": draw(st.sampled_from((torch.float32, dtype))),
        "bias_scale": draw(st.sampled_from(scales)),
        "bias_holes": draw(st.booleans()),
    }


@st.composite
def cases(draw, regime: str = "cpu", *, direction: str = "forward", **fixed) -> Case:
    """A Case of ``regime`` ("cpu" or "gpu").

    ``direction="backward"`` keeps the bias at 30 standard deviations or less (larger
    ones leave nearly every softmax row peaked). ``fixed``
    constrains the draw: ``layout`` ("dense", "padded" or "thd"), ``heads="grouped"``
    (GQA or MQA only), ``min_batch`` (sequences), ``mask="right_bounded"`` (causal or
    a window with a finite right edge), and any Case field given as a value
    (``sinks=True``) replaces the drawn one.
    """
    size = REGIMES[regime]
    dtype = draw(st.sampled_from(DTYPES))
    layout = _layout(draw, size, fixed.pop("layout", None), fixed.pop("min_batch", 1))
    heads_q, heads_kv = _heads(draw, size, fixed.pop("heads", None) == "grouped")
    rope = draw(st.integers(0, 3)) == 0
    head_dim_qk = _head_dim(draw, size, even=rope)
    head_dim_v = head_dim_qk if draw(st.integers(0, 2)) else _head_dim(draw, size, even=False)
    fields = dict(
        dtype=dtype, device=size.device, **layout, heads_q=heads_q, heads_kv=heads_kv,
        head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, **_mask(draw, size, fixed.pop("mask", None) == "right_bounded"),
        **_bias(draw, dtype, max_scale=30.0 if direction == "backward" else 300.0),
        rope=rope, strided=draw(st.integers(0, 3)) == 0, seed=draw(st.integers(0, 2**16)),
    )  # fmt: skip
    if draw(st.integers(0, 2)) == 0:
        fields.update(sinks=True, sink_scale=draw(st.sampled_from((2.0, 0.5, 20.0))))
    if draw(st.integers(0, 3)) == 0:
        # zero and negative scales are legal (SEMANTICS.md); an engine honors or declines them
        fields["scale"] = draw(st.sampled_from((0.3, 1.0, 0.05, 2.0, -0.5, 0.0, -2.0)))
    fields["logit_scale"] = draw(st.sampled_from((1.0, 4.0, 16.0)))
    fields.update(fixed)
    if fields.get("bias_holes") and layout.get("layout") != "thd" and min(layout["seqlen_q"], layout["seqlen_k"]) == 0:
        fields["bias_holes"] = False  # the harness punches its -inf row into a non-empty bias
    return Case(**fields)


def backward_cases(regime: str = "cpu", **fixed) -> st.SearchStrategy[Case]:
    """``cases`` for backward properties. Nothing is filtered out: every drawn problem is
    judged, and only the outputs the contract's known limit exempts go unjudged, per output
    (``frost_harness.oracle.tolerance.known_limit``); ``python -m frost_harness.fuzz.limits`` measures the shares."""
    return cases(regime, direction="backward", **fixed)
