"""The float64 forward agrees with independent computations of SEMANTICS.md.

- the row-by-row transcription (``naive``) on every case of ``cases.FEATURES``,
  NaN tails and -inf rows included;
- torch's math SDPA in float64 wherever torch has the feature: causal
  (top-left), attn_mask as a float bias, GQA via ``enable_gqa``, custom scale,
  and its autograd gradients against the analytic backward;
- the result does not depend on input dtype once upcast, on strides, or on block_q,
  and the inputs are never written.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from frost_harness.oracle import reference
from frost_harness.suites.oracle import naive
from frost_harness.suites.oracle.cases import FEATURES, FEATURES_BY_NAME, Case, build

pytestmark = pytest.mark.L0


@pytest.mark.parametrize("case", FEATURES, ids=str)
def test_forward_equals_transcription(case):
    p = build(case, seed=11)
    o, lse = reference.forward(p.q, p.k, p.v, **p.options)
    o_naive, lse_naive = naive.attention(p.q, p.k, p.v, **p.options)
    assert o.dtype == lse.dtype == torch.float64
    torch.testing.assert_close(o, o_naive, rtol=1e-12, atol=1e-13, equal_nan=True)
    torch.testing.assert_close(lse, lse_naive, rtol=1e-12, atol=1e-13, equal_nan=True)


TORCH_SDPA_CASES = (
    Case("plain", batch=2, seqlen_q=5, seqlen_k=7, heads_q=3, heads_kv=3, head_dim_qk=8, head_dim_v=6),
    Case("causal", batch=2, seqlen_q=6, seqlen_k=6, heads_q=2, heads_kv=2, causal=True),
    Case("causal_sq_lt_sk", batch=1, seqlen_q=3, seqlen_k=7, heads_q=2, heads_kv=2, causal=True),
    Case("causal_sq_gt_sk", batch=1, seqlen_q=7, seqlen_k=4, heads_q=2, heads_kv=2, causal=True),
    Case("gqa", batch=2, seqlen_q=5, seqlen_k=6, heads_q=6, heads_kv=2),
    Case("mqa_causal", batch=1, seqlen_q=5, seqlen_k=5, heads_q=4, heads_kv=1, causal=True),
    Case("scale", seqlen_q=4, seqlen_k=9, scale=0.21),
    *(Case(f"bias_{s}", batch=2, seqlen_q=4, seqlen_k=6, heads_q=4, heads_kv=2, bias=s)
      for s in ("11", "B1", "1H", "BH")),
)


def _torch_sdpa(p):
    """torch's math SDPA on BHSD views; returns o in BSHD."""
    q, k, v = (t.transpose(1, 2) for t in (p.q, p.k, p.v))
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=p.options.get("bias"), is_causal=p.options["causal"],
            scale=p.options["scale"], enable_gqa=p.q.shape[2] != p.k.shape[2])
    return o.transpose(1, 2)


@pytest.mark.parametrize("case", TORCH_SDPA_CASES, ids=str)
def test_forward_and_backward_equal_torch_math_sdpa(case):
    p = build(case, seed=12)
    leaves = {n: t.detach().clone().requires_grad_() for n, t in p.differentiable.items()}
    lp = p.with_inputs(**leaves)
    o_torch = _torch_sdpa(lp)
    o, _ = reference.forward(p.q, p.k, p.v, **p.options)
    torch.testing.assert_close(o, o_torch.detach(), rtol=1e-12, atol=1e-13)

    want = torch.autograd.grad(o_torch, list(leaves.values()), p.do)
    got = reference.backward(p.do, p.q, p.k, p.v, **p.options).as_dict()
    for name, w in zip(leaves, want):
        field = {"q": "dq", "k": "dk", "v": "dv", "bias": "dbias"}[name]
        torch.testing.assert_close(got[field], w, rtol=1e-10, atol=1e-12, msg=field)


def test_lse_is_natural_log_of_the_softmax_denominator():
    p = build(Case("lse", batch=1, seqlen_q=3, seqlen_k=4, heads_q=2, heads_kv=2, scale=0.5), seed=13)
    _, lse = reference.forward(p.q, p.k, p.v, **p.options)
    logits = torch.einsum("bihd,bjhd->bhij", p.q, p.k) * 0.5
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_are_upcast_exactly(dtype):
    """The oracle of rounded inputs is the float64 oracle of the same values."""
    p = build(FEATURES_BY_NAME["packed_everything"], seed=14, dtype=dtype)
    o, lse = reference.forward(p.q, p.k, p.v, **p.options)
    g = reference.backward(p.do, p.q, p.k, p.v, **p.options)
    p64 = p.with_inputs(q=p.q.double(), k=p.k.double(), v=p.v.double(), do=p.do.double())
    o64, lse64 = reference.forward(p64.q, p64.k, p64.v, **p64.options)
    g64 = reference.backward(p64.do, p64.q, p64.k, p64.v, **p64.options)
    assert o.dtype == lse.dtype == g.dq.dtype == g.dbias.dtype == g.dsinks.dtype == torch.float64
    torch.testing.assert_close(o, o64, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(lse, lse64, rtol=0, atol=0, equal_nan=True)
    for name, t in g.as_dict().items():
        torch.testing.assert_close(t, getattr(g64, name), rtol=0, atol=0, equal_nan=True, msg=name)


def test_any_strides():
    """BHSD storage viewed as BSHD, and q/k/v sliced out of one packed qkv buffer."""
    gen = torch.Generator().manual_seed(15)
    b, s, h, d = 2, 5, 3, 4
    bhsd = [torch.randn(b, h, s, d, generator=gen, dtype=torch.float64) for _ in range(3)]
    strided = [t.transpose(1, 2) for t in bhsd]
    qkv = torch.randn(b, s, 3, h, d, generator=gen, dtype=torch.float64)
    do = torch.randn(b, s, h, d, generator=gen, dtype=torch.float64)
    for tensors in (strided, [qkv[:, :, i] for i in range(3)]):
        assert not any(t.is_contiguous() for t in tensors)
        contiguous = [t.contiguous() for t in tensors]
        for want, got in zip(reference.forward(*contiguous, causal=True),
                             reference.forward(*tensors, causal=True)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        want = reference.backward(do, *contiguous, causal=True)
        got = reference.backward(do.transpose(0, 1).contiguous().transpose(0, 1), *tensors, causal=True)
        for name in ("dq", "dk", "dv"):
            torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=0, atol=0)


@pytest.mark.parametrize("block_q", [1, 3, 256])
def test_block_size_does_not_change_results(block_q):
    p = build(FEATURES_BY_NAME["packed_everything"], seed=16)
    options = dict(p.options, block_q=block_q)
    base = dict(p.options, block_q=2)
    for got, want in zip(reference.forward(p.q, p.k, p.v, **options),
                         reference.forward(p.q, p.k, p.v, **base)):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-14, equal_nan=True)
    got = reference.backward(p.do, p.q, p.k, p.v, **options).as_dict()
    want = reference.backward(p.do, p.q, p.k, p.v, **base).as_dict()
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-13, equal_nan=True)


def test_inputs_are_never_written():
    """float64 inputs alias the oracle's working views; nothing may write through them."""
    p = build(FEATURES_BY_NAME["packed_everything"], seed=17)
    tensors = [p.q, p.k, p.v, p.do, p.options["bias"], p.options["sinks"], *p.options["rope"]]
    before = [t.clone() for t in tensors]
    reference.forward(p.q, p.k, p.v, **p.options)
    reference.backward(p.do, p.q, p.k, p.v, **p.options)
    for t, saved in zip(tensors, before):
        assert torch.equal(t, saved)
