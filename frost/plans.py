"""The plan cache: the fast path of a call whose like was served before.

A call's signature is what its Problem and its validation depend on, read cheaply
from the arguments: each tensor's shape, strides, dtype, device and whether its data
pointer sits on 16 bytes; the non-tensor keywords with their types (``causal=1`` is
not ``causal=True``: validation rejects one of them); the direction; the engine asked
for. A first call with a signature goes the whole way (``frost.problem`` validates and
builds the Problem, ``frost.dispatch.select`` routes and compiles); the plan it chose
is kept under the signature. A later call with the same signature skips all of that
and goes to ``frost.dispatch.run``, with two exceptions:

- what only values can tell still runs on every call: ``validation.check_values``
  reads seqlens / cu_seqlens on the host, raises the same ValueError the full path
  would, and returns the extents that the values give (for packed input the longest
  sequence is part of the Problem). The kept plans are keyed by those extents too. A
  dense call without seqlens has no values to read (``validation.reads_no_values``): its
  extents are its shapes', kept with the signature; a call traced by torch.compile reads
  only what its launch needs (``Options.check_lengths``);
- ``out=`` is checked on every call that passes it.

Validation lives in ``frost.validation`` only: a signature is remembered only after
the full validation passed for it, and nothing here judges an argument.

Plans are reused as long as the engine tables are the same objects and no engine's
attribute changed (``Engine.generation``): a plan is a function of its Problem and
its engine's settings. ``frost.route`` never uses the cache. ``cache.stats()`` counts
hits and misses (tests assert reuse with it); ``cache.clear()`` forgets every plan.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import torch

from frost import dispatch, validation
from frost.engines.base import Engine
from frost.problem import bind_lengths, prepare_records
from frost.records import Options, Tensors

# Only plain tensors are keyed: a subclass may answer data_ptr() or stride() differently.
PLAIN = (torch.Tensor, torch.nn.Parameter)


class _Uncacheable(Exception):
    """A call whose signature cannot be read cheaply; it takes the full path."""


def _tensor_key(x):
    if x is None:
        return None
    if type(x) not in PLAIN or x.layout is not torch.strided:
        raise _Uncacheable
    return x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16 == 0


def signature(direction: str, t: Tensors, options: Options, engine) -> tuple:
    """The call's signature (see the module docstring); raises ``_Uncacheable``."""
    # the optional tensors are mostly absent: None is tested inline, without a call
    return (
        direction, engine,
        _tensor_key(t.q), _tensor_key(t.k), _tensor_key(t.v),
        None if t.o is None else _tensor_key(t.o), None if t.lse is None else _tensor_key(t.lse),
        None if t.do is None else _tensor_key(t.do),
        None if t.seqlens_q is None else _tensor_key(t.seqlens_q),
        None if t.seqlens_k is None else _tensor_key(t.seqlens_k),
        None if t.cu_seqlens_q is None else _tensor_key(t.cu_seqlens_q),
        None if t.cu_seqlens_k is None else _tensor_key(t.cu_seqlens_k),
        None if t.bias is None else _tensor_key(t.bias), None if t.sinks is None else _tensor_key(t.sinks),
        None if t.rope_cos is None else _tensor_key(t.rope_cos),
        None if t.rope_sin is None else _tensor_key(t.rope_sin),
        options, tuple(map(type, options)),
    )  # fmt: skip


class _Entry:
    """One signature whose full validation passed: its plans by the extents values gave."""

    __slots__ = ("layout", "table", "generation", "served", "fixed")

    def __init__(self, layout: str, table, generation: int, fixed: validation.Extents | None):
        self.layout, self.table, self.generation = layout, table, generation
        self.served: dict[validation.Extents, dispatch.Served] = {}
        self.fixed = fixed  # the extents when no value can change them (validation.reads_no_values)

    def current(self, direction: str) -> bool:
        return self.table is dispatch.engines(direction) and self.generation == Engine.generation

    def lookup(self, extents: validation.Extents):
        """The plan for these extents; under a graph capture (longest sequences unknown) the one
        made eagerly for the same layout, batch and max_seqlen_*."""
        served = self.served.get(extents)
        if served is None and extents.longest_q is None:
            served = next((s for e, s in self.served.items() if e[:4] == extents[:4]), None)
        return served


class CacheStats(NamedTuple):
    hits: int
    misses: int
    entries: int  # signatures kept


class PlanCache:
    """Plans by call signature, bounded: the oldest signature goes when ``capacity`` is reached.

    Packed calls keep at most ``per_signature`` plans per signature (one per distinct
    longest sequence); past that the signature's plans are dropped and rebuilt.
    """

    def __init__(self, capacity: int = 1024, per_signature: int = 64):
        self.capacity, self.per_signature = capacity, per_signature
        self._entries: dict[tuple, _Entry] = {}
        self._lock = threading.Lock()
        self._hits = self._misses = 0

    def serve(self, direction: str, tensors: Tensors, options: Options, engine=None, out=None):
        """Validate (fully, or the values only on a hit), select and run one call."""
        served, tensors, out, _ = self.plan(direction, tensors, options, engine, out)
        return dispatch.run(served, tensors, out)

    def plan(self, direction: str, tensors: Tensors, options: Options, engine=None, out=None):
        """``serve`` without the run: ``(served, tensors, out, cacheable)``, the tensors with their
        length tensors bound (``frost.problem.bind_lengths``) and ``out`` checked."""
        try:
            key = signature(direction, tensors, options, engine)
            entry = self._entries.get(key)
        except (_Uncacheable, TypeError, RuntimeError):  # unhashable options; a tensor without storage
            key = entry = None
        if entry is not None and entry.current(direction):
            extents = entry.fixed or validation.check_values(entry.layout, tensors, options)
            served = entry.lookup(extents)
            if served is not None:
                self._hits += 1
                tensors = bind_lengths(served.problem, tensors)
                if out is not None:
                    out = validation.check_out(direction, out, tensors, options.bias_grad)
                return served, tensors, out, True
        self._misses += 1
        lengths = [n for n in ("cu_seqlens_q", "seqlens_q", "seqlens_k") if getattr(tensors, n) is not None]
        if lengths and validation.capturing(tensors.q):
            raise ValueError(f"{lengths[0]}: a packed or padded call captured in a CUDA graph must first run once "
                             "outside the capture with the same arguments (its plan, and the checks of its "
                             "sequence lengths, are made then)")
        given = tensors
        problem, tensors, extents = prepare_records(direction, tensors, options)
        out = validation.check_out(direction, out, tensors, options.bias_grad)
        served = dispatch.select(problem, engine=engine)
        if key is not None:
            fixed = extents if validation.reads_no_values(problem.layout, given) else None
            self._keep(key, direction, extents, served, fixed)
        return served, tensors, out, key is not None

    def serve_backward_of(self, forward: dispatch.Served, settings: int, tensors: Tensors, options: Options,
                          engine=None):  # fmt: skip
        """The backward of a call that ``forward`` served, from ``frost.attention``'s autograd
        formula: ``settings`` names its static keywords (``frost.ops.settings_id``).

        Everything in the backward's signature but ``do`` is fixed by the forward: the same
        q, k, v and optional tensors (autograd's saved tensors, whose version counters
        forbid an in-place change in between), o and lse as the forward plan allocated them,
        the same keywords. So the forward's plan keeps the backward plan it led to, by
        ``settings`` and ``do``'s layout, and a later backward of it skips the signature
        and the value checks (run by the forward on these very tensors); anything else
        takes ``serve``'s way.
        """
        try:
            key = (settings, _tensor_key(tensors.do))
        except _Uncacheable:
            key = None
        followers = forward.followers
        link = followers.get(key) if key is not None else None
        table = dispatch.engines("backward")
        if link is not None and link[1] is table and link[2] == Engine.generation:
            self._hits += 1
            return dispatch.run(link[0], bind_lengths(link[0].problem, tensors))
        served, tensors, _, cacheable = self.plan("backward", tensors, options, engine)
        if key is not None and cacheable:
            if len(followers) >= 8:  # a forward plan has few backward layouts; bound it anyway
                followers.clear()
            followers[key] = (served, table, Engine.generation)
        return dispatch.run(served, tensors)

    def _keep(self, key: tuple, direction: str, extents, served: dispatch.Served, fixed) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or not entry.current(direction):
                if len(self._entries) >= self.capacity:
                    self._entries.pop(next(iter(self._entries)))
                entry = _Entry(served.problem.layout, dispatch.engines(direction), Engine.generation, fixed)
                self._entries[key] = entry
            if len(entry.served) >= self.per_signature:
                entry.served.clear()
            entry.served[extents] = served

    def stats(self) -> CacheStats:
        return CacheStats(self._hits, self._misses, len(self._entries))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


cache = PlanCache()
