"""Bad input raises ValueError naming the argument and the fault, before any engine runs.

Each case starts from a valid call (dense or packed), breaks one thing, and expects
the message to start with the argument's name. The routing ledger must not move: the
error comes from validation, not from an engine.
"""
from __future__ import annotations

import pytest
import torch

import frost
from frost.dispatch import ledger

BF16 = torch.bfloat16


def _dense(**changes):
    """A valid dense call's (args, keywords); ``changes`` overrides tensors or keywords."""
    gen = torch.Generator().manual_seed(0)
    call = {
        "q": torch.randn(2, 8, 4, 16, generator=gen).to(BF16),
        "k": torch.randn(2, 12, 2, 16, generator=gen).to(BF16),
        "v": torch.randn(2, 12, 2, 16, generator=gen).to(BF16),
    }
    call.update(changes)
    return call


def _packed(**changes):
    gen = torch.Generator().manual_seed(1)
    call = {
        "q": torch.randn(10, 4, 16, generator=gen).to(BF16),
        "k": torch.randn(14, 2, 16, generator=gen).to(BF16),
        "v": torch.randn(14, 2, 16, generator=gen).to(BF16),
        "cu_seqlens_q": _i32(0, 3, 10),
        "cu_seqlens_k": _i32(0, 6, 14),
    }
    call.update(changes)
    return call


def _bf16(*shape):
    return torch.randn(*shape).to(BF16)


def _i32(*values):
    return torch.tensor(values, dtype=torch.int32)


def _rope(positions, dim=16):
    return torch.ones(positions, dim // 2), torch.zeros(positions, dim // 2)


def _forward(call):
    call = dict(call)
    frost.sdpa_forward(call.pop("q"), call.pop("k"), call.pop("v"), **call)


FORWARD_CASES = {
    "q-dtype-float32": (_dense(q=torch.randn(2, 8, 4, 16)), "q: dtype torch.float32"),
    "k-dtype-mismatch": (_dense(k=torch.randn(2, 12, 2, 16).half()), "k: dtype torch.float16 does not match"),
    "v-dtype-mismatch": (_dense(v=torch.randn(2, 12, 2, 16).half()), "v: dtype"),
    "q-rank": (_dense(q=_bf16(8, 16)), "q: expected 4 dims"),
    "k-rank-mixed": (_dense(k=_bf16(12, 2, 16)), "k: has 3 dims but q has 4"),
    "k-batch": (_dense(k=_bf16(3, 12, 2, 16)), "k: batch 3 does not match q's 2"),
    "v-seqlen": (_dense(v=_bf16(2, 11, 2, 16)), "v: shape"),
    "v-heads": (_dense(v=_bf16(2, 12, 1, 16)), "v: has 1 heads but k has 2"),
    "heads-not-multiple": (_dense(k=_bf16(2, 12, 3, 16), v=_bf16(2, 12, 3, 16)),
                           "k: Hq=4 is not a multiple of Hkv=3"),  # fmt: skip
    "k-head-dim": (_dense(k=_bf16(2, 12, 2, 8)), "k: head dim 8 does not match q's 16"),
    "q-last-stride": (_dense(q=_bf16(2, 8, 4, 32)[..., ::2]), "q: the last dimension must have stride 1"),
    "v-last-stride": (_dense(v=_bf16(2, 12, 16, 2).transpose(-1, -2)), "v: the last dimension"),
    "cu-with-dense": (_dense(cu_seqlens_q=_i32(0, 8)), "cu_seqlens_q: only for packed"),
    "max-seqlen-with-dense": (_dense(max_seqlen_q=8), "max_seqlen_q: only for packed"),
    "seqlens-dtype": (_dense(seqlens_q=torch.tensor([3, 4])), "seqlens_q: dtype must be torch.int32"),
    "seqlens-length": (_dense(seqlens_k=_i32(3)), "seqlens_k: expected 2 entries"),
    "seqlens-too-long": (_dense(seqlens_q=_i32(3, 9)), r"seqlens_q: values must lie in \[0, 8\]"),
    "seqlens-negative": (_dense(seqlens_k=_i32(-1, 9)), r"seqlens_k: values must lie in \[0, 12\]"),
    "window-below-minus-one": (_dense(window=(-2, 3)), "window: values must be >= -1"),
    "window-not-pair": (_dense(window=(3,)), "window: expected a \\(left, right\\) pair"),
    "window-float": (_dense(window=(1.5, 2)), "window: expected a \\(left, right\\) pair of ints"),
    "window-conflicts-causal": (_dense(causal=True, window=(-1, 4)), "window: window_right=4 conflicts with causal=True"),
    "causal-align": (_dense(causal=True, causal_align="bottom-right"), "causal_align: expected one of"),
    "causal-not-bool": (_dense(causal=1), "causal: expected a bool"),
    "scale-nan": (_dense(scale=float("nan")), "scale: expected a finite number"),
    "bias-batch": (_dense(bias=torch.randn(3, 4, 8, 12)), "bias: shape \\(3, 4, 8, 12\\) does not broadcast"),
    "bias-heads": (_dense(bias=torch.randn(1, 2, 8, 12)), "bias: shape \\(1, 2, 8, 12\\) does not broadcast"),
    "bias-seqlen": (_dense(bias=torch.randn(1, 1, 8, 11)), "bias: shape \\(1, 1, 8, 11\\) does not broadcast"),
    "bias-rank": (_dense(bias=torch.randn(8, 12)), "bias: shape \\(8, 12\\) does not broadcast"),
    "bias-dtype": (_dense(bias=torch.randn(1, 1, 8, 12).half()), "bias: dtype must be torch.float32 or q's"),
    "sinks-length": (_dense(sinks=torch.randn(3)), "sinks: expected shape \\(4,\\)"),
    "sinks-dtype": (_dense(sinks=_bf16(4)), "sinks: dtype must be torch.float32"),
    "rope-too-short": (_dense(rope=_rope(11)), "rope: tables have 11 positions but positions up to 11 are used"),
    "rope-odd-head-dim": (_dense(q=_bf16(2, 8, 4, 15), k=_bf16(2, 12, 2, 15),
                                 v=_bf16(2, 12, 2, 15), rope=_rope(12, 14)),
                          "rope: head_dim_qk=15 is odd"),  # fmt: skip
    "rope-width": (_dense(rope=_rope(12, 8)), "rope: tables must have shape \\[max_pos, 8\\]"),
    "rope-dtype": (_dense(rope=tuple(t.double() for t in _rope(12))), "rope: tables must be torch.float32"),
    "rope-not-pair": (_dense(rope=torch.ones(12, 8)), "rope: expected a \\(cos, sin\\) pair"),
    "mixed-devices-k": (_dense(k=torch.empty(2, 12, 2, 16, dtype=BF16, device="meta")), "k: on meta but q is on cpu"),
    "mixed-devices-bias": (_dense(bias=torch.empty(1, 1, 8, 12, device="meta")), "bias: on meta"),
    "cu-dtype": (_packed(cu_seqlens_q=torch.tensor([0, 3, 10])), "cu_seqlens_q: dtype must be torch.int32"),
    "cu-start": (_packed(cu_seqlens_q=_i32(1, 3, 10)), "cu_seqlens_q: must start at 0, got 1"),
    "cu-decreasing": (_packed(cu_seqlens_k=_i32(0, 9, 6)), "cu_seqlens_k: must be non-decreasing"),
    "cu-longer-than-tensor": (_packed(cu_seqlens_q=_i32(0, 3, 11)),
                              "cu_seqlens_q: ends at 11 but q has only 10 rows"),  # fmt: skip
    "cu-batch-mismatch": (_packed(cu_seqlens_k=_i32(0, 6, 10, 14)),
                          "cu_seqlens_k: describes 3 sequences but cu_seqlens_q describes 2"),  # fmt: skip
    "cu-too-short": (_packed(cu_seqlens_q=_i32(0)), "cu_seqlens_q: needs at least 2 entries"),
    "cu-missing": (_packed(cu_seqlens_k=None), "cu_seqlens_k: required for packed"),
    "cu-rank": (_packed(cu_seqlens_q=torch.tensor([[0, 3, 10]], dtype=torch.int32)), "cu_seqlens_q: expected a 1-dim"),
    "seqlens-with-packed": (_packed(seqlens_q=_i32(3, 7)), "seqlens_q: dense padding"),
    "packed-v-rows": (_packed(v=_bf16(13, 2, 16)), "v: has 13 rows but k has 14"),
    "max-seqlen-short": (_packed(max_seqlen_q=6), "max_seqlen_q: 6 is less than the longest sequence \\(7\\)"),
    "max-seqlen-type": (_packed(max_seqlen_k=8.0), "max_seqlen_k: expected an int"),
    "packed-bias-short": (_packed(bias=torch.randn(2, 1, 6, 8)), "bias: shape \\(2, 1, 6, 8\\) does not broadcast"),
    "packed-rope-too-short": (_packed(rope=_rope(7)), "rope: tables have 7 positions but positions up to 7 are used"),
    "out-shape": (_dense(out=(torch.empty(2, 8, 4, 8, dtype=BF16), torch.empty(2, 4, 8))), "out.o: expected shape"),
    "out-dtype": (_dense(out=(torch.empty(2, 8, 4, 16, dtype=BF16), torch.empty(2, 4, 8, dtype=BF16))),
                  "out.lse: expected dtype torch.float32"),  # fmt: skip
    "out-device": (_dense(out=(torch.empty(2, 8, 4, 16, dtype=BF16, device="meta"), torch.empty(2, 4, 8))),
                   "out.o: on meta"),  # fmt: skip
    "out-not-pair": (_dense(out=torch.empty(2, 8, 4, 16, dtype=BF16)), "out: expected a \\(o, lse\\) pair"),
    "scale-beyond-float32": (_dense(scale=1e39), "scale: 1e\\+39 is beyond float32's range"),
    "scale-beyond-float32-negative": (_dense(scale=-4e38), "scale: -4e\\+38 is beyond float32's range"),
    "kv-heads-zero": (_dense(k=_bf16(2, 12, 0, 16), v=_bf16(2, 12, 0, 16)), "k: head counts must be >= 1"),
    "q-heads-zero": (_dense(q=_bf16(2, 8, 0, 16)), "q: head counts must be >= 1"),
    "v-head-dim-zero": (_dense(v=_bf16(2, 12, 2, 0)), "v: head dims must be >= 1"),
    "deterministic-forward": (_dense(deterministic=True), "deterministic: only the backward takes it"),
    "deterministic-forward-type": (_dense(deterministic="yes"), "deterministic: expected a bool"),
    "packed-meta": (_packed(**{name: x.to("meta") for name, x in _packed().items()}),
                    "cu_seqlens_q: on the meta device"),  # fmt: skip
    "padded-meta": (_dense(**{name: x.to("meta") for name, x in _dense(seqlens_k=_i32(3, 9)).items()}),
                    "seqlens_k: on the meta device"),  # fmt: skip
}


@pytest.mark.L0
@pytest.mark.parametrize("name", FORWARD_CASES)
def test_bad_forward_input_raises_named_value_error(name):
    call, message = FORWARD_CASES[name]
    before = ledger.mark()
    with pytest.raises(ValueError, match="^" + message):
        _forward(call)
    assert ledger.mark() == before, "validation must fail before any engine is chosen"


def _backward_call(**changes):
    call = _dense()
    o, lse = frost.sdpa_forward(call["q"], call["k"], call["v"])
    call.update(do=torch.randn_like(o), o=o, lse=lse)
    call.update(changes)
    return call


def _backward(call):
    call = dict(call)
    tensors = [call.pop(name) for name in ("do", "q", "k", "v", "o", "lse")]
    frost.sdpa_backward(*tensors, **call)


BACKWARD_CASES = {
    "o-shape": ({"o": _bf16(2, 8, 4, 8)}, "o: expected shape \\(2, 8, 4, 16\\)"),
    "do-shape": ({"do": _bf16(2, 7, 4, 16)}, "do: expected shape"),
    "do-dtype": ({"do": torch.randn(2, 8, 4, 16).half()}, "do: dtype torch.float16 does not match"),
    "lse-shape": ({"lse": torch.randn(2, 8, 4)}, "lse: expected shape \\(2, 4, 8\\)"),
    "lse-dtype": ({"lse": _bf16(2, 4, 8)}, "lse: dtype must be torch.float32"),
    "o-missing": ({"o": None}, "o: required by the backward"),
    "deterministic-type": ({"deterministic": "yes"}, "deterministic: expected a bool"),
    "out-dq-shape": ({"out": frost.Grads(_bf16(2, 8, 4, 8), _bf16(2, 12, 2, 16), _bf16(2, 12, 2, 16))},
                     "out.dq: expected shape"),  # fmt: skip
    "out-dbias-without-bias": ({"out": frost.Grads(_bf16(2, 8, 4, 16), _bf16(2, 12, 2, 16), _bf16(2, 12, 2, 16),
                                                   torch.empty(1))},
                               "out.dbias: must be None when bias is not given"),  # fmt: skip
    "out-dsinks-missing": ({"sinks": torch.zeros(4),
                            "out": frost.Grads(_bf16(2, 8, 4, 16), _bf16(2, 12, 2, 16), _bf16(2, 12, 2, 16))},
                           "out.dsinks: a tensor is required since sinks is given"),  # fmt: skip
}


@pytest.mark.L0
@pytest.mark.parametrize("name", BACKWARD_CASES)
def test_bad_backward_input_raises_named_value_error(name):
    changes, message = BACKWARD_CASES[name]
    call = _backward_call(**changes)
    before = ledger.mark()
    with pytest.raises(ValueError, match="^" + message):
        _backward(call)
    assert ledger.mark() == before


@pytest.mark.L0
def test_attention_and_route_validate_like_sdpa_forward():
    call = _packed(cu_seqlens_q=_i32(0, 5, 3))
    q, k, v = call.pop("q"), call.pop("k"), call.pop("v")
    for entry in (frost.attention, frost.route):
        with pytest.raises(ValueError, match="^cu_seqlens_q: must be non-decreasing"):
            entry(q, k, v, **call)
    with pytest.raises(ValueError, match="^direction: expected"):
        frost.route(q, k, v, direction="sideways")
    with pytest.raises(ValueError, match="^deterministic:"):
        frost.route(q, k, v, deterministic=True)


def _overlapping_outs(call):
    """Bad ``out=`` of the backward of ``call``, by name: (out, the message's start)."""
    q, k, v = call["q"], call["k"], call["v"]
    shared, dq = torch.empty_like(k), torch.empty_like(q)
    dkv = torch.empty(*k.shape[:-1], 2 * k.shape[-1], dtype=BF16)
    return {
        "dk-is-dv": ((dq, shared, shared, None, None), "out.dv: overlaps out.dk"),
        "dk-inside-dq": ((dq, dq.view(-1)[: k.numel()].view(k.shape), torch.empty_like(v), None, None),
                         "out.dk: overlaps out.dq"),  # fmt: skip
        "dk-dv-half-overlap": ((dq, dkv[..., :16], dkv[..., 8:24], None, None), "out.dv: overlaps out.dk"),
        "dq-self-overlap": ((torch.empty(1, *q.shape[1:], dtype=BF16).expand(q.shape), torch.empty_like(k),
                             torch.empty_like(v), None, None), "out.dq: its elements overlap in memory"),  # fmt: skip
        "dq-aliases-q": ((q, torch.empty_like(k), torch.empty_like(v), None, None), "out.dq: overlaps the input q"),
        "dv-aliases-v": ((dq, torch.empty_like(k), v, None, None), "out.dv: overlaps the input v"),
        "dk-inside-o": ((dq, call["o"].view(-1)[: k.numel()].view(k.shape), torch.empty_like(v), None, None),
                        "out.dk: overlaps the input o"),  # fmt: skip
    }


OVERLAP_NAMES = ("dk-is-dv", "dk-inside-dq", "dk-dv-half-overlap", "dq-self-overlap", "dq-aliases-q",
                 "dv-aliases-v", "dk-inside-o")  # fmt: skip


@pytest.mark.L0
@pytest.mark.parametrize("name", OVERLAP_NAMES)
@pytest.mark.parametrize("cached", [False, True], ids=["first-call", "cached-plan"])
def test_overlapping_out_raises_before_any_work(name, cached, monkeypatch):
    from frost import dispatch, plans

    call = _backward_call()
    plans.cache.clear()
    if cached:  # the same signature served once: the bad out= must be caught on the hit path too
        _backward(call)
    out, message = _overlapping_outs(call)[name]
    before = {key: x.clone() for key, x in call.items() if isinstance(x, torch.Tensor)}

    def no_work(*args, **kwargs):
        raise AssertionError("an engine was asked to work on a call with a bad out=")

    monkeypatch.setattr(dispatch, "select", no_work)
    monkeypatch.setattr(dispatch, "run", no_work)
    with pytest.raises(ValueError, match="^" + message):
        _backward({**call, "out": out})
    for key, x in before.items():
        assert torch.equal(call[key], x), f"{key} changed"


@pytest.mark.L0
def test_forward_out_overlap_and_interleaved_outputs():
    call = _dense()
    q = call["q"]
    with pytest.raises(ValueError, match="^out.o: overlaps the input q"):
        _forward({**call, "out": (q, torch.empty(2, 4, 8))})
    o = torch.empty_like(q)
    with pytest.raises(ValueError, match="^out.lse: overlaps out.o"):
        _forward({**call, "out": (o, o.view(-1)[:128].view(torch.float32).view(2, 4, 8))})
    # Interleaved but disjoint: dk and dv as the halves of one [.., 2 * D] buffer are legal.
    back = _backward_call()
    tensors = [back[name] for name in ("do", "q", "k", "v", "o", "lse")]
    dkv = torch.full((2, 12, 2, 32), float("nan"), dtype=BF16)
    grads = frost.sdpa_backward(*tensors, out=(torch.empty_like(back["q"]), dkv[..., :16], dkv[..., 16:], None, None))
    reference = frost.sdpa_backward(*tensors)
    assert torch.equal(grads.dk, reference.dk) and torch.equal(grads.dv, reference.dv)
