"""Fuzz: every engine that accepts a drawn problem agrees with the float64 oracle.

``cpu`` tests run in L0 under the ``ci`` profile against the native engines (the SM80
engines decline CPU problems); ``gpu`` tests draw larger problems on CUDA, where frost's
own engines take part. Every drawn problem is judged; only the outputs the contract's known
limit exempts go unjudged (``frost_harness.oracle.tolerance.known_limit``). Pinned ``@example``s are
failures found once and kept in L0.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import example, given

from frost_harness.fuzz import catalog, strategies
from frost_harness.suites.harness import Case

pytestmark = pytest.mark.fuzz


@pytest.mark.L0
@given(case=strategies.cases("cpu"))
# pinned: torch's CPU flash kernel in fp16 summed rounded probabilities (lse L2 ratio 3.4)
@example(case=Case(dtype=torch.float16, seqlen_q=8, seqlen_k=8, heads_q=1, heads_kv=1, head_dim_qk=1,
                   head_dim_v=1, scale=0.05, strided=True))
# pinned: o of 4 elements failed rule 2 alone (L2 ratio 1.02) on an honest engine: rule 2 judges 64 or more
@example(case=Case(dtype=torch.float16, layout="thd", batch=2, seqlen_q=24, seqlen_k=24, lengths_q=(0, 1, 0, 0, 1),
                   lengths_k=(0, 1, 0, 0, 1), tail_q=4, tail_k=4, heads_q=1, heads_kv=1, head_dim_qk=2, head_dim_v=2,
                   causal=True, causal_align="bottom_right", window=(-1, 0), sinks=True, sink_scale=0.5, rope=True,
                   scale=0.3, strided=True, seed=1))
# pinned: 5 computed values among 60 padded zeros of o; L2 ratio 1.12 on unfused (frost_harness.oracle.tolerance)
@example(case=Case(dtype=torch.bfloat16, layout="bshd", batch=1, seqlen_q=13, seqlen_k=24, lengths_q=(1,),
                   lengths_k=(14,), heads_q=5, heads_kv=1, head_dim_qk=1, head_dim_v=1, window=(0, -1), sinks=True,
                   scale=1.0, logit_scale=4.0, strided=True, seed=29737))
# pinned (CPU nightly, seed 1): rows one hot in effect but one, whose 16 elements held all of o's error
# (L2 ratio 1.2 on unfused: its P rounded to bf16 and then o; the baseline's P came out as exactly 0.5)
@example(case=Case(dtype=torch.bfloat16, layout="thd", batch=2, seqlen_q=24, seqlen_k=24, lengths_q=(2, 10, 7, 9),
                   lengths_k=(14, 24, 8, 10), tail_q=1, tail_k=1, heads_q=4, heads_kv=1, head_dim_qk=64,
                   head_dim_v=16, causal=True, window=(0, -1), bias="1H", sinks=True, scale=-2.0, bias_scale=0.25,
                   sink_scale=0.5, logit_scale=16.0, seed=119))
# pinned (CI's CPU fuzz, seed 1): the same, the one-hot rows' o = v 1e-5 off the truth (L2 ratio 1.22 on
# unfused, its row's bf16 rounding of o against a baseline's lucky 0.4 of that)
@example(case=Case(dtype=torch.bfloat16, layout="thd", batch=2, seqlen_q=24, seqlen_k=24, lengths_q=(0, 2),
                   lengths_k=(1, 23), tail_q=3, tail_k=3, heads_q=4, heads_kv=4, head_dim_qk=16, head_dim_v=16,
                   window=(3, 1), bias="BH", sinks=True, sink_scale=20.0, logit_scale=16.0, seed=19663))
def test_forward_matches_oracle(case):
    catalog.run("forward_matches_oracle", case)


@pytest.mark.L0
@pytest.mark.allows_failed_cases(reason="the xfail example below, on AVX512-FP16 hosts")
@given(case=strategies.backward_cases("cpu"))
# pinned: a sequence without keys and without a sink made the backward filter raise
@example(case=Case(layout="thd", lengths_q=(3, 20), lengths_k=(0, 20), head_dim_qk=16))
# pinned: torch's CPU flash backward in bf16 missed the rule (fixed by running it on float32 copies)
@example(case=Case(dtype=torch.bfloat16, batch=3, seqlen_q=9, seqlen_k=2, heads_q=1, heads_kv=1, head_dim_qk=11,
                   head_dim_v=11, causal=True, scale=1.0, strided=True, seed=1))
# pinned, found once the backward filter was gone (each failed before its fix):
# torch-sdpa took D from the given o, rounded to bf16: dq 3.6 times over the rule on 2-key rows
@example(case=Case(batch=3, seqlen_q=2, seqlen_k=2, head_dim_qk=16, head_dim_v=16, logit_scale=4.0, seed=2338))
# unfused normalized its fp32 logits of magnitude ~500 by the given (oracle's) lse: dq 2e6 times over
@example(case=Case(dtype=torch.float16, batch=3, seqlen_q=2, seqlen_k=6, lengths_q=(1, 1, 2), lengths_k=(0, 0, 3),
                   heads_q=7, heads_kv=1, head_dim_qk=40, head_dim_v=40, causal=True, window=(106, -1), scale=2.0,
                   logit_scale=16.0, seed=3632))
# unfused formed dP - D of peaked rows (spread 3e-7) as a difference: dq 1% off, 6 times over
@example(case=Case(dtype=torch.float16, batch=1, seqlen_q=2, seqlen_k=16, heads_q=6, heads_kv=3, head_dim_qk=56,
                   head_dim_v=56, causal=True, causal_align="bottom_right", window=(65, -1), bias="B1",
                   bias_dtype=torch.float16, bias_scale=30.0, sinks=True, sink_scale=20.0, logit_scale=4.0, seed=7897))
# the oracle itself lost ds of rows peaked beyond float64's epsilon (logits 46 apart)
@example(case=Case(batch=2, seqlen_q=18, seqlen_k=2, heads_q=5, heads_kv=1, head_dim_qk=8, head_dim_v=8, causal=True,
                   causal_align="bottom_right", window=(2, 0), bias="B1", bias_dtype=torch.bfloat16, bias_scale=30.0,
                   seed=1477))
# CPU fuzz of 2026-12-04: each row sees one key beside a sink (window (0, 0)); unfused's dk at 1.02x
# rule 2 without the allowance for the given o and lse (frost_harness/oracle/operand_slack.py)
@example(case=Case(batch=1, seqlen_q=17, seqlen_k=17, lengths_q=(17,), lengths_k=(17,), heads_q=4, heads_kv=4,
                   head_dim_qk=5, head_dim_v=32, causal_align="bottom_right", window=(0, 0), bias="BH", sinks=True,
                   scale=0.3, dtype=torch.float16, bias_dtype=torch.float16, bias_holes=True, bias_scale=4.0,
                   sink_scale=20.0, logit_scale=4.0, seed=212))
# CPU fuzz of 2026-12-04 (seed 1): two keys of nearly equal weight whose k rows nearly agree, so dq
# cancels to 1/15 of its terms; unfused rounded dS to bf16 before dS.K: dq 1.79x rule 1 (unfused_math.py)
@example(case=Case(batch=3, seqlen_q=1, seqlen_k=7, heads_q=4, heads_kv=1, head_dim_qk=1, head_dim_v=1, window=(3, 3),
                   dtype=torch.bfloat16, logit_scale=16.0, seed=384))
# the same night: peaked fp16 rows (scale -2), where torch's CPU flash backward takes D from the
# given o: dq 4x the baseline's L2 error, all of it what that o costs (operand_slack.py). On a host
# with AVX512-FP16 (an Intel Xeon with avx512_fp16 and AMX) torch's float32 kernel still missed, dk
# at 2.56x rule 2 (its error 1.1e-4 against a dk of norm 8.5e-5): its float32 D and dp, which the
# allowance takes in (dk 0.03x there)
@example(case=Case(batch=1, seqlen_q=5, seqlen_k=10, heads_q=1, heads_kv=1, head_dim_qk=24, head_dim_v=24, scale=-2.0,
                   dtype=torch.float16, logit_scale=4.0, strided=True, seed=0))
# CPU fuzz of 2026-12-05: every row one-hot in effect but one (weight 1.2e-7 off its top key, above
# the known limit's 2^-24); torch's CPU flash backward (float32 copies) at dq 1.21x, dk 1.64x rule 1,
# its float32 D's residue on a one-key row against the other rows' allowance (operand_slack.py)
@example(case=Case(batch=1, seqlen_q=2, seqlen_k=2, heads_q=3, heads_kv=3, head_dim_qk=57, head_dim_v=57, causal=True,
                   causal_align="bottom_right", window=(-1, 0), scale=-0.5, dtype=torch.float16, logit_scale=16.0,
                   seed=687))
def test_backward_matches_oracle(case):
    catalog.run("backward_matches_oracle", case)


@pytest.mark.L1
@pytest.mark.gpu
@given(case=strategies.cases("gpu"))
def test_forward_matches_oracle_gpu(case):
    catalog.run("forward_matches_oracle", case)


@pytest.mark.L1
@pytest.mark.gpu
@given(case=strategies.backward_cases("gpu"))
def test_backward_matches_oracle_gpu(case):
    catalog.run("backward_matches_oracle", case)


# Found by the H200 nightly of 2026-12-03 (night seed 20261204), as shrunk there: RoPE in fp16 with
# logits in the hundreds, where the rotated q and k rounded to fp16 (as the baseline and every fused
# kernel do) cost more than the rule as written allowed (o at 3x, dv at 5.5x). A CPU emulation of the
# sm80 arithmetic reproduced each figure; with the allowance for those operands
# (frost_harness/oracle/operand_slack.py) it passes them (worst 0.81); so did the H200 (L0 GPU suite, 2026-12-03).
FOUND_ON_GPU = {
    "rope_forward_bias": ("forward_matches_oracle", Case(
        batch=1, seqlen_q=8, seqlen_k=9, heads_q=1, heads_kv=1, head_dim_qk=64, head_dim_v=64,
        causal_align="bottom_right", window=(1, 1), bias="1H", rope=True, scale=1.0, dtype=torch.float16,
        device="cuda", logit_scale=16.0, seed=135)),
    "rope_backward_sinks_gqa": ("backward_matches_oracle", Case(
        seqlen_q=1, seqlen_k=2, heads_q=6, heads_kv=3, head_dim_qk=64, head_dim_v=64, causal_align="bottom_right",
        window=(-1, 0), sinks=True, rope=True, dtype=torch.float16, device="cuda", logit_scale=16.0, strided=True)),
    "rope_backward_long": ("backward_matches_oracle", Case(
        seqlen_q=129, seqlen_k=130, heads_q=12, heads_kv=3, head_dim_qk=64, head_dim_v=64,
        causal_align="bottom_right", window=(130, 1), sinks=True, rope=True, dtype=torch.float16, device="cuda",
        sink_scale=20.0, logit_scale=16.0, strided=True, seed=3)),
}


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("found", FOUND_ON_GPU)
def test_oracle_gpu_found_by_the_nightly(found):
    name, case = FOUND_ON_GPU[found]
    catalog.run(name, case, "sdpa_fwd_sm80" if name.startswith("forward") else "sdpa_bwd_sm80")

