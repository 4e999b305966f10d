"""The float64 truth of SEMANTICS.md: forward (o, lse) and the analytic backward.

Everything frost computes is judged against these two functions, so they
transcribe the contract as directly as the memory bound allows:

- inputs of any float dtype and strides are cast to float64 on their own
  device (CPU or CUDA); outputs are float64 in the contract's layouts:
  dense ``o [B, Sq, Hq, Dv]``, ``lse [B, Hq, Sq]``; packed ``o [Tq, Hq, Dv]``,
  ``lse [Hq, Tq]``;
- work goes one sequence at a time and, within it, ``block_q`` query rows at
  a time over only the key range those rows can see, so no ``B x H x S x S``
  tensor ever exists (B=1, H=8, S=4096, D=128 forward plus backward: 15 s on
  two CPU cores, 0.7 GiB peak on CUDA; frost_harness/suites/oracle/test_performance.py);
- GQA is done by viewing the ``G = Hq // Hkv`` query heads of a kv head as
  extra rows of one matmul (``[Hkv, G*rows, D] @ [Hkv, D, keys]``), so K and V
  are never repeated and dk/dv come out summed over the group;
- the log-sum-exp subtracts the row maximum (sink included), so logits of
  magnitude 1e4 stay finite; a row with nothing visible gets ``o = 0`` and
  ``lse = -inf`` (or the sink) without ever forming ``-inf - -inf``.

Rows no sequence owns (see frost_harness.oracle.segments): dense padding follows the
contract (``o = 0``, ``lse = -inf``, zero gradients, ``dk = dv = 0`` for
padded keys); packed rows past ``cu_seqlens[-1]`` are NaN in o, lse, dq (and
dk, dv past ``cu_seqlens_k[-1]``). ``valid_rows_mask`` selects the others;
``frost_harness.oracle.tolerance`` skips NaN positions of the reference by itself.

The backward recomputes the forward in float64, block by block, and applies
the formulas of SEMANTICS.md. Where the contract says engines take
``D_i = do_i . o_i`` from their (rounded) o, the oracle uses the exact float64
value, computed as ``D_i = sum_j p_ij dp_ij`` (equal to ``do_i . o_i`` because
``o_i = sum_j p_ij v_j`` and ``dp_ij = do_i . v_j``), so no block needs o.
Nothing here calls autograd; ``_forward_autograd`` exists so the suites can
differentiate the very same forward and compare.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from frost_harness.oracle.call import Call
from frost_harness.oracle.rope import rotate
from frost_harness.oracle.segments import Segment, bias_index, valid_rows_mask

__all__ = ["Grads", "backward", "forward", "keys_seen", "valid_rows_mask"]

F64 = torch.float64


@dataclass(frozen=True)
class Grads:
    """Gradients of one backward call; dbias has bias's shape, dsinks is ``[Hq]``."""

    dq: Tensor
    dk: Tensor
    dv: Tensor
    dbias: Tensor | None = None
    dsinks: Tensor | None = None

    def as_dict(self) -> dict[str, Tensor | None]:
        """Field name -> tensor, without copying (``dataclasses.asdict`` would deep-copy)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class _Sequence:
    """One sequence's float64 operands, head-major; q and k already rotated."""

    seg: Segment
    q: Tensor  # [Hkv, G, sq, Dqk], pre-multiplied by scale (so dk = ds^T @ q needs no rescale)
    k: Tensor  # [Hkv, sk, Dqk]
    v: Tensor  # [Hkv, sk, Dv]
    bias: Tensor | None  # [Hq|1, sq, sk]


@dataclass(frozen=True)
class _Block:
    """Rows ``rows`` of one sequence against the keys ``keys`` they can see.

    Probabilities are kept unnormalized, ``p = e / z`` (e = exp(s - rowmax),
    zero where invisible): dividing the [rows, Dv] results by z instead of the
    [rows, keys] matrix saves a full pass over the largest tensor.
    """

    rows: slice
    keys: slice
    q: Tensor  # [Hkv, G*nb, Dqk], scaled
    e: Tensor  # [Hkv, G*nb, nk]
    z: Tensor  # [Hkv, G*nb, 1], sum of e plus the sink term; 1 where both are 0 (p = 0 then)
    lse: Tensor  # [Hq, nb]


def _load(call: Call, seg: Segment, q: Tensor, k: Tensor, v: Tensor) -> _Sequence:
    layout = call.layout
    qs = q[seg.q_index].to(F64)
    ks = k[seg.k_index].to(F64)
    if call.rope is not None:
        cos, sin = (t.to(device=q.device, dtype=F64) for t in call.rope)
        qs, ks = rotate(qs, cos, sin), rotate(ks, cos, sin)
    bias = None
    if call.bias is not None:
        bias = call.bias[bias_index(call.bias, seg)].to(device=q.device, dtype=F64)
    return _Sequence(
        seg,
        (qs * call.scale).permute(1, 0, 2).reshape(layout.hkv, layout.group, seg.sq, qs.shape[-1]),
        ks.permute(1, 0, 2),
        v[seg.k_index].to(F64).permute(1, 0, 2),
        bias,
    )


def _exp_normalizer(s: Tensor, sinks: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """``(e, z, lse)`` of logits ``s [Hq, nb, nk]`` (-inf = invisible) and the sinks.

    Consumes ``s``: it becomes e in place. At S=4096 each [Hq, nb, nk]
    temporary is 67 MB, and allocating one costs 3x the arithmetic on it
    (measured: exp 80 ms out of place, 25 ms in place). In-place exp keeps
    autograd usable, since exp's backward reads only its own output.
    """
    m = s.detach().amax(-1) if s.shape[-1] else s.new_full(s.shape[:-1], float("-inf"))
    if sinks is not None:
        m = torch.maximum(m, sinks.detach().unsqueeze(-1))
    # Shift by the row maximum; a row with nothing visible shifts by 0 so that
    # no -inf - -inf is formed. The shift cancels exactly, so it carries no gradient.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = s.sub_(m.unsqueeze(-1)).exp_()
    z = e.sum(-1)
    if sinks is not None:
        z = z + torch.exp(sinks.unsqueeze(-1) - m)
    lse = m + torch.log(z)  # log(0) = -inf: no visible key and no sink
    return e, torch.where(z > 0, z, torch.ones_like(z)), lse


def _blocks(seq: _Sequence, call: Call, sinks: Tensor | None) -> Iterator[_Block]:
    """Recompute the probabilities and lse block by block; forward and backward both use this."""
    hkv, group, sq, dqk = seq.q.shape
    sk = seq.k.shape[1]
    for i0 in range(0, sq, call.block_q):
        i1 = min(sq, i0 + call.block_q)
        j0, j1 = call.visibility.key_range(i0, i1, sq, sk)
        nb, nk = i1 - i0, j1 - j0
        q = seq.q[:, :, i0:i1].reshape(hkv, group * nb, dqk)
        # [Hkv, G*nb, nk] viewed per query head: row h*nb + i of kv head g = h // G.
        s = torch.matmul(q, seq.k[:, j0:j1].transpose(1, 2)).view(hkv * group, nb, nk)
        if seq.bias is not None:
            s.add_(seq.bias[:, i0:i1, j0:j1])
        mask = call.visibility.block_mask(i0, i1, j0, j1, sq, sk, s.device)
        if mask is not None:
            s.masked_fill_(~mask, float("-inf"))
        e, z, lse = _exp_normalizer(s, sinks)
        yield _Block(slice(i0, i1), slice(j0, j1), q, e.view(hkv, group * nb, nk),
                     z.view(hkv, group * nb, 1), lse)


def _sinks64(call: Call, device) -> Tensor | None:
    return None if call.sinks is None else call.sinks.to(device=device, dtype=F64)


def _forward(q: Tensor, k: Tensor, v: Tensor, call: Call) -> tuple[Tensor, Tensor]:
    layout, device = call.layout, q.device
    hq, dv = layout.hq, v.shape[-1]
    o = layout.new_rows(layout.o_shape(dv), 0.0, dtype=F64, device=device)
    lse = layout.new_rows(layout.lse_shape(), float("-inf"), dtype=F64, device=device)
    sinks = _sinks64(call, device)
    for seg in layout.segments:
        if seg.sq == 0:
            continue
        seq = _load(call, seg, q, k, v)
        o_parts, lse_parts = [], []
        for blk in _blocks(seq, call, sinks):
            nb = blk.rows.stop - blk.rows.start
            o_parts.append((torch.matmul(blk.e, seq.v[:, blk.keys]) / blk.z).view(hq, nb, dv))
            lse_parts.append(blk.lse)
        o[seg.q_index] = torch.cat(o_parts, dim=1).permute(1, 0, 2)
        lse[seg.lse_index] = torch.cat(lse_parts, dim=1)
    return o, lse


def forward(q: Tensor, k: Tensor, v: Tensor, *, scale=None, causal=False, causal_align="top_left",
            window=(-1, -1), seqlens_q=None, seqlens_k=None, cu_seqlens_q=None, cu_seqlens_k=None,
            max_seqlen_q=None, max_seqlen_k=None, bias=None, sinks=None, rope=None,
            block_q=256) -> tuple[Tensor, Tensor]:
    """``(o, lse)`` in float64, per SEMANTICS.md; see the module docstring for layouts.

    ``max_seqlen_q``/``max_seqlen_k`` are frost's packed-length hints, accepted
    so frost's keywords pass through unchanged (checked, otherwise unused);
    ``block_q`` bounds memory (query rows per block) and never changes results
    beyond float64 rounding.
    """
    call = Call.of(q, k, v, scale=scale, causal=causal, causal_align=causal_align, window=window,
                   seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                   bias=bias, sinks=sinks, rope=rope, block_q=block_q)
    with torch.no_grad():
        return _forward(q, k, v, call)


def _forward_autograd(q: Tensor, k: Tensor, v: Tensor, **options) -> tuple[Tensor, Tensor]:
    """The same forward with autograd recording, for the suites that check ``backward``.

    Differentiable in q, k, v, bias and sinks (when they require grad).
    """
    return _forward(q, k, v, Call.of(q, k, v, **options))


def backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, *, scale=None, causal=False,
             causal_align="top_left", window=(-1, -1), seqlens_q=None, seqlens_k=None,
             cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
             bias=None, sinks=None, rope=None, block_q=256) -> Grads:
    """Analytic float64 gradients of ``sum(do * o)``; recomputes the forward itself.

    dq/dk are with respect to the unrotated q/k; dbias is reduced over bias's
    broadcast dims (zero where no visible pair uses an entry); dsinks sums over
    valid rows only. ``do`` rows that no sequence owns are never read.
    """
    call = Call.of(q, k, v, scale=scale, causal=causal, causal_align=causal_align, window=window,
                   seqlens_q=seqlens_q, seqlens_k=seqlens_k, cu_seqlens_q=cu_seqlens_q,
                   cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                   bias=bias, sinks=sinks, rope=rope, block_q=block_q)
    if do.shape != call.layout.o_shape(v.shape[-1]):
        raise ValueError(f"do must have o's shape {call.layout.o_shape(v.shape[-1])}, "
                         f"got {tuple(do.shape)}")
    with torch.no_grad():
        return _backward(do, q, k, v, call)


def _ds(blk: _Block, dp_z: Tensor, sinks: Tensor | None) -> Tensor:
    """``ds = p (dp - D)`` of one block, in ``dp_z``'s storage (``dp_z = dp / z``).

    ``dp - D`` is taken relative to each row's most probable key m: with ``c = dp_m`` and the
    keys' weights summing to ``1 - p_sink``, ``dp_i - D = (dp_i - c) - sum_j p_j (dp_j - c)
    + c p_sink``, whose term at m is exactly 0. Formed as ``dp_i - D``, a row whose other keys
    weigh less than float64's epsilon loses its whole ds at m (``1 - p_m`` rounds to 0):
    the unfiltered fuzz found dq of 1e-20 with the wrong sign on rows whose two logits
    differ by 46, where a centered fp32 engine was right.
    """
    if dp_z.shape[-1] == 0:  # no key in the block: nothing to differentiate
        return dp_z
    c_z = dp_z.gather(-1, blk.e.argmax(dim=-1, keepdim=True))  # [Hkv, G*nb, 1]
    dp_z.sub_(c_z)
    dp_z.sub_(torch.matmul(blk.e.unsqueeze(-2), dp_z.unsqueeze(-1)).squeeze(-1) / blk.z)
    if sinks is not None:
        hkv, rows = c_z.shape[:2]
        # exp(sink - lse) is finite: with a sink, lse >= sink
        p_sink = torch.exp(sinks.unsqueeze(-1) - blk.lse).reshape(hkv, rows, 1)
        dp_z.add_(c_z * p_sink)
    return dp_z.mul_(blk.e)


def _backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, call: Call) -> Grads:
    layout, device = call.layout, q.device
    dq = layout.new_rows(q.shape, 0.0, dtype=F64, device=device)
    dk = layout.new_rows(k.shape, 0.0, dtype=F64, device=device)
    dv = layout.new_rows(v.shape, 0.0, dtype=F64, device=device)
    bias, sinks = call.bias, _sinks64(call, device)
    dbias = None if bias is None else torch.zeros(bias.shape, dtype=F64, device=device)
    dsinks = None if sinks is None else torch.zeros_like(sinks)
    for seg in layout.segments:
        seq = _load(call, seg, q, k, v)
        hkv, group, sq, dqk = seq.q.shape
        d_v = seq.v.shape[-1]
        do_seq = do[seg.q_index].to(F64).permute(1, 0, 2).reshape(hkv, group, sq, d_v)
        dq_seq = torch.zeros_like(seq.q)
        dk_seq = torch.zeros_like(seq.k)
        dv_seq = torch.zeros_like(seq.v)
        for blk in _blocks(seq, call, sinks):
            nb = blk.rows.stop - blk.rows.start
            # do / z folds the normalization p = e / z into the small operand:
            # dp / z = (do / z) @ v^T, and dv = p^T @ do = e^T @ (do / z).
            do_z = do_seq[:, :, blk.rows].reshape(hkv, group * nb, d_v) / blk.z
            dp_z = torch.matmul(do_z, seq.v[:, blk.keys].transpose(1, 2))
            # D_i = sum_j p_ij dp_ij = sum_j e_ij (dp_ij / z_i): a batched row dot.
            d_row = torch.matmul(blk.e.unsqueeze(-2), dp_z.unsqueeze(-1)).squeeze(-1)
            ds = _ds(blk, dp_z, sinks)
            dq_seq[:, :, blk.rows] = torch.matmul(ds, seq.k[:, blk.keys]).view(hkv, group, nb, dqk)
            dk_seq[:, blk.keys] += torch.matmul(ds.transpose(1, 2), blk.q)
            dv_seq[:, blk.keys] += torch.matmul(blk.e.transpose(1, 2), do_z)
            if dbias is not None:
                ds_h = ds.view(hkv * group, nb, -1)
                if bias.shape[1] == 1:
                    ds_h = ds_h.sum(0, keepdim=True)
                dbias[bias_index(bias, seg)[0], :, blk.rows, blk.keys] += ds_h
            if dsinks is not None:
                # exp(sink - lse) is finite: with a sink, lse >= sink.
                weight = torch.exp(sinks.unsqueeze(-1) - blk.lse)
                dsinks -= (weight * d_row.view(hkv * group, nb)).sum(-1)
        dq_s = dq_seq.reshape(hkv * group, sq, dqk).permute(1, 0, 2) * call.scale
        dk_s = dk_seq.permute(1, 0, 2)  # q was scaled in _load
        if call.rope is not None:
            cos, sin = (t.to(device=device, dtype=F64) for t in call.rope)
            dq_s = rotate(dq_s, cos, sin, transpose=True)
            dk_s = rotate(dk_s, cos, sin, transpose=True)
        dq[seg.q_index] = dq_s
        dk[seg.k_index] = dk_s
        dv[seg.k_index] = dv_seq.permute(1, 0, 2)
    return Grads(dq, dk, dv, dbias, dsinks)


def keys_seen(q: Tensor, k: Tensor, v: Tensor, **options) -> Tensor:
    """How many keys each softmax row sees: visible under the masks and not hidden by a -inf
    bias (the sink, a logit without a key, is not counted). float64 in lse's layout
    (``[B, Hq, Sq]`` or ``[Hq, Tq]``); 0 on padded rows, NaN on packed rows no sequence owns.
    Takes the keywords of ``forward``; reads no q, k or v values, only their layout."""
    call = Call.of(q, k, v, **options)
    layout, device = call.layout, q.device
    seen = layout.new_rows(layout.lse_shape(), 0.0, dtype=F64, device=device)
    for seg in layout.segments:
        visible = torch.ones(1, seg.sq, seg.sk, dtype=torch.bool, device=device)
        mask = call.visibility.block_mask(0, seg.sq, 0, seg.sk, seg.sq, seg.sk, device)
        if mask is not None:
            visible = visible & mask
        if call.bias is not None:
            visible = visible & (call.bias[bias_index(call.bias, seg)].to(device) != float("-inf"))
        seen[seg.lse_index] = visible.sum(-1).expand(layout.hq, seg.sq).to(F64)
    return seen


def weight_off_top_key(q: Tensor, k: Tensor, v: Tensor, *, stop_at: float = float("inf"), **options) -> float:
    """The largest share of a softmax row's weight outside its heaviest key, over every row
    that sees a key (a sink is left out); 0.0 where every row is one-hot in float64. Returns as
    soon as a block's share reaches ``stop_at`` (the caller needs no more). Takes the keywords
    of ``forward``."""
    call = Call.of(q, k, v, **{**options, "sinks": None})
    worst = 0.0
    for seg in call.layout.segments:
        if seg.sq == 0 or seg.sk == 0:
            continue
        for blk in _blocks(_load(call, seg, q, k, v), call, None):
            total = blk.e.sum(-1)  # the heaviest key's e is exactly 1 (e = exp(s - rowmax))
            rest = ((total - 1) / total)[total > 0]
            if rest.numel():
                worst = max(worst, float(rest.max()))
            if worst >= stop_at:
                return worst
    return worst
