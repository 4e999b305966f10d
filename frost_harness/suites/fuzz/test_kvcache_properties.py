"""Fuzz: the KV-cache call's properties (``frost_harness.fuzz.kvcache`` says what each rewrites).

Dense and padded CPU problems under the ``ci`` profile (L0); each property also gets a planted bug
in ``frost.kvcache`` that it must catch, so neither passes vacuously.
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import frost.kvcache
from frost_harness.fuzz import catalog
from frost_harness.fuzz.failures import PropertyFailure
from frost_harness.fuzz.kvcache import KVCACHE_DRAWS
from frost_harness.fuzz.strategies import cases
from frost_harness.suites.harness import Case

pytestmark = pytest.mark.fuzz

STEPS = st.one_of(cases("cpu", layout="dense", **KVCACHE_DRAWS), cases("cpu", layout="padded", **KVCACHE_DRAWS))

# A step of three sequences that append 5 rows each onto 9, 0 and 17 cached rows, with GQA and sinks.
PINNED = Case(batch=3, seqlen_q=5, seqlen_k=22, lengths_k=(14, 5, 22), heads_q=4, heads_kv=2, causal=True,
              window=(6, 0), sinks=True)  # fmt: skip


@pytest.mark.L0
@given(case=STEPS)
def test_kvcache_append_equals_concatenation(case):
    catalog.run("kvcache_append_equals_concatenation", case)


@pytest.mark.L0
@given(case=STEPS)
def test_kvcache_paged_equals_contiguous(case):
    catalog.run("kvcache_paged_equals_contiguous", case)


@pytest.mark.L0
def test_the_append_property_catches_rows_written_one_early(monkeypatch):
    catalog.PROPERTIES["kvcache_append_equals_concatenation"](PINNED)
    real = frost.kvcache._append
    monkeypatch.setattr(frost.kvcache, "_append", lambda layout, kc, vc, positions, k, v: real(
        layout, kc, vc, positions - 1, k, v))  # fmt: skip
    with pytest.raises(PropertyFailure, match="kvcache_append_equals_concatenation failed: .*wrong rows written"):
        catalog.PROPERTIES["kvcache_append_equals_concatenation"](PINNED)


@pytest.mark.L0
def test_the_paged_property_catches_pages_read_out_of_order(monkeypatch):
    catalog.PROPERTIES["kvcache_paged_equals_contiguous"](PINNED)
    real = frost.kvcache.gather

    def reversed_pages(cache, layout):
        gathered = real(cache, layout)
        if layout.table is None:
            return gathered
        return gathered.unflatten(1, (-1, layout.page_size)).flip(1).flatten(1, 2)

    monkeypatch.setattr(frost.kvcache, "gather", reversed_pages)
    with pytest.raises(PropertyFailure, match="kvcache_paged_equals_contiguous failed: o: bits differ"):
        catalog.PROPERTIES["kvcache_paged_equals_contiguous"](PINNED)


@pytest.mark.L0
@pytest.mark.parametrize("case", [Case(bias="BH"), Case(rope=True), Case(lengths_q=(3, 24)),
                                  Case(layout="thd", lengths_q=(3, 5), lengths_k=(3, 5))])  # fmt: skip
def test_a_step_is_a_dense_case_without_query_padding_bias_or_rope(case):
    with pytest.raises(PropertyFailure, match="ValueError: a KV-cache step is a dense Case"):
        catalog.PROPERTIES["kvcache_paged_equals_contiguous"](case)
