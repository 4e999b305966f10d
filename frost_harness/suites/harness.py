"""The accuracy harness every engine suite uses: build, run poisoned, judge, record.

``Case`` describes a problem by sizes and features (no tensors). ``check(case)``:

1. builds fresh seeded random inputs for it (``make_inputs``; never zeros; the seed
   mixes ``case.seed`` with the case's id, so every case draws its own numbers), with
   NaN in every row the contract lets hold garbage (padded and packed-tail rows of q,
   k, v, do, and of o and lse fed to the backward; bias entries of padded positions),
   on every device unless ``Case(poison=False)``;
2. runs frost forward and/or backward as its API does (validation, dispatch or a forced
   ``engine=``) into outputs poisoned with NaN before the launch, each the middle of a
   buffer with guard regions on both sides, and a guarded workspace of the size the
   plan reports (``frost_harness.suites.canaries``); fails naming the output whose guards changed,
   and checks that packed rows past ``cu_seqlens[-1]`` are still poisoned afterwards;
3. runs the float64 oracle and the same-precision baseline on the same (already
   rounded) inputs and applies the acceptance rule (``frost_harness.oracle.tolerance``); the
   backward is fed the oracle's o and lse rounded to their io dtypes, so it is judged
   on its own;
4. with ``deterministic=True`` runs the backward twice and compares bits;
5. records one row per output for the report plugin (``frost_harness.reports.records``): engine
   chosen (from the routing ledger), forced or routed, feature tags, dtype, ratio,
   pass/fail; an engine that raises is recorded as a failed row, then re-raised.

It returns a ``Result`` whose ``passed`` and ``describe()`` the tests assert on. The
same code runs on CUDA (``Case(device="cuda")``), for the GPU suites.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field

import torch

import frost
import frost_harness.oracle.baseline
import frost_harness.oracle.reference
import frost_harness.oracle.tolerance
from frost import dispatch, validation
from frost.case import CaseFields
from frost.dispatch import Decision
from frost.problem import FEATURES, prepare
from frost_harness.oracle import operand_slack
from frost_harness.reports import records
from frost_harness.suites import canaries

_SHORT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}
# The fields in the order a case's id names them. The id seeds the case's tensors
# (``_generator``), so this is the order the fields had before Case took its shared fields
# from frost.case.CaseFields: every case, pinned fuzz failures included, keeps its numbers.
_ID_ORDER = (
    "dtype", "device", "layout", "batch", "seqlen_q", "seqlen_k", "lengths_q", "lengths_k", "tail_q", "tail_k",
    "heads_q", "heads_kv", "head_dim_qk", "head_dim_v", "causal", "causal_align", "window", "bias", "bias_dtype",
    "bias_holes", "bias_scale", "sinks", "sink_scale", "rope", "scale", "logit_scale", "strided", "poison",
    "deterministic", "seed",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class Case(CaseFields):
    """One problem to check: ``frost.case.CaseFields`` (sizes, layout, masks, features) plus
    how the harness draws and runs it. ``layout="thd"`` takes its sequence lengths from
    ``lengths_q`` and ``lengths_k``; for ``"bshd"`` those (optional) are dense padding's."""

    dtype: torch.dtype = torch.bfloat16
    device: str = "cpu"
    bias_dtype: torch.dtype = torch.float32
    bias_holes: bool = False  # -inf bias entries, one query row entirely
    bias_scale: float = 1.0  # standard deviation of the bias
    sink_scale: float = 2.0  # standard deviation of the sinks
    logit_scale: float = 1.0  # multiplies q: large values stress the softmax
    strided: bool = False  # q, k, v as non-contiguous views (last dim stride 1)
    poison: bool = True  # NaN in the rows no one may read (see make_inputs)
    deterministic: bool = False
    seed: int = 0
    name: str = ""  # a readable id; generated from the fields when empty

    @property
    def id(self) -> str:
        if self.name:
            return self.name
        default = Case()
        parts = [f"{name}={_short(getattr(self, name))}" for name in _ID_ORDER
                 if getattr(self, name) != getattr(default, name)]  # fmt: skip
        return ",".join(parts) or "default"


def _short(value) -> str:
    if isinstance(value, torch.dtype):
        return _SHORT_DTYPES.get(value, str(value))
    if isinstance(value, tuple):
        return "/".join(str(x) for x in value)
    return str(value)


@dataclass
class Inputs:
    """The tensors of a case; ``keywords`` are the call's keywords for frost and the oracle alike."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    keywords: dict
    poisoned: bool = False  # unread rows hold NaN; the backward's o and lse get it too (backward_feed)


@dataclass
class Result:
    case: Case
    engine: str | None = None  # the engine forced, None when routed
    verdicts: dict = field(default_factory=dict)  # output name -> frost_harness.oracle.tolerance.Verdict
    decisions: dict = field(default_factory=dict)  # direction -> frost.dispatch.Decision
    failures: list = field(default_factory=list)  # checks other than the acceptance rule

    @property
    def passed(self) -> bool:
        return not self.failures and all(v.passed for v in self.verdicts.values())

    def describe(self) -> str:
        lines = [f"case {self.case.id}", f"reproduce: {_reproduce(self.case, self.engine)}"]
        for direction, decision in self.decisions.items():
            lines.append(f"{direction}: {decision.engine} ({decision.problem.describe()})")
        lines += [verdict.describe() for verdict in self.verdicts.values()]
        lines += [f"FAIL {failure}" for failure in self.failures]
        return "\n".join(lines)


def _generator(case: Case) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(case.id.encode()) ^ case.seed)


def _randn(gen: torch.Generator, shape, case: Case, dtype=None, scale: float = 1.0) -> torch.Tensor:
    x = torch.randn(shape, generator=gen) * scale
    return x.to(device=case.device, dtype=dtype or case.dtype)


def _rope_tables(positions: int, head_dim: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim // 2, dtype=torch.float64) * 2 / head_dim))
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def make_inputs(case: Case) -> Inputs:
    """Fresh seeded random inputs and keywords for ``case``."""
    gen = _generator(case)
    hq, hkv, dqk, dv = case.heads_q, case.heads_kv, case.head_dim_qk, case.dim_v
    keywords: dict = {"scale": case.scale, "causal": case.causal, "causal_align": case.causal_align,
                      "window": case.window}  # fmt: skip
    if case.layout == "thd":
        lengths_q, lengths_k = case.lengths_q, case.lengths_k
        batch = len(lengths_q)
        rows_q, rows_k = sum(lengths_q) + case.tail_q, sum(lengths_k) + case.tail_k
        lead_q, lead_k = (rows_q,), (rows_k,)
        extent_q, extent_k = max(lengths_q), max(lengths_k)
        for name, lengths in (("cu_seqlens_q", lengths_q), ("cu_seqlens_k", lengths_k)):
            cu = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
            keywords[name] = cu.to(device=case.device, dtype=torch.int32)
    else:
        batch = case.batch
        lead_q, lead_k = (batch, case.seqlen_q), (batch, case.seqlen_k)
        extent_q, extent_k = case.seqlen_q, case.seqlen_k
        for name, lengths in (("seqlens_q", case.lengths_q), ("seqlens_k", case.lengths_k)):
            if lengths is not None:
                keywords[name] = torch.tensor(lengths, dtype=torch.int32, device=case.device)
    q = _randn(gen, (*lead_q, hq, dqk), case, scale=case.logit_scale)
    kv = _randn(gen, (*lead_k, hkv, dqk + dv), case)
    k, v = kv[..., :dqk], kv[..., dqk:]
    if case.strided:  # q a view of a wider buffer; k and v slices of one shared buffer
        wide = torch.empty((*lead_q, hq, dqk + 8), dtype=case.dtype, device=case.device)
        wide[..., :dqk] = q
        q = wide[..., :dqk]
        if case.layout == "bshd":  # and BHSD storage seen as BSHD
            q = q.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        k, v = k.contiguous(), v.contiguous()
    do = _randn(gen, (*lead_q, hq, dv), case)
    if case.bias is not None:
        shape = (batch if case.bias[0] == "B" else 1, hq if case.bias[1] == "H" else 1)
        padding = 1 if case.layout == "thd" else 0  # packed bias may cover more than the longest
        bias_shape = (*shape, extent_q + padding, extent_k + padding)
        bias = _randn(gen, bias_shape, case, dtype=case.bias_dtype, scale=case.bias_scale)
        if case.bias_holes:
            holes = torch.rand(bias.shape, generator=gen).to(bias.device) < 0.2
            bias = bias.masked_fill(holes, -math.inf)
            bias[0, 0, min(1, extent_q - 1), :] = -math.inf
        keywords["bias"] = bias
    if case.sinks:
        keywords["sinks"] = _randn(gen, (hq,), case, dtype=torch.float32, scale=case.sink_scale)
    if case.rope:
        keywords["rope"] = _rope_tables(max(extent_q, extent_k) + 3, dqk, case.device)
    inputs = Inputs(q, k, v, do, keywords)
    if case.poison:
        _poison_unread(case, inputs)
        inputs.poisoned = True
    return inputs


def _unread_rows(case: Case) -> tuple[list[slice], list[slice]]:
    """Per batch entry (dense) or for the whole tensor (packed, one entry): the rows of
    (q, do) and of (k, v) that SEMANTICS.md lets hold any bits."""
    if case.layout == "thd":
        return [slice(sum(case.lengths_q), None)], [slice(sum(case.lengths_k), None)]
    lengths_q = case.lengths_q or (case.seqlen_q,) * case.batch
    lengths_k = case.lengths_k or (case.seqlen_k,) * case.batch
    return [slice(n, None) for n in lengths_q], [slice(n, None) for n in lengths_k]


def _poison_unread(case: Case, inputs: Inputs) -> None:
    """NaN into every input element no output may depend on (SEMANTICS.md, "Garbage outside
    the valid region"): padded query and key/value rows, packed rows past cu_seqlens[-1],
    bias entries of padded positions. An engine that multiplies them by zero (0 * NaN) or
    lets them into a sum shows NaN where the oracle is finite, and fails. In place, after
    every random draw, so each case keeps its numbers."""
    rows_q, rows_k = _unread_rows(case)
    dense = case.layout != "thd"
    for index, rows in enumerate(rows_q):
        for x in (inputs.q, inputs.do):
            (x[index, rows] if dense else x[rows]).fill_(math.nan)
    for index, rows in enumerate(rows_k):
        for x in (inputs.k, inputs.v):
            (x[index, rows] if dense else x[rows]).fill_(math.nan)
    if inputs.keywords.get("bias") is not None:
        poison_bias(case, inputs.keywords["bias"])


def poison_bias(case: Case, bias: torch.Tensor) -> None:
    """NaN, in place, into the entries of ``bias`` (``[B|1, Hq|1, ...]``) at padded positions of
    ``case``'s layout: rows or columns past a sequence's length (SEMANTICS.md lets them hold
    any bits)."""
    rows_q, rows_k = _unread_rows(case)
    if case.layout == "thd":  # the bias is indexed by in-sequence positions, per sequence
        rows_q = [slice(n, None) for n in case.lengths_q]
        rows_k = [slice(n, None) for n in case.lengths_k]
    if bias.shape[0] == 1:  # broadcast over the batch: only what every sequence leaves unread
        rows_q = [max(rows_q, key=lambda r: r.start)]
        rows_k = [max(rows_k, key=lambda r: r.start)]
    for index, (rq, rk) in enumerate(zip(rows_q, rows_k)):
        bias[index, :, rq].fill_(math.nan)
        bias[index, :, :, rk].fill_(math.nan)


def judged(judge, slack_of):
    """``judge(slack)``'s verdicts: first without a slack; if one fails, again with ``slack_of()``
    (``operand_slack``), which only widens the allowances, so a pass stays a pass."""
    verdicts = judge(None)
    if all(v.passed for v in verdicts.values()):
        return verdicts
    slack = slack_of()
    return judge(slack) if slack else verdicts


def backward_feed(inputs: Inputs, o64: torch.Tensor, lse64: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle's (o, lse) as a backward takes them (o in the io dtype, lse in float32);
    for poisoned inputs, the padded query rows hold NaN too (packed tails are NaN already)."""
    o, lse = o64.to(inputs.q.dtype), lse64.float()
    seqlens_q = inputs.keywords.get("seqlens_q")
    if inputs.poisoned and seqlens_q is not None:
        padded = torch.arange(o.shape[1], device=o.device).view(1, -1) >= seqlens_q.view(-1, 1)  # [B, Sq]
        o = o.masked_fill(padded[:, :, None, None], math.nan)
        lse = lse.masked_fill(padded[:, None, :], math.nan)
    return o, lse


def _tail_writes(case: Case, inputs: Inputs, named: dict) -> list[str]:
    """Names of outputs whose packed rows past cu_seqlens[-1] lost their poison."""
    if case.layout != "thd":
        return []
    used_q = int(inputs.keywords["cu_seqlens_q"][-1])
    used_k = int(inputs.keywords["cu_seqlens_k"][-1])
    tails = {"o": lambda x: x[used_q:], "lse": lambda x: x[:, used_q:], "dq": lambda x: x[used_q:],
             "dk": lambda x: x[used_k:], "dv": lambda x: x[used_k:]}  # fmt: skip
    return [
        f"{name}: rows past cu_seqlens[-1] were written"
        for name, tail in tails.items()
        if name in named and not torch.isnan(tail(named[name])).all()
    ]


class GuardDamaged(AssertionError):
    """An engine wrote outside one of its outputs or its workspace (``frost_harness.suites.canaries``)."""


def _serve(direction: str, inputs: Inputs, outputs: list[canaries.Guarded], *, engine: str | None,
           deterministic: bool = False, **feed) -> Decision:
    """Validate, route and run one call as frost's API does, into the guarded ``outputs`` and a
    guarded workspace of the size the plan reports; raise if any guard changed."""
    q = inputs.q
    problem, tensors = prepare(direction, q, inputs.k, inputs.v, **feed, **inputs.keywords,
                               deterministic=deterministic)  # fmt: skip
    bodies = [None if x is None else x.body for x in outputs]
    out = validation.check_out(direction, tuple(bodies) if direction == "forward" else frost.Grads(*bodies), tensors)
    served = dispatch.select(problem, engine=engine)
    workspace = canaries.guarded("workspace", (served.plan.workspace_bytes,), torch.uint8, q.device, fill=None)
    with torch.no_grad():
        dispatch.run(served, tensors, out, workspace=workspace.body)
    damaged = canaries.damage([x for x in outputs if x is not None] + [workspace])
    if damaged:
        raise GuardDamaged(f"{served.decision.engine} ({direction}): " + "; ".join(damaged))
    return served.decision


def run_forward(inputs: Inputs, *, engine: str | None = None) -> tuple[torch.Tensor, torch.Tensor, Decision]:
    """frost's forward into NaN-poisoned, guarded outputs: ``(o, lse, decision)``."""
    q, v = inputs.q, inputs.v
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
    o = canaries.guarded("o", (*q.shape[:-1], v.shape[-1]), q.dtype, q.device)
    lse = canaries.guarded("lse", lse_shape, torch.float32, q.device)
    decision = _serve("forward", inputs, [o, lse], engine=engine)
    return o.body, lse.body, decision


def run_backward(
    inputs: Inputs, o: torch.Tensor, lse: torch.Tensor, *, engine: str | None = None, deterministic: bool = False
) -> tuple[frost.Grads, Decision]:
    """frost's backward into NaN-poisoned, guarded gradients: ``(grads, decision)``."""
    kw = inputs.keywords
    sources = zip(("dq", "dk", "dv", "dbias", "dsinks"), (inputs.q, inputs.k, inputs.v, kw.get("bias"), kw.get("sinks")))
    grads = [None if x is None else canaries.guarded(name, x.shape, x.dtype, x.device) for name, x in sources]
    decision = _serve("backward", inputs, grads, engine=engine, deterministic=deterministic, o=o, lse=lse,
                      do=inputs.do)  # fmt: skip
    return frost.Grads(*(None if x is None else x.body for x in grads)), decision


def bits_equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two outputs hold the same bits (both absent counts as equal)."""
    return a is None or torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def check(case: Case, *, engine: str | None = None, directions=("forward", "backward")) -> Result:
    """Run ``case`` through frost and judge it against the oracle; record and return the result.

    The rule is SEMANTICS.md's as written (``frost_harness.oracle.tolerance``); the backward leaves out
    only what the contract's known limit exempts, per output (``tolerance.known_limit``). Where a
    verdict fails, the outputs are judged again with both rules also allowing what the problem's
    io-dtype operands cost by themselves (``frost_harness.oracle.operand_slack``: RoPE's rounded
    rotations; the backward's given o and lse), computed only then: it costs a float64 pass.
    """
    inputs = make_inputs(case)
    result = Result(case, engine)
    kw = inputs.keywords
    o64, lse64 = frost_harness.oracle.reference.forward(inputs.q, inputs.k, inputs.v, **kw)
    direction = None
    try:
        if "forward" in directions:
            direction = "forward"
            o, lse, result.decisions[direction] = run_forward(inputs, engine=engine)
            base = frost_harness.oracle.baseline.forward(inputs.q, inputs.k, inputs.v, **kw)
            verdicts = judged(
                lambda slack: frost_harness.oracle.tolerance.check_forward((o, lse), (o64, lse64), base,
                                                                           io_dtype=case.dtype, slack=slack),
                lambda: operand_slack.forward_slack(inputs.q, inputs.k, inputs.v, (o64, lse64), **kw))
            failures = _tail_writes(case, inputs, {"o": o, "lse": lse})
            _record(result, direction, verdicts, failures, engine)
        if "backward" in directions:
            direction = "backward"
            o_ref, lse_ref = backward_feed(inputs, o64, lse64)
            grads, result.decisions[direction] = run_backward(
                inputs, o_ref, lse_ref, engine=engine, deterministic=case.deterministic
            )
            ref = frost_harness.oracle.reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
            base = frost_harness.oracle.baseline.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
            exempt = frost_harness.oracle.tolerance.known_limit(inputs.q, inputs.k, inputs.v, **kw)
            verdicts = judged(
                lambda slack: frost_harness.oracle.tolerance.check_backward(grads, ref, base, io_dtype=case.dtype,
                                                                            exempt=exempt, slack=slack),
                lambda: operand_slack.backward_slack(inputs.do, inputs.q, inputs.k, inputs.v, o_ref, lse_ref, ref,
                                                     **kw))  # fmt: skip
            failures = _tail_writes(case, inputs, grads._asdict())
            if case.deterministic:
                again, _ = run_backward(inputs, o_ref, lse_ref, engine=engine, deterministic=True)
                if not all(bits_equal(a, b) for a, b in zip(grads, again)):
                    failures.append("deterministic=True: two backward runs differ in their bits")
            _record(result, direction, verdicts, failures, engine)
    except Exception as error:
        _record_error(case, direction, engine, error)
        raise
    return result


def _reproduce(case: Case, engine: str | None) -> str:
    """A call that replays the case exactly (same seed), after ``import torch, frost_harness.suites.harness``."""
    return f"frost_harness.suites.harness.check(frost_harness.suites.harness.{case!r}" + ("" if engine is None else f", engine={engine!r}") + ")"


def _row(case: Case, direction: str, engine: str | None) -> dict:
    return {
        "case": case.id,
        "direction": direction,
        "dtype": _short(case.dtype),
        "device": case.device,
        "mode": "routed" if engine is None else "forced",
        "reproduce": _reproduce(case, engine),
    }


def _record(result: Result, direction: str, verdicts: dict, failures: list, engine: str | None) -> None:
    """Add one direction's verdicts and failures to the result and to the report records."""
    result.verdicts.update(verdicts)
    result.failures += failures
    decision = result.decisions[direction]
    problem = decision.problem
    for verdict in verdicts.values():
        records.add({
            **_row(result.case, direction, engine),
            "engine": decision.engine,
            "native": decision.native,
            "device": problem.device,
            "declined": " | ".join(f"{name}: {reason}" for name, reason in decision.declined),
            "layout": problem.layout,
            "features": " ".join(tag for tag in FEATURES if tag in problem.features),
            "feature_group": problem.feature_group,
            "problem": problem.describe(),
            "output": verdict.name,
            "ratio": verdict.ratio,
            "ratio_max": verdict.ratio_max,
            "ratio_l2": verdict.ratio_l2,
            "err_max": verdict.err_max,
            "allowed_max": verdict.allowed_max,
            "nonfinite": verdict.nonfinite,
            "passed": verdict.passed and not failures,
            "error": "; ".join(failures),
        })  # fmt: skip


def _record_error(case: Case, direction: str | None, engine: str | None, error: Exception) -> None:
    records.add({
        **_row(case, direction or "setup", engine),
        "engine": engine or "?",
        "output": "*",
        "passed": False,
        "error": f"{type(error).__name__}: {error}",
    })  # fmt: skip
