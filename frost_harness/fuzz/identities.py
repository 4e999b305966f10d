"""Metamorphic identities, checked on the engines: rewrites of a problem that must not matter.

Each identity takes the drawn problem A (a Case's harness inputs) and builds one or
more rewritten problems B ("sides") whose outputs, mapped back into A's layout, must
equal A's. Every engine that accepts A runs A and then each side (the same engine when
it accepts the side, else the routed one); ``frost_harness.fuzz.compare`` judges B against A with
twice the allowance of the acceptance rule (two acceptable answers). Forward
(o, lse) and backward (dq, dk, dv, dbias, dsinks; fed each side's own oracle o and
lse) are both compared on every problem; the backward outputs the contract's known limit
exempts for A (``frost_harness.oracle.tolerance.known_limit``) are exempt on every side.

- ``packed_equals_per_sequence_and_padded``: a packed THD problem == each sequence
  run alone (dense, batch 1) == the dense padded layout (NaN in the padding);
- ``gqa_equals_repeated_kv``: GQA / MQA == MHA with K and V heads repeated
  (dk, dv summed back over each group);
- ``batch_permutation``: permuting the sequences permutes the outputs (dbias of a
  batch-broadcast bias and dsinks are sums over the batch and do not move);
- ``sink_equals_zero_value_key``: a sink == one extra key with a zero key and value
  vector whose bias is the sink, with A's masks written into the bias as -inf
  (dsink == that bias column's gradient summed over batch and rows);
- ``row_shift_changes_nothing``: a per-row constant added through a float32 bias
  leaves o, dq, dk, dv, dbias alone and shifts lse by it (no sinks: a sink is not
  shifted);
- ``causal_prefix_ignores_later_keys``: with a right-bounded mask, changing keys and
  values that the first m query rows cannot see leaves those rows' o and lse bit for
  bit the same and their dq within the rule.
"""
from __future__ import annotations

import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from frost_harness.fuzz import compare, runs
from frost_harness.fuzz.failures import PropertyFailure, reproduce_command
from frost_harness.fuzz.properties import observe
from frost_harness.oracle import operand_slack
from frost_harness.oracle.masking import Visibility
from frost_harness.oracle.segments import Layout, split
from frost_harness.suites.harness import Case, Inputs, judged, make_inputs, poison_bias

Outputs = dict[str, torch.Tensor | None]


@dataclass
class Side:
    """One rewritten spelling B of problem A: its problems and how their outputs map back to A's layout."""

    label: str  # the report's property name of this comparison, e.g. "packed==padded"
    parts: list[Inputs]  # one problem, or several (one per sequence)
    back: Callable[[list[Outputs]], Outputs]  # the parts' outputs -> A's layout (absent names: not compared)
    exclude: dict[str, torch.Tensor] = field(default_factory=dict)  # per output: True = not compared
    bitwise_forward: bool = False  # o and lse must match bit for bit where compared
    slack: dict[str, torch.Tensor] = field(default_factory=dict)  # per output: error B's spelling adds itself


@dataclass(frozen=True)
class Identity:
    name: str
    sides: Callable[[Case, Inputs], list[Side]]
    # what its problems need: constraints of frost_harness.fuzz.strategies.cases (the GPU pool keeps
    # classes that satisfy each, frost_harness.fuzz.pool)
    draws: dict = field(default_factory=dict)


def check_identity(identity: Identity, case: Case, engine: str | None = None) -> None:
    """Run A and every side on each accepting engine (or ``engine`` alone); raise on the first mismatch."""
    inputs = make_inputs(case)
    sides = identity.sides(case, inputs)
    truth = {"forward": (runs.oracle_forward(inputs), runs.baseline_forward(inputs)),
             "backward": (runs.oracle_backward(inputs), runs.baseline_backward(inputs))}
    exempt = {"forward": {}, "backward": runs.known_limit(inputs)}
    part_forwards = {}  # each part's oracle forward: the o and lse its backward is fed
    operands = {}  # per direction, what A's io-dtype operands cost (operand_slack), once a verdict needs it
    ratios = []
    for direction, (reference, baseline) in truth.items():
        problem = runs.problem_of(inputs, direction)
        for name in runs.accepting(inputs, direction):
            if engine not in (None, name):
                continue
            want, _ = runs.run(inputs, direction, name, forward=truth["forward"][0])
            for side in sides:
                if direction == "backward" and side.label not in part_forwards:
                    part_forwards[side.label] = [runs.oracle_forward(part) for part in side.parts]
                same = all(name in runs.accepting(part, direction) for part in side.parts)
                got, served = [], set()
                for index, part in enumerate(side.parts):
                    forward = part_forwards[side.label][index] if direction == "backward" else None
                    outputs, decision = runs.run(part, direction, name if same else None, forward=forward)
                    got.append(outputs)
                    served.add(decision.engine)
                mapped = side.back(got)

                def judge(slack):
                    return compare.agree(mapped, want, reference, baseline, io_dtype=case.dtype,
                                         exclude=side.exclude, exempt=exempt[direction], slack=slack)

                verdicts = judged(judge, lambda: _with_operand_slack(side.slack, operands, inputs, direction, truth))
                error = _bit_mismatch(side, direction, mapped, want)
                command = reproduce_command(identity.name, case, name)
                compare.record(side.label, case, name, problem, verdicts, command, error)
                ratios += [v.ratio for v in verdicts.values()]
                if error or not all(v.passed for v in verdicts.values()):
                    how = "the same engine" if same else f"B served by {', '.join(sorted(served))}"
                    details = "\n".join([f"{side.label} ({direction}, {how})", error]
                                        + [v.describe() for v in verdicts.values()])  # fmt: skip
                    raise PropertyFailure(identity.name, case, name, details)
    observe("identity error/allowed", ratios)


def _with_operand_slack(own: dict, operands: dict, inputs: Inputs, direction: str, truth: dict) -> dict:
    """The side's own slack plus twice what A's io-dtype operands cost by themselves
    (``frost_harness.oracle.operand_slack``: RoPE's rounded rotations, the backward's given o and lse):
    A and B are each allowed that error of the contract's own arithmetic. Computed once per
    direction, and only for a comparison that fails without it (``harness.judged``)."""
    if direction not in operands:
        forward, kw = truth["forward"][0], inputs.keywords
        if direction == "forward":
            operands[direction] = operand_slack.forward_slack(inputs.q, inputs.k, inputs.v,
                                                              (forward["o"], forward["lse"]), **kw)  # fmt: skip
        else:
            o, lse = runs.rounded(forward, inputs)
            grads = types.SimpleNamespace(**truth["backward"][0])
            operands[direction] = operand_slack.backward_slack(inputs.do, inputs.q, inputs.k, inputs.v, o, lse,
                                                               grads, **kw)  # fmt: skip
    extra = operands[direction]
    return {name: own.get(name, 0.0) + 2 * extra[name] if name in extra else own[name]
            for name in {*own, *extra}}


def _bit_mismatch(side: Side, direction: str, got: Outputs, want: Outputs) -> str:
    if not (side.bitwise_forward and direction == "forward"):
        return ""
    counts = {
        name: compare.bitwise(got[name], want[name], ~side.exclude[name]) for name in ("o", "lse")
    }  # fmt: skip
    differ = [f"{name}: {count} positions" for name, count in counts.items() if count]
    return ("bits differ where they must not: " + ", ".join(differ)) if differ else ""


# helpers ---------------------------------------------------------------------------


def _layout(inputs: Inputs) -> Layout:
    kw = inputs.keywords
    return split(inputs.q, inputs.k, inputs.v, **{n: kw.get(n) for n in (
        "seqlens_q", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k")})  # fmt: skip


def _garbage(gen: torch.Generator, shape, like: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Random values (never zeros) for rows no one may read, or for keys being replaced."""
    return (torch.randn(shape, generator=gen) * scale).to(device=like.device, dtype=like.dtype)


def _keywords(inputs: Inputs, **changes) -> dict:
    """A copy of the keywords with ``changes``; a None value drops the keyword."""
    kw = {**inputs.keywords, **changes}
    return {name: value for name, value in kw.items() if value is not None}


def _copy_keeping_strides(x: torch.Tensor) -> torch.Tensor:
    """A copy laid out as ``x`` (``clone`` makes a strided view contiguous): an identity that
    compares bits changes values only, since a matmul may sum in another order for other
    strides (the H200 nightly of 2026-12-03: unfused's o, 4 positions off by one ulp under the
    causal prefix, strided keys and values against contiguous copies)."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device).copy_(x)


def _nan_like(x: torch.Tensor, shape=None) -> torch.Tensor:
    return torch.full(shape or x.shape, math.nan, dtype=torch.float64, device=x.device)


def _sum_to(x: torch.Tensor, shape) -> torch.Tensor:
    """``x`` summed over the dimensions where ``shape`` has size 1 (a broadcast bias's gradient)."""
    dims = [d for d, size in enumerate(shape) if size == 1 and x.shape[d] != 1]
    return x.double().sum(dims, keepdim=True) if dims else x.double()


# packed == per-sequence == padded -------------------------------------------------


def _packed_sides(case: Case, inputs: Inputs) -> list[Side]:
    kw = inputs.keywords
    packed = _layout(inputs)
    segs = packed.segments
    longest_q, longest_k = packed.max_sq, packed.max_sk
    bias, sinks = kw.get("bias"), kw.get("sinks")
    dense_kw = _keywords(inputs, cu_seqlens_q=None, cu_seqlens_k=None, bias=None)

    def pad(x: torch.Tensor, rows: str, longest: int) -> torch.Tensor:
        # padded rows hold NaN: SEMANTICS.md lets them hold any bits, and NaN is what a
        # product by zero (rather than a selection) would let through
        out = torch.full((len(segs), longest, *x.shape[1:]), math.nan, dtype=x.dtype, device=x.device)
        for seg in segs:
            index = seg.q_index if rows == "q" else seg.k_index
            out[seg.batch, : (seg.sq if rows == "q" else seg.sk)] = x[index]
        return out

    def bias_of(batch: int, sq: int, sk: int) -> torch.Tensor:
        return bias[(batch if bias.shape[0] > 1 else 0,)][None, :, :sq, :sk]

    padded = Inputs(
        pad(inputs.q, "q", longest_q), pad(inputs.k, "k", longest_k), pad(inputs.v, "k", longest_k),
        pad(inputs.do, "q", longest_q),
        {**dense_kw, "seqlens_q": _lengths(segs, "q", inputs), "seqlens_k": _lengths(segs, "k", inputs),
         **({"bias": bias[:, :, :longest_q, :longest_k]} if bias is not None else {})},
        poisoned=True,
    )  # fmt: skip
    alone = [
        Inputs(inputs.q[seg.q_index][None], inputs.k[seg.k_index][None], inputs.v[seg.k_index][None],
               inputs.do[seg.q_index][None],
               {**dense_kw, **({"bias": bias_of(seg.batch, seg.sq, seg.sk)} if bias is not None else {})})
        for seg in segs
    ]  # fmt: skip

    def empty(first: Outputs) -> Outputs:
        """A's layout, NaN in rows no sequence owns, zero sums for dbias and dsinks."""
        out = {}
        for name, rows in (("o", inputs.q), ("dq", inputs.q), ("dk", inputs.k), ("dv", inputs.v)):
            if first.get(name) is not None:
                out[name] = _nan_like(rows, (*rows.shape[:-1], first[name].shape[-1]))
        if first.get("lse") is not None:
            out["lse"] = _nan_like(inputs.q, (inputs.q.shape[1], inputs.q.shape[0]))
        for name, source in (("dbias", bias), ("dsinks", sinks)):
            if first.get(name) is not None:
                out[name] = torch.zeros(source.shape, dtype=torch.float64, device=source.device)
        return out

    def place(out: Outputs, part: Outputs, seg, b: int) -> None:
        """Sequence ``seg``'s rows, found at batch entry ``b`` of a dense part, into A's layout."""
        for name, index, extent in (("o", seg.q_index, seg.sq), ("dq", seg.q_index, seg.sq),
                                    ("dk", seg.k_index, seg.sk), ("dv", seg.k_index, seg.sk)):
            if name in out:
                out[name][index] = part[name][b, :extent].double()
        if "lse" in out:
            out["lse"][seg.lse_index] = part["lse"][b, :, : seg.sq].double()

    def back_alone(parts: list[Outputs]) -> Outputs:
        out = empty(parts[0])
        for seg, part in zip(segs, parts):
            place(out, part, seg, 0)
            if "dbias" in out:
                out["dbias"][(seg.batch if bias.shape[0] > 1 else 0,)][:, : seg.sq, : seg.sk] += part["dbias"][0]
            if "dsinks" in out:
                out["dsinks"] += part["dsinks"]
        return out

    def back_padded(parts: list[Outputs]) -> Outputs:
        (part,) = parts
        out = empty(part)
        for seg in segs:
            place(out, part, seg, seg.batch)
        if "dbias" in out:
            out["dbias"][:, :, :longest_q, :longest_k] = part["dbias"].double()
        if "dsinks" in out:
            out["dsinks"] = part["dsinks"].double()
        return out

    return [Side("packed==per-sequence", alone, back_alone), Side("packed==padded", [padded], back_padded)]


def _lengths(segs, rows: str, inputs: Inputs) -> torch.Tensor:
    values = [seg.sq if rows == "q" else seg.sk for seg in segs]
    return torch.tensor(values, dtype=torch.int32, device=inputs.q.device)


# GQA == repeated K/V ---------------------------------------------------------------


def _gqa_sides(case: Case, inputs: Inputs) -> list[Side]:
    head_axis = inputs.k.dim() - 2
    heads_kv, group = inputs.k.shape[head_axis], inputs.q.shape[head_axis] // inputs.k.shape[head_axis]
    repeated = Inputs(inputs.q, inputs.k.repeat_interleave(group, dim=head_axis),
                      inputs.v.repeat_interleave(group, dim=head_axis), inputs.do, inputs.keywords,
                      poisoned=inputs.poisoned)  # fmt: skip

    def back(parts: list[Outputs]) -> Outputs:
        out = {name: x for name, x in parts[0].items() if x is not None}
        for name in ("dk", "dv"):
            if name in out:
                out[name] = out[name].double().unflatten(head_axis, (heads_kv, group)).sum(head_axis + 1)
        return out

    return [Side("gqa==repeated-kv", [repeated], back)]


# batch permutation -----------------------------------------------------------------


def _permutation(case: Case, count: int) -> list[int]:
    """A permutation of the sequences drawn from the case's seed, never the identity."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(case.seed)).tolist()
    return order if order != sorted(order) else order[1:] + order[:1]


def _permuted_sides(case: Case, inputs: Inputs) -> list[Side]:
    kw = inputs.keywords
    layout = _layout(inputs)
    order = _permutation(case, layout.batch)
    inverse = torch.argsort(torch.tensor(order))
    bias = kw.get("bias")
    changes = {}
    if bias is not None and bias.shape[0] > 1:
        changes["bias"] = bias[order]
    if layout.packed:
        # rows of the permuted problem, in A's row order (tails stay at the end)
        index_q, index_k = _packed_order(layout, order)
        cu = {rows: torch.tensor([0, *[getattr(layout.segments[b], "s" + rows) for b in order]]).cumsum(0)
              for rows in ("q", "k")}  # fmt: skip
        changes.update(cu_seqlens_q=cu["q"].to(torch.int32).to(inputs.q.device),
                       cu_seqlens_k=cu["k"].to(torch.int32).to(inputs.q.device))  # fmt: skip
        take_q, take_k = torch.argsort(index_q), torch.argsort(index_k)
        permuted = Inputs(inputs.q[take_q], inputs.k[take_k], inputs.v[take_k], inputs.do[take_q],
                          _keywords(inputs, **changes), poisoned=inputs.poisoned)  # fmt: skip
        rows = {"o": ("q", 0), "dq": ("q", 0), "lse": ("q", 1), "dk": ("k", 0), "dv": ("k", 0)}
        index = {"q": index_q, "k": index_k}
    else:
        for name in ("seqlens_q", "seqlens_k"):
            if kw.get(name) is not None:
                changes[name] = kw[name][order]
        permuted = Inputs(inputs.q[order], inputs.k[order], inputs.v[order], inputs.do[order],
                          _keywords(inputs, **changes), poisoned=inputs.poisoned)  # fmt: skip
        rows = {name: ("b", 0) for name in ("o", "dq", "lse", "dk", "dv")}
        index = {"b": inverse}

    def back(parts: list[Outputs]) -> Outputs:
        out = {}
        for name, x in parts[0].items():
            if x is None:
                continue
            if name in rows:
                which, dim = rows[name]
                x = x.index_select(dim, index[which].to(x.device))
            elif name == "dbias" and x.shape[0] > 1:
                x = x[inverse.to(x.device)]
            out[name] = x
        return out

    return [Side("batch-permutation", [permuted], back)]


def _packed_order(layout: Layout, order: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of A's rows (q and k), the row it lands on when the sequences come in ``order``;
    rows past ``cu_seqlens[-1]`` stay where they are."""
    index = {}
    for rows, total in (("q", layout.rows_q), ("k", layout.rows_k)):
        target = torch.arange(total)
        start = 0
        for b in order:
            seg = layout.segments[b]
            span = (seg.q_index if rows == "q" else seg.k_index)[0]
            target[span] = torch.arange(start, start + span.stop - span.start)
            start += span.stop - span.start
        index[rows] = target
    return index["q"], index["k"]


# sink == zero-value extra key ------------------------------------------------------


def _sink_sides(case: Case, inputs: Inputs) -> list[Side]:
    """Dense, unpadded A with sinks: B appends a zero key and value per sequence; a float32 bias
    carries A's bias, A's masks as -inf, and the sink in the new key's column."""
    kw = inputs.keywords
    batch, seqlen_q, heads_q, _ = inputs.q.shape
    seqlen_k, device = inputs.k.shape[1], inputs.q.device
    bias, sinks = kw.get("bias"), kw["sinks"]
    full = torch.zeros(batch, heads_q, seqlen_q, seqlen_k + 1, dtype=torch.float32, device=device)
    if bias is not None:
        full[..., :seqlen_k] = bias.float()
    visible = Visibility.from_args(kw["causal"], kw["causal_align"], kw["window"]).block_mask(
        0, seqlen_q, 0, seqlen_k, seqlen_q, seqlen_k, device
    )
    if visible is not None:
        full[..., :seqlen_k] = full[..., :seqlen_k].masked_fill(~visible, -math.inf)
    full[..., seqlen_k] = sinks.view(1, heads_q, 1)

    def extended(x: torch.Tensor) -> torch.Tensor:
        return torch.cat((x, x.new_zeros((x.shape[0], 1, *x.shape[2:]))), dim=1)

    keyed = Inputs(inputs.q, extended(inputs.k), extended(inputs.v), inputs.do,
                   _keywords(inputs, causal=False, window=(-1, -1), sinks=None, bias=full))  # fmt: skip

    def back(parts: list[Outputs]) -> Outputs:
        out = {name: x for name, x in parts[0].items() if x is not None and name != "dbias"}
        dbias = parts[0].get("dbias")
        for name in ("dk", "dv"):
            if name in out:
                out[name] = out[name][:, :seqlen_k]
        if dbias is not None:
            out["dsinks"] = dbias[..., seqlen_k].double().sum(dim=(0, 2))
            if bias is not None:
                out["dbias"] = _sum_to(dbias[..., :seqlen_k], bias.shape)
        return out

    return [Side("sink==zero-value-key", [keyed], back)]


# a per-row constant through the bias -----------------------------------------------


def _shift_sides(case: Case, inputs: Inputs) -> list[Side]:
    """A without sinks: B's float32 bias is A's (or 0) plus an integer c per (sequence, head, row)."""
    kw = inputs.keywords
    layout = _layout(inputs)
    bias = kw.get("bias")
    heads_q, device = inputs.q.shape[-2], inputs.q.device
    extent_q = bias.shape[2] if bias is not None else (layout.max_sq if layout.packed else layout.rows_q)
    extent_k = bias.shape[3] if bias is not None else (layout.max_sk if layout.packed else layout.rows_k)
    gen = torch.Generator().manual_seed(case.seed + 2)
    shift = torch.randint(-64, 65, (layout.batch, heads_q, extent_q, 1), generator=gen).float().to(device)
    base = bias.float() if bias is not None else torch.zeros(1, 1, extent_q, extent_k, device=device)
    new_bias = base + shift
    if inputs.poisoned:  # A's unread bias entries are NaN; B's, where A had no bias, must be too
        poison_bias(case, new_bias)
    shifted = Inputs(inputs.q, inputs.k, inputs.v, inputs.do, _keywords(inputs, bias=new_bias),
                     poisoned=inputs.poisoned)
    # the shift of each lse entry, in A's lse layout
    lse_shift = torch.zeros(layout.lse_shape(), dtype=torch.float64, device=device)
    for seg in layout.segments:
        lse_shift[seg.lse_index] = shift[seg.batch, :, : seg.sq, 0].double()

    def back(parts: list[Outputs]) -> Outputs:
        out = {name: x for name, x in parts[0].items() if x is not None and name != "dbias"}
        if "lse" in out:
            out["lse"] = out["lse"].double() - lse_shift
        if bias is not None and parts[0].get("dbias") is not None:
            out["dbias"] = _sum_to(parts[0]["dbias"], bias.shape)
        return out

    # B's lse is c + lse in float32: stored (and reduced) at |c|'s magnitude, it carries rounding of
    # that size, which A's allowance (errors at |lse|) does not include. Two roundings there.
    # (Found by the CPU fuzz: fp16, scale 0, lse = log 2 in A, |c| up to 64 in B: L2 ratio 1.09.)
    slack = {"lse": 2 * torch.finfo(torch.float32).eps * (lse_shift.abs() + 1)}
    return [Side("row-shift", [shifted], back, slack=slack)]


# a causal prefix ignores later keys ------------------------------------------------


def _prefix_sides(case: Case, inputs: Inputs) -> list[Side]:
    """A right-bounded mask: keys no query row i < m can see get new values; rows i < m compare."""
    kw = inputs.keywords
    layout = _layout(inputs)
    visibility = Visibility.from_args(kw["causal"], kw["causal_align"], kw["window"])
    gen = torch.Generator().manual_seed(case.seed + 3)
    prefix = int(torch.randint(1, max(1, layout.max_sq) + 1, (1,), generator=gen))
    k, v = _copy_keeping_strides(inputs.k), _copy_keeping_strides(inputs.v)
    later_q = torch.ones(inputs.q.shape[:-2], dtype=torch.bool, device=inputs.q.device)  # True: not compared
    for seg in layout.segments:
        first_hidden = max(0, prefix + visibility.delta(seg.sq, seg.sk) + visibility.right)
        if visibility.right >= 0 and first_hidden < seg.sk:
            keys = _rows(seg.k_index, first_hidden, seg.sk)
            k[keys] = _garbage(gen, k[keys].shape, k, scale=4.0)
            v[keys] = _garbage(gen, v[keys].shape, v, scale=4.0)
        later_q[_rows(seg.q_index, 0, min(prefix, seg.sq))] = False
    changed = Inputs(inputs.q, k, v, inputs.do, kw, poisoned=inputs.poisoned)
    skip_rows = later_q[..., None, None]  # o and dq: [..., rows, 1, 1]
    skip_lse = later_q.unsqueeze(-2)  # lse: [B, 1, Sq] or [1, T]

    def back(parts: list[Outputs]) -> Outputs:
        return {name: parts[0][name] for name in ("o", "lse", "dq") if parts[0].get(name) is not None}

    exclude = {"o": skip_rows, "dq": skip_rows, "lse": skip_lse}
    return [Side("causal-prefix", [changed], back, exclude=exclude, bitwise_forward=True)]


def _rows(index: tuple, start: int, stop: int) -> tuple:
    """Rows ``start .. stop`` of one sequence, from its segment index (dense ``(b, slice)`` or packed ``(slice,)``)."""
    span = index[-1]
    return (*index[:-1], slice(span.start + start, span.start + stop))


IDENTITIES = {
    identity.name: identity
    for identity in (
        Identity("packed_equals_per_sequence_and_padded", _packed_sides, {"layout": "thd"}),
        Identity("gqa_equals_repeated_kv", _gqa_sides, {"heads": "grouped"}),
        Identity("batch_permutation", _permuted_sides, {"min_batch": 2}),
        Identity("sink_equals_zero_value_key", _sink_sides, {"layout": "dense", "sinks": True}),
        Identity("row_shift_changes_nothing", _shift_sides, {"sinks": False}),
        Identity("causal_prefix_ignores_later_keys", _prefix_sides, {"mask": "right_bounded"}),
    )
}
