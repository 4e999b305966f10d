"""One Case vocabulary: the harness's, the oracle suites' and the check script's records agree.

All three derive from ``frost.case.CaseFields``; here the same field values must build the
same problem in each (shapes, layouts, sequence lengths, masks), so a name cannot drift to
another meaning in one of them.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import frost.kernels.sm80.check as sm80_check
from frost.case import CaseFields
from frost_harness.suites import harness
from frost_harness.suites.oracle import cases as oracle_cases

pytestmark = pytest.mark.L0

SHARED = {f.name for f in dataclasses.fields(CaseFields)}
PROBLEMS = {
    "padded": dict(batch=2, seqlen_q=9, seqlen_k=7, lengths_q=(9, 4), lengths_k=(3, 0), heads_q=4, heads_kv=2,
                   head_dim_qk=16, head_dim_v=8, causal=True, causal_align="bottom_right", window=(3, -1), sinks=True),
    "packed": dict(layout="thd", lengths_q=(5, 0, 3), lengths_k=(2, 6, 1), tail_q=2, tail_k=1, heads_q=2,
                   heads_kv=1, head_dim_qk=8, window=(1, 1), scale=0.5),
}


def test_every_record_derives_from_the_shared_fields():
    for record in (harness.Case, oracle_cases.Case, sm80_check.Case):
        assert issubclass(record, CaseFields)
        assert SHARED <= {f.name for f in dataclasses.fields(record)}
    with pytest.raises(ValueError, match="no bias"):  # a field the check script cannot honor is refused
        sm80_check.Case(bias="BH")


def test_harness_id_names_every_field():
    """The id (which seeds a case's tensors) keeps a fixed order; a new field must join it."""
    names = {f.name for f in dataclasses.fields(harness.Case)} - {"name"}
    assert set(harness._ID_ORDER) == names and len(harness._ID_ORDER) == len(names)


def _shapes(q, k, v, keywords) -> dict:
    out = {"q": q.shape, "k": k.shape, "v": v.shape}
    for name in ("cu_seqlens_q", "cu_seqlens_k", "seqlens_q", "seqlens_k"):
        value = keywords.get(name)
        out[name] = None if value is None else value.tolist()
    out.update({name: keywords.get(name) for name in ("causal", "causal_align", "window", "scale")})
    out["sinks"] = keywords.get("sinks") is not None
    return out


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_the_same_fields_build_the_same_problem_in_each_record(name):
    fields = PROBLEMS[name]
    from_harness = harness.make_inputs(harness.Case(**fields))
    got = _shapes(from_harness.q, from_harness.k, from_harness.v, from_harness.keywords)
    problem = oracle_cases.build(oracle_cases.Case(name, **fields))
    assert _shapes(problem.q, problem.k, problem.v, problem.options) == got
    check_case = sm80_check.Case(**fields)
    q, k, v, keywords, _ = sm80_check._inputs(check_case, "cpu", torch.Generator().manual_seed(0))
    keywords.update(check_case.keywords())
    assert _shapes(q, k, v, keywords) == got
