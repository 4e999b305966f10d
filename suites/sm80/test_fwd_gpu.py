"""GPU: the SM80 forward against the float64 oracle under the acceptance rule.

Every feature of the forward's Capabilities row, both dtypes and both flavors
(with head dims that fill them and that do not), outputs poisoned with NaN
before each launch (suites.harness), and routing asserted through the ledger:
``frost.sdpa_forward`` must choose ``sdpa_fwd_sm80`` for each of these cases.
L0 runs each feature once (dtype and head dims rotating); L1 runs every
feature with every dtype and head-dim pair.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from suites.harness import Case, check

pytestmark = pytest.mark.gpu

ENGINE = "sdpa_fwd_sm80"
DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = ((128, 128), (64, 64), (96, 96), (72, 40), (48, 64), (32, 32))

FEATURES = {
    "dense": dict(),
    "strided": dict(strided=True),
    "causal": dict(causal=True),
    "causal_br_sq_lt_sk": dict(causal=True, causal_align="bottom_right", seqlen_q=150, seqlen_k=333),
    "causal_br_sq_gt_sk": dict(causal=True, causal_align="bottom_right", seqlen_q=333, seqlen_k=150),
    "window_left": dict(window=(40, -1)),
    "window_right": dict(window=(-1, 24)),
    "window_both": dict(window=(37, 5)),
    "window_zero": dict(window=(0, 0)),
    "window_wider_than_seq": dict(window=(1000, 1000)),
    "window_br": dict(window=(30, 10), causal_align="bottom_right", seqlen_q=100, seqlen_k=260),
    "padding": dict(lengths_q=(257, 0), lengths_k=(190, 260)),
    "padding_causal_br": dict(lengths_q=(257, 120), lengths_k=(190, 0), causal=True, causal_align="bottom_right"),
    "gqa": dict(heads_q=8, heads_kv=2, causal=True),
    "mqa": dict(heads_q=6, heads_kv=1, window=(50, 0)),
    "sinks": dict(sinks=True),
    "sinks_empty_rows": dict(sinks=True, window=(0, 0), causal_align="bottom_right", seqlen_q=300, seqlen_k=100),
    "large_logits": dict(logit_scale=30.0),
    "thd": dict(layout="thd", lengths_q=(96, 0, 160, 33), lengths_k=(96, 7, 160, 64), tail_q=5, tail_k=3),
    "thd_causal_gqa": dict(layout="thd", lengths_q=(200, 1, 0, 130), lengths_k=(200, 1, 9, 150), causal=True,
                           heads_q=8, heads_kv=2, tail_q=3),
    "thd_br_window_sinks": dict(layout="thd", lengths_q=(70, 300), lengths_k=(150, 90), window=(20, 3),
                                causal_align="bottom_right", sinks=True),
    "single_row": dict(seqlen_q=1, seqlen_k=517, causal=True, causal_align="bottom_right"),
}
BASE = Case(device="cuda", seqlen_q=300, seqlen_k=300, heads_q=4, heads_kv=4)


def _case(feature: str, dtype, dims, seed=0) -> Case:
    return dataclasses.replace(
        BASE, dtype=dtype, head_dim_qk=dims[0], head_dim_v=dims[1], seed=seed, **FEATURES[feature]
    )


def _assert_sm80(case: Case):
    result = check(case, directions=("forward",))
    assert result.decisions["forward"].engine == ENGINE, result.describe()
    assert result.passed, result.describe()


L0_CASES = [
    (feature, DTYPES[i % 2], HEAD_DIMS[i % len(HEAD_DIMS)]) for i, feature in enumerate(FEATURES)
]


@pytest.mark.L0
@pytest.mark.parametrize("feature, dtype, dims", L0_CASES, ids=lambda x: str(x))
def test_fwd_sm80_matches_oracle(feature, dtype, dims):
    _assert_sm80(_case(feature, dtype, dims))


@pytest.mark.L1
@pytest.mark.parametrize(
    "feature, dtype, dims",
    [c for c in itertools.product(FEATURES, DTYPES, HEAD_DIMS) if c not in L0_CASES],
    ids=lambda x: str(x),
)
def test_fwd_sm80_matches_oracle_every_dtype_and_flavor(feature, dtype, dims):
    _assert_sm80(_case(feature, dtype, dims, seed=1))


@pytest.mark.L0
def test_fwd_sm80_thd_rebinds_one_artifact_across_token_totals():
    from frost.kernels.sm80 import compile as sm80_compile

    first = dataclasses.replace(BASE, layout="thd", lengths_q=(96, 160), lengths_k=(96, 160), causal=True)
    _assert_sm80(first)
    before = sm80_compile.FWD_CACHE.stats()
    second = dataclasses.replace(first, lengths_q=(64, 256), lengths_k=(64, 256))
    _assert_sm80(second)  # the re-bound call is judged against the oracle, not discarded
    after = sm80_compile.FWD_CACHE.stats()
    assert after.compiles == before.compiles and after.hits >= before.hits + 1, (before, after)
    third = dataclasses.replace(first, lengths_q=(64, 100, 30), lengths_k=(64, 100, 30))
    _assert_sm80(third)
    assert sm80_compile.FWD_CACHE.stats().compiles == after.compiles
    print(f"compile cache before={before} after={after} final={sm80_compile.FWD_CACHE.stats()}")
