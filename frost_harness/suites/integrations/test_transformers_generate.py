"""``model.generate()`` with ``attn_implementation="frost"``: every step served by frost.

Tiny random-init decoders (Llama with GQA, Qwen2 with sliding-window layers, Mistral's sliding
window, Gemma with MQA, gpt-oss with sinks and sliding layers) generate greedily from a batch of
prompts, left-padded to one length or not, with transformers' dynamic cache (its default) and its
static cache (``cache_implementation="static"``), eagerly and with the decoding step compiled as
transformers compiles it (``compile_config``; also ``model.forward`` compiled by the caller, with
the dynamic cache). Each case asserts:

- the routing ledger holds one frost forward per attention layer and step (prefill and every
  decoding step) and nothing fell back (``fallbacks()`` empty); left padding reached frost as
  -inf in a bias;
- on the CPU, frost's greedy tokens are the reference implementation's (sdpa, or eager for
  gpt-oss's sinks): the reference generates along frost's tokens (``_Follow``) and its greedy
  choice at every step is frost's;
- every step's logits, judged as in ``test_transformers.py``: at most 2x as far from the float32
  reference (generated along the same tokens) as the reference implementation in frost's dtype
  is, plus a floor of two units in the last place;
- compiled: no graph break (``fullgraph=True``) and no recompile from one decoding step to the
  next (the model's own static sliding-window cache excepted: transformers keeps its length in a
  Python int that dynamo guards on, so it adds one graph, with sdpa as with frost).

Why float16 on the CPU (not float32 or bfloat16): frost computes in float16 / bfloat16, so a
float32 model falls back by design; in bfloat16 the two implementations' roundings move these
tiny models' logits by more than their top-two margins often enough to flip a greedy token
(measured on a tiny Llama, 12 seeds, 8 steps: 2 seeds flipped one in bfloat16; none in float16,
where the smallest top-two margin was 1.5 times the largest logit difference, the median 44).
On the GPU (bfloat16, frost's kernels against torch's) the tokens are judged through the logit
rule alone, for the same reason: along frost's tokens, a step's logits within the rule leave a
token different from the reference's only where the reference's own top two logits are that
close.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import pytest
import torch

transformers = pytest.importorskip("transformers")

from frost.dispatch import ledger  # noqa: E402
from frost.integrations import transformers as adapter  # noqa: E402  (registers "frost")
from frost_harness.suites.integrations.test_transformers import (  # noqa: E402,F401  (_fresh_fallbacks: autouse)
    BF16, VOCAB, _config, _fresh_fallbacks, _frost_forwards, _models, assert_like_sdpa,
)  # fmt: skip
from frost_harness.suites.integrations.test_transformers_compile import (  # noqa: E402
    GPT_OSS_ON_SM80, _gemma, _gpt_oss, _qwen2_sliding,
)  # fmt: skip

FP16 = torch.float16
STEPS = 6  # tokens generated: the prefill and five decoding steps
PROMPT_LENGTHS = (12, 7, 10)  # left-padded to the longest; prompts longer than the models' windows


class Model(NamedTuple):
    config: Callable  # () -> a transformers config
    reference: str = "sdpa"  # the implementation frost is judged against (eager where sdpa ignores sinks)
    sliding: bool = False  # some layers slide a window: a static cache's length is a Python int (see above)


MODELS = {
    "llama": Model(_config),
    "qwen2-sliding-layers": Model(_qwen2_sliding, sliding=True),
    "mistral-sliding-window": Model(lambda: _config("mistral", sliding_window=5), sliding=True),
    "gemma": Model(_gemma),
    "gpt-oss-sinks": Model(_gpt_oss, "eager", sliding=True),
}


class Generated(NamedTuple):
    tokens: torch.Tensor  # [B, STEPS]
    logits: torch.Tensor  # [B, STEPS, vocab] float32, each step's before any processing


class _Follow(transformers.LogitsProcessor):
    """Makes generate() choose ``tokens`` [B, STEPS] (another model's greedy choices), so that two
    implementations' logits are compared along one sequence of tokens."""

    def __init__(self, tokens: torch.Tensor, prompt_length: int):
        self.tokens, self.prompt_length = tokens, prompt_length

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_length
        return torch.full_like(scores, float("-inf")).scatter(1, self.tokens[:, step : step + 1], 0.0)


def _prompt(padded: bool, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention_mask) of three prompts, left-padded (token 0 is the pad) or all full.

    Their seed gives every case clear greedy choices: the reference's smallest top-two margin over
    all steps is 8.7 times the largest logit difference between the two implementations (float16,
    CPU, every model, cache and padding here). Of 12 seeds tried, 7 had a near-tie below 2 times
    (two an exact tie), where the greedy token is decided by rounding rather than by attention."""
    longest = max(PROMPT_LENGTHS)
    ids = torch.randint(1, VOCAB, (len(PROMPT_LENGTHS), longest), generator=torch.Generator().manual_seed(70))
    mask = torch.ones_like(ids)
    if padded:
        for row, length in enumerate(PROMPT_LENGTHS):
            mask[row, : longest - length] = 0
        ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


def _generate(model, prompt, cache: str, follow: torch.Tensor | None = None, compile_config=None) -> Generated:
    ids, mask = prompt
    processors = transformers.LogitsProcessorList([] if follow is None else [_Follow(follow, ids.shape[1])])
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=STEPS, do_sample=False, pad_token_id=0, eos_token_id=None,
        cache_implementation=None if cache == "dynamic" else cache, compile_config=compile_config,
        logits_processor=processors, output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    return Generated(out.sequences[:, ids.shape[1] :], torch.stack(out.logits, dim=1).float())


def _compile_config(backend: str) -> transformers.CompileConfig:
    """transformers' own compilation of the decoding step, graph breaks made errors."""
    if backend == "aot_eager":  # traces forward as inductor does, without inductor's C++ builds on the CPU
        config = transformers.CompileConfig(fullgraph=True, backend=backend, mode=None)
        config._compile_all_devices = True  # transformers compiles on accelerators only unless told (its tests do this)
        return config
    return transformers.CompileConfig(fullgraph=True, backend=backend, mode="reduce-overhead")  # CUDA graphs


def _assert_greedy_like(got: Generated, expected: Generated) -> None:
    """frost's tokens are the reference's greedy choices, step by step along frost's tokens."""
    choices = expected.logits.argmax(dim=-1)
    for row, step in (choices != got.tokens).nonzero().tolist():
        top = expected.logits[row, step].topk(2).values
        difference = (got.logits[row, step] - expected.logits[row, step]).abs().max()
        pytest.fail(f"row {row} step {step}: frost chose {int(got.tokens[row, step])}, the reference "
                    f"{int(choices[row, step])} (its top-two margin {float(top[0] - top[1]):.3g}, the two "
                    f"implementations' largest logit difference {float(difference):.3g})")  # fmt: skip


def _check_generation(name: str, cache: str, padded: bool, device: str = "cpu", dtype=FP16,
                      compile_backend: str | None = None) -> None:  # fmt: skip
    case = MODELS[name]
    if case.config is _gpt_oss and not hasattr(transformers, "GptOssConfig"):
        pytest.skip("this transformers has no gpt-oss")
    copies = ((case.reference, torch.float32), (case.reference, dtype), ("frost", dtype))
    ref, baseline, frost_model = (m.to(device) for m in _models(case.config(), copies=copies))
    prompt = _prompt(padded, device)
    compile_config = None if compile_backend is None else _compile_config(compile_backend)
    counters = torch._dynamo.utils.counters
    if compile_config is not None:
        torch.compiler.reset()
        counters.clear()
    mark = ledger.mark()
    # a full-attention model's decoding step compiles once; a recompile is an error naming its guard
    with torch._dynamo.config.patch(error_on_recompile=compile_config is not None and not case.sliding):
        got = _generate(frost_model, prompt, cache, compile_config=compile_config)
    problems = _frost_forwards(mark)
    layers = frost_model.config.num_hidden_layers
    if compile_config is not None and compile_config.mode == "reduce-overhead":
        # CUDA graphs: the prefill and the steps that warm up and record the graph run frost's
        # Python; the steps after replay the recorded kernels and leave no ledger entry
        assert layers * 2 <= len(problems) <= layers * STEPS, [p.describe() for p in problems]
        assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    else:
        assert len(problems) == layers * STEPS, [p.describe() for p in problems]
    assert not adapter.fallbacks()
    assert all(p.dtype == dtype for p in problems)
    if padded:  # the prompts' padding: keys no query sees, given to frost as -inf in a bias
        assert any(p.bias is not None for p in problems), [p.describe() for p in problems]
    if compile_config is not None:
        assert not counters["graph_break"], dict(counters["graph_break"])
        assert counters["stats"]["unique_graphs"] == (2 if case.sliding and cache == "static" else 1)
        torch.compiler.reset()
    _judge(got, baseline, ref, prompt, cache, exact_tokens=device == "cpu")


def _judge(got: Generated, baseline, ref, prompt, cache: str, exact_tokens: bool) -> None:
    """frost's generation against the reference implementation in frost's dtype (``baseline``) and
    in float32 (``ref``), both generating along frost's tokens: the same greedy tokens
    (``exact_tokens``), and every step's logits within the rule of ``assert_like_sdpa``."""
    expected = _generate(baseline, prompt, cache, follow=got.tokens)
    reference = _generate(ref, prompt, cache, follow=got.tokens)
    if exact_tokens:
        _assert_greedy_like(got, expected)
    assert_like_sdpa(got.logits, expected.logits, reference.logits, "logits", baseline.dtype)


CACHES = ("dynamic", "static")
PADDING = pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])


@pytest.mark.L0
@PADDING
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("name", MODELS)
def test_generate_matches_reference(name, cache, padded):
    _check_generation(name, cache, padded)


@pytest.mark.L0
@PADDING
def test_compiled_static_cache_decoding(padded):
    """transformers compiles the decoding step (static cache): one graph for every step, no break."""
    _check_generation("llama", "static", padded, compile_backend="aot_eager")


@pytest.mark.L1
@PADDING
@pytest.mark.parametrize("name", ["gpt-oss-sinks", "qwen2-sliding-layers", "gemma"])
def test_compiled_static_cache_decoding_models(name, padded):
    _check_generation(name, "static", padded, compile_backend="aot_eager")


@pytest.mark.L1
def test_compiled_forward_with_dynamic_cache():
    """``model.forward`` compiled by the caller, with transformers' default (dynamic) cache: the
    prefill and the decoding steps trace without a graph break, in as many graphs as sdpa's model
    (the growing cache recompiles the step until dynamo makes its length symbolic)."""
    copies = (("sdpa", torch.float32), ("sdpa", FP16), ("frost", FP16))
    ref, baseline, frost_model = _models(_config(), copies=copies)
    prompt = _prompt(True, "cpu")
    counters = torch._dynamo.utils.counters
    graphs = []
    for model in (baseline, frost_model):
        model.forward = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
        torch.compiler.reset()
        counters.clear()
        mark = ledger.mark()
        got = _generate(model, prompt, "dynamic")
        del model.forward  # the class's forward again
        assert not counters["graph_break"], dict(counters["graph_break"])
        graphs.append(counters["stats"]["unique_graphs"])
    torch.compiler.reset()
    problems = _frost_forwards(mark)  # frost's model ran last
    assert len(problems) == frost_model.config.num_hidden_layers * STEPS and not adapter.fallbacks()
    assert graphs[1] == graphs[0], f"frost's model compiled {graphs[1]} graphs, sdpa's {graphs[0]}"
    _judge(got, baseline, ref, prompt, "dynamic", exact_tokens=True)


@pytest.mark.L1
def test_compiled_decoding_fallback_keeps_the_cache_mask():
    """A decoding step frost does not serve (a float32 model outside autocast), compiled: it falls
    back inside the graph to sdpa with the 4-D mask transformers built for the step, as given, and
    generates sdpa's tokens."""
    sdpa, frost_model = _models(_config(), copies=(("sdpa", torch.float32), ("frost", torch.float32)))
    prompt = _prompt(True, "cpu")
    torch.compiler.reset()
    got = _generate(frost_model, prompt, "static", compile_config=_compile_config("aot_eager"))
    torch.compiler.reset()
    expected = _generate(sdpa, prompt, "static", follow=got.tokens)
    assert torch.equal(got.tokens, expected.logits.argmax(dim=-1))
    # float32 throughout, the same masks; the compiled and the eager graph may round in another order
    torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
    assert list(adapter.fallbacks()) == ["dtype torch.float32 outside autocast (frost computes in float16 / "
                                         "bfloat16, one dtype for q, k, v)"]  # fmt: skip


GPU_MODELS = ("llama", "mistral-sliding-window", "gemma", pytest.param("gpt-oss-sinks", marks=GPT_OSS_ON_SM80))


@pytest.mark.L0
@pytest.mark.gpu
@PADDING
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("name", GPU_MODELS)
def test_generate_on_cuda(name, cache, padded):
    """The same in bfloat16 on CUDA, the calls served by frost's kernels; judged by the logit rule."""
    _check_generation(name, cache, padded, "cuda", BF16)


@pytest.mark.L0
@pytest.mark.gpu
@PADDING
def test_compiled_static_cache_decoding_on_cuda(padded):
    """transformers' default compilation of the decoding step on CUDA: inductor and CUDA graphs."""
    _check_generation("llama", "static", padded, "cuda", BF16, compile_backend="inductor")
