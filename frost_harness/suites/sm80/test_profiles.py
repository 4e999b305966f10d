"""The SM80 engines' records fit every named device (frost/devices.py), on a CPU.

For each profile (the test id names it), the records the engines select under it, over the L0 GPU
grid's problems and a wide grid (every flavor x mode (default, deterministic, recompute) x
feature: bias staged or read, broadcast or not, without dbias; GQA split, MQA; THD, padding;
windows, bottom-right; sinks; RoPE; head dims below their tiles), must fit the profile's opt-in
shared memory per block and use no instruction the part lacks; L1 also compiles each distinct
record for the profile's architecture. A problem no backward tile fits is declined with a
reason that names the shared memory.
"""
from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch

from frost import devices
from frost.engines.sm80 import Sm80Backward, Sm80Forward
from frost.problem import BiasSpec, Problem, prepare
from frost_harness.suites.harness import make_inputs
from frost_harness.suites.sm80 import gpu_cases

PROFILES = tuple(devices.PROFILES)
FLAVOR_DIMS = {"d64": (64, 64), "d128": (128, 128), "d192x128": (192, 128), "d192": (192, 192), "d256": (256, 256)}
PARTIAL_DIMS = {"d64": (40, 48), "d128": (96, 72), "d192x128": (160, 96), "d192": (168, 168), "d256": (232, 232)}

BASE = Problem(
    direction="backward", layout="bshd", dtype=torch.bfloat16, device="cpu", batch=2, seqlen_q=1000, seqlen_k=1000,
    total_q=None, total_k=None, heads_q=8, heads_kv=8, head_dim_qk=64, head_dim_v=64, scale=0.125, causal=False,
    causal_align="top_left", window_left=-1, window_right=-1, has_seqlens=False, bias=None, has_sinks=False,
    has_rope=False, deterministic=False, strided=False, vector_aligned=True,
)
CAUSAL = dict(causal=True, window_right=0)
FEATURES = {  # name -> Problem fields
    "plain": {},
    "causal": CAUSAL,
    "bottom_right": dict(CAUSAL, causal_align="bottom_right", seqlen_q=300),
    "window": dict(window_left=100, window_right=20),
    "window_left": dict(window_left=100),
    "padding": dict(CAUSAL, has_seqlens=True),
    "thd": dict(CAUSAL, layout="thd", total_q=1700, total_k=1700, batch=3),
    "sinks": dict(has_sinks=True),
    "rope": dict(CAUSAL, has_rope=True),
    "gqa_split": dict(CAUSAL, heads_q=8, heads_kv=2, batch=1),
    "mqa": dict(heads_q=8, heads_kv=1, batch=1, seqlen_q=4000, seqlen_k=4000),
    "bias_f32": dict(bias=BiasSpec((2, 8, 1000, 1000), torch.float32)),
    "bias_f32_broadcast": dict(CAUSAL, bias=BiasSpec((1, 8, 1000, 1000), torch.float32)),
    "bias_io_broadcast": dict(bias=BiasSpec((1, 1, 1000, 1000), torch.bfloat16)),
    "bias_no_grad": dict(bias=BiasSpec((2, 8, 1000, 1000), torch.float32, grad=False)),
}
MODES = {"default": (dict(), dict()), "deterministic": (dict(deterministic=True), dict()),
         "recompute": (dict(deterministic=True), dict(dq_recompute=True))}


def wide_grid():
    """(id, problem, backward engine settings): every flavor x mode x feature, full and partial head dims."""
    for (flavor, dims), mode, (feature, fields), partial in itertools.product(
            FLAVOR_DIMS.items(), MODES, FEATURES.items(), (False, True)):
        problem_fields, engine = MODES[mode]
        dqk, dv = PARTIAL_DIMS[flavor] if partial else dims
        problem = dataclasses.replace(BASE, head_dim_qk=dqk, head_dim_v=dv, **problem_fields, **fields)
        yield f"{flavor}{'-partial' if partial else ''}-{mode}-{feature}", problem, engine


def l0_grid():
    """The L0 GPU grid's cases (gpu_cases: features, bias, wide head dims) as CPU problems, default
    and deterministic."""
    from frost_harness.suites.sm80.test_hdim_gpu import CASES as HDIM_CASES

    cases = [gpu_cases.case("backward", f, dtype, dims) for f, dtype, dims in map(_values, gpu_cases.l0_grid("backward"))]
    cases += [gpu_cases.bias_case(f, dtype, dims, io) for f, dtype, dims, io in gpu_cases.bias_grid()]
    cases += [gpu_cases.case("backward", feature, dtype, dims, **extra) for dims, dtype, feature, extra in HDIM_CASES.values()]
    for case in cases:
        inputs = make_inputs(dataclasses.replace(case, device="cpu", poison=False))
        problem, _ = prepare("forward", inputs.q, inputs.k, inputs.v, **inputs.keywords)
        for deterministic in (False, True):  # the records read facts only: the forward's, as a backward
            yield dataclasses.replace(problem, direction="backward", deterministic=deterministic), {}


def _values(param):
    return param.values if hasattr(param, "values") else param


def selected_records(profile: devices.DeviceProfile, grids) -> set:
    """Every record the engines select under ``profile`` for the problems of ``grids``."""
    records = set()
    with devices.profile(profile):
        for problem, engine in grids:
            records.update(Sm80Forward().records(dataclasses.replace(problem, direction="forward",
                                                                      deterministic=False)))
            records.update(Sm80Backward(**engine).records(problem))
    return records


@pytest.fixture(scope="module")
def l0_problems():
    return list(l0_grid())


def _fits(record, profile: devices.DeviceProfile) -> bool:
    from frost.kernels.sm80.compile import arch_number, min_arch

    record.validate()  # a ValueError names the rule a record breaks
    smem = record.smem_bytes() if hasattr(record, "smem_bytes") else 0
    return smem <= profile.smem_per_block_optin and arch_number(min_arch(record)) <= arch_number(profile.arch)


@pytest.mark.L0
@pytest.mark.parametrize("name", PROFILES)
def test_profile_records_fit(name, l0_problems):
    """Every record selected under the profile over the L0 grid and the wide grid fits its shared
    memory and instructions (L1 compiles them: ``test_profile_records_compile``; the compile sweeps
    build the space of every device class, frost/kernels/sm80/space.py)."""
    profile = devices.named(name)
    wide = [(problem, engine) for _, problem, engine in wide_grid()]
    records = selected_records(profile, l0_problems) | selected_records(profile, wide)
    misfits = [r for r in records if not _fits(r, profile)]
    assert not misfits, f"{name}: {len(misfits)} records do not fit, e.g. {misfits[0]}"


@pytest.mark.L1
@pytest.mark.parametrize("name", PROFILES)
def test_profile_records_compile(name, l0_problems):
    """Each distinct record selected under the profile compiles for its architecture."""
    from frost.kernels.sm80.compile import compile_record

    profile = devices.named(name)
    wide = [(problem, engine) for _, problem, engine in wide_grid()]
    for record in sorted(selected_records(profile, l0_problems) | selected_records(profile, wide), key=repr):
        compile_record(record, profile.arch)


@pytest.mark.L0
def test_a_problem_no_backward_tile_fits_is_declined_naming_the_shared_memory(monkeypatch):
    """A part with 48 KiB per block: the backward of d256 fits no tile there, and the engine says so
    (the forward of d64 still fits)."""
    from frost.engines import sm80

    small = dataclasses.replace(devices.named("a10"), name="small", smem_per_block_optin=48 * 1024)
    monkeypatch.setattr(devices, "of_device", lambda device: devices.named("h100"))
    monkeypatch.setattr(sm80, "_dsl_installed", lambda: True)
    problem = dataclasses.replace(BASE, device="cuda:0", head_dim_qk=256, head_dim_v=256)
    with devices.profile(small):
        reason = Sm80Backward().check_support(problem)
        assert reason is not None and "shared memory" in reason and "49152 B" in reason and "d256" in reason, reason
        d64 = dataclasses.replace(problem, direction="forward", head_dim_qk=64, head_dim_v=64)
        assert Sm80Forward().check_support(d64) is None
