"""An engine independent of both the oracle and the baseline, for the rule's own suites.

Judging the same-precision baseline against an allowance computed from the baseline itself
proves nothing: rule 1 allows k >= 2 times its own worst error and rule 2 twice its own
norm, so it passes whatever it computes. The rule's suites judge this engine instead:
frost's ``unfused`` native engine (plain torch, shares no code with ``oracle``), which
serves every feature of ``frost_harness.suites.oracle.cases`` on CPU and CUDA. Its backward is fed the
oracle's o and lse rounded to their io dtypes, as the accuracy harness does, so it is
judged on its own.
"""
from __future__ import annotations

import frost
from frost_harness.oracle import reference
from frost_harness.suites.oracle.cases import Problem

ENGINE = "unfused"


def _keywords(problem: Problem) -> dict:
    """The problem's options as frost takes them (``block_q`` is the oracle's own knob)."""
    return {name: value for name, value in problem.options.items() if name != "block_q"}


def run(problem: Problem) -> tuple[tuple, frost.Grads]:
    """``((o, lse), grads)`` of the engine on ``problem`` (fp16 or bf16 inputs)."""
    kw = _keywords(problem)
    outputs = frost.sdpa_forward(problem.q, problem.k, problem.v, **kw, engine=ENGINE)
    o64, lse64 = reference.forward(problem.q, problem.k, problem.v, **problem.options)
    grads = frost.sdpa_backward(problem.do, problem.q, problem.k, problem.v, o64.to(problem.q.dtype),
                                lse64.float(), **kw, engine=ENGINE)  # fmt: skip
    return outputs, grads
