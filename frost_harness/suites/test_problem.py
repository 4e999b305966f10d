"""The Problem record: facts, canonical forms, feature tags, and what prepare hands to plans."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import frost
from frost.problem import Problem, prepare

BF16 = torch.bfloat16


def _dense(sq=8, sk=8, hq=4, hkv=4, d=16, dv=None, batch=2):
    return (torch.randn(batch, sq, hq, d, dtype=BF16), torch.randn(batch, sk, hkv, d, dtype=BF16),
            torch.randn(batch, sk, hkv, dv or d, dtype=BF16))  # fmt: skip


def _packed(lengths_q=(3, 0, 6), lengths_k=(4, 2, 5), tail=2):
    def cu(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)

    q = torch.randn(sum(lengths_q) + tail, 4, 16, dtype=BF16)
    k = torch.randn(sum(lengths_k), 2, 16, dtype=BF16)
    v = torch.randn(sum(lengths_k), 2, 8, dtype=BF16)
    return q, k, v, {"cu_seqlens_q": cu(lengths_q), "cu_seqlens_k": cu(lengths_k)}


@pytest.mark.L0
def test_dense_facts():
    p = Problem.from_call("forward", *_dense(sq=8, sk=12, hq=8, hkv=2, d=32, dv=16))
    assert (p.direction, p.layout, p.dtype, p.device) == ("forward", "bshd", BF16, "cpu")
    assert (p.batch, p.seqlen_q, p.seqlen_k, p.total_q, p.total_k) == (2, 8, 12, None, None)
    assert (p.heads_q, p.heads_kv, p.group_size, p.head_dim_qk, p.head_dim_v) == (8, 2, 4, 32, 16)
    assert p.scale == pytest.approx(32**-0.5)
    assert p.features == frozenset({"gqa", "dqk_ne_dv"})
    assert p.feature_group == "gqa+dqk_ne_dv"
    assert p.o_shape == (2, 8, 8, 16) and p.lse_shape == (2, 8, 8)


@pytest.mark.L0
def test_packed_facts_and_max_seqlen():
    q, k, v, keywords = _packed()
    p = Problem.from_call("forward", q, k, v, **keywords)
    assert (p.layout, p.batch, p.seqlen_q, p.seqlen_k, p.total_q, p.total_k) == ("thd", 3, 6, 5, 11, 11)
    assert p.features == frozenset({"thd", "gqa", "dqk_ne_dv"})
    assert p.o_shape == (11, 4, 8) and p.lse_shape == (4, 11)
    hinted = Problem.from_call("forward", q, k, v, **keywords, max_seqlen_q=16, max_seqlen_k=5)
    assert (hinted.seqlen_q, hinted.seqlen_k) == (16, 5)


@pytest.mark.L0
def test_problem_is_hashable_and_equal_for_equal_calls():
    a = Problem.from_call("forward", *_dense(), causal=True)
    b = Problem.from_call("forward", *_dense(), causal=True)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Problem.from_call("forward", *_dense())


@pytest.mark.L0
def test_canonical_forms():
    # causal is window_right = 0, both ways
    causal = Problem.from_call("forward", *_dense(), causal=True)
    assert (causal.causal, causal.window_left, causal.window_right) == (True, -1, 0)
    assert Problem.from_call("forward", *_dense(), window=(-1, 0)) == causal
    # alignment without any window bound, or where both alignments coincide, reads top_left
    assert Problem.from_call("forward", *_dense(), causal_align="bottom_right").causal_align == "top_left"
    assert Problem.from_call("forward", *_dense(), causal=True, causal_align="bottom_right") == causal
    rect = Problem.from_call("forward", *_dense(sq=4, sk=8), causal=True, causal_align="bottom_right")
    assert rect.causal_align == "bottom_right" and "bottom_right" in rect.features
    padded = Problem.from_call("forward", *_dense(), causal=True, causal_align="bottom_right",
                               seqlens_q=torch.tensor([3, 8], dtype=torch.int32))  # fmt: skip
    assert padded.causal_align == "bottom_right"
    # scale resolves
    assert Problem.from_call("forward", *_dense(d=64)).scale == 0.125
    assert Problem.from_call("forward", *_dense(), scale=2).scale == 2.0


@pytest.mark.L0
def test_feature_tags():
    q, k, v = _dense(hq=4, hkv=1)
    extras = {"bias": torch.zeros(1, 4, 8, 8), "sinks": torch.zeros(4), "rope": (torch.ones(8, 8), torch.zeros(8, 8)),
              "window": (3, 0), "seqlens_k": torch.tensor([8, 2], dtype=torch.int32)}  # fmt: skip
    p = Problem.from_call("forward", q.transpose(1, 2).contiguous().transpose(1, 2), k, v, **extras)
    assert p.features == frozenset({"mqa", "causal", "window", "bias", "sinks", "rope", "padding", "strided"})
    assert p.feature_group == "padding+mqa+causal+window+bias+sinks+rope+strided"
    assert p.bias.shape == (1, 4, 8, 8) and p.bias.broadcast_batch and not p.bias.broadcast_heads
    assert Problem.from_call("forward", *_dense()).feature_group == "dense"
    assert "window" in Problem.from_call("forward", *_dense(), window=(-1, 2)).features


@pytest.mark.L0
def test_prepare_fills_the_missing_seqlens_side():
    q, k, v = _dense(sk=12)
    problem, tensors = prepare("forward", q, k, v, seqlens_q=torch.tensor([3, 8], dtype=torch.int32))
    assert problem.has_seqlens
    assert tensors.seqlens_k.tolist() == [12, 12] and tensors.seqlens_k.dtype == torch.int32


@pytest.mark.L0
def test_backward_problem_reads_o_and_do_strides():
    q, k, v = _dense()
    o, lse = frost.sdpa_forward(q, k, v)
    do = torch.randn(2, 4, 8, 16, dtype=BF16).transpose(1, 2)
    p = Problem.from_call("backward", q, k, v, o=o, lse=lse, do=do, deterministic=True)
    assert p.direction == "backward" and p.deterministic and p.strided


@pytest.mark.L0
def test_describe_is_one_line():
    q, k, v, keywords = _packed()
    text = Problem.from_call("forward", q, k, v, **keywords).describe()
    assert text == "forward bf16 thd B3 T11/11 Sq6 Sk5 H4/2 D16/8 window(-1,-1) thd+gqa+dqk_ne_dv"


@pytest.mark.L0
def test_import_frost_does_not_import_the_dsl():
    code = "import sys, frost; sys.exit(sorted(m for m in sys.modules if m.split('.')[0] == 'cutlass') or 0)"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.L0
def test_vector_aligned():
    q, k, v = _dense(d=16)
    assert Problem.from_call("forward", q, k, v).vector_aligned
    wide = torch.randn(2, 8, 4, 17, dtype=BF16)
    assert not Problem.from_call("forward", wide[..., 1:], k, v).vector_aligned  # pointer off by 2 bytes
    q12, k12, v12 = _dense(d=12)
    assert not Problem.from_call("forward", q12, k12, v12).vector_aligned  # 24-byte rows
