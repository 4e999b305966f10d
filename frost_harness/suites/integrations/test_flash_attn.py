"""``frost.flash_attn_func`` / ``flash_attn_varlen_func`` against FlashAttention-2's documented semantics.

The oracle here is FA2's docstring, written out independently of frost's keywords: query i of
a sequence with Sq queries and Sk keys sees key j when ``j <= i + Sk - Sq`` (causal, aligned to
the bottom right) and ``i + Sk - Sq - left <= j <= i + Sk - Sq + right`` (``window_size``, a
negative side unbounded; causal sets ``right = 0``), kv head ``h // (Hq // Hkv)``; lse is the
natural-log normalizer ``[B, H, Sq]`` / ``[H, T]``. It runs in float64 (the reference) and in the
io dtype (the baseline: products and probabilities rounded to bf16, the softmax in float32),
gradients by autograd, and SEMANTICS.md's acceptance rule judges frost's outputs. A row that
sees no key is o = 0 and lse = -inf (FA2 writes +inf there: the one documented difference).

Also: transformers' own flash-attention path with frost's module as a hub kernel, offline: the
``kernels`` loader is replaced by one that returns ``frost.flash_attn`` (the module a hub repo
would ship), so transformers' real wrapper (``flash_attention_forward``, its unpadding and its
keyword mapping) calls frost's ``flash_attn_varlen_func``.
"""
from __future__ import annotations

import math

import pytest
import torch

import frost
import frost_harness.oracle.tolerance as tolerance
from frost.dispatch import ledger

BF16 = torch.bfloat16


def _fa2_sequence(q, k, v, causal, window, scale, exact: bool):
    """One sequence, FA2's semantics: q [Sq, Hq, D], k / v [Sk, Hkv, D] -> (o, lse [Hq, Sq])."""
    sq, sk, group = q.shape[0], k.shape[0], q.shape[1] // k.shape[1]
    left, right = (-1 if side < 0 else side for side in window)
    if causal:
        right = 0
    i = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    visible = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        visible &= j <= i + right
    if left >= 0:
        visible &= j >= i - left
    kh, vh = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if exact:
        s = torch.einsum("qhd,khd->hqk", q.double(), kh.double()) * scale
    else:  # the baseline: products in the io dtype, the softmax in float32
        s = torch.einsum("qhd,khd->hqk", q, kh).float() * scale
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None].masked_fill(~visible.any(-1)[:, None], 0.0))
    if exact:
        o = torch.einsum("hqk,khd->qhd", p, vh.double())
    else:
        o = torch.einsum("hqk,khd->qhd", p.to(q.dtype), vh).float()
    return o, lse


def _fa2(q, k, v, cu_q, cu_k, causal, window, scale, exact):
    """FA2's semantics over packed sequences (dense: one sequence per batch row)."""
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        rows_q, rows_k = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o, lse = _fa2_sequence(q[rows_q], k[rows_k], v[rows_k], causal, window, scale, exact)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


def _judged(q, k, v, do, cu_q, cu_k, causal, window, scale):
    """(reference, baseline): each ``(o, lse, dq, dk, dv)`` of FA2's semantics, packed layout."""
    results = []
    for exact in (True, False):
        leaves = [(x.double() if exact else x).detach().requires_grad_() for x in (q, k, v)]
        o, lse = _fa2(*leaves, cu_q, cu_k, causal, window, scale, exact)
        o.backward(do.double() if exact else do.float())
        results.append((o.detach(), lse.detach(), *(x.grad for x in leaves)))
    return results


def _packed_inputs(lengths_q, lengths_k, heads_q=4, heads_kv=2, dim=16, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=generator).to(BF16)

    tq, tk = sum(lengths_q), sum(lengths_k)
    q, k, v, do = draw(tq, heads_q, dim), draw(tk, heads_kv, dim), draw(tk, heads_kv, dim), draw(tq, heads_q, dim)
    cu_q = [0, *torch.tensor(lengths_q).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(lengths_k).cumsum(0).tolist()]
    return q, k, v, do, cu_q, cu_k


def _assert_accepted(got, reference, baseline):
    """``got``, reference and baseline: ``(o, lse, dq, dk, dv)``; rows without keys: o = 0, lse = -inf."""
    o, lse, dq, dk, dv = got
    verdicts = tolerance.check_forward((o, lse), reference[:2], baseline[:2], io_dtype=BF16)
    verdicts |= tolerance.check_backward(frost.Grads(dq, dk, dv), frost.Grads(*reference[2:]),
                                         frost.Grads(*baseline[2:]), io_dtype=BF16)  # fmt: skip
    assert all(v.passed for v in verdicts.values()), tolerance.summary(verdicts)


# (causal, window_size): FA2's bottom-right alignment shows where Sq != Sk
MASKS = {
    "full": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "causal-left-3": (True, (3, -1)),
    "window-2-1": (False, (2, 1)),
    "causal-overrides-right": (True, (4, 2)),  # FA2 sets right = 0 under causal
}


@pytest.mark.L0
@pytest.mark.parametrize("mask", MASKS)
def test_flash_attn_func_matches_fa2_semantics(mask):
    causal, window = MASKS[mask]
    batch, sq, sk = 2, 7, 11  # Sq < Sk: the bottom-right alignment differs from the top-left one
    q, k, v, do, cu_q, cu_k = _packed_inputs([sq] * batch, [sk] * batch, seed=1)
    dense = [x.view(batch, -1, *x.shape[1:]).clone().requires_grad_() for x in (q, k, v)]
    o, lse, probs = frost.flash_attn_func(*dense, causal=causal, window_size=window, return_attn_probs=True)
    assert probs is None and lse.shape == (batch, 4, sq) and lse.dtype == torch.float32
    o.backward(do.view(batch, sq, *do.shape[1:]))
    got = (o.detach().reshape(q.shape), lse.permute(1, 0, 2).reshape(4, -1), *(x.grad.flatten(0, 1) for x in dense))
    _assert_accepted(got, *_judged(q, k, v, do, cu_q, cu_k, causal, window, 1 / math.sqrt(16)))


@pytest.mark.L0
@pytest.mark.parametrize("mask", ["causal", "window-2-1"])
def test_flash_attn_varlen_func_matches_fa2_semantics(mask):
    causal, window = MASKS[mask]
    lengths_q, lengths_k = (3, 6, 0, 5), (5, 4, 2, 9)  # per sequence alignment; Sq > Sk in one; an empty one
    q, k, v, do, cu_q, cu_k = _packed_inputs(lengths_q, lengths_k, seed=2)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    cu = [torch.tensor(c, dtype=torch.int32) for c in (cu_q, cu_k)]
    o, lse, _ = frost.flash_attn_varlen_func(*leaves, *cu, max(lengths_q), max(lengths_k), softmax_scale=0.3,
                                             causal=causal, window_size=window, return_attn_probs=True)  # fmt: skip
    o.backward(do)
    got = (o.detach(), lse, *(x.grad for x in leaves))
    _assert_accepted(got, *_judged(q, k, v, do, cu_q, cu_k, causal, window, 0.3))
    # the sequence with more queries than keys: its first rows see no key under causal
    if causal:
        first = slice(cu_q[1], cu_q[1] + 2)
        assert torch.equal(o[first], torch.zeros_like(o[first])) and bool(torch.isneginf(lse[:, first]).all())


@pytest.mark.L0
def test_flash_attn_func_options():
    q, k, v, do, cu_q, cu_k = _packed_inputs([6], [6], seed=3)
    dense = [x[None] for x in (q, k, v)]
    out = frost.flash_attn_func(*dense, causal=True, deterministic=True)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 6, 4, 16)
    mark = ledger.mark()
    leaves = [x.clone().requires_grad_() for x in dense]
    frost.flash_attn_func(*leaves, causal=True, deterministic=True).sum().backward()
    forward, backward = ledger.since(mark)
    assert forward.problem.causal and backward.problem.deterministic
    sinks = torch.randn(4, dtype=BF16)  # transformers hands sinks over in the io dtype
    with_sinks = frost.flash_attn_func(*dense, causal=True, s_aux=sinks)
    expected = frost.attention(*dense, causal=True, sinks=sinks.float())
    assert torch.equal(with_sinks, expected)
    for keywords, name in [(dict(dropout_p=0.1), "dropout_p"), (dict(softcap=30.0), "softcap"),
                           (dict(alibi_slopes=torch.zeros(4)), "alibi_slopes"),
                           (dict(window_size=3), "window_size")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name}:"):
            frost.flash_attn_func(*dense, **keywords)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="^block_table:"):
        frost.flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, block_table=torch.zeros(1, 1, dtype=torch.int32))
    # a tensor max_seqlen (transformers' position_ids route) is read as FA2 reads it
    got = frost.flash_attn_varlen_func(q, k, v, cu, cu, torch.tensor(6), torch.tensor(6), causal=True)
    assert torch.equal(got, frost.flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, causal=True))


@pytest.mark.L0
def test_flash_attn_varlen_func_traces_with_fullgraph():
    """Differentiable and compile-traceable: forward and backward under ``fullgraph=True``."""
    q, k, v, do, cu_q, cu_k = _packed_inputs((4, 7), (4, 7), seed=4)
    cu = torch.tensor(cu_q, dtype=torch.int32)

    def step(q, k, v):
        return (frost.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True) * do).sum()

    eager = [x.clone().requires_grad_() for x in (q, k, v)]
    compiled = [x.clone().requires_grad_() for x in (q, k, v)]
    step(*eager).backward()
    torch.compiler.reset()
    torch.compile(step, fullgraph=True, backend="aot_eager")(*compiled).backward()
    torch.compiler.reset()
    for a, b in zip(eager, compiled):
        assert torch.equal(a.grad, b.grad)


@pytest.mark.L0
def test_transformers_flash_path_with_frost_as_a_local_hub_kernel(monkeypatch):
    """``attn_implementation="<org>/<repo>"`` with frost's module as the kernel: transformers'
    own flash-attention wrapper calls ``frost.flash_attn_varlen_func`` (padding unpadded by
    transformers) and the model matches sdpa's."""
    hub_kernels = pytest.importorskip("transformers.integrations.hub_kernels")
    modeling_utils = pytest.importorskip("transformers.modeling_utils")
    if not hasattr(hub_kernels, "load_and_register_attn_kernel") or not hasattr(hub_kernels, "get_kernel"):
        pytest.skip("this transformers loads no attention kernels from the hub")
    from frost_harness.suites.integrations.test_transformers import _config, _models, _run, assert_like_sdpa

    # what a hub repo would ship: a module with FA2's functions; loaded from here, offline
    for module in (hub_kernels, modeling_utils):
        monkeypatch.setattr(module, "is_kernels_available", lambda: True, raising=False)
    monkeypatch.setattr(hub_kernels, "get_kernel", lambda *args, **kwargs: frost.flash_attn)
    name = "frost-local/flash-attn"
    hub_kernels.load_and_register_attn_kernel(name)
    ref, sdpa, kernel_model = _models(_config(), copies=(("sdpa", torch.float32), ("sdpa", BF16), (name, BF16)))
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    kwargs = dict(attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    calls = []
    monkeypatch.setattr(frost.flash_attn, "attention", lambda *a, **kw: calls.append(kw) or frost.attention(*a, **kw))
    got = _run(kernel_model, ids, **kwargs)
    assert len(calls) == 2 and all(c["cu_seqlens_q"] is not None and c["causal"] for c in calls)
    expected, reference = _run(sdpa, ids, **kwargs), _run(ref, ids, **kwargs)
    rows = mask.bool()  # transformers' flash path leaves padded rows zero, sdpa does not
    assert_like_sdpa(got[0][rows], expected[0][rows], reference[0][rows], "logits")
    assert_like_sdpa(got[1], expected[1], reference[1], "gradients")
