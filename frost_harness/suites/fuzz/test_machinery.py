"""The fuzz machinery itself: strategies, limits, the identity rule, replay, budget, profiles.

Each property gets a planted bug it must catch, so none of them passes vacuously.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
import time
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings

import frost.engines.native as native
import frost.engines.unfused_math as unfused_math
from frost_harness.fuzz import budget, catalog, compare, identities, limits, profiles, replay, runs, strategies
from frost_harness.fuzz import plugin as fuzz_plugin
from frost_harness.fuzz.failures import PropertyFailure, reproduce_command
from frost_harness.oracle import tolerance
from frost_harness.reports import records
from frost_harness.suites.harness import Case, make_inputs

pytestmark = pytest.mark.L0


@pytest.fixture
def planted(monkeypatch):
    """A planted bug's failures are this test's expectation, not report rows."""
    monkeypatch.setattr(records, "add", lambda row: None)
    return monkeypatch

THD = dict(layout="thd", lengths_q=(5, 0, 9), lengths_k=(7, 3, 0), tail_q=2, tail_k=1)
# one problem per property that it checks on both directions on the CPU engines
PROBLEMS = {
    "forward_matches_oracle": Case(bias="B1", causal=True),
    "backward_matches_oracle": Case(sinks=True, heads_q=4, heads_kv=2),
    "deterministic_backward_is_bitwise": Case(heads_q=4, heads_kv=2, causal=True),
    "routing_is_stable": Case(),
    "packed_equals_per_sequence_and_padded": Case(**THD, bias="B1", sinks=True, heads_q=4, heads_kv=2),
    "gqa_equals_repeated_kv": Case(heads_q=8, heads_kv=2, sinks=True, window=(3, 2)),
    "batch_permutation": Case(batch=3, lengths_q=(24, 3, 11), lengths_k=(0, 24, 9), bias="BH", sinks=True),
    "sink_equals_zero_value_key": Case(sinks=True, bias="1H", window=(3, 1), heads_q=4, heads_kv=2),
    "row_shift_changes_nothing": Case(**THD, bias="11", heads_q=4, heads_kv=1),
    "causal_prefix_ignores_later_keys": Case(causal=True, causal_align="bottom_right", seqlen_q=16, seqlen_k=28),
}


def _features(case: Case) -> set[str]:
    problem = runs.problem_of(make_inputs(case), "forward")
    tags = set(problem.features)
    if case.layout == "thd":
        tags |= {"zero-length sequence"} if 0 in case.lengths_q + case.lengths_k else set()
        tags |= {"rows past cu_seqlens"} if case.tail_q or case.tail_k else set()
    if problem.seqlen_q != problem.seqlen_k:
        tags.add("Sq > Sk" if problem.seqlen_q > problem.seqlen_k else "Sq < Sk")
    tags |= {"head dim not a multiple of 8"} if case.head_dim_qk % 8 or case.dim_v % 8 else set()
    tags |= {"-inf bias"} if case.bias and case.bias_holes else set()
    tags |= {"large sinks"} if case.sinks and case.sink_scale >= 20 else set()
    tags |= {"fp16"} if case.dtype == torch.float16 else {"bf16"}
    tags |= {"scale 0"} if case.scale == 0 else {"negative scale"} if (case.scale or 0) < 0 else set()
    return tags


def test_strategies_draw_valid_problems_covering_the_contract():
    """300 derandomized draws: frost validates each one, and every feature of SEMANTICS.md shows up."""
    seen = collections.Counter()

    @settings(max_examples=300, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(case=strategies.cases("cpu"))
    def draw(case):
        seen.update(_features(case))

    draw()
    wanted = {"thd", "padding", "gqa", "mqa", "causal", "bottom_right", "window", "bias", "sinks", "rope",
              "dqk_ne_dv", "strided", "zero-length sequence", "rows past cu_seqlens", "Sq > Sk", "Sq < Sk",
              "head dim not a multiple of 8", "-inf bias", "large sinks", "fp16", "bf16", "scale 0",
              "negative scale"}  # fmt: skip
    assert wanted <= set(seen), f"never drawn: {wanted - set(seen)}"


@settings(max_examples=15, derandomize=True, database=None, deadline=None)
@given(case=strategies.cases("gpu"))
def test_gpu_regime_draws_valid_problems(case):
    """The gpu regime's problems pass frost's validation (checked on CPU tensors of the same sizes)."""
    assert runs.problem_of(make_inputs(dataclasses.replace(case, device="cpu")), "forward").device == "cpu"


def test_every_drawn_backward_problem_is_judged_and_only_the_known_limit_is_exempt():
    """No strategy filters: 40 backward draws of each regime all come back, every one judges dv,
    and the only outputs left unjudged are dq, dk, dbias of problems whose rows see one key."""
    for regime in ("cpu", "gpu"):
        drawn = limits.draw(regime, 40)
        assert len(drawn) == 40
        shares = limits.measure(drawn)
        assert shares.problems == 40 and shares.judged["dv"] == 40
        assert shares.judged["dsinks"] == shares.outputs["dsinks"]
    assert runs.known_limit(make_inputs(Case(window=(0, 0)))) == {name: tolerance.ONE_KEY_REASON
                                                                  for name in ("dq", "dk", "dbias")}
    assert runs.known_limit(make_inputs(Case(window=(0, 0), sinks=True))) == {}  # the sink spreads each row
    assert runs.known_limit(make_inputs(Case(seqlen_k=1, bias="BH"))) != {}  # one key, no sink
    assert runs.known_limit(make_inputs(Case(seqlen_q=4, seqlen_k=4, heads_q=2, heads_kv=2))) == {}  # small: judged


def test_shares_count_problems_and_outputs():
    shares = limits.Shares()
    shares.add(["dq", "dk", "dv"], {})
    shares.add(["dq", "dk", "dv", "dbias"], {"dq": "why", "dk": "why", "dbias": "why"})
    assert (shares.problems, shares.fully_judged) == (2, 1)
    assert shares.judged == {"dq": 1, "dk": 1, "dv": 2} and shares.outputs["dbias"] == 1
    assert "every output judged in 1 (50.0%)" in shares.describe()


PADDED = Case(lengths_q=(10, 5), lengths_k=(7, 24), heads_q=4, heads_kv=2, causal=True, causal_align="bottom_right")


@pytest.mark.parametrize("name", ["gqa_equals_repeated_kv", "batch_permutation", "row_shift_changes_nothing",
                                  "causal_prefix_ignores_later_keys", "packed_equals_per_sequence_and_padded"])
def test_every_padded_side_of_an_identity_carries_the_poison(name):
    """SEMANTICS.md's garbage rows are NaN on both sides of every rewrite: a padded part is
    marked poisoned (so the o and lse its backward is fed are NaN there too), its padded
    q, k, v, do rows are NaN and so are its bias entries at padded positions."""
    case = Case(**THD, heads_q=4, heads_kv=2) if name.startswith("packed") else PADDED
    inputs = make_inputs(case)
    padded_parts = [part for side in identities.IDENTITIES[name].sides(case, inputs) for part in side.parts
                    if part.keywords.get("seqlens_q") is not None]
    assert padded_parts, "no side keeps the padding"
    for part in padded_parts:
        assert part.poisoned
        lengths_q, lengths_k = part.keywords["seqlens_q"].tolist(), part.keywords["seqlens_k"].tolist()
        for b, (n_q, n_k) in enumerate(zip(lengths_q, lengths_k)):
            assert part.q[b, n_q:].isnan().all() and part.do[b, n_q:].isnan().all()
            assert part.k[b, n_k:].isnan().all() and part.v[b, n_k:].isnan().all()
            bias = part.keywords.get("bias")
            if bias is not None and bias.shape[0] > 1:
                assert bias[b, :, n_q:].isnan().all() and bias[b, :, :, n_k:].isnan().all()
        _, lse = runs.rounded(runs.oracle_forward(part), part)
        assert lse[1, :, lengths_q[1]:].isnan().all()


def test_identity_rule_takes_twice_the_allowance():
    x64 = torch.linspace(-1, 1, 101, dtype=torch.float64)
    baseline = x64 + 1e-3  # allowance: 2 * (2 * 1e-3) plus two fp16 ulps
    want = x64.to(torch.float16)
    within = compare.agree({"o": x64 + 3e-3}, {"o": x64}, {"o": x64}, {"o": baseline}, io_dtype=torch.float16)
    beyond = compare.agree({"o": x64 + 1e-2}, {"o": x64}, {"o": x64}, {"o": baseline}, io_dtype=torch.float16)
    assert within["o"].passed and not beyond["o"].passed
    broken = want.clone()
    broken[3] = math.nan
    verdict = compare.agree({"o": want}, {"o": broken}, {"o": x64}, {"o": baseline}, io_dtype=torch.float16)["o"]
    assert not verdict.passed and "reference side" in verdict.note
    keep = torch.ones(101, dtype=torch.bool)
    keep[7] = False
    assert compare.bitwise(want, want.clone(), keep) == 0
    changed = want.clone()
    changed[7], changed[8] = 5.0, 5.0
    assert compare.bitwise(changed, want, keep) == 1


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_property_holds_on_the_native_engines(name):
    catalog.PROPERTIES[name](PROBLEMS[name])


def _scaled_forward(factor):
    real = unfused_math.forward

    def forward(problem, block):
        o, lse = real(problem, block)
        return o * factor, lse

    return forward


@pytest.mark.parametrize("name", [n for n in PROBLEMS if n not in ("deterministic_backward_is_bitwise",
                                                                    "routing_is_stable", "backward_matches_oracle")])
def test_property_catches_a_wrong_side(name, planted):
    """Every identity (and the oracle check) fails when one side's forward output is off by 3%."""
    if name == "forward_matches_oracle":
        planted.setattr(unfused_math, "forward", _scaled_forward(1.03))
    else:
        identity = catalog.identities.IDENTITIES[name]
        sides = identity.sides

        def skewed(case, inputs):
            built = sides(case, inputs)
            for side in built:
                back = side.back
                side.back = lambda parts, back=back: {n: (x * 1.03 if n == "o" else x) for n, x in back(parts).items()}
            return built

        planted.setitem(catalog.identities.IDENTITIES, name, dataclasses.replace(identity, sides=skewed))
        planted.setitem(catalog.PROPERTIES, name, lambda case, engine=None: catalog.identities.check_identity(
            catalog.identities.IDENTITIES[name], case, engine))  # fmt: skip
    with pytest.raises(PropertyFailure, match=f"{name} failed on engine"):
        catalog.PROPERTIES[name](PROBLEMS[name])


def test_packed_identity_catches_padding_ignored(planted):
    """A planted engine bug: the unfused engine forgets dense padding's key lengths."""
    real = native._blocks

    def blocks(problem, tensors):
        for rows_q, rows_k, index, block in real(problem, tensors):
            if rows_q is None and block.lens_k is not None:
                block = block._replace(lens_k=torch.full_like(block.lens_k, block.k.shape[1]))
            yield rows_q, rows_k, index, block

    planted.setattr(native, "_blocks", blocks)
    with pytest.raises(PropertyFailure, match="packed==padded"):
        catalog.PROPERTIES["packed_equals_per_sequence_and_padded"](PROBLEMS["packed_equals_per_sequence_and_padded"])


def test_backward_and_determinism_catch_planted_bugs(planted):
    real = unfused_math.backward

    def noisy(problem, block, do):
        grads = real(problem, block, do)
        return grads._replace(dq=grads.dq + 1e-2 * torch.rand_like(grads.dq))

    planted.setattr(unfused_math, "backward", noisy)
    with pytest.raises(PropertyFailure, match="backward_matches_oracle failed on engine 'unfused'"):
        catalog.PROPERTIES["backward_matches_oracle"](PROBLEMS["backward_matches_oracle"])
    with pytest.raises(PropertyFailure, match="two deterministic backward runs differ in dq"):
        catalog.PROPERTIES["deterministic_backward_is_bitwise"](PROBLEMS["deterministic_backward_is_bitwise"])


def test_routing_property_catches_an_empty_reason(planted):
    planted.setattr(native.TorchSdpaForward, "check_support", lambda self, problem: "")
    with pytest.raises(PropertyFailure, match="declined without a reason"):
        catalog.PROPERTIES["routing_is_stable"](PROBLEMS["routing_is_stable"])


def test_failure_prints_a_command_that_replays_it(planted, capsys):
    case = PROBLEMS["forward_matches_oracle"]
    command = reproduce_command("forward_matches_oracle", case, "unfused")
    words = re.findall(r'"[^"]*"|\S+', command)
    assert words[:4] == ["python", "-m", "frost_harness.fuzz.replay", "forward_matches_oracle"]
    assert replay.parse_case(words[4].strip('"')) == case
    planted.setattr(unfused_math, "forward", _scaled_forward(1.03))
    with pytest.raises(PropertyFailure) as failure:
        catalog.PROPERTIES["forward_matches_oracle"](case)
    assert str(failure.value).splitlines()[-1] == f"reproduce: {command}"
    assert replay.main(["forward_matches_oracle", repr(case), "--engine", "unfused"]) == 1
    planted.undo()
    assert replay.main(["forward_matches_oracle", repr(case)]) == 0
    assert "holds" in capsys.readouterr().out
    with pytest.raises(ValueError, match="not a Case repr"):
        replay.parse_case("__import__('os')")


def test_budget_shares_chunks_and_seeds():
    run = budget.Budget(until=time.time() + 100.0, seed=7, worker="gw1")
    seeds = {run.chunk_seed(test, chunk) for test in ("a", "b") for chunk in range(3)}
    assert len(seeds) == 6 and run.chunk_seed("a", 0) == budget.Budget(0.0, 7, "gw1").chunk_seed("a", 0)
    assert run.chunk_seed("a", 0) != budget.Budget(0.0, 7, "gw0").chunk_seed("a", 0)
    run.start_test(tests_left=4)
    assert 24.0 < run.share_end - time.time() <= 25.0
    budget.activate(run)
    try:
        run.start_chunk()
        run.share_end = time.time() - 1.0  # spent before the first example: it still runs
        budget.example_started()
        budget.example_finished()
        with pytest.raises(budget.ShareSpent):
            budget.example_started()
        budget.example_failed()  # after a failure the shrinker may replay: no stop
        budget.example_started()
        budget.example_finished()
        assert run.examples == 2 and run.examples_total == 2
        run.failed = False
        with budget.suspended():  # a single run (a fuzz test without @given): no share ends it, nothing counts
            budget.example_started()
            budget.example_finished()
        assert run.examples == 2 and run.examples_total == 2 and budget.active() is run
        with pytest.raises(budget.ShareSpent):
            budget.example_started()
    finally:
        budget.activate(None)


def test_profile_selection(monkeypatch):
    def configure(**options):
        config = SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))
        fuzz_plugin.pytest_configure(config)
        return settings.default

    try:
        assert configure().max_examples == 50 and settings.default.derandomize
        monkeypatch.setenv(profiles.ENV, "dev")
        assert configure().max_examples == 100
        assert configure(frost_profile="nightly").max_examples == 200
        # with Hypothesis's own --hypothesis-profile, frost's plugin leaves the choice to Hypothesis
        assert configure(hypothesis_profile="ci").max_examples == 200
    finally:
        profiles.load("ci")
    with pytest.raises(ValueError, match="unknown fuzz profile"):
        profiles.load("weekly")


@pytest.mark.L0
def test_gpu_regime_draws_band_edges_on_tile_boundaries():
    """Sequence ends, bottom-right offsets and window sides at -1/0/+1 modulo 64 and 128 come
    by design, not by luck: a third or more of the dense GPU-regime draws hold one."""
    from hypothesis import HealthCheck, given, settings

    from frost_harness.fuzz import strategies

    drawn = {"all": 0, "edge": 0, "window": 0}

    @settings(max_examples=300, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(case=strategies.cases("gpu"))
    def draw(case):
        if case.layout == "thd":
            return
        drawn["all"] += 1
        values = (case.seqlen_q, case.seqlen_k, abs(case.seqlen_k - case.seqlen_q))
        windows = [w for w in case.window if w >= 0]
        drawn["edge"] += any(v in strategies.TILE_EDGES for v in (*values, *windows))
        drawn["window"] += any(w in strategies.TILE_EDGES for w in windows)

    draw()
    assert drawn["edge"] >= drawn["all"] / 3, drawn
    assert drawn["window"] > 0, drawn
