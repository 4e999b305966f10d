"""Fuzz: deterministic backward runs agree bit for bit, and routing is stable and explained."""
from __future__ import annotations

import pytest
from hypothesis import given

from frost_harness.fuzz import catalog, strategies

pytestmark = pytest.mark.fuzz


@pytest.mark.L0
@given(case=strategies.backward_cases("cpu"))
def test_deterministic_backward_is_bitwise(case):
    catalog.run("deterministic_backward_is_bitwise", case)


@pytest.mark.L0
@given(case=strategies.cases("cpu"))
def test_routing_is_stable(case):
    catalog.run("routing_is_stable", case)


@pytest.mark.L1
@pytest.mark.gpu
@given(case=strategies.backward_cases("gpu"))
def test_deterministic_backward_is_bitwise_gpu(case):
    catalog.run("deterministic_backward_is_bitwise", case)


@pytest.mark.L1
@pytest.mark.gpu
@given(case=strategies.cases("gpu"))
def test_routing_is_stable_gpu(case):
    catalog.run("routing_is_stable", case)
