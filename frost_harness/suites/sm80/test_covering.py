"""CPU: the L0 records (frost/kernels/sm80/covering.py) take every pair of values of any two
fields that the admitted records of their type take, chosen greedily in the space's order;
``frost-compile --records L0`` lists exactly them."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from frost.kernels import prebuild
from frost.kernels.sm80 import covering
from frost.kernels.sm80.config import FwdParams


@dataclasses.dataclass(frozen=True)
class _Three:
    a: int
    b: int
    c: int


@dataclasses.dataclass(frozen=True)
class _One:
    x: str
    y: bool


def _pairs(records) -> set:
    pairs = set()
    for record in records:
        values = [(type(record), field.name, getattr(record, field.name)) for field in dataclasses.fields(record)]
        pairs.update(itertools.combinations(values, 2))
    return pairs


@pytest.mark.L0
def test_the_greedy_cover_takes_the_first_record_that_covers_the_most_pairs():
    # three two-valued fields: each of the first four records chosen covers three new pairs;
    # (1, 1, 1), listed before the last two, would cover only two and then one
    a, b, e, c, d = _Three(0, 0, 0), _Three(0, 1, 1), _Three(1, 1, 1), _Three(1, 0, 1), _Three(1, 1, 0)
    p, q, r = _One("p", False), _One("q", True), _One("p", True)  # one pair of fields: each record its own pair
    chosen = covering.covering_subset([a, p, b, e, c, d, q, r])
    assert chosen == [a, b, c, d, p, q, r]  # per type, in the order the types first appear
    assert _pairs(chosen) == _pairs([a, b, c, d, e, p, q, r])


@pytest.mark.L0
def test_the_forward_l0_records_take_every_pair_the_space_takes():
    every, l0 = covering.admitted("fwd"), covering.l0("fwd")
    assert set(l0) <= set(every) and all(isinstance(p, FwdParams) for p in every)
    assert _pairs(l0) == _pairs(every) and len(l0) < len(every) / 100


@pytest.mark.L0
def test_frost_compile_lists_the_l0_records_of_the_template_family():
    assert prebuild._records("L0", "sm80/fwd") == list(covering.l0("fwd"))
    assert prebuild._records("all", "sm80/rope") == list(covering.admitted("rope"))
    assert prebuild._records("L0", "sm80/nonesuch") == []
