"""RoPE for the SM80 engines: the rotation pass around the attention kernels (``sm80/rope``).

A plan for a problem with ``rope=`` holds a ``RopePass``. The forward rotates q and k into
its workspace and runs the forward on the rotated copies (o and lse mean what they mean
without RoPE). The backward rotates q and k again (recomputed, not kept from the forward),
runs the backward chain on the rotated copies, and rotates dq and dk back in place with the
transpose, so the gradients are with respect to the unrotated q and k (SEMANTICS.md). The
attention kernels' records do not change with RoPE; the pass has records of its own
(``rope_params.RopeParams``), listed by the engines' ``records`` so that ``frost-compile``
and ``build_records`` build them ahead of time.

Workspace: the rotated q and k, contiguous, in the io dtype (shaped as q and k), each
starting on a 256-byte boundary, ahead of whatever else the plan carves.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from frost.problem import Problem, Tensors

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
ALIGN = 256


def rope_records(problem: Problem) -> tuple:
    """The RoPE pass's records a plan for ``problem`` compiles: none without RoPE; the rotation
    for the forward; the rotation and its transpose for the backward."""
    if not problem.has_rope:
        return ()
    from frost.kernels.sm80.rope_params import rope_params_for

    rotate, transpose = rope_params_for(dtype=_DTYPE_NAMES[problem.dtype], head_dim=problem.head_dim_qk,
                                        layout=problem.layout)
    return (rotate,) if problem.direction == "forward" else (rotate, transpose)


def _rows_shape(problem: Problem, heads: int, rows: int, total: int | None) -> tuple[int, ...]:
    if problem.layout == "thd":
        return (total, heads, problem.head_dim_qk)
    return (problem.batch, rows, heads, problem.head_dim_qk)


class RopePass:
    """The compiled RoPE kernels of one plan and the workspace they rotate into."""

    def __init__(self, problem: Problem, compiled: tuple):
        self.problem = problem
        self._compiled = compiled  # (rotation,) forward; (rotation, transpose) backward
        p = problem
        self._shapes = (_rows_shape(p, p.heads_q, p.seqlen_q, p.total_q),
                        _rows_shape(p, p.heads_kv, p.seqlen_k, p.total_k))
        element = torch.empty((), dtype=p.dtype).element_size()
        self._bytes = [-(-element * math.prod(shape) // ALIGN) * ALIGN for shape in self._shapes]
        self.nbytes = sum(self._bytes)

    @classmethod
    def compile(cls, problem: Problem) -> "RopePass | None":
        """The pass for ``problem`` (None without RoPE)."""
        records = rope_records(problem)
        if not records:
            return None
        from frost.kernels.sm80.compile import compile_record

        return cls(problem, tuple(map(compile_record, records)))

    def rotate(self, tensors: Tensors, workspace: torch.Tensor) -> Tensors:
        """The call's tensors with q and k replaced by their rotations, written into the first
        ``nbytes`` of ``workspace`` (a uint8 buffer)."""
        views = []
        start = 0
        for shape, nbytes in zip(self._shapes, self._bytes):
            count = math.prod(shape)
            views.append(workspace[start : start + count * tensors.q.element_size()].view(tensors.q.dtype).view(shape))
            start += nbytes
        q_rot, k_rot = views
        self._launch(self._compiled[0], tensors, tensors.q, tensors.k, q_rot, k_rot)
        return dataclasses.replace(tensors, q=q_rot, k=k_rot)

    def rotate_back(self, tensors: Tensors, dq: torch.Tensor, dk: torch.Tensor) -> None:
        """dq, dk (gradients w.r.t. the rotated q, k) -> w.r.t. the unrotated ones, in place."""
        self._launch(self._compiled[1], tensors, dq, dk, dq, dk)

    def _launch(self, compiled, t: Tensors, q, k, q_out, k_out) -> None:
        from frost.kernels.sm80.compile import launch_rope

        p = self.problem
        launch_rope(compiled, q, k, q_out, k_out, t.rope_cos, t.rope_sin, cu_seqlens_q=t.cu_seqlens_q,
                    cu_seqlens_k=t.cu_seqlens_k, max_seqlen_q=p.seqlen_q, max_seqlen_k=p.seqlen_k)
