"""What a problem's io-dtype operands cost by themselves: an allowance the rule adds on top.

Two operands that a contract-faithful engine must use carry rounding the float64 oracle does
not see, and an engine's error can be exactly that rounding's effect:

- **RoPE.** A same-precision engine with fused RoPE (FlashAttention's, frost's sm80, and the
  baseline X_lp itself) rotates q and k in float32 and rounds the rotated rows to the io dtype
  before the attention products. The oracle runs on exact rotations, so at large logits (|s| ~
  250 in fp16: logit errors of 0.03) the engine's error is the rotation's, and the baseline,
  which makes the same rounding plus fp16 scores, can land well under it on a problem with few
  informative rows (the H200 nightly of 2026-12-03: o at 3x rule 1 on an 8x9 problem; a CPU
  emulation of the kernel reproduced it).
- **The backward's given o and lse.** SEMANTICS.md's backward takes o (in the io dtype) and lse
  as inputs: ``p = exp(s - lse)`` with the given lse and ``D = rowsum(do * o)`` of the given o.
  Where a row's weight sits on one key (peaked logits, or one key beside a sink), ``dp - D`` is
  a small difference whose D carries o's io-dtype rounding, while the baseline (autograd) never
  reads o. The contract's own known limit is the extreme of it (one key, no sink: the truth is
  0 and only that residue is left). Found: the H200 grid's ``window_zero_sinks`` (sm80 dq, dk at
  1.03-1.04x rule 2), and the CPU fuzz of 2026-12-04: unfused on one key beside a sink (dk at
  1.02x), torch's CPU flash backward on a peaked fp16 problem (dq at 4x the baseline's L2).

- **The backward's float32 D and dp.** The contract computes ``D = rowsum(do * o)`` in float32,
  and an engine's ``dp = do . v`` comes out of a float32 accumulation too: each carries rounding
  up to ``Dv * 2^-24`` of its terms' magnitudes, and ``dp - D`` keeps it whole where the row is
  one-hot in effect (the truth of ``ds`` is then ~0). The known limit exempts dq, dk and dbias
  only where every row is so; the CPU fuzz of 2026-12-05 drew a problem whose rows were all
  one-hot but one (weight 1.2e-7 off its top key, above the limit's 2^-24): torch's CPU flash
  backward at dq 1.21x, dk 1.64x rule 1, its error on a one-key row (truth 0) against an
  allowance from the other rows. ``backward_slack`` adds the bound of that rounding carried
  through ``ds = p * (dp - D)`` and the products in magnitudes (``_float32_residue``):
  ``(Dv - 1) * 2^-24`` of ``|p| |do| (|v| + |o|) |k|``, a few millionths of the products' size,
  far below any rounding the io dtype makes and any bug the rule is there for; it decides only
  where the truth is ~0 (measured on that problem: dq's allowance 1.0e-6 -> 2.0e-6, dk's 1.2e-5 ->
  5.3e-3 against a dk of 3e-5 whose truth is ~0).

``backward_slack`` / ``forward_slack`` compute, per output, the exact size of those effects:
the contract's formulas evaluated in float64 on the operands such an engine holds (with RoPE the
rotated q and k rounded to the io dtype; in the backward the given o and lse) minus the oracle's
truth. ``tolerance.check`` adds it to both rules' allowances (``slack``). The suites ask for it
only once a verdict fails without it (``harness.check``): it is an absolute error per element of
the contract's own arithmetic, so an engine judged with it is blamed only for what it adds. A
wrong rotation (sign, position, the inverse in the backward) or a wrong gradient moves the
outputs by O(1), far past it. Measured on the RoPE night's shrunk failures with a CPU emulation
of the sm80 arithmetic: the eight backward ones at worst ratio 0.81 with it (1.04-5.46 without),
the two forward ones at 0.51 and 0.77 (3.0 without).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from frost_harness.oracle import reference
from frost_harness.oracle.call import Call
from frost_harness.oracle.rope import rotate
from frost_harness.oracle.segments import bias_index

F64 = torch.float64


def rounded_rotation(x: Tensor, call: Call, index: str) -> Tensor:
    """x's valid rows rotated in float32 with the given tables and rounded to x's dtype, per
    sequence (positions count from each sequence's start), as the baseline and fused kernels do;
    x itself without RoPE."""
    if call.rope is None:
        return x
    cos, sin = (t.to(device=x.device, dtype=torch.float32) for t in call.rope)
    out = x.clone()
    for seg in call.layout.segments:
        rows = getattr(seg, index)
        out[rows] = rotate(x[rows].float(), cos, sin).to(x.dtype)
    return out


def forward_slack(q: Tensor, k: Tensor, v: Tensor, truth: tuple[Tensor, Tensor], **options) -> dict[str, Tensor]:
    """|oracle(rounded rotations) - oracle| for o and lse; ``truth`` is the oracle's (o, lse).
    Without RoPE the forward's operands are the oracle's own: no slack."""
    call = Call.of(q, k, v, **options)
    if call.rope is None:
        return {}
    plain = {name: value for name, value in options.items() if name != "rope"}
    o, lse = reference.forward(rounded_rotation(q, call, "q_index"), rounded_rotation(k, call, "k_index"), v, **plain)
    return {"o": _gap(o, truth[0]), "lse": _gap(lse, truth[1])}


def backward_slack(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, truth,
                   **options) -> dict[str, Tensor]:
    """|the contract's backward on (the given o and lse; with RoPE, rounded rotations) - truth|
    per gradient; ``truth`` is the oracle's Grads."""
    given, residue = _backward_as_given(do, q, k, v, o, lse, Call.of(q, k, v, **options))
    return {name: _gap(value, getattr(truth, name)) + residue[name] for name, value in given.items()
            if value is not None and getattr(truth, name) is not None}


def _gap(x: Tensor, truth: Tensor) -> Tensor:
    """|x - truth| where both are finite, 0 elsewhere (infinities and unread rows match or are judged as such)."""
    x, truth = x.to(F64), truth.to(F64)
    both = torch.isfinite(x) & torch.isfinite(truth)
    return torch.where(both, (x - truth).abs(), torch.zeros_like(x))


def _backward_as_given(do, q, k, v, o, lse, call: Call) -> tuple[dict[str, Tensor | None], dict[str, Tensor | None]]:
    """SEMANTICS.md's backward, float64, p from the given lse and D from the given o; with RoPE on
    q and k rotated and rounded as above, dq and dk taken back through the rotation's transpose.
    The scores come from the oracle's own blocks (``reference._blocks``, without the sink):
    p = e / z * exp(lse_own - lse_given). Returns the gradients and, per gradient, the bound of
    float32 D and dp carried to it (``_float32_residue``; in the gradient's layout)."""
    layout, device = call.layout, q.device
    plain = dataclasses.replace(call, rope=None)
    q_io, k_io = rounded_rotation(q, call, "q_index"), rounded_rotation(k, call, "k_index")
    sinks = None if call.sinks is None else call.sinks.to(device=device, dtype=F64)
    grads = {"dq": torch.zeros(q.shape, dtype=F64, device=device), "dk": torch.zeros(k.shape, dtype=F64, device=device),
             "dv": torch.zeros(v.shape, dtype=F64, device=device),
             "dbias": None if call.bias is None else torch.zeros(call.bias.shape, dtype=F64, device=device),
             "dsinks": None if sinks is None else torch.zeros_like(sinks)}  # fmt: skip
    residue = {name: None if x is None else torch.zeros_like(x) for name, x in grads.items()}
    for seg in layout.segments:
        if seg.sq == 0:
            continue
        seq = reference._load(plain, seg, q_io, k_io, v)  # q pre-scaled, head-major
        hkv, group, sq, dqk = seq.q.shape
        per_head = (hkv, group, sq, -1)
        lse_seq = lse[seg.lse_index].to(F64).reshape(hkv, group, sq)
        do_seq = do[seg.q_index].to(F64).permute(1, 0, 2).reshape(per_head)
        o_seq = o[seg.q_index].to(F64).permute(1, 0, 2).reshape(per_head)
        dq_seq, dk_seq, dv_seq = torch.zeros_like(seq.q), torch.zeros_like(seq.k), torch.zeros_like(seq.v)
        dq_res, dk_res = torch.zeros_like(seq.q), torch.zeros_like(seq.k)  # float32 residue bounds
        for blk in reference._blocks(seq, plain, None):
            nb = blk.rows.stop - blk.rows.start
            given = lse_seq[:, :, blk.rows].reshape(hkv, group * nb, 1)
            p = torch.where(torch.isfinite(given), blk.e / blk.z * torch.exp(blk.lse.view_as(given) - given), 0.0)
            do_b = do_seq[:, :, blk.rows].reshape(hkv, group * nb, -1)
            o_b = o_seq[:, :, blk.rows].reshape(do_b.shape)
            v_b, k_b = seq.v[:, blk.keys], seq.k[:, blk.keys]
            d_row = (do_b * o_b).sum(-1, keepdim=True)
            ds = p * (torch.matmul(do_b, v_b.transpose(1, 2)) - d_row)
            ds_res, d_res = _float32_residue(p, do_b, o_b, v_b)
            dq_seq[:, :, blk.rows] = torch.matmul(ds, k_b).view(hkv, group, nb, dqk)
            dq_res[:, :, blk.rows] = torch.matmul(ds_res, k_b.abs()).view(hkv, group, nb, dqk)
            dk_seq[:, blk.keys] += torch.matmul(ds.transpose(1, 2), blk.q)
            dk_res[:, blk.keys] += torch.matmul(ds_res.transpose(1, 2), blk.q.abs())
            dv_seq[:, blk.keys] += torch.matmul(p.transpose(1, 2), do_b)  # no D in dv: no residue
            if grads["dbias"] is not None:
                index = bias_index(call.bias, seg)
                for out, x in ((grads["dbias"], ds), (residue["dbias"], ds_res)):
                    x_h = x.view(hkv * group, nb, -1)
                    out[index[0], :, blk.rows, blk.keys] += x_h.sum(0, keepdim=True) if call.bias.shape[1] == 1 else x_h
            if grads["dsinks"] is not None:
                weight = torch.exp(sinks.view(hkv, group, 1) - given.view(hkv, group, nb))
                grads["dsinks"] -= (weight * d_row.view(hkv, group, nb)).sum(-1).reshape(-1)
                residue["dsinks"] += (weight * d_res.view(hkv, group, nb)).sum(-1).reshape(-1)
        grads["dq"][seg.q_index] = _unrotated((dq_seq.reshape(hkv * group, sq, dqk) * call.scale).permute(1, 0, 2), call)
        grads["dk"][seg.k_index] = _unrotated(dk_seq.permute(1, 0, 2), call)
        grads["dv"][seg.k_index] = dv_seq.permute(1, 0, 2)
        residue["dq"][seg.q_index] = _unrotated_bound((dq_res.reshape(hkv * group, sq, dqk) * abs(call.scale))
                                                      .permute(1, 0, 2), call)  # fmt: skip
        residue["dk"][seg.k_index] = _unrotated_bound(dk_res.permute(1, 0, 2), call)
    return grads, residue


# A float32 sum of n products errs by at most (n - 1) * 2^-24 of the sum of their magnitudes.
_F32_UNIT = 2.0 ** -24


def _float32_residue(p: Tensor, do: Tensor, o: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Bounds of what float32 D = rowsum(do * o) and dp = do . v^T put into ds = p * (dp - D):
    ``(|ds| residue [.., rows, keys], D's residue [.., rows, 1])`` for one block (head-major)."""
    unit = _F32_UNIT * max(do.shape[-1] - 1, 1)
    d_residue = unit * (do.abs() * o.abs()).sum(-1, keepdim=True)
    dp_residue = unit * torch.matmul(do.abs(), v.abs().transpose(1, 2))
    return p * (dp_residue + d_residue), d_residue


def _unrotated_bound(bound: Tensor, call: Call) -> Tensor:
    """A bound on |x| from a bound on |rotated x| (``_unrotated``'s magnitude): each half takes both
    halves' bounds through |cos| and |sin|; the bound itself without RoPE."""
    if call.rope is None:
        return bound
    cos, sin = (t.to(device=bound.device, dtype=F64).abs()[: bound.shape[0]].unsqueeze(1) for t in call.rope)
    half = bound.shape[-1] // 2
    b1, b2 = bound[..., :half], bound[..., half:]
    return torch.cat((b1 * cos + b2 * sin, b2 * cos + b1 * sin), dim=-1)


def _unrotated(grad: Tensor, call: Call) -> Tensor:
    """A gradient with respect to the rotated rows taken back to the unrotated ones (the
    rotation's transpose); itself without RoPE."""
    if call.rope is None:
        return grad
    cos, sin = (t.to(device=grad.device, dtype=F64) for t in call.rope)
    return rotate(grad, cos, sin, transpose=True)
