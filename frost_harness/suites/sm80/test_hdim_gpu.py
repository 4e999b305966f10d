"""GPU: the wide head-dim flavors (d192x128, d192, d256) against the float64 oracle.

Forward and the whole backward chain, default and deterministic mode, under the
acceptance rule with outputs poisoned (frost_harness.suites.harness), routing asserted through
the ledger, and the compiled records checked to be the flavor ``config.flavor_for``
selects. Head dims that fill their tiles (192/192, 256/256, 192/128) and that do
not (168 and 232 on d192 / d256, 160/96 on d192x128), dense and packed layouts,
causal, bottom-right and windowed masks, dense padding, sinks and GQA groups (the
small grids here make the engine split each group, so the fp32 dK / dV partials,
of different widths for d192x128, are exercised too).

Compiles about 40 records (6 forward; the backward chains of 6 cases in default
mode, 4 in deterministic mode, plus one dQ-recompute chain and one SM90 wide-reduction
record).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from frost_harness.suites.harness import Case, check
from frost_harness.suites.sm80 import gpu_cases

pytestmark = [pytest.mark.gpu, pytest.mark.L0]

FWD_ENGINE, BWD_ENGINE = "sdpa_fwd_sm80", "sdpa_bwd_sm80"

# name -> (head dims, dtype, the gpu_cases feature it takes its masks and layout from, extra fields)
CASES = {
    "d192_edge_causal": ((192, 192), torch.bfloat16, "edge_lengths", {}),
    "d256_thd_window_gqa": ((256, 256), torch.float16, "thd", dict(window=(37, 5), heads_q=8, heads_kv=2)),
    "d192x128_causal_br_gqa": ((192, 128), torch.bfloat16, "causal_br_sq_lt_sk", dict(heads_q=8, heads_kv=2)),
    "d168_thd_causal_gqa": ((168, 168), torch.bfloat16, "thd_causal_gqa", {}),
    "d232_padding_window": ((232, 232), torch.float16, "padding", dict(window=(40, 3))),
    "d160x96_thd_br_window_sinks": ((160, 96), torch.bfloat16, "thd_br_window_sinks", {}),
}
DETERMINISTIC = ("d192_edge_causal", "d256_thd_window_gqa", "d192x128_causal_br_gqa", "d232_padding_window")


def _case(direction: str, name: str, **more) -> Case:
    dims, dtype, feature, extra = CASES[name]
    return gpu_cases.case(direction, feature, dtype, dims, **{**extra, **more})


def _flavor(case: Case) -> tuple:
    from frost.kernels.sm80.config import FLAVORS, flavor_for

    flavor = flavor_for(case.head_dim_qk, case.dim_v)
    qk, v = FLAVORS[flavor]
    return flavor, case.head_dim_qk < qk, case.dim_v < v


def _compiled(cache) -> set:
    return {(key[1].flavor, getattr(key[1], "partial_hdim_qk", None), getattr(key[1], "partial_hdim_v", None))
            for key in cache.keys()}


def _assert_sm80(case: Case, direction: str):
    from frost.kernels.sm80 import compile as sm80_compile

    result = check(case, directions=(direction,))
    engine = FWD_ENGINE if direction == "forward" else BWD_ENGINE
    assert result.decisions[direction].engine == engine, result.describe()
    assert result.passed, result.describe()
    flavor, partial_qk, partial_v = _flavor(case)
    cache = sm80_compile.FWD_CACHE if direction == "forward" else sm80_compile.BWD_CACHE
    assert (flavor, partial_qk, partial_v) in _compiled(cache), (flavor, _compiled(cache))


@pytest.mark.parametrize("name", list(CASES))
def test_hdim_fwd_matches_oracle(name):
    _assert_sm80(_case("forward", name), "forward")


@pytest.mark.parametrize("name", list(CASES))
def test_hdim_bwd_matches_oracle(name):
    _assert_sm80(_case("backward", name), "backward")


@pytest.mark.parametrize("name", DETERMINISTIC)
def test_hdim_bwd_deterministic_matches_oracle_and_is_bitwise_stable(name):
    """The deterministic default (dQ reduced in order) for the wide flavors; the harness runs it
    twice and compares bits."""
    _assert_sm80(_case("backward", name, deterministic=True), "backward")


def _engine():
    from frost import dispatch

    return next(e for e in dispatch.engines("backward") if e.name == BWD_ENGINE)


def test_hdim_bwd_recompute_deterministic_matches_oracle(monkeypatch):
    """The deterministic mode's other way (dQ recomputed per query block by bwd_dq) on d192x128."""
    from frost.kernels.sm80 import compile as sm80_compile
    from frost.kernels.sm80.config import BwdDqParams

    monkeypatch.setattr(_engine(), "dq_recompute", True)
    case = dataclasses.replace(_case("backward", "d168_thd_causal_gqa"), head_dim_qk=192, head_dim_v=128,
                               deterministic=True)
    _assert_sm80(case, "backward")
    assert any(isinstance(k[1], BwdDqParams) and k[1].flavor == "d192x128"
               for k in sm80_compile.BWD_CACHE.keys())


def test_hdim_bwd_wide_dq_reductions_match_oracle(monkeypatch):
    """dQ reduced 4 floats at a time (red.global.add.v4.f32, SM90) into the d256 accumulator."""
    from frost.kernels.sm80 import compile as sm80_compile
    from frost.kernels.sm80.config import BwdParams

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("red.global.add.v4.f32 needs an SM90 device")
    monkeypatch.setattr(_engine(), "dq_reduce_width", 4)
    _assert_sm80(_case("backward", "d256_thd_window_gqa"), "backward")
    assert any(isinstance(k[1], BwdParams) and k[1].dq_reduce_width == 4 and k[1].flavor == "d256"
               for k in sm80_compile.BWD_CACHE.keys())
