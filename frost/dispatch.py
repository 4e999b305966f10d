"""Dispatch: the ranked engine tables, routing, and the routing ledger.

Each direction has one table, best engine first. Routing walks it: every engine
answers ``check_support(problem)``; the first to accept serves the call. ``route``
only asks (it runs and records nothing); ``select`` also compiles, moving on when
``compile`` raises ``Declined``, and returns the plan with its ``Decision``; ``run``
executes it and, once it has served the call, records the decision in ``ledger``.
``serve`` is ``select`` then ``run``. ``frost.plans`` keeps what ``select`` returned per
call signature, so repeated calls go straight to ``run``. Plans execute with the caller's
autocast off: the API casts the inputs as autocast asks (``frost.ops``), and an engine's own
arithmetic keeps the dtypes it chose.

An engine whose ``ranks_first(problem)`` gives a reason goes ahead of the table's order for
that problem: ``torch-cudnn`` on the device families where it measured faster than frost's own
kernels (``frost.engines.native.CUDNN_FASTER_ON``). If it accepts, its Decision carries the
reason (``Decision.ranked_first``); if it declines, its reason joins the others and the table's
order serves. ``engine=`` forces an engine regardless (``engine="sm80"``: frost's kernels).

Adding an engine: implement ``frost.engines.base.Engine`` for a direction and put an
instance in ``FORWARD_ENGINES`` or ``BACKWARD_ENGINES`` at its rank. Engine modules
must not import the CuTe DSL at import time (``import frost`` stays fast).

``engine=`` forces one engine, by its name or its family (the name the forward and
backward engines of one implementation share, so ``engine="unfused"`` or
``engine="sm80"`` forces both directions of ``frost.attention``). Unknown names and
declines raise ValueError with the reason. No environment variable forces an engine
(ARCHITECTURE rule 5 would allow a test-only one): every caller, tests included,
passes ``engine=``.
"""
from __future__ import annotations

import contextlib
import threading
from collections import Counter, deque
from dataclasses import dataclass

import torch

from frost.engines.base import Declined, Engine, Plan
from frost.engines.native import (
    TorchCudnnBackward, TorchCudnnForward, TorchSdpaBackward, TorchSdpaForward, UnfusedBackward, UnfusedForward,
)  # fmt: skip
from frost.engines.sm80 import Sm80Backward, Sm80Forward
from frost.problem import Grads, Problem, Tensors

# Best first: frost's own SM80 kernels, then the native fallbacks. torch-cudnn, last, serves where
# it ranks itself first (its measured device families) or when forced; unfused accepts every
# problem, so nothing reaches it by rank.
FORWARD_ENGINES: tuple[Engine, ...] = (
    Sm80Forward(),
    TorchSdpaForward(),
    UnfusedForward(),
    TorchCudnnForward(),
)
BACKWARD_ENGINES: tuple[Engine, ...] = (
    Sm80Backward(),
    TorchSdpaBackward(),
    UnfusedBackward(),
    TorchCudnnBackward(),
)


def engines(direction: str) -> tuple[Engine, ...]:
    """The ranked table of one direction."""
    return FORWARD_ENGINES if direction == "forward" else BACKWARD_ENGINES


@dataclass(frozen=True)
class Decision:
    """Which engine serves a problem and why each engine ranked before it declined."""

    problem: Problem
    engine: str
    native: bool
    declined: tuple[tuple[str, str], ...]  # (engine name, reason), in the order asked
    forced: bool
    ranked_first: str | None = None  # why the serving engine went ahead of the table's order

    @property
    def direction(self) -> str:
        return self.problem.direction

    def __str__(self) -> str:
        declined = "; ".join(f"{name}: {reason}" for name, reason in self.declined)
        forced = " (forced)" if self.forced else ""
        ranked = f" (ranked first: {self.ranked_first})" if self.ranked_first else ""
        return f"{self.direction} -> {self.engine}{forced}{ranked}" + (f" [declined: {declined}]" if declined else "")


class Ledger:
    """Every served call's Decision: running counts plus the most recent decisions.

    Counts never forget until ``reset``; the ``recent`` window is bounded so a long
    training run cannot grow it without limit. Safe to record from several threads.
    """

    def __init__(self, keep: int = 4096):
        self._lock = threading.Lock()
        self._recent: deque[Decision] = deque(maxlen=keep)
        self._total = 0
        self._by_engine: Counter[tuple[str, str]] = Counter()
        self._declines: Counter[tuple[str, str, str]] = Counter()

    @staticmethod
    def keys_of(decision: Decision) -> tuple[tuple[str, str], tuple[tuple[str, str, str], ...]]:
        """The counter keys one decision adds to: ``(direction, engine)`` and its declines."""
        direction = decision.direction
        return (direction, decision.engine), tuple((direction, name, reason) for name, reason in decision.declined)

    def record(self, decision: Decision, keys=None) -> None:
        """Count one served call. ``keys`` (from ``keys_of``) spares recomputing them for a
        decision recorded again and again (a cached plan's)."""
        engine_key, decline_keys = keys if keys is not None else self.keys_of(decision)
        with self._lock:
            self._recent.append(decision)
            self._total += 1
            self._by_engine[engine_key] += 1
            for key in decline_keys:
                self._declines[key] += 1

    def snapshot(self) -> LedgerSnapshot:
        with self._lock:
            return LedgerSnapshot(
                total=self._total,
                by_engine=dict(self._by_engine),
                declines=dict(self._declines),
                recent=tuple(self._recent),
            )

    def mark(self) -> int:
        """A position to pass to ``since`` later."""
        with self._lock:
            return self._total

    def since(self, mark: int) -> tuple[Decision, ...]:
        """The decisions recorded after ``mark`` (those still in the recent window)."""
        with self._lock:
            count = min(self._total - mark, len(self._recent))
            return tuple(self._recent)[len(self._recent) - count :] if count > 0 else ()

    def reset(self) -> None:
        with self._lock:
            self._recent.clear()
            self._total = 0
            self._by_engine.clear()
            self._declines.clear()


@dataclass(frozen=True)
class LedgerSnapshot:
    total: int
    by_engine: dict[tuple[str, str], int]  # (direction, engine) -> calls served
    declines: dict[tuple[str, str, str], int]  # (direction, engine, reason) -> count
    recent: tuple[Decision, ...]


ledger = Ledger()


_table_order_only = False  # table_order(): no engine ranks itself first


@contextlib.contextmanager
def table_order():
    """Within this block no engine goes ahead of the table's order by its device family: frost's
    own kernels rank first everywhere, as ``engine="sm80"`` forces for the calls that cannot pass
    it (a model's attention). Benchmarks of frost's kernels run in it. Plans made outside are not
    reused inside, nor the other way round (``Engine.generation``)."""
    global _table_order_only
    before, _table_order_only = _table_order_only, True
    Engine.generation += 1
    try:
        yield
    finally:
        _table_order_only = before
        Engine.generation += 1


def _candidates(problem: Problem, engine: str | None) -> tuple[tuple[Engine, str | None], ...]:
    """The engines to ask, in order, each with why it ranks first (None: the table's rank)."""
    table = engines(problem.direction)
    if engine is None and _table_order_only:
        return tuple((e, None) for e in table)
    if engine is None:
        first = [(e, why) for e in table if (why := e.ranks_first(problem)) is not None]
        return (*first, *((e, None) for e in table if all(e is not f for f, _ in first)))
    chosen = tuple(e for e in table if engine in (e.name, e.family))
    if not chosen:
        names = ", ".join(repr(name) for name in dict.fromkeys(n for e in table for n in (e.name, e.family)))
        raise ValueError(f"engine: unknown {problem.direction} engine {engine!r} (known: {names})")
    return tuple((e, None) for e in chosen)


def ranked(problem: Problem) -> tuple[Engine, ...]:
    """The engines of the problem's direction in the order routing asks them (``ranks_first``
    applied): the table's order unless an engine goes first on this problem's device."""
    return tuple(engine for engine, _ in _candidates(problem, None))


def _forced_decline(engine: str, reason: str) -> ValueError:
    return ValueError(f"engine: {engine!r} declined this problem: {reason}")


def route(problem: Problem, *, engine: str | None = None) -> Decision:
    """The engine that would serve ``problem`` and the reasons of those before it; runs nothing.

    A ``Declined`` raised by a later ``compile`` cannot be foreseen here.
    """
    declined = []
    for candidate, ranked_first in _candidates(problem, engine):
        reason = candidate.check_support(problem)
        if reason is None:
            return Decision(problem, candidate.name, candidate.native, tuple(declined), engine is not None,
                            ranked_first)  # fmt: skip
        if engine is not None:
            raise _forced_decline(engine, reason)
        declined.append((candidate.name, reason))
    raise RuntimeError(f"no engine accepts {problem.describe()}; declined: {declined}")


class Served:
    """A problem's plan with the Decision that chose it: what ``frost.plans`` keeps per call
    signature, so a repeated call neither routes, compiles nor builds a Decision again."""

    __slots__ = ("problem", "plan", "decision", "ledger_keys", "followers")

    def __init__(self, problem: Problem, plan: Plan, decision: Decision):
        self.problem, self.plan, self.decision = problem, plan, decision
        self.ledger_keys = Ledger.keys_of(decision)
        self.followers: dict = {}  # a forward's backward plans (frost.plans.PlanCache.serve_backward_of)


def select(problem: Problem, *, engine: str | None = None) -> Served:
    """Route and compile: the first engine that accepts and lowers ``problem``, and why
    those before it declined. Records nothing."""
    declined = []
    for candidate, ranked_first in _candidates(problem, engine):
        reason = candidate.check_support(problem)
        plan: Plan | None = None
        if reason is None:
            try:
                plan = candidate.compile(problem)
            except Declined as decline:
                reason = decline.reason
        if plan is None:
            if engine is not None:
                raise _forced_decline(engine, reason)
            declined.append((candidate.name, reason))
            continue
        decision = Decision(problem, candidate.name, candidate.native, tuple(declined), engine is not None,
                            ranked_first)  # fmt: skip
        return Served(problem, plan, decision)
    raise RuntimeError(f"no engine accepts {problem.describe()}; declined: {declined}")


def run(served: Served, tensors: Tensors, out=None, workspace=None):
    """Execute a selected plan and record its decision once it has served the call (a
    call that raised is not counted). ``workspace``: the plan's scratch, at least
    ``served.plan.workspace_bytes`` bytes (None: the plan allocates it; the test harness
    passes one with guard regions). Returns ``(o, lse)`` or ``Grads``."""
    if torch._C._is_any_autocast_enabled():  # one C call off autocast
        # engines compute in the dtypes they choose (float32 copies, fp32 products): the caller's
        # autocast would recast their matmuls to its half dtype (measured: unfused's lse 0.022 off)
        with torch.autocast(served.problem.device_type, enabled=False):
            result = served.plan.execute(tensors, out=out, workspace=workspace)
    else:
        result = served.plan.execute(tensors, out=out, workspace=workspace)
    ledger.record(served.decision, served.ledger_keys)
    if type(result) is Grads or served.problem.direction == "forward":
        return result
    return Grads(*result)  # an engine's plain tuple


def serve(problem: Problem, tensors: Tensors, *, engine: str | None = None, out=None):
    """Route, compile and execute; record the decision. Returns ``(o, lse)`` or ``Grads``."""
    return run(select(problem, engine=engine), tensors, out)
