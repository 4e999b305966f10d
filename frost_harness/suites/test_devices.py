"""Device profiles (frost/devices.py): the named parts, a profile read from torch's device
properties, which profile a plan is made for (forced by the API or FROST_DEVICE_PROFILE, else the
device's own, else the H100's for a CPU problem), and whether a GPU can run another part's records."""
from __future__ import annotations

import dataclasses
import types

import pytest
import frost
from frost import devices
from frost.engines.base import Engine

pytestmark = pytest.mark.L0


@pytest.fixture(autouse=True)
def _no_forced_profile(monkeypatch):
    """Each test starts with no profile forced and the environment unread; the one before is restored."""
    before = devices._forced
    monkeypatch.delenv(devices.ENV, raising=False)
    devices._forced = devices._UNSET
    yield
    devices._forced = before


def test_named_profiles_carry_the_parts_figures():
    """The figures the plans depend on, for the parts named in the tile policy's comments."""
    expected = {  # name: (compute capability, opt-in smem per block, SMs, sm90)
        "a100": ((8, 0), 166_912, 108, False), "a30": ((8, 0), 166_912, 56, False),
        "a10": ((8, 6), 101_376, 72, False), "rtx3090": ((8, 6), 101_376, 82, False),
        "l4": ((8, 9), 101_376, 58, False), "rtx4090": ((8, 9), 101_376, 128, False),
        "h100": ((9, 0), 232_448, 132, True), "h200": ((9, 0), 232_448, 132, True),
    }
    for name, (cc, smem, sms, sm90) in expected.items():
        part = devices.named(name)
        assert (part.compute_capability, part.smem_per_block_optin, part.sm_count, part.sm90) == (cc, smem, sms, sm90)
        assert part.arch == ("sm_90" if sm90 else "sm_80")
    assert {"a40", "a6000", "l40s"} <= set(devices.PROFILES)
    assert devices.named("L4") is devices.PROFILES["l4"]  # names are case-insensitive
    with pytest.raises(ValueError, match="'b300' is not known; known: a100"):
        devices.named("b300")


def test_a_profile_from_torch_device_properties():
    props = types.SimpleNamespace(
        name="NVIDIA L4", major=8, minor=9, shared_memory_per_block_optin=101_376,
        shared_memory_per_multiprocessor=102_400, multi_processor_count=58, L2_cache_size=48 << 20,
        max_threads_per_multi_processor=1536, regs_per_multiprocessor=65536,
    )
    part = devices.from_properties(props)
    assert part == dataclasses.replace(devices.named("l4"), name="NVIDIA L4")


def test_plans_are_made_for_the_forced_profile_else_the_device_else_the_h100(monkeypatch):
    a10 = devices.named("a10")
    monkeypatch.setattr(devices, "of_device", lambda device: a10)  # the "GPU" at hand
    assert devices.profile_for("cpu") is devices.named("h100")
    assert devices.profile_for("cuda:0") is a10
    generation = Engine.generation
    with devices.profile("l4") as forced:
        assert forced is devices.named("l4") and Engine.generation > generation  # kept plans go stale
        assert devices.profile_for("cpu") is forced and devices.profile_for("cuda:0") is forced
    assert devices.forced() is None and devices.profile_for("cuda:0") is a10
    assert devices.use(devices.named("a100")) is None and devices.forced() is devices.named("a100")


def test_the_environment_forces_a_profile_read_at_the_first_plan(monkeypatch):
    monkeypatch.setenv(devices.ENV, "rtx4090")
    assert devices.profile_for("cpu") is devices.named("rtx4090")
    monkeypatch.setenv(devices.ENV, "a30")  # read once: a later change of the variable is not seen
    assert devices.profile_for("cpu") is devices.named("rtx4090")
    devices.use(None)  # the API wins over the environment
    assert devices.profile_for("cpu") is devices.named("h100")
    devices._forced = devices._UNSET
    monkeypatch.setenv(devices.ENV, "tpu")
    with pytest.raises(ValueError, match="'tpu' is not known"):
        devices.profile_for("cpu")


def test_a_gpu_runs_another_parts_records_only_where_its_memory_and_instructions_cover_them():
    h100, a100, l4 = (devices.named(n) for n in ("h100", "a100", "l4"))
    assert h100.runs_on(h100) is None and a100.runs_on(h100) is None and l4.runs_on(h100) is None
    assert l4.runs_on(a100) is None
    assert "166912 B of shared memory per block; l4 allows 101376 B" in a100.runs_on(l4)
    assert "SM90 instructions, which a100 lacks" in h100.runs_on(a100)


def test_frost_exports_the_profile_switch():
    assert frost.device_profile is devices.profile and frost.use_device_profile is devices.use
