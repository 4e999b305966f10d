"""CPU: head dims up to 256 on the SM80 engines (flavors d192x128, d192, d256).

Lowering only, no GPU: every pair of head dims the Capabilities row admits (multiples
of 8 up to 256) lowers to valid records of the forward and of every kernel of the
backward chain, on a flavor whose tiles cover it; the validators name the rules the
wide tiles can break; the backward workspace sizes dK and dV partials by their own
tiles; packed token totals and sequence counts stay dynamic for a flavor whose Q/K and
V tiles differ. (The compile sweep of every admitted record is test_fwd_compile.py and
test_bwd_compile.py, over ``frost.kernels.sm80.space``.)
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import cutlass  # noqa: F401  (a hard dependency: a missing DSL fails these suites, it does not skip them)

from frost.engines import sm80
from frost.engines.sm80 import SM80_CAPABILITIES, Sm80Backward, Sm80Forward
from frost.kernels.sm80 import compile as sm80_compile
from frost.kernels.sm80 import config
from frost.kernels.sm80.config import (
    FLAVORS, BwdConvertParams, BwdDqParams, BwdPreParams, bwd_params_for, flavor_for, fwd_params_for,
)
from frost.problem import Problem

pytestmark = [pytest.mark.L0, pytest.mark.usefixtures("cpu_target")]
MASKS = dict(window_left=-1, window_right=0, bottom_right=False)


@pytest.mark.parametrize("dims, flavor", [
    ((64, 64), "d64"), ((128, 128), "d128"), ((192, 128), "d192x128"), ((160, 96), "d192x128"),
    ((136, 8), "d192x128"), ((128, 136), "d192"), ((192, 192), "d192"), ((168, 168), "d192"),
    ((200, 8), "d256"), ((8, 200), "d256"), ((256, 256), "d256"), ((264, 8), None), ((8, 264), None),
])
def test_flavor_for_picks_the_narrowest_covering_tiles(dims, flavor):
    assert flavor_for(*dims) == flavor


def test_every_admitted_head_dim_pair_lowers_on_a_covering_flavor():
    """The row's promise (multiples of 8 up to max_head_dim) and the records agree, both directions,
    default and deterministic mode."""
    assert SM80_CAPABILITIES.max_head_dim == max(max(tiles) for tiles in FLAVORS.values()) == 256
    step = SM80_CAPABILITIES.head_dim_multiple
    for dqk in range(step, 257, step):
        for dv in range(step, 257, step):
            fwd = fwd_params_for(dtype="bfloat16", head_dim_qk=dqk, head_dim_v=dv, layout="thd", has_seqlens=False,
                                 has_sinks=False, **MASKS)
            records = [fwd]
            for deterministic in (False, True):
                main = bwd_params_for(dtype="bfloat16", head_dim_qk=dqk, head_dim_v=dv, layout="thd",
                                      has_seqlens=False, deterministic=deterministic, **MASKS)
                last = BwdDqParams.of(main) if deterministic else BwdConvertParams.of(main)
                pre = BwdPreParams(dtype="bfloat16", flavor=main.flavor, partial_hdim_v=main.partial_hdim_v,
                                   layout="thd", has_seqlens=False, has_sinks=True,
                                   accum_tile_m=0 if deterministic else main.tile_m)
                records += [main, last.validate(), pre.validate()]
            for p in records:
                assert p.flavor == flavor_for(dqk, dv)
                assert dqk <= p.tile_hdim_qk and dv <= p.tile_hdim_v, (dqk, dv, p)
                for field, dim, tile in (("partial_hdim_qk", dqk, p.tile_hdim_qk),
                                         ("partial_hdim_v", dv, p.tile_hdim_v)):
                    if hasattr(p, field):
                        assert getattr(p, field) == (dim < tile), (field, dqk, dv, p)


def test_wide_flavor_tile_policy():
    """The tiles chosen for the wide flavors (config.FWD_TILES / BWD_TILES), and their shared memory."""
    for flavor, want in (("d192x128", (128, 64, 8)), ("d192", (128, 64, 8)), ("d256", (64, 64, 4))):
        qk, v = FLAVORS[flavor]
        for window_right in (-1, 0):
            p = fwd_params_for(dtype="float16", head_dim_qk=qk, head_dim_v=v, layout="bshd", has_seqlens=False,
                               window_left=-1, window_right=window_right, bottom_right=False, has_sinks=False)
            assert (p.tile_m, p.tile_n, p.num_warps) == want
            assert p.heavy_first == (window_right >= 0)
    smem = {"d192x128": 136 * 1024, "d192": 160 * 1024, "d256": 208 * 1024}
    for flavor, want in smem.items():
        qk, v = FLAVORS[flavor]
        main = bwd_params_for(dtype="float16", head_dim_qk=qk, head_dim_v=v, layout="bshd", has_seqlens=False,
                              deterministic=False, **MASKS)
        assert (main.tile_m, main.tile_n, main.num_warps, main.warps_m_sdp, main.warps_n_dkv,
                main.warps_m_dq) == (64, 64, 8, 4, 2, 2)
        assert main.smem_bytes() == want <= config.SMEM_BYTES_MAX


def _main(flavor: str, **change):
    qk, v = FLAVORS[flavor]
    main = bwd_params_for(dtype="float16", head_dim_qk=qk, head_dim_v=v, layout="bshd", has_seqlens=False,
                          deterministic=False, **MASKS)
    return dataclasses.replace(main, **change)


@pytest.mark.parametrize("record, rule", [
    (lambda: dataclasses.replace(
        fwd_params_for(dtype="float16", head_dim_qk=256, head_dim_v=256, layout="bshd", has_seqlens=False,
                       has_sinks=False, **MASKS), tile_m=128, tile_n=192, num_warps=8), "shared memory"),
    (lambda: _main("d256", tile_n=128), "shared memory"),
    (lambda: _main("d192x128", warps_n_dkv=8), "warps_n_dkv=8 does not tile 64x"),
    (lambda: _main("d192", warps_m_dq=1), "warps_m_dq=1 does not tile 64x192"),
    (lambda: dataclasses.replace(BwdDqParams.of(_main("d256")), tile_n=256), "shared memory"),
])
def test_wide_tiles_that_do_not_fit_name_the_rule(record, rule):
    with pytest.raises(ValueError, match=rule):
        record().validate()


def test_forward_refuses_a_v_tile_wider_than_the_qk_tile(monkeypatch):
    """The forward stages O in Q's shared memory: a flavor with a wider V tile would overrun it."""
    d128 = fwd_params_for(dtype="float16", head_dim_qk=128, head_dim_v=128, layout="bshd", has_seqlens=False,
                          has_sinks=False, **MASKS)
    monkeypatch.setitem(config.FLAVORS, "d128x192", (128, 192))
    with pytest.raises(ValueError, match="tile_hdim_v must not exceed tile_hdim_qk"):
        dataclasses.replace(d128, flavor="d128x192").validate()


def _problem(direction: str, q, k, v, **kw):
    extra = {}
    if direction == "backward":
        o = torch.randn(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        lse = torch.zeros(q.shape[-2], q.shape[0]) if "cu_seqlens_q" in kw else torch.zeros(
            q.shape[0], q.shape[2], q.shape[1])
        extra = dict(o=o, do=o, lse=lse)
    return Problem.from_call(direction, q, k, v, **extra, **kw)


def test_split_workspace_sizes_dk_and_dv_partials_by_their_own_tiles():
    q = torch.randn(2, 300, 8, 160, dtype=torch.bfloat16)
    k = torch.randn(2, 300, 1, 160, dtype=torch.bfloat16)
    v = torch.randn(2, 300, 1, 96, dtype=torch.bfloat16)
    problem = _problem("backward", q, k, v, causal=True)
    (pre, main, last, combine), splits = Sm80Backward(split=4)._chain(problem)
    assert combine.tile_hdim_qk == 192 and combine.tile_hdim_v == 128
    assert main.flavor == "d192x128" and main.split_group and splits == 4
    assert isinstance(last, BwdConvertParams) and last.tile_hdim_qk == 192
    parts = dict(sm80._Workspace(problem, splits, pre, main).parts)
    assert parts["dk_partial"] == (4, 2, 300, 1, 192) and parts["dv_partial"] == (4, 2, 300, 1, 128)
    assert parts["dq_accum"] == (2, 8, 5 * 64 * 192)


def _packed(direction: str, lengths, dqk=192, dv=128):
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(total + 5, 4, dqk, dtype=torch.bfloat16)
    k = torch.randn(total + 3, 2, dqk, dtype=torch.bfloat16)
    v = torch.randn(total + 3, 2, dv, dtype=torch.bfloat16)
    return _problem(direction, q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)


def test_thd_token_totals_and_sequence_counts_reuse_one_artifact_for_d192x128():
    """Compiles the forward and the default backward chain of d192x128 once; other packed token
    totals and numbers of sequences are served by the same artifacts."""
    fwd, bwd = Sm80Forward(), Sm80Backward()  # compile() needs no GPU; check_support would decline on CPU
    fwd.compile(_packed("forward", [96, 160]))
    plan = bwd.compile(_packed("backward", [96, 160]))
    assert all(p.flavor == "d192x128" and (p.tile_hdim_qk, p.tile_hdim_v) == (192, 128) for p in plan.params)
    keys = {key[1] for key in sm80_compile.BWD_CACHE.keys()}
    assert set(plan.params) <= keys  # the artifacts compiled for it are keyed by exactly those records
    before = sm80_compile.FWD_CACHE.stats(), sm80_compile.BWD_CACHE.stats()
    for lengths in ([64, 256], [64, 100, 30]):
        fwd.compile(_packed("forward", lengths))
        bwd.compile(_packed("backward", lengths))
    after = sm80_compile.FWD_CACHE.stats(), sm80_compile.BWD_CACHE.stats()
    assert [a.compiles for a in after] == [b.compiles for b in before], "a new token total or sequence count recompiled"
    assert after[0].hits == before[0].hits + 2 and after[1].hits == before[1].hits + 2 * len(plan.params)
