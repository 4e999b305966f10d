"""The engine contract: what every engine (native fallback or DSL kernel) provides.

An ``Engine`` serves one direction. It declares a ``Capabilities`` row (what it
accepts), answers ``check_support(problem)`` with None (accept) or a reason a person
can read, and lowers an accepted problem with ``compile(problem)`` to a ``Plan``.
``Plan.execute(tensors, out=, workspace=)`` binds the call's tensors and runs.

Declining is never a crash: a reason string from ``check_support``, or ``Declined``
raised from ``compile`` for what only lowering can tell. Any other exception from an
engine is a bug and propagates.

Outputs: with ``out=None`` a plan allocates them with ``allocate_forward`` /
``allocate_backward``, zero-filled by default, so rows an engine never writes (packed
rows past ``cu_seqlens[-1]``) read as zeros; a plan that writes every element asks
for ``zero=False`` and skips the fill. With ``out=`` given (already checked against the
problem by ``frost.validation.check_out``) the plan writes into it and leaves those
rows untouched, which lets test harnesses poison outputs before a launch.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch

from frost.problem import FEATURES, Grads, Problem, Tensors


class Declined(Exception):
    """Raised by ``Engine.compile`` when lowering finds the problem is not this engine's."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Capabilities:
    """What an engine accepts, declared once per engine (one row of the routing report).

    ``features`` lists the optional features accepted (tags of ``Problem.features``;
    the layout tag is judged by ``layouts``). ``device_types=None`` accepts any device.
    Head dims must be multiples of ``head_dim_multiple`` and at most ``max_head_dim``.
    """

    dtypes: frozenset[torch.dtype]
    layouts: frozenset[str]
    features: frozenset[str]
    device_types: frozenset[str] | None = None
    head_dim_multiple: int = 1
    max_head_dim: int | None = None
    deterministic: bool = True  # backward: can honor deterministic=True

    def decline_reason(self, problem: Problem) -> str | None:
        """None if the problem is inside this row, else the first rule it breaks."""
        if self.device_types is not None and problem.device_type not in self.device_types:
            return f"needs a {' or '.join(sorted(self.device_types))} device, got {problem.device}"
        if problem.dtype not in self.dtypes:
            return f"dtype {problem.dtype} is not supported"
        if problem.layout not in self.layouts:
            return f"unsupported: {FEATURES['thd'] if problem.layout == 'thd' else 'dense (BSHD) layout'}"
        missing = [tag for tag in FEATURES if tag in problem.features - {problem.layout} - self.features]
        if missing:
            return "unsupported: " + "; ".join(FEATURES[tag] for tag in missing)
        for name, dim in (("head_dim_qk", problem.head_dim_qk), ("head_dim_v", problem.head_dim_v)):
            if dim % self.head_dim_multiple:
                return f"{name}={dim} is not a multiple of {self.head_dim_multiple}"
            if self.max_head_dim is not None and dim > self.max_head_dim:
                return f"{name}={dim} exceeds {self.max_head_dim}"
        if problem.deterministic and not self.deterministic:
            return "cannot run deterministic=True"
        return None


class Plan(abc.ABC):
    """One accepted problem, lowered and ready to bind tensors and run."""

    def __init__(self, problem: Problem):
        self.problem = problem

    @property
    def workspace_bytes(self) -> int:
        """Scratch memory ``execute`` needs besides its outputs (allocated by it when not passed)."""
        return 0

    @abc.abstractmethod
    def execute(self, tensors: Tensors, *, out=None, workspace: torch.Tensor | None = None):
        """Run: forward returns ``(o, lse)``, backward returns ``Grads``."""


class Engine(abc.ABC):
    """A ranked entry of a dispatch table, serving one direction.

    ``name`` is unique within its direction's table; ``family`` is shared by the
    forward and backward engines of one implementation (``engine="sm80"`` forces both
    directions of ``frost.attention``) and defaults to the name.
    """

    name: str
    direction: str  # "forward" | "backward"
    native: bool  # True for torch fallbacks; False for frost's own kernels
    capabilities: Capabilities
    # Counts attribute changes on any engine. frost.plans keeps compiled plans per call
    # signature; a setting changed on an engine (a test switching a variant on) must not
    # be answered with a plan lowered under the old one, so the cache compares this.
    generation: ClassVar[int] = 0

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        Engine.generation += 1

    @property
    def family(self) -> str:
        return self.name

    def check_support(self, problem: Problem) -> str | None:
        """None to accept, else a human-readable reason. Never raises for a valid problem."""
        if problem.direction != self.direction:
            return f"serves the {self.direction}, not the {problem.direction}"
        return self.capabilities.decline_reason(problem)

    def ranks_first(self, problem: Problem) -> str | None:
        """Why this engine goes ahead of the table's order for this problem (a native kernel that
        measures faster than frost's on the problem's device family), or None: the table's rank."""
        return None

    @abc.abstractmethod
    def compile(self, problem: Problem) -> Plan:
        """Lower an accepted problem to a plan; may raise ``Declined``."""

    def records(self, problem: Problem) -> tuple:
        """The kernel params records ``compile(problem)`` would build, without building them
        (``frost.kernels.prebuild.build_records`` compiles them ahead of time); () for an
        engine that compiles nothing."""
        return ()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.direction}>"


def allocate_forward(problem: Problem, *, zero: bool = True, q: torch.Tensor | None = None,
                     lse_like: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Contiguous ``(o, lse)`` for the problem: zero-filled, or uninitialized with ``zero=False``
    for a plan that writes every element (packed rows past ``cu_seqlens[-1]`` included).

    Allocating like a tensor costs the host about half of a shape, dtype and device given
    apart, so a plan on the hot path passes ``q``, the call's query tensor (o is allocated like
    it when the head dims agree), and ``lse_like``, its ``lse_template`` of the problem."""
    new_like = torch.zeros_like if zero else torch.empty_like
    new = torch.zeros if zero else torch.empty
    if q is not None and q.shape[-1] == problem.head_dim_v:
        o = new_like(q, memory_format=torch.contiguous_format)
    else:
        o = new(problem.o_shape, dtype=problem.dtype, device=problem.device)
    if lse_like is not None:
        lse = new_like(lse_like, memory_format=torch.contiguous_format)
    else:
        lse = new(problem.lse_shape, dtype=torch.float32, device=problem.device)
    return o, lse


def lse_template(problem: Problem) -> torch.Tensor:
    """A one-element float32 tensor expanded to the problem's lse shape: ``allocate_forward``'s
    ``lse_like`` (what a plan keeps holds one float of memory)."""
    return torch.empty(1, dtype=torch.float32, device=problem.device).expand(problem.lse_shape)


def allocate_backward(problem: Problem, tensors: Tensors, *, zero: bool = True) -> Grads:
    """Contiguous gradients shaped like their inputs, None where absent: zero-filled, or
    uninitialized with ``zero=False`` for a plan that writes every element."""
    new = torch.zeros_like if zero else torch.empty_like

    def like(x: torch.Tensor | None) -> torch.Tensor | None:
        return None if x is None else new(x, memory_format=torch.contiguous_format)

    if problem.bias is None and tensors.sinks is None:
        return Grads(like(tensors.q), like(tensors.k), like(tensors.v))
    bias = tensors.bias if problem.bias is not None and problem.bias.grad else None  # bias_grad=False: no dbias
    return Grads(like(tensors.q), like(tensors.k), like(tensors.v), like(bias), like(tensors.sinks))
