"""The GPU fuzz searches instead of compiling (issue 14): a finite pool of record classes, every
drawn problem's kernels inside the pool's records, the prewarm building exactly those, the
throughput lines, and shrinking held to the budget.

Everything runs on the CPU: a GPU-regime Case is built with CPU tensors of the same sizes,
its Problem moved to ``cuda:0`` and the SM80 engines asked as on an H200 (compute
capability 9.0, 132 SMs), so ``check_support`` and ``Engine.records`` answer as there;
nothing is compiled or launched.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import time

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

import frost.engines.sm80 as sm80
from frost import dispatch
from frost_harness.fuzz import budget, nightly, pool, prewarm, runs, strategies
from frost_harness.fuzz.identities import IDENTITIES
from frost_harness.reports import fuzzlog
from frost_harness.suites.harness import make_inputs

pytestmark = pytest.mark.L0

ALL_MODES = (("forward", False), ("backward", False), ("backward", True))
SIDE_MODES = ALL_MODES[:2]  # the identities run the forward and the default backward


@pytest.fixture
def as_on_an_h200(as_device):
    as_device("h200")
    if not sm80._dsl_installed():
        pytest.skip("the SM80 engines decline everything without the CuTe DSL")


@pytest.fixture
def small_pool():
    """A pool other than the default one (with RoPE in a class), active while the test draws."""
    classes = pool.sample(20261203, 4)
    assert any(c.rope for c in classes)
    pool.activate(classes)
    yield classes
    pool.activate(None)


def test_the_pool_is_finite_and_meets_every_demand():
    every = pool.space()
    kinds = {(c.flavor, c.partial_qk, c.partial_v) for c in every}
    assert len(every) == len(set(every)) == (len(pool.DTYPES) * len(kinds) * len(pool.LAYOUTS) * len(pool.MASKS)
                                             * len(pool.BIASES) * 4)  # fmt: skip
    assert {flavor for flavor, _, _ in kinds} == {"d64", "d128"}  # head dims up to 128
    for seed in (0, 1, 20261202001):
        chosen = pool.sample(seed, 6)
        assert chosen == pool.sample(seed, 6) and len(set(chosen)) == len(chosen)
        assert 6 <= len(chosen) <= 6 + pool.PER_DEMAND * len(pool.demands())
        for demand in pool.demands():
            assert sum(pool.matches(c, demand) for c in chosen) >= pool.PER_DEMAND, demand
    assert pool.sample(1, 6) != pool.sample(2, 6)
    roped = [c for seed in range(20) for c in pool.sample(seed, 6) if c.rope is not None]
    assert roped and all(c.rope in c.head_dims_qk() for c in roped)
    assert pool.parse_spec("7:3") == (7, 3) and pool.parse_spec("7") == (7, pool.DEFAULT_SIZE)
    with pytest.raises(ValueError, match="SEED:SIZE"):
        pool.parse_spec("seven")
    # a sample's records are fewer than those of more classes (the whole pool's: a minute on a CPU)
    records = pool.records(pool.sample(0))
    assert len(records) == len(set(records)) and set(records) < set(pool.records(pool.sample(0) + pool.sample(1)))


def _records_inside(inputs, modes, allowed: set, accepted: collections.Counter) -> None:
    """Every record an engine that accepts these inputs on an H200 would compile is in ``allowed``."""
    for direction, deterministic in modes:
        problem = dataclasses.replace(runs.problem_of(inputs, direction, deterministic=deterministic), device="cuda:0")
        for engine in dispatch.engines(direction):
            if engine.check_support(problem) is None:
                accepted[engine.name] += 1
                outside = set(engine.records(problem)) - allowed
                assert not outside, f"{problem.describe()} compiles {outside}, outside the pool"


@pytest.mark.parametrize("name", [None, *IDENTITIES])
def test_every_drawn_gpu_problem_compiles_inside_the_pool(name, as_on_an_h200, small_pool):
    """Draws of the gpu strategies (plain, and each identity's with its rewritten sides) meet
    only the pool's records, come from its classes, and hold NaN in their unread rows."""
    identity = IDENTITIES.get(name)
    allowed = set(pool.records(small_pool))
    accepted = collections.Counter()

    @settings(max_examples=25, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=strategies.backward_cases("gpu", **(identity.draws if identity else {})))
    def draw(case):
        assert case.device == "cuda" and case.poison
        inputs = make_inputs(dataclasses.replace(case, device="cpu"))
        assert inputs.poisoned
        _unread_rows_are_nan(case, inputs)
        _records_inside(inputs, ALL_MODES, allowed, accepted)
        for side in identity.sides(case, inputs) if identity else ():
            for part in side.parts:
                _records_inside(part, SIDE_MODES, allowed, accepted)

    draw()
    assert accepted["sdpa_fwd_sm80"] and accepted["sdpa_bwd_sm80"], f"the SM80 engines took no draw: {accepted}"


def _unread_rows_are_nan(case, inputs) -> None:
    if case.layout == "thd":
        assert inputs.q[sum(case.lengths_q):].isnan().all() and inputs.k[sum(case.lengths_k):].isnan().all()
    elif case.lengths_q is not None:
        for b, (n_q, n_k) in enumerate(zip(case.lengths_q, case.lengths_k)):
            assert inputs.q[b, n_q:].isnan().all() and inputs.v[b, n_k:].isnan().all()


def test_each_class_draws_problems_of_that_class_varying_the_rest(small_pool):
    """A pool of one class draws problems of exactly that class (what frost reads from them: a
    bounded side stays below the longest extent, which frost would read as no bound), and the
    sizes, head dims and window widths still vary under it."""
    for cls in small_pool:
        pool.activate((cls,))
        seen = set()

        @settings(max_examples=20, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(case=strategies.cases("gpu"))
        def draw(case):
            p = runs.problem_of(make_inputs(dataclasses.replace(case, device="cpu")), "forward")
            facts = (p.dtype, _layout(case), p.window_left >= 0, p.window_right >= 0, p.causal_align == "bottom_right",
                     p.has_sinks, p.bias and p.bias.dtype, p.has_rope, p.heads_kv < p.heads_q)  # fmt: skip
            assert facts == (cls.torch_dtype, cls.layout, cls.left, cls.right, cls.bottom_right, cls.sinks,
                             cls.bias_dtype, cls.rope is not None, cls.grouped)  # fmt: skip
            if p.head_dim_qk % 8 == 0 and p.head_dim_v % 8 == 0:  # else a problem the native engines alone take
                assert cls.admits_head_dims(p.head_dim_qk, p.head_dim_v), (p.head_dim_qk, p.head_dim_v)
                assert cls.rope in (None, p.head_dim_qk)
            seen.add((p.seqlen_q, p.seqlen_k, p.head_dim_qk, p.window_left))

        draw()
        assert len(seen) > 10, (cls, seen)


def _layout(case) -> str:
    return "thd" if case.layout == "thd" else "padded" if case.lengths_q is not None else "dense"


def test_a_constraint_no_class_meets_is_an_error_not_a_compile(small_pool):
    pool.activate(tuple(c for c in small_pool if c.layout != "thd"))
    with pytest.raises(ValueError, match="no record class of the pool"):
        find(strategies.cases("gpu", layout="thd"), lambda case: True)
    with pytest.raises(ValueError, match="draws .*dtype"):
        find(strategies.cases("gpu", dtype=None), lambda case: True)


def test_prewarm_builds_exactly_the_pools_records(monkeypatch, tmp_path):
    built = []

    def build_records(records, jobs=1, arch=None):
        built.append((list(records), jobs))
        return {"compiled": len(records) - 3, "present": 3, "failed": 0}

    from frost.kernels import prebuild

    monkeypatch.setattr(prebuild, "build_records", build_records)
    monkeypatch.setenv("FROST_CACHE_DIR", str(tmp_path / "elsewhere"))
    args = argparse.Namespace(cache_dir=tmp_path / "cache", no_prewarm=False, prewarm_jobs=3)
    cache_dir, facts = nightly._prepare_cache(args, "17:5")
    assert cache_dir == tmp_path / "cache"
    ((records, jobs),) = built
    assert records == pool.records(pool.sample(17, 5)) and jobs == 3
    assert facts["records"] == len(records) and facts["present"] == 3 and facts["classes"] == len(pool.sample(17, 5))
    command = nightly.pytest_command("gpu", 2, tmp_path, 100.0, 1, [], shrink_until=110.0, pool="17:5",
                                     cache_dir=cache_dir)  # fmt: skip
    assert {"--frost-fuzz-pool=17:5", f"--frost-cache-dir={cache_dir}", "--frost-fuzz-shrink-until=110.000"} <= set(
        command)
    monkeypatch.setenv("FROST_DISK_CACHE", "0")
    line = prewarm.prewarm(pool.sample(17, 5), jobs=1).line()
    assert line.startswith("no prewarm: the disk cache is disabled") and len(built) == 1


def test_throughput_lines_parse():
    oracle = "s/test_oracle.py::test_forward_matches_oracle_gpu"
    permutation = "s/test_identities.py::test_identity_gpu[batch_permutation]"
    chunks = fuzzlog.frame([
        {"test_id": oracle, "worker": "gw0", "examples": 600, "seconds": 60},
        {"test_id": oracle, "worker": "gw1", "examples": 400, "seconds": 60},
        {"test_id": permutation, "worker": "gw0", "examples": 500, "seconds": 60},
    ])  # fmt: skip
    text = "\n".join(f"frost-fuzz: {line}" for line in fuzzlog.throughput_lines(chunks, wall_seconds=60.0))
    assert fuzzlog.parse_throughput(text) == {"overall": 1500.0, "forward_matches_oracle": 1000.0,
                                              "batch_permutation": 500.0}  # fmt: skip
    assert "(1000 checked; 500/min per worker while it ran)" in text
    assert fuzzlog.parse_throughput(fuzzlog.throughput_lines(fuzzlog.frame([]), 30.0)[0]) == {"overall": 0.0}
    assert fuzzlog.property_of("x.py::test_routing_is_stable") == "routing_is_stable"


def test_shrinking_stops_at_the_budgets_shrink_deadline():
    """A failure found near the end shrinks only until ``shrink_until``: unbounded, this shrink
    (30 distinct values among 40, 20 ms an example) took 26 s. Judged examples are counted."""
    active = budget.Budget(until=time.time() + 60, seed=1, worker="main", shrink_until=time.time() + 2.0)
    budget.activate(active)
    calls = []

    @settings(max_examples=200, database=None, deadline=None, derandomize=True, phases=[Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)  # fmt: skip
    @given(values=st.lists(st.integers(0, 10**6), min_size=40))
    def slow_failure(values):
        budget.example_started()
        time.sleep(0.02)
        calls.append(time.time())
        budget.example_finished()
        if len(set(values)) >= 30:
            budget.example_failed()
            raise AssertionError("too many distinct values")

    started = time.time()
    try:
        active.start_chunk()
        with pytest.raises(AssertionError, match="too many distinct values"):
            slow_failure()
    finally:
        budget.activate(None)
    elapsed = time.time() - started
    assert elapsed < 2.0 + 1.5, f"shrinking ran {elapsed:.1f} s, past a 2 s deadline"
    assert active.examples_total == len(calls) > 10
    from hypothesis.internal.conjecture import engine

    assert engine.MAX_SHRINKING_SECONDS == budget.SHRINK_SECONDS_DEFAULT  # restored for everyone else
    assert math.isclose(nightly.SHRINK_SLACK, 0.10)
    assert Phase.explain not in settings.get_profile("nightly").phases  # it would run past the deadline
