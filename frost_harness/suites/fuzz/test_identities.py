"""Fuzz: metamorphic identities on the engines (``frost_harness.fuzz.identities`` says what each rewrites).

``cpu`` tests are L0 under the ``ci`` profile; the ``gpu`` test draws the larger problems
on CUDA for each identity. Pinned ``@example``s are failures found once, kept in L0.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from frost_harness.fuzz import catalog
from frost_harness.fuzz.identities import IDENTITIES
from frost_harness.fuzz.strategies import cases
from frost_harness.suites.harness import Case

pytestmark = pytest.mark.fuzz

# Pinned: failures the search found once (in the fuzz code), kept in L0 for good.
EMPTY = Case(batch=1, seqlen_q=0, seqlen_k=0, heads_q=1, heads_kv=1, head_dim_qk=1, bias="BH", scale=0.3)

# property name -> the constraints its problems need
DRAWS = {name: identity.draws for name, identity in IDENTITIES.items()}


@pytest.mark.L0
@given(case=cases("cpu", **DRAWS["packed_equals_per_sequence_and_padded"]))
def test_packed_equals_per_sequence_and_padded(case):
    catalog.run("packed_equals_per_sequence_and_padded", case)


@pytest.mark.L0
@given(case=cases("cpu", **DRAWS["gqa_equals_repeated_kv"]))
def test_gqa_equals_repeated_kv(case):
    catalog.run("gqa_equals_repeated_kv", case)


@pytest.mark.L0
@given(case=cases("cpu", **DRAWS["batch_permutation"]))
def test_batch_permutation(case):
    catalog.run("batch_permutation", case)


@pytest.mark.L0
@given(case=cases("cpu", **DRAWS["sink_equals_zero_value_key"]))
@example(case=dataclasses.replace(EMPTY, sinks=True))  # the extra key of an empty K was empty too
def test_sink_equals_zero_value_key(case):
    catalog.run("sink_equals_zero_value_key", case)


@pytest.mark.L0
@given(case=cases("cpu", **DRAWS["row_shift_changes_nothing"]))
# unfused normalized 2-key rows of bias 300 by the given lse: dk 2.4e3 times over (found once unfiltered)
@example(case=Case(layout="thd", lengths_q=(0, 29, 0), lengths_k=(0, 2, 0), heads_q=2, heads_kv=2, head_dim_qk=2,
                   head_dim_v=1, bias="BH", bias_scale=300.0, rope=True, strided=True))
# scale 0: A's lse is log 2, B's is c + log 2 in float32 (|c| <= 64), whose rounding A's allowance lacked
@example(case=Case(batch=2, seqlen_q=6, seqlen_k=2, heads_q=6, heads_kv=3, head_dim_qk=2, head_dim_v=2, rope=True,
                   scale=0.0, dtype=torch.float16, strided=True))
# CPU fuzz of 2026-12-04: A on torch-sdpa (D from the given fp16 o, peaked rows), B on unfused: dq
# 1.01x the comparison's allowance, which now adds what A's given operands cost (operand_slack.py)
@example(case=Case(batch=2, seqlen_q=4, seqlen_k=10, heads_q=1, heads_kv=1, head_dim_qk=16, head_dim_v=16,
                   window=(-1, 0), scale=-2.0, dtype=torch.float16, logit_scale=4.0, seed=1))
def test_row_shift_changes_nothing(case):
    catalog.run("row_shift_changes_nothing", case)


@pytest.mark.L0
@given(case=cases("cpu", **DRAWS["causal_prefix_ignores_later_keys"]))
@example(case=dataclasses.replace(EMPTY, causal=True))  # the bit comparison of empty outputs raised
def test_causal_prefix_ignores_later_keys(case):
    catalog.run("causal_prefix_ignores_later_keys", case)


@pytest.mark.L1
@pytest.mark.gpu
@pytest.mark.parametrize("name", DRAWS)
@given(data=st.data())
def test_identity_gpu(name, data):
    catalog.run(name, data.draw(cases("gpu", **DRAWS[name]), label="case"))


# Found by the H200 nightly of 2026-12-03 (night seed 20261204), as shrunk there; each passes
# since its fix. Saturated rows (a bias 30-300 apart): dq, dk, dbias are residue, the known limit
# in effect (frost_harness.oracle.tolerance.ONE_KEY_IN_EFFECT). The causal prefix: the rewrite
# copied strided keys and values contiguous, and unfused's cuBLAS summed o in another order.
FOUND_ON_GPU = {
    "dk_subnormal_residue": ("gqa_equals_repeated_kv", Case(
        batch=1, seqlen_q=1, seqlen_k=2, heads_q=2, heads_kv=1, head_dim_qk=64, head_dim_v=8,
        causal_align="bottom_right", window=(-1, 1), bias="B1", dtype=torch.float16, device="cuda",
        bias_dtype=torch.float16, bias_scale=30.0, logit_scale=4.0, strided=True)),
    "dbias_residue_gqa": ("gqa_equals_repeated_kv", Case(
        batch=1, seqlen_q=2, seqlen_k=3, heads_q=2, heads_kv=1, head_dim_qk=64, head_dim_v=8,
        causal_align="bottom_right", window=(-1, 2), bias="BH", dtype=torch.float16, device="cuda",
        bias_dtype=torch.float16, bias_scale=300.0, strided=True, seed=1)),
    "dbias_residue_row_shift": ("row_shift_changes_nothing", Case(
        batch=4, seqlen_q=2, seqlen_k=370, heads_q=2, heads_kv=2, head_dim_v=64, window=(0, -1), bias="1H",
        device="cuda", bias_scale=300.0, logit_scale=4.0, strided=True, seed=22776)),
    "prefix_strided_unfused": ("causal_prefix_ignores_later_keys", Case(
        layout="thd", lengths_q=(384, 0, 0), lengths_k=(384, 0, 0), heads_q=2, heads_kv=1, head_dim_qk=1,
        head_dim_v=128, causal_align="bottom_right", window=(-1, 383), sinks=True, device="cuda", strided=True)),
}


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("found", FOUND_ON_GPU)
def test_identity_gpu_found_by_the_nightly(found):
    name, case = FOUND_ON_GPU[found]
    catalog.run(name, case)
