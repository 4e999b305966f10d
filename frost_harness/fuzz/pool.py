"""Record classes: the finite pool of compiled kernels a GPU fuzz run draws its problems from.

A GPU example that meets a params record no process has compiled pays a JIT compile of
4-8 s (measured on the H200 machine), far more than the example itself. So the ``gpu``
regime's strategies (``frost_harness.fuzz.strategies``) first draw a *record class* from a
small pool and then many problems under it: the class fixes every fact that changes a
compiled params record of frost's engines (``frost.kernels.sm80.config``,
``frost.kernels.sm80.rope_params``), the problem draws what stays a runtime value.

What a class fixes (and why):

- the dtype;
- the head-dim flavor and whether each head dim fills its tile (``flavor``,
  ``partial_qk``, ``partial_v``; the head dims themselves are runtime);
- the layout (dense, dense with padding, packed THD);
- which window sides are bounded (causal is a right side of 0; the widths are runtime)
  and, when one is, the bottom-right alignment;
- sinks;
- an additive bias and its dtype (float32 or the io dtype). Its broadcast pattern is
  runtime, though the backward reduces dbias differently when the bias has size 1 where
  the problem has more batches or heads: a class with a bias may compile both;
- whether heads are grouped: the backward splits a GQA / MQA group over CTAs
  (``split_group``) depending on the grid, so a grouped class may compile both;
- RoPE, with the exact head_dim_qk it rotates (the RoPE pass compiles one small kernel
  per head dim; the attention kernels do not change).

Everything else a problem draws is runtime or makes frost's engines decline (head dims
that are not multiples of 8, a scale that is not positive): sizes, head counts, window
widths, scales, seeds, strides.

``sample(seed, size)`` draws ``size`` classes by ``seed`` from the class space without
RoPE (``space()``), plus, for every constraint a property puts on its problems
(``demands()``: the identities' draws), enough to have ``PER_DEMAND`` that satisfy it,
and gives ``ROPE_SHARE`` of them RoPE at one of their head dims (the cpu regime draws
RoPE for a quarter of its problems). ``records(classes)`` are every params record a run
on that pool can compile: each class's own records for the forward, the backward and
the deterministic backward, the GQA splits (none, the whole group's, and 2, summed in
clusters on SM90) and both bias reductions, plus those of
the problems the identities rewrite it into (a packed problem's per-sequence and padded
spellings, with its window sides or alignment lost where a sequence is too short to
bound them; GQA spelled as MHA; a float32 bias carrying a row shift, or a sink and the
masks). They come from the engines' own lowering (``Engine.records``), so they are
exactly what the plans compile. ``frost-fuzz`` compiles them into the disk cache before
its workers start (``frost_harness.fuzz.prewarm``).

The pool a process draws from is ``active()``: the one the plugin activates from
``--frost-fuzz-pool SEED:SIZE`` (``frost-fuzz`` passes it), else ``sample(0, DEFAULT_SIZE)``.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterable, Mapping

import torch

from frost import dispatch
from frost.kernels.sm80.config import FLAVORS, HEAD_DIM_MULTIPLE, flavor_for
from frost.problem import BiasSpec, Problem

DTYPES = ("bfloat16", "float16")
LAYOUTS = ("dense", "padded", "thd")
BIASES = (None, "float32", "io")  # no bias, a float32 one, one in the io dtype
DEFAULT_SIZE = 12
PER_DEMAND = 2
ROPE_SHARE = 0.25
MAX_HEAD_DIM = 128  # the gpu regime's (frost_harness.fuzz.strategies.REGIMES)


@dataclasses.dataclass(frozen=True)
class RecordClass:
    """The facts of a problem that decide which params records frost's engines compile."""

    layout: str  # "dense" | "padded" | "thd"
    left: bool  # a bounded left window side
    right: bool  # a bounded right window side (causal is right = 0)
    bottom_right: bool  # bottom-right alignment (only with a bounded side)
    sinks: bool
    grouped: bool  # GQA or MQA (Hkv < Hq)
    flavor: str  # a key of frost.kernels.sm80.config.FLAVORS
    partial_qk: bool  # head_dim_qk below the flavor's Q/K tile
    partial_v: bool  # head_dim_v below its V tile
    dtype: str  # "bfloat16" | "float16"
    bias: str | None = None  # a key of BIASES
    rope: int | None = None  # RoPE, at this head_dim_qk (the RoPE pass's record fixes it); None: no RoPE

    def __post_init__(self):
        if self.bottom_right and not (self.left or self.right):
            raise ValueError(f"{self}: bottom-right alignment needs a bounded window side")
        if self.rope is not None and self.rope not in self.head_dims_qk():
            raise ValueError(f"{self}: RoPE at a head_dim_qk the class does not admit")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def bias_dtype(self) -> torch.dtype | None:
        return None if self.bias is None else torch.float32 if self.bias == "float32" else self.torch_dtype

    def head_dims(self) -> tuple[list[int], list[int]]:
        """Every (multiple-of-8) head_dim_qk and head_dim_v this class admits, each on its own:
        a pair must also pass ``admits_head_dims`` (a narrower flavor may cover both)."""
        tile_qk, tile_v = FLAVORS[self.flavor]
        return _dims(tile_qk, self.partial_qk), _dims(tile_v, self.partial_v)

    def head_dims_qk(self) -> list[int]:
        """The head_dim_qk values of some admitted pair (RoPE fixes one of them)."""
        dims_qk, dims_v = self.head_dims()
        return [d for d in dims_qk if any(self.admits_head_dims(d, v) for v in dims_v)]

    def admits_head_dims(self, head_dim_qk: int, head_dim_v: int) -> bool:
        tile_qk, tile_v = FLAVORS[self.flavor]
        return (flavor_for(head_dim_qk, head_dim_v) == self.flavor and (head_dim_qk < tile_qk) == self.partial_qk
                and (head_dim_v < tile_v) == self.partial_v)  # fmt: skip


def _dims(tile: int, partial: bool) -> list[int]:
    """A tile's head dims: the tile itself, or every multiple of 8 below it (up to MAX_HEAD_DIM)."""
    if not partial:
        return [tile] if tile <= MAX_HEAD_DIM else []
    return list(range(HEAD_DIM_MULTIPLE, min(tile, MAX_HEAD_DIM + HEAD_DIM_MULTIPLE), HEAD_DIM_MULTIPLE))


def _head_kinds() -> list[tuple[str, bool, bool]]:
    """(flavor, partial_qk, partial_v) of every pair of multiple-of-8 head dims up to MAX_HEAD_DIM."""
    dims = range(HEAD_DIM_MULTIPLE, MAX_HEAD_DIM + 1, HEAD_DIM_MULTIPLE)
    kinds = set()
    for qk, v in itertools.product(dims, dims):
        flavor = flavor_for(qk, v)
        kinds.add((flavor, qk < FLAVORS[flavor][0], v < FLAVORS[flavor][1]))
    return sorted(kinds)


# (left, right, bottom_right): no bound; then each bounded combination in both alignments
MASKS = ((False, False, False),) + tuple(
    (left, right, bottom_right) for left, right in ((True, False), (False, True), (True, True))
    for bottom_right in (False, True)
)  # fmt: skip


def space() -> list[RecordClass]:
    """Every record class of the gpu regime, in a fixed order."""
    return [
        RecordClass(layout=layout, left=left, right=right, bottom_right=bottom_right, sinks=sinks, grouped=grouped,
                    flavor=flavor, partial_qk=partial_qk, partial_v=partial_v, dtype=dtype, bias=bias)
        for dtype, (flavor, partial_qk, partial_v), layout, (left, right, bottom_right), sinks, grouped, bias
        in itertools.product(DTYPES, _head_kinds(), LAYOUTS, MASKS, (False, True), (False, True), BIASES)
    ]  # fmt: skip


def demands() -> list[Mapping]:
    """The constraints properties put on their problems: none, and each identity's draws
    (``frost_harness.fuzz.identities``); the pool holds PER_DEMAND classes for each."""
    from frost_harness.fuzz.identities import IDENTITIES  # here: the identities import the harness

    found = [{}]
    for identity in IDENTITIES.values():
        if identity.draws not in found:
            found.append(identity.draws)
    return found


def matches(cls: RecordClass, constraints: Mapping) -> bool:
    """Whether ``cls`` satisfies a strategy's constraints (``frost_harness.fuzz.strategies.cases``'s
    ``fixed``): layout, heads="grouped", mask="right_bounded", sinks; the others (min_batch) are sizes."""
    return (
        constraints.get("layout", cls.layout) == cls.layout
        and (constraints.get("heads") != "grouped" or cls.grouped)
        and (constraints.get("mask") != "right_bounded" or cls.right)
        and constraints.get("sinks", cls.sinks) == cls.sinks
    )


def sample(seed: int, size: int = DEFAULT_SIZE) -> tuple[RecordClass, ...]:
    """A run's pool: ``size`` classes drawn from ``space()`` by ``seed``, plus enough for every
    demand to have ``PER_DEMAND``; sorted, simplest first (Hypothesis shrinks toward the first)."""
    rng = random.Random(seed)
    every = space()
    chosen = rng.sample(every, min(size, len(every)))
    for demand in demands():
        have = [c for c in chosen if matches(c, demand)]
        rest = [c for c in every if matches(c, demand) and c not in chosen]
        chosen += rng.sample(rest, max(0, min(PER_DEMAND - len(have), len(rest))))
    chosen = [dataclasses.replace(c, rope=rng.choice(c.head_dims_qk())) if rng.random() < ROPE_SHARE else c
              for c in chosen]  # fmt: skip
    return tuple(sorted(dict.fromkeys(chosen), key=_simplicity))


def _simplicity(cls: RecordClass) -> tuple:
    switched_on = (cls.layout != "dense", cls.left, cls.right, cls.bottom_right, cls.sinks, cls.bias is not None,
                   cls.rope is not None, cls.grouped, cls.partial_qk, cls.partial_v)  # fmt: skip
    return (sum(switched_on), list(FLAVORS).index(cls.flavor), LAYOUTS.index(cls.layout), switched_on,
            DTYPES.index(cls.dtype))  # fmt: skip


def parse_spec(text: str) -> tuple[int, int]:
    """``"SEED:SIZE"`` -> (seed, size)."""
    seed, _, size = text.partition(":")
    try:
        return int(seed), int(size or DEFAULT_SIZE)
    except ValueError:
        raise ValueError(f"pool: expected SEED:SIZE, e.g. 20261202001:12, got {text!r}") from None


_active: tuple[RecordClass, ...] | None = None


def activate(classes: tuple[RecordClass, ...] | None) -> None:
    global _active
    _active = classes


def active() -> tuple[RecordClass, ...]:
    """The pool this process draws from (the plugin's, else the default one)."""
    global _active
    if _active is None:
        _active = sample(0, DEFAULT_SIZE)
    return _active


# the records of a pool --------------------------------------------------------------

_MODES = (("forward", False), ("backward", False), ("backward", True))  # (direction, deterministic)


# a grid of a few CTAs (a GQA group is split over CTAs; two sequences, so a bias can broadcast
# over the batch) and one of thousands (it is not)
_GRIDS = (2, 4096)
# (broadcast, odd number of keys) of a bias: the backward reduces dbias over broadcast dims, with the
# sequences launched fastest over the batch, two floats per reduction where Sk is even
_BIAS_SHAPES = ((None, False), ("heads", False), ("heads", True), ("batch", False), ("batch", True))


def records(classes: Iterable[RecordClass]) -> list:
    """Every params record frost's engines may compile for problems of ``classes`` (and for the
    identities' rewrites of them), without repeats, in a fixed order."""
    found: dict = {}
    for cls in classes:
        for variant, modes in closure(cls):
            shapes = itertools.product(_GRIDS, _BIAS_SHAPES if variant.bias else (_BIAS_SHAPES[0],))
            for (direction, deterministic), (batch, (broadcast, odd_keys)) in itertools.product(modes, shapes):
                problem = representative(variant, direction, deterministic, batch, broadcast, odd_keys)
                for engine in (*dispatch.engines(direction), *_two_way_splits(direction, variant)):
                    found.update(dict.fromkeys(engine.records(problem)))
    return list(found)


def _two_way_splits(direction: str, cls: RecordClass) -> tuple:
    """The backward forced to split a group in 2, whose CTAs sum dK and dV in clusters on SM90
    (engines/sm80.cluster_sums) rather than through partials: a drawn grid may take 2
    splits, where the representative grids take the whole group's or none."""
    from frost.engines.sm80 import Sm80Backward

    return (Sm80Backward(split=2),) if direction == "backward" and cls.grouped else ()


def closure(cls: RecordClass) -> list[tuple[RecordClass, tuple]]:
    """The classes a property may run for a problem of ``cls``, each with its (direction,
    deterministic) modes: ``cls`` in every mode, and the identities' rewrites
    (``frost_harness.fuzz.identities``; forward and the default backward) of the problems
    whose draws ``cls`` meets: GQA as MHA; a packed problem as padded and as one dense
    problem per sequence, whose shorter extents may unbound a window side or make the
    alignments coincide; a row shift as a float32 bias (no sinks); a sink and the masks of
    a dense problem as a float32 bias over one more key."""
    sides = [dataclasses.replace(cls, grouped=False)] if cls.grouped else []
    if cls.layout == "thd":
        sides.append(dataclasses.replace(cls, layout="padded"))
        for left, right, bottom_right in MASKS:
            if (left <= cls.left) and (right <= cls.right) and (bottom_right <= cls.bottom_right):
                sides.append(dataclasses.replace(cls, layout="dense", left=left, right=right,
                                                 bottom_right=bottom_right))  # fmt: skip
    if not cls.sinks:
        sides.append(dataclasses.replace(cls, bias="float32"))
    elif cls.layout == "dense":
        sides.append(dataclasses.replace(cls, left=False, right=False, bottom_right=False, sinks=False, bias="float32"))
    return [(cls, _MODES)] + [(side, _MODES[:2]) for side in dict.fromkeys(sides) if side != cls]


def representative(cls: RecordClass, direction: str, deterministic: bool, batch: int = 1,
                   broadcast: str | None = None, odd_keys: bool = False) -> Problem:
    """A Problem of ``cls``, for the engines' lowering only (nothing runs; the device is the CPU,
    so that no CUDA is needed, and the backward's GQA split counts an H200's SMs); ``batch``
    sets the grid's size, ``broadcast`` ("heads" or "batch") gives the bias size 1 over the (8)
    query heads or the batch, ``odd_keys`` an odd number of keys (how dbias is reduced)."""
    head_dim_qk = cls.rope or max(cls.head_dims_qk())
    head_dim_v = max(v for v in cls.head_dims()[1] if cls.admits_head_dims(head_dim_qk, v))
    seqlen = 256
    bias_shape = (1 if broadcast == "batch" else batch, 1 if broadcast == "heads" else 8, seqlen,
                  seqlen + 64 + odd_keys)
    return Problem(
        direction=direction, layout="thd" if cls.layout == "thd" else "bshd", dtype=cls.torch_dtype, device="cpu",
        batch=batch, seqlen_q=seqlen, seqlen_k=seqlen + 64 + odd_keys,
        total_q=batch * seqlen if cls.layout == "thd" else None,
        total_k=batch * (seqlen + 64 + odd_keys) if cls.layout == "thd" else None,
        heads_q=8, heads_kv=2 if cls.grouped else 8,
        head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, scale=0.125, causal=cls.right,
        causal_align="bottom_right" if cls.bottom_right else "top_left", window_left=16 if cls.left else -1,
        window_right=0 if cls.right else -1, has_seqlens=cls.layout == "padded", has_sinks=cls.sinks,
        bias=BiasSpec(bias_shape, cls.bias_dtype) if cls.bias else None,
        has_rope=cls.rope is not None, deterministic=deterministic, strided=False, vector_aligned=True,
    )  # fmt: skip
