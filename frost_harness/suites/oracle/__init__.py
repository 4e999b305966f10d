"""Suites of the float64 oracle (``oracle``): why its answers can be trusted.

Every test here runs on CPU and is L0, except the S=4096 timing (L1) and
the CUDA comparison (L0, marked gpu). Support modules: ``cases`` (seeded tiny
problems, one per feature and combination), ``naive`` (SEMANTICS.md row by
row), ``fp32_engine`` (a stand-in flash engine for the acceptance-rule tests).

Coverage matrix (feature x witness).

Columns: **N** forward == row-by-row transcription of SEMANTICS.md (`naive.py`);
**A** analytic backward == autograd of the oracle's own forward; **A2** == autograd of
the transcription; **G** `torch.autograd.gradcheck` (finite differences) of the analytic
backward; **T** torch math SDPA in float64, forward and autograd backward;
**P** packed == per-sequence == padded dense; **Q** GQA == MHA with repeated K/V (dk/dv
summed back); **S** sink == extra key with zero key/value (dsink == dbias of that column);
**R** per-row constant through bias changes o, dq, dk, dv, dbias not at all, lse by the
constant; **M** -inf bias == masking (window as bias; -inf column == key removed);
**BR** bottom-right == top-left when Sq_b == Sk_b; **E** closed forms (fully masked rows,
empty sequences, |s| ~ 1e4); **B** the same-precision baseline in float32 == oracle.
An x means at least one variant of the row's feature runs through that witness.

| feature | N | A | A2 | G | T | P | Q | S | R | M | BR | E | B |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| dense BSHD | x | x | x | x | x | x | x | x | x | x | x | x | x |
| packed THD (cu_seqlens) | x | x | x | x | | x | x | | x | | x | x | x |
| zero-length sequences | x | x | x | x | | x | x | | x | | x | x | x |
| packed rows past cu_seqlens[-1] (NaN) | x | x | x | x | | x | x | | x | | x | x | x |
| dense padding (seqlens) | x | x | x | x | | x | x | | | | | x | x |
| GQA | x | x | x | x | x | x | x | x | x | x | x | | x |
| MQA | x | x | x | x | x | x | x | | | | x | x | x |
| Dqk != Dv | x | x | x | x | x | x | x | | x | | | | x |
| custom scale | x | x | x | x | x | x | x | | x | | | | x |
| causal top-left | x | x | x | x | x | | | | | | x | x | x |
| causal bottom-right, Sq < Sk and Sq > Sk | x | x | x | x | | x | x | | x | x | x | x | x |
| window left / right / both | x | x | x | x | | x | x | | x | x | x | | x |
| window zero, window larger than sequence | x | x | x | x | | | | | | x | | x | x |
| bias [1,1,..], [B,1,..], [1,H,..], [B,H,..] | x | x | x | x | x | x | x | x | x | x | x | x | x |
| packed bias [B,H,>=Sq_max,>=Sk_max] | x | x | x | x | | x | x | | x | | | x | x |
| RoPE (rotary table; arbitrary table) | x | x | x | x | | x | x | x | x | | x | | x |
| sinks | x | x | x | x | | x | x | x | | x | x | x | x |
| fully masked rows (o=0, lse=-inf or sink) | x | x | x | x | | | | x | | x | | x | x |
| large logits (bias, sinks ~1e4) | | | | | | | | | | | | x | x |

Interacting combinations run through every column that applies: GQA + window +
sinks; MQA + causal bottom-right + sinks; RoPE + bias (BH; arbitrary table + 1H + GQA);
bottom-right windows with Sq > Sk (with and without bias); packed THD with zero-length
sequences + GQA + causal bottom-right + window + bias + sinks + RoPE + scale + Dqk != Dv
(`packed_everything`); padded + MQA + bias 1H + sinks + arbitrary RoPE table
(`padded_everything`).

Also: any strides (BHSD views, slices of one qkv buffer) and fp16/bf16/fp32 inputs
give bit-identical results to the contiguous float64 call; results do not depend on
`block_q`; bad arguments raise ValueError naming them; CUDA == CPU (marked `gpu`).
The acceptance rule (`test_tolerance.py`) passes an fp32-accumulating stand-in engine,
the baseline and the rounded oracle, and fails a mask off by one, one element off
(rule 1), a 1% scale on dq (rule 2 where rule 1 passes), NaN/Inf, a wrong -inf lse;
its factors k = 2/3 and 2 and its ulp floors are pinned. The S=4096 timing is L1
(`test_performance.py`).
"""
