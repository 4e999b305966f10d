"""``frost.attention``: the torch.library custom ops, their autograd, opcheck and torch.compile."""
from __future__ import annotations

import pytest
import torch

import frost
import frost_harness.oracle.baseline
import frost_harness.oracle.reference
import frost_harness.oracle.tolerance
from frost.dispatch import ledger
from frost_harness.suites.harness import Case, make_inputs

BF16 = torch.bfloat16

OP_CASES = {
    "dense-gqa-causal": Case(heads_q=4, heads_kv=2, causal=True, seqlen_q=6, seqlen_k=9, head_dim_qk=8),
    "dense-bias-sinks-rope": Case(bias="1H", sinks=True, rope=True, seqlen_q=5, seqlen_k=7, head_dim_qk=8,
                                  heads_q=2, heads_kv=2),  # fmt: skip
    "thd-window-bias": Case(layout="thd", lengths_q=(3, 0, 5), lengths_k=(4, 2, 6), tail_q=2, window=(2, 1),
                            bias="BH", heads_q=2, heads_kv=1, head_dim_qk=8),  # fmt: skip
}


def _differentiable(inputs):
    """q, k, v and the float keywords (bias, sinks) as leaves that require grad."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    keywords = dict(inputs.keywords)
    for name in ("bias", "sinks"):
        if keywords.get(name) is not None:
            keywords[name] = keywords[name].detach().clone().requires_grad_()
    return q, k, v, keywords


def _op_arguments(q, k, v, keywords):
    """The ops' arguments after the leading tensors: the optional tensors, max_seqlen_q / _k, then
    the settings index."""
    keywords = dict(keywords)
    window_left, window_right = keywords.pop("window")
    keywords["rope_cos"], keywords["rope_sin"] = keywords.pop("rope", None) or (None, None)
    optional = tuple(keywords.pop(name, None) for name in frost.ops.OPTIONAL_TENSORS)
    longest = keywords.pop("max_seqlen_q", None), keywords.pop("max_seqlen_k", None)
    settings = frost.ops.settings_id(
        keywords.pop("scale", None), keywords.pop("causal", False), keywords.pop("causal_align", "top_left"),
        window_left, window_right, keywords.pop("deterministic", False), keywords.pop("engine", None),
    )  # fmt: skip
    assert not keywords, keywords
    return (q, k, v), (*optional, *longest, settings)


@pytest.mark.L0
@pytest.mark.parametrize("name", OP_CASES)
def test_opcheck_forward_op(name):
    leading, rest = _op_arguments(*_differentiable(make_inputs(OP_CASES[name])))
    torch.library.opcheck(torch.ops.frost.sdpa_forward.default, (*leading, *rest))


@pytest.mark.L0
@pytest.mark.parametrize("name", OP_CASES)
def test_opcheck_backward_op(name):
    inputs = make_inputs(OP_CASES[name])
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, **inputs.keywords)
    (q, k, v), rest = _op_arguments(inputs.q, inputs.k, inputs.v, inputs.keywords)
    torch.library.opcheck(torch.ops.frost.sdpa_backward.default, (inputs.do, q, k, v, o, lse, *rest))


@pytest.mark.L0
@pytest.mark.parametrize("name", OP_CASES)
def test_attention_forward_and_autograd_match_oracle(name):
    case = OP_CASES[name]
    inputs = make_inputs(case)
    q, k, v, keywords = _differentiable(inputs)
    o = frost.attention(q, k, v, **keywords)
    o.backward(inputs.do)
    kw = inputs.keywords
    reference = frost_harness.oracle.reference.forward(inputs.q, inputs.k, inputs.v, **kw)[0]
    baseline = frost_harness.oracle.baseline.forward(inputs.q, inputs.k, inputs.v, **kw)[0]
    verdicts = frost_harness.oracle.tolerance.check({"o": o.detach()}, {"o": reference}, {"o": baseline}, io_dtype=case.dtype)
    grads = frost.Grads(q.grad, k.grad, v.grad, *(keywords[n].grad if n in keywords else None for n in ("bias", "sinks")))
    ref = frost_harness.oracle.reference.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    base = frost_harness.oracle.baseline.backward(inputs.do, inputs.q, inputs.k, inputs.v, **kw)
    verdicts |= frost_harness.oracle.tolerance.check_backward(grads, ref, base, io_dtype=case.dtype)
    assert all(v.passed for v in verdicts.values()), frost_harness.oracle.tolerance.summary(verdicts)


@pytest.mark.L0
def test_lse_carries_no_gradient_and_engine_forces_both_directions():
    inputs = make_inputs(Case(heads_q=4, heads_kv=2, seqlen_q=6, seqlen_k=6, head_dim_qk=8))
    q, k, v, keywords = _differentiable(inputs)
    mark = ledger.mark()
    o = frost.attention(q, k, v, **keywords, engine="unfused", deterministic=True)
    o.sum().backward()  # a stride-0 gradient
    forward, backward = ledger.since(mark)
    assert (forward.engine, backward.engine, backward.problem.deterministic) == ("unfused", "unfused", True)
    leading, rest = _op_arguments(q, k, v, {**keywords, "deterministic": True})
    _, lse = torch.ops.frost.sdpa_forward(*leading, *rest)
    assert not lse.requires_grad


def _loss(q, k, v, bias, do):
    return (frost.attention(q, k, v, causal=True, bias=bias) * do).sum()


@pytest.mark.L0
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_torch_compile_matches_eager(dynamic):
    inputs = make_inputs(Case(heads_q=4, heads_kv=2, seqlen_q=8, seqlen_k=8, head_dim_qk=16, bias="11"))
    eager = _differentiable(inputs)
    compiled = _differentiable(inputs)
    _loss(*eager[:3], eager[3]["bias"], inputs.do).backward()
    torch.compiler.reset()
    step = torch.compile(_loss, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    step(*compiled[:3], compiled[3]["bias"], inputs.do).backward()
    for a, b in zip((*eager[:3], eager[3]["bias"]), (*compiled[:3], compiled[3]["bias"])):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


@pytest.mark.L0
def test_op_schemas_are_short_and_settings_are_one_int():
    for op in (torch.ops.frost.sdpa_forward.default, torch.ops.frost.sdpa_backward.default):
        arguments = op._schema.arguments
        assert [a.name for a in arguments[-11:]] == [*frost.ops.OPTIONAL_TENSORS, "max_seqlen_q", "max_seqlen_k",
                                                     "settings"]  # fmt: skip
        assert "SymInt? max_seqlen_q, SymInt? max_seqlen_k, int settings) ->" in str(op._schema)
        assert all(a.default_value is None for a in arguments)
    assert len(torch.ops.frost.sdpa_forward.default._schema.arguments) == 14


@pytest.mark.L0
def test_settings_side_table_keeps_values_and_their_types():
    first = frost.ops.settings_id(0.5, True, "top_left", 3, 0, False, None)
    assert frost.ops.settings_id(0.5, True, "top_left", 3, 0, False, None) == first
    assert frost.ops.settings_id(0.5, 1, "top_left", 3, 0, False, None) != first
    assert frost.ops.settings_id(0.5, True, "top_left", 3, 0, True, None) != first
    traced = frost.ops._settings[frost.ops.settings_id(0.5, True, "top_left", 3, 0, False, None, True, True)]
    settings = frost.ops._settings[first]
    assert settings.forward.window == (3, 0) and not settings.forward.deterministic and settings.engine is None
    assert settings.forward.check_lengths and not traced.forward.check_lengths


@pytest.mark.L0
@pytest.mark.parametrize("keywords, message", [
    ({"causal": 1}, "causal: expected a bool"),
    ({"scale": [0.5]}, "scale: expected a finite number"),
    ({"causal_align": "middle"}, "causal_align: expected one of"),
    ({"engine": "sm99"}, "engine: unknown forward engine 'sm99'"),
])  # fmt: skip
def test_attention_rejects_bad_settings_like_sdpa_forward(keywords, message):
    q, k, v = (torch.randn(1, 4, 2, 8, dtype=BF16, requires_grad=True) for _ in range(3))
    before = ledger.mark()
    with pytest.raises(ValueError, match="^" + message):
        frost.attention(q, k, v, **keywords)
    assert ledger.mark() == before


@pytest.mark.L0
def test_attention_without_grad_records_no_graph_and_reuses_the_plan():
    inputs = make_inputs(Case(heads_q=2, heads_kv=2, seqlen_q=5, seqlen_k=5, head_dim_qk=8))
    o = frost.attention(inputs.q, inputs.k, inputs.v, causal=True)
    hits = frost.plans.cache.stats().hits
    again = frost.attention(inputs.q, inputs.k, inputs.v, causal=True)
    assert o.grad_fn is None and frost.plans.cache.stats().hits == hits + 1
    torch.testing.assert_close(again, o, rtol=0, atol=0)
    torch.testing.assert_close(o, frost.sdpa_forward(inputs.q, inputs.k, inputs.v, causal=True)[0], rtol=0, atol=0)


@pytest.mark.L0
def test_double_backward_raises():
    inputs = make_inputs(Case(heads_q=2, heads_kv=2, seqlen_q=4, seqlen_k=4, head_dim_qk=8))
    q, k, v, _ = _differentiable(inputs)
    o = frost.attention(q, k, v)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(o, (q,), inputs.do, create_graph=True)  # the backward op would need a graph
    (dq,) = torch.autograd.grad(o, (q,), inputs.do)
    assert dq.grad_fn is None and dq.abs().sum() > 0


def _two_settings_loss(q, k, v, sinks, do):
    first = frost.attention(q, k, v, window=(2, 1), sinks=sinks, deterministic=True)
    second = frost.attention(q, k, v, causal=True, scale=0.25)
    return ((first + second) * do).sum()


@pytest.mark.L0
def test_torch_compile_bakes_each_calls_settings():
    inputs = make_inputs(Case(heads_q=4, heads_kv=2, seqlen_q=8, seqlen_k=8, head_dim_qk=16, sinks=True))
    eager, compiled = _differentiable(inputs), _differentiable(inputs)
    loss = _two_settings_loss(*eager[:3], eager[3]["sinks"], inputs.do)
    loss.backward()
    torch.compiler.reset()
    step = torch.compile(_two_settings_loss, backend="aot_eager", fullgraph=True)
    compiled_loss = step(*compiled[:3], compiled[3]["sinks"], inputs.do)
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, loss, rtol=0, atol=0)
    for a, b in zip((*eager[:3], eager[3]["sinks"]), (*compiled[:3], compiled[3]["sinks"])):
        assert a.grad is not None
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


@pytest.mark.L0
def test_eager_attention_skips_the_operators(monkeypatch):
    """Eager ``attention`` (plain tensors, no mode) runs the implementations without a
    dispatcher round trip in either direction, and gives what the operator path gives."""
    inputs = make_inputs(OP_CASES["dense-bias-sinks-rope"])
    q, k, v, keywords = _differentiable(inputs)
    leaves = (q, k, v, keywords["bias"], keywords["sinks"])
    with monkeypatch.context() as traced:
        traced.setattr(frost.ops, "_eager", lambda *tensors: False)  # what torch.compile or a mode would see
        through_ops = torch.autograd.grad(frost.attention(q, k, v, **keywords), leaves, inputs.do)

    def refuse(*args):
        raise AssertionError("an eager call reached a frost operator")

    monkeypatch.setattr(frost.ops, "_FORWARD", refuse)
    monkeypatch.setattr(frost.ops, "_BACKWARD", refuse)
    direct = torch.autograd.grad(frost.attention(q, k, v, **keywords), leaves, inputs.do)
    for got, want in zip(direct, through_ops):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    monkeypatch.setattr(frost.ops, "_eager", lambda *tensors: False)
    with pytest.raises(AssertionError, match="reached a frost operator"):
        frost.attention(q, k, v, **keywords)


@pytest.mark.L0
def test_a_tensor_subclass_goes_through_the_operators(monkeypatch):
    """Only plain q, k and v skip the operators: a subclass anywhere among them (its
    ``__torch_function__`` may need to see the op) takes the operator path."""
    inputs = make_inputs(OP_CASES["dense-gqa-causal"])
    q, k, v, keywords = _differentiable(inputs)

    class Marked(torch.Tensor):
        pass

    paths = []  # True: the direct path (ops._apply_direct), False: Function.apply from the operator
    apply, apply_direct = frost.ops._Attention.apply, frost.ops._apply_direct
    monkeypatch.setattr(frost.ops._Attention, "apply", lambda direct, *args: paths.append(direct) or apply(direct, *args))
    monkeypatch.setattr(frost.ops, "_apply_direct", lambda *args: paths.append(True) or apply_direct(*args))
    plain = frost.attention(q, k, v, **keywords)
    marked = frost.attention(q, k.as_subclass(Marked), v, **keywords)
    assert paths == [True, False]
    torch.testing.assert_close(marked.as_subclass(torch.Tensor), plain, rtol=0, atol=0)


@pytest.mark.L0
def test_a_repeated_backward_takes_the_plan_its_forward_led_to(monkeypatch):
    """The direct backward of a forward plan seen before skips its signature and value
    checks; a new ``do`` layout, other settings, or an engine setting changed in between
    take the full way, and every one gives what ``sdpa_backward`` gives."""
    from frost import plans

    case = Case(layout="thd", lengths_q=(3, 5), lengths_k=(4, 6), heads_q=4, heads_kv=2, head_dim_qk=8, causal=True)
    inputs = make_inputs(case)
    q, k, v, keywords = _differentiable(inputs)
    signatures = []
    signature = plans.signature
    monkeypatch.setattr(plans, "signature", lambda direction, *a: signatures.append(direction) or signature(direction, *a))

    def step(do, **extra):
        out = frost.attention(q, k, v, **keywords, **extra)
        got = torch.autograd.grad(out, (q, k, v), do)
        o, lse = frost.sdpa_forward(q.detach(), k.detach(), v.detach(), **keywords)
        want = frost.sdpa_backward(do, q.detach(), k.detach(), v.detach(), o, lse, **keywords, **extra)
        for g, w in zip(got, want[:3]):
            torch.testing.assert_close(g, w, rtol=0, atol=0)

    step(inputs.do)
    signatures.clear()
    step(inputs.do)
    assert signatures[:2] == ["forward", "forward"]  # attention's forward, then the reference's own calls
    assert signatures.count("backward") == 1  # the reference sdpa_backward only: attention's took the link
    transposed = inputs.do.transpose(0, 1).contiguous().transpose(0, 1)  # a new do layout, same values
    assert transposed.stride() != inputs.do.stride()
    signatures.clear()
    step(transposed)
    assert signatures.count("backward") == 2
    signatures.clear()
    step(inputs.do, deterministic=True)  # other settings: their own link
    assert signatures.count("backward") == 2
    engine = frost.dispatch.BACKWARD_ENGINES[-1]
    out = frost.attention(q, k, v, **keywords)  # a forward whose plan holds the link ...
    monkeypatch.setattr(engine, "name", engine.name)  # ... then an engine attribute set: plans made before are stale
    signatures.clear()
    got = torch.autograd.grad(out, (q, k, v), inputs.do)
    assert signatures == ["backward"]  # the full way, not the stale link
    o, lse = frost.sdpa_forward(q.detach(), k.detach(), v.detach(), **keywords)
    want = frost.sdpa_backward(inputs.do, q.detach(), k.detach(), v.detach(), o, lse, **keywords)
    for g, w in zip(got, want[:3]):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def _autocast_loss(q, k, v, bias, do):
    with torch.autocast(q.device.type, dtype=BF16):
        out = frost.attention(q, k, v, causal=True, bias=bias, deterministic=True)
    assert out.dtype == BF16
    return (out.float() * do).sum()


@pytest.mark.L0
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_autocast_runs_float32_inputs_in_its_dtype(compiled, device):
    """Under autocast float32 q, k, v run in autocast's dtype, as sdpa's do, with the float32
    bias as given; gradients reach the float32 leaves as the cast's backward makes them: those
    of the same call on bf16 copies, in float32. Outside autocast float32 stays a ValueError."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    case = Case(heads_q=4, heads_kv=2, seqlen_q=80, seqlen_k=80, head_dim_qk=64, bias="11", device=device)
    inputs = make_inputs(case)
    wide = [x.detach().float().requires_grad_() for x in (inputs.q, inputs.k, inputs.v)]
    bias = inputs.keywords["bias"].detach().float().requires_grad_()
    torch.compiler.reset()
    loss = torch.compile(_autocast_loss, backend="aot_eager", fullgraph=True) if compiled else _autocast_loss
    mark = ledger.mark()
    loss(*wide, bias, inputs.do.float()).backward()
    served = {d.engine for d in ledger.since(mark)}
    narrow = [x.detach().to(BF16).requires_grad_() for x in wide]
    bias_given = bias.detach().clone().requires_grad_()
    out = frost.attention(*narrow, causal=True, bias=bias_given, deterministic=True)
    (out.float() * inputs.do.float()).sum().backward()
    for got, expected in zip((*wide, bias), (*narrow, bias_given)):  # deterministic: bit for bit
        assert got.grad.dtype == torch.float32
        torch.testing.assert_close(got.grad, expected.grad.float(), rtol=0, atol=0)
    assert device == "cpu" or served == {"sdpa_fwd_sm80", "sdpa_bwd_sm80"}, served
    with pytest.raises(ValueError, match="q: dtype torch.float32"):
        frost.attention(*wide, causal=True)


@pytest.mark.L0
def test_meta_tensors_get_shapes_forward_and_backward():
    """On the meta device (a model built there to count shapes or FLOPs) ``attention`` runs the
    operators' shape-only implementations, as torch's sdpa does, instead of an engine."""
    q = torch.empty(2, 16, 4, 32, dtype=BF16, device="meta", requires_grad=True)
    k = torch.empty(2, 24, 2, 32, dtype=BF16, device="meta", requires_grad=True)
    v = torch.empty(2, 24, 2, 48, dtype=BF16, device="meta", requires_grad=True)
    mark = ledger.mark()
    out = frost.attention(q, k, v, causal=True)
    assert out.is_meta and out.shape == (2, 16, 4, 48) and out.dtype == BF16
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape] and all(g.is_meta for g in grads)
    assert not ledger.since(mark)  # no engine ran


@pytest.mark.L0
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_bias_that_takes_no_gradient_gets_none_computed(compiled, device):
    """``attention`` makes dbias only for a bias that requires grad (a fixed mask given as a bias
    costs no dbias work); ``sdpa_backward(bias_grad=False)`` returns dbias None, with dq, dk and
    dv bit for bit those of the full backward (deterministic mode: on the GPU the main kernel
    then differs only in the dbias it leaves out)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    case = Case(bias="1H", heads_q=4, heads_kv=2, causal=True, seqlen_q=70, seqlen_k=70, head_dim_qk=64,
                head_dim_v=64, device=device)
    inputs = make_inputs(case)
    keywords = dict(inputs.keywords, deterministic=True)
    bias = keywords.pop("bias")
    o, lse = frost.sdpa_forward(inputs.q, inputs.k, inputs.v, bias=bias, **{**keywords, "deterministic": False})
    args = (inputs.do, inputs.q, inputs.k, inputs.v, o, lse)
    full = frost.sdpa_backward(*args, bias=bias, **keywords)
    lean = frost.sdpa_backward(*args, bias=bias, bias_grad=False, **keywords)
    assert full.dbias is not None and lean.dbias is None
    assert all(torch.equal(a, b) for a, b in zip(full[:3], lean[:3]))
    with pytest.raises(ValueError, match="out.dbias"):
        frost.sdpa_backward(*args, bias=bias, bias_grad=False, **keywords,
                            out=frost.Grads(*(torch.empty_like(x) for x in args[1:4]), torch.empty_like(bias)))
    with pytest.raises(ValueError, match="bias_grad"):
        frost.sdpa_backward(*args, bias=bias, bias_grad="no", **keywords)
    if device == "cuda":
        from frost.kernels.sm80.compile import BWD_CACHE
        from frost.kernels.sm80.config import BwdParams

        # the main kernels only: the cache also holds the chain's other records (a dQ pass reads
        # the bias too, and has no dbias to leave out)
        mains = [key[1] for key in BWD_CACHE.keys() if isinstance(key[1], BwdParams)]
        assert any(params.bias_dtype and params.dbias_dtype is None for params in mains)
    attention = torch.compile(frost.attention, fullgraph=True) if compiled else frost.attention
    q, k, v = (x.detach().clone().requires_grad_() for x in (inputs.q, inputs.k, inputs.v))
    fixed = bias.clone()
    attention(q, k, v, bias=fixed, **keywords).backward(inputs.do)
    assert fixed.grad is None
    assert all(torch.equal(g, w) for g, w in zip((q.grad, k.grad, v.grad), full[:3]))
    learned = bias.clone().requires_grad_()
    attention(q.detach(), k.detach(), v.detach(), bias=learned, **keywords).backward(inputs.do)
    assert torch.equal(learned.grad, full.dbias)


@pytest.mark.L0
def test_the_functional_entries_give_shapes_on_meta_tensors():
    """``sdpa_forward`` / ``sdpa_backward`` on meta tensors validate and route like any call, then
    give meta outputs of the right shapes (dbias None with ``bias_grad=False``) and run nothing;
    bad arguments still raise, and lengths whose values the meta device lacks are refused."""
    q = torch.empty(2, 16, 4, 32, dtype=BF16, device="meta")
    k = torch.empty(2, 24, 2, 32, dtype=BF16, device="meta")
    v = torch.empty(2, 24, 2, 48, dtype=BF16, device="meta")
    bias = torch.empty(1, 4, 16, 24, device="meta")
    mark = ledger.mark()
    o, lse = frost.sdpa_forward(q, k, v, causal=True, bias=bias)
    assert o.is_meta and o.shape == (2, 16, 4, 48) and o.dtype == BF16
    assert lse.is_meta and lse.shape == (2, 4, 16) and lse.dtype == torch.float32
    grads = frost.sdpa_backward(o, q, k, v, o, lse, causal=True, bias=bias)
    assert [tuple(g.shape) for g in grads[:4]] == [tuple(x.shape) for x in (q, k, v, bias)]
    assert all(g.is_meta for g in grads[:4]) and grads.dsinks is None
    assert frost.sdpa_backward(o, q, k, v, o, lse, causal=True, bias=bias, bias_grad=False).dbias is None
    assert not ledger.since(mark)  # no engine ran
    with pytest.raises(ValueError, match="window"):
        frost.sdpa_forward(q, k, v, causal=True, window=(3, 2))
    with pytest.raises(ValueError, match="seqlens_k: on the meta device"):
        frost.sdpa_forward(q, k, v, seqlens_k=torch.ones(2, dtype=torch.int32, device="meta"))
