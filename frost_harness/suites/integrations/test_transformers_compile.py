"""``attn_implementation="frost"`` under ``torch.compile(model, fullgraph=True)``.

Each case compiles a tiny random-init decoder whose attention is frost's and runs two
training steps (forward and backward) on different inputs of the same shapes: the first
traces, the second must reuse the graph (``error_on_recompile``), and ``fullgraph=True``
makes any graph break an error. Both steps' logits and gradients are judged as in
``test_transformers.py`` (at most 2x as far from the float32 sdpa model as the bf16 sdpa
model is, plus a floor), the routing ledger shows which frost problems served the calls
(padding, packing, window, sinks), and no call fell back.

The backend is ``aot_eager``: it traces forward and backward through AOTAutograd (frost's
fake implementations, the autograd formula) as inductor does, without inductor's C++
compile of every graph on the CPU. On the CPU frost's native engines serve the calls.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import pytest
import torch

transformers = pytest.importorskip("transformers")

from frost.dispatch import ledger  # noqa: E402
from frost.integrations import transformers as adapter  # noqa: E402  (registers "frost")
from frost_harness.suites.integrations.test_transformers import (  # noqa: E402,F401  (_fresh_fallbacks: autouse)
    BF16, VOCAB, _config, _fresh_fallbacks, _frost_forwards, _models, _run, assert_like_sdpa,
)  # fmt: skip


class Step(NamedTuple):
    ids: torch.Tensor
    kwargs: dict


class CompileCase(NamedTuple):
    config: Callable  # () -> a transformers config
    steps: Callable  # (step number) -> Step
    served: Callable  # (frost's forward Problem) -> whether it is the expected one
    reference: str = "sdpa"  # the implementation frost is judged against (eager where sdpa is not offered)


def _padded(batch: int, seqlen: int, lengths_of_step, left: bool = False):
    def step(n: int) -> Step:
        ids = torch.randint(1, VOCAB, (batch, seqlen), generator=torch.Generator().manual_seed(30 + n))
        mask = torch.ones_like(ids)
        for row, length in enumerate(lengths_of_step[n]):
            if left:
                mask[row, : seqlen - length] = 0
            else:
                mask[row, length:] = 0
        # the loss reads the logits of row t - 1 for label t: a padded row predicts no label
        predicted = torch.nn.functional.pad(mask[:, :-1], (1, 0), value=1) * mask
        return Step(ids, dict(attention_mask=mask, labels=ids.masked_fill(predicted == 0, -100)))

    return step


def _packed(lengths_of_step, flash_kwargs: bool):
    """One row of several sequences with restarting position_ids (sdpa reads those), and with
    ``flash_kwargs`` also DataCollatorWithFlattening's ``cu_seq_lens_*`` / ``max_length_*``."""
    def step(n: int) -> Step:
        lengths = lengths_of_step[n]
        ids = torch.randint(1, VOCAB, (1, sum(lengths)), generator=torch.Generator().manual_seed(40 + n))
        starts = torch.tensor([0, *lengths]).cumsum(0)
        labels = ids.clone()
        labels[0, starts[:-1]] = -100  # no prediction across a sequence boundary
        # use_cache=False: with a cache transformers' sdpa does not read position_ids as packing
        kwargs = dict(position_ids=torch.cat([torch.arange(n) for n in lengths])[None], labels=labels,
                      use_cache=False)  # fmt: skip
        if flash_kwargs:
            cu = starts.to(torch.int32)
            kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
        return Step(ids, kwargs)

    return step


def _plain(batch: int, seqlen: int):
    def step(n: int) -> Step:
        ids = torch.randint(1, VOCAB, (batch, seqlen), generator=torch.Generator().manual_seed(50 + n))
        return Step(ids, dict(use_cache=False))

    return step


def _qwen2_sliding():
    return transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, use_sliding_window=True, sliding_window=5,
        max_window_layers=0, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip


def _gemma():
    return transformers.GemmaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                    max_position_embeddings=256)  # fmt: skip


def _gpt_oss():
    return transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=2, num_experts_per_tok=1, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256,
    )  # fmt: skip


CASES = {
    "llama-right-padding": pytest.param(
        CompileCase(_config, _padded(3, 20, [(20, 13, 4), (9, 20, 17)]), lambda p: p.has_seqlens and p.causal),
        marks=pytest.mark.L0),
    "llama-packed-position-ids": pytest.param(
        CompileCase(_config, _packed([(5, 9, 6), (7, 3, 10)], flash_kwargs=False),
                    lambda p: p.layout == "thd" and p.batch == 3 and p.total_q == 20),
        marks=pytest.mark.L0),
    "llama-causal": pytest.param(
        CompileCase(_config, _plain(2, 24), lambda p: p.layout == "bshd" and p.causal and not p.has_seqlens),
        marks=pytest.mark.L1),
    "llama-left-padding": pytest.param(  # a 2-D mask is padding wherever it lies (valid tokens kept in order)
        CompileCase(_config, _padded(2, 16, [(16, 11), (7, 16)], left=True), lambda p: p.has_seqlens),
        marks=pytest.mark.L1),
    "llama-packed-flash-kwargs": pytest.param(
        CompileCase(_config, _packed([(5, 9, 6), (9, 6, 5)], flash_kwargs=True),
                    lambda p: p.layout == "thd" and p.seqlen_q == 9),
        marks=pytest.mark.L1),
    "mistral-sliding-window-padding": pytest.param(
        CompileCase(lambda: _config("mistral", sliding_window=5), _padded(2, 24, [(24, 17), (20, 24)]),
                    lambda p: p.window_left == 4 and p.window_right == 0 and p.has_seqlens),
        marks=pytest.mark.L1),
    "qwen2-sliding-layers": pytest.param(
        CompileCase(_qwen2_sliding, _plain(2, 16), lambda p: p.window_left in (4, -1) and p.causal),
        marks=pytest.mark.L1),
    "gemma": pytest.param(
        CompileCase(_gemma, _padded(2, 16, [(16, 10), (12, 16)]), lambda p: p.has_seqlens and p.heads_kv == 1),
        marks=pytest.mark.L1),
    "gpt-oss-sinks": pytest.param(
        CompileCase(_gpt_oss, _plain(2, 16), lambda p: p.has_sinks and p.window_left in (5, -1), "eager"),
        marks=pytest.mark.L1),
}


def _compiled(model, **options):
    torch.compiler.reset()
    return torch.compile(model, fullgraph=True, **({"backend": "aot_eager"} | options))


def _on(device: str, step: Step) -> Step:
    return Step(step.ids.to(device), {k: v.to(device) if isinstance(v, torch.Tensor) else v
                                      for k, v in step.kwargs.items()})  # fmt: skip


def _check_compiled_steps(case: CompileCase, device: str = "cpu", **options) -> None:
    """Two training steps of the compiled frost model: one graph, no break, no recompile, each
    step's logits and gradients judged against the reference implementation's."""
    copies = ((case.reference, torch.float32), (case.reference, BF16), ("frost", BF16))
    ref, sdpa, frost_model = (model.to(device) for model in _models(case.config(), copies=copies))
    compiled = _compiled(frost_model, **options)
    counters = torch._dynamo.utils.counters
    counters.clear()
    for n in range(2):
        ids, kwargs = _on(device, case.steps(n))
        mark = ledger.mark()
        with torch._dynamo.config.patch(error_on_recompile=n > 0):  # the second step reuses the graph
            got = _run(compiled, ids, **kwargs)
        problems = _frost_forwards(mark)
        assert len(problems) == 2 and all(case.served(p) for p in problems), [p.describe() for p in problems]
        expected, reference = _run(sdpa, ids, **kwargs), _run(ref, ids, **kwargs)
        if kwargs.get("attention_mask") is not None:  # padded rows: what the loss ignores may differ
            rows = kwargs["attention_mask"].bool()
            got, expected, reference = ((x[0][rows], x[1]) for x in (got, expected, reference))
        assert_like_sdpa(got[0], expected[0], reference[0], f"step {n} logits")
        assert_like_sdpa(got[1], expected[1], reference[1], f"step {n} gradients")
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch.compiler.reset()
    assert not adapter.fallbacks()


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_fullgraph_training_steps_match_sdpa(case):
    if case.config is _gpt_oss and not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no gpt-oss")
    _check_compiled_steps(case)


# An open finding, judged and expected to fail (strict: a fix shows as XPASS and fails until the mark
# goes). On an H100 (torch 2.11, transformers 5.17) the tiny gpt-oss model's logits are 0.26 from the
# float32 eager model with frost's sm80 kernels serving its two attention calls, eager as compiled
# (bf16 eager: 0.0046; frost's unfused engine on the same calls: 0.0047), while sdpa_fwd_sm80 matches
# the unfused engine on the same problems with random q / k / v (D16, H4/2, window (5, 0) and causal,
# sinks, q and k transposed BHSD views); the cause is not found yet.
GPT_OSS_ON_SM80 = pytest.mark.xfail(strict=True, reason="gpt-oss with sinks on the sm80 kernels: logits off (open)")
GPU_CASES = ("llama-causal", "llama-right-padding", "llama-packed-flash-kwargs", "llama-packed-position-ids",
             "mistral-sliding-window-padding", pytest.param("gpt-oss-sinks", marks=GPT_OSS_ON_SM80))  # fmt: skip


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_CASES)
def test_fullgraph_inductor_on_cuda(name):
    """The same on CUDA with inductor, the calls served by frost's SM80 kernels (or, on SM90, by
    torch-cudnn where it ranks first)."""
    case = CASES[name].values[0]
    if case.config is _gpt_oss and not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no gpt-oss")
    _check_compiled_steps(case, "cuda", backend="inductor")


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama-causal", "llama-packed-flash-kwargs"])
def test_compiled_step_replays_as_a_cuda_graph(name):
    """``torch.compile(mode="reduce-overhead")``: forward and backward captured in CUDA graphs
    (inductor skipped none) and replayed on new inputs with the losses of the default mode."""
    case = CASES[name].values[0]
    (frost_model,) = (m.cuda() for m in _models(case.config(), copies=(("frost", BF16),)))
    steps = [_on("cuda", case.steps(n % 2)) for n in range(3)]
    plain = _compiled(frost_model, backend="inductor")
    expected = [_run(plain, ids, **kwargs)[0] for ids, kwargs in steps]
    graphed = _compiled(frost_model, backend="inductor", mode="reduce-overhead")
    counters = torch._dynamo.utils.counters
    counters.clear()
    for (ids, kwargs), logits in zip(steps, expected):  # cudagraph trees: warm up, record, replay
        torch.compiler.cudagraph_mark_step_begin()
        torch.testing.assert_close(_run(graphed, ids, **kwargs)[0], logits, rtol=0, atol=0)
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    torch.compiler.reset()


@pytest.mark.L1
def test_fullgraph_symbolic_longest_sequence():
    """With dynamic shapes a packed batch's ``max_length_q/k`` reach frost as symbolic sizes (the
    ops' SymInt arguments): a new packing compiles no new graph."""
    (frost_model,) = _models(_config(), copies=(("frost", BF16),))
    torch.compiler.reset()
    compiled = torch.compile(frost_model, fullgraph=True, backend="aot_eager", dynamic=True)
    steps = _packed([(5, 9, 6), (7, 3, 10), (2, 4, 14)], flash_kwargs=True)
    for n in range(3):
        ids, kwargs = steps(n)
        with torch._dynamo.config.patch(error_on_recompile=n > 0):
            got = _run(compiled, ids, **kwargs)
        torch.testing.assert_close(got[0], _run(frost_model, ids, **kwargs)[0], rtol=0, atol=0)
    torch.compiler.reset()
    assert not adapter.fallbacks()


@pytest.mark.L1
def test_fullgraph_fallback_builds_sdpas_mask():
    """A call frost does not serve (a float32 model outside autocast) falls back to sdpa inside
    the compiled graph, with the mask transformers' sdpa builder would have made (here: padding
    and causal, built on the device from the 2-D padding mask), and the reason is counted."""
    sdpa, frost_model = _models(_config(), copies=(("sdpa", torch.float32), ("frost", torch.float32)))
    ids, kwargs = _padded(2, 12, [(12, 7)])(0)
    got = _run(_compiled(frost_model), ids, **kwargs)
    torch.compiler.reset()
    expected = _run(sdpa, ids, **kwargs)
    rows = kwargs["attention_mask"].bool()
    # float32 throughout; the two masks select the same keys, the kernels may sum in another order
    torch.testing.assert_close(got[0][rows], expected[0][rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-4, atol=1e-6)
    assert len(adapter.fallbacks()) == 1 and "float32 outside autocast" in next(iter(adapter.fallbacks()))
