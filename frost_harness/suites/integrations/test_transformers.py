"""transformers' ``attn_implementation="frost"`` (``frost.integrations.transformers``).

Tiny random-init models (built from a config, never downloaded) run with "frost" and with
"sdpa" on the same weights and inputs, and the adapter's reading of transformers' own
masks is checked at the attention-function level. Each test also asserts how frost served
the calls (the routing ledger: padding as seqlens, packing as THD, the window), so a
silent fallback to sdpa cannot pass for success, and the fallback tests assert the
reason is logged once and the result is sdpa's, bit for bit.

Tolerance: SEMANTICS.md's acceptance rule, applied to whole models. The reference is the
same model in float32 with sdpa; frost's bf16 logits and gradients may be at most 2x as
far from it as sdpa's bf16 ones are (worst element and L2), plus a floor of two bf16
units in the last place at the reference's magnitude. Why not equality with sdpa: both
compute attention in float32 (frost's CPU engines on float32 copies of the bf16 inputs,
torch's CPU flash kernel with float32 accumulation) and round to bf16, but the roundings
differ in the last place and spread through the layers. Measured on the padded Llama
case: logits error 4.05e-3 (frost) vs 4.15e-3 (sdpa) at magnitude 0.66; gradients
1.0e-3 vs 0.9e-3.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

from frost.dispatch import ledger  # noqa: E402
from frost.integrations import transformers as adapter  # noqa: E402  (registers "frost")

BF16 = torch.bfloat16
VOCAB = 128
LOGGER = "frost.integrations.transformers"


def _config(kind="llama", **overrides):
    fields = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    fields.update(overrides)
    return transformers.MistralConfig(**fields) if kind == "mistral" else transformers.LlamaConfig(**fields)


def _models(config, build=None, copies=(("sdpa", torch.float32), ("sdpa", BF16), ("frost", BF16))):
    """One random init (``build(config)``, a causal LM by default), a copy per (implementation,
    dtype) of ``copies``: by default the float32 sdpa reference, bf16 sdpa and bf16 frost."""
    torch.manual_seed(0)
    base = (build or transformers.AutoModelForCausalLM.from_config)(config)
    built = []
    for impl, dtype in copies:
        model = copy.deepcopy(base).to(dtype)  # deepcopy: each copy its own config
        model.set_attn_implementation(impl)
        built.append(model)
    assert [m.config._attn_implementation for m in built] == [impl for impl, _ in copies]
    return built


def _run(model, ids, backward=True, **kwargs):
    """(logits as float32, every parameter's gradient flattened as float32)."""
    model.zero_grad(set_to_none=True)
    labels = kwargs.pop("labels", ids)
    out = model(ids, labels=labels, **kwargs)
    if not backward:
        return out.logits.detach().float(), None
    out.loss.backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
    return out.logits.detach().float(), grads


def _ulp(magnitude: float, dtype: torch.dtype) -> float:
    return 2.0 ** math.floor(math.log2(max(magnitude, 1e-30))) * torch.finfo(dtype).eps


def assert_like_sdpa(got, sdpa, ref, what, dtype=BF16):
    """frost's error against the float32 reference is at most 2x sdpa's, plus a floor (two units in
    the last place of ``dtype``, frost's, at the reference's magnitude)."""
    floor = 2 * _ulp(ref.abs().max().item(), dtype)
    err, base = (got - ref).abs().max().item(), (sdpa - ref).abs().max().item()
    assert err <= 2 * base + floor, f"{what}: max error {err:.3g} vs sdpa's {base:.3g} (floor {floor:.3g})"
    err2, base2 = (got - ref).norm().item(), (sdpa - ref).norm().item()
    floor2 = 1e-3 * floor * math.sqrt(ref.numel())
    assert err2 <= 2 * base2 + floor2, f"{what}: L2 error {err2:.3g} vs sdpa's {base2:.3g}"


def _frost_forwards(mark):
    """The forward problems frost served since ``mark``."""
    return [d.problem for d in ledger.since(mark) if d.direction == "forward"]


@pytest.fixture(autouse=True)
def _fresh_fallbacks():
    adapter.reset_fallbacks()
    yield


@pytest.mark.L0
def test_registered_for_attention_and_masks():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS["frost"] is adapter.frost_attention_forward
    # without a mask function transformers hands custom implementations no mask at all
    assert ALL_MASK_ATTENTION_FUNCTIONS["frost"] is adapter.frost_mask
    # eager calls get sdpa's own 4-D mask, which the adapter reads
    padding = torch.tensor([[True, True, False]])
    arguments = dict(batch_size=1, q_length=3, kv_length=3, attention_mask=padding)
    expected = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](**arguments)
    assert torch.equal(adapter.frost_mask(**arguments), expected)


@pytest.mark.L0
def test_causal_logits_and_grads():
    ref, sdpa, frost_model = _models(_config())
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    mark = ledger.mark()
    got = _run(frost_model, ids)
    problems = _frost_forwards(mark)
    assert len(problems) == 2 and all(p.causal and not p.has_seqlens and p.heads_kv == 2 for p in problems)
    expected, reference = _run(sdpa, ids), _run(ref, ids)
    assert_like_sdpa(got[0], expected[0], reference[0], "logits")
    assert_like_sdpa(got[1], expected[1], reference[1], "gradients")
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_right_padding_logits_and_grads():
    ref, sdpa, frost_model = _models(_config())
    ids = torch.randint(0, VOCAB, (3, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 13:] = 0
    mask[2, 4:] = 0
    kwargs = dict(attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    mark = ledger.mark()
    got = _run(frost_model, ids, **kwargs)
    problems = _frost_forwards(mark)
    assert len(problems) == 2 and all(p.has_seqlens and p.causal_align == "top_left" for p in problems)
    expected, reference = _run(sdpa, ids, **kwargs), _run(ref, ids, **kwargs)
    # every row, padded ones included: with seqlens_k alone frost's padded query rows see
    # the valid keys as transformers' do (ignoring the padding would change those rows)
    assert_like_sdpa(got[0], expected[0], reference[0], "logits")
    assert_like_sdpa(got[1], expected[1], reference[1], "gradients")
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_left_padding_logits_and_grads():
    """Left padding: the keys no query sees go to frost as -inf in a key bias (one row per
    sequence, read by every query); the padded query rows see no key and are o = 0, as sdpa's."""
    ref, sdpa, frost_model = _models(_config())
    ids = torch.randint(0, VOCAB, (3, 20), generator=torch.Generator().manual_seed(8))
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    mask[2, :16] = 0
    kwargs = dict(attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    mark = ledger.mark()
    got = _run(frost_model, ids, **kwargs)
    problems = _frost_forwards(mark)
    assert len(problems) == 2 and all(p.bias is not None and p.causal and not p.has_seqlens for p in problems)
    expected, reference = _run(sdpa, ids, **kwargs), _run(ref, ids, **kwargs)
    assert_like_sdpa(got[0], expected[0], reference[0], "logits")
    assert_like_sdpa(got[1], expected[1], reference[1], "gradients")
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_custom_4d_mask_as_a_bias():
    """A mask frost reads no structure in (a hole in a causal mask) is served whole as a bias;
    one mask row broadcast over the batch, as sdpa takes it."""
    ref, sdpa, frost_model = _models(_config())
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(7))
    mask = torch.ones(1, 1, 12, 12, dtype=torch.bool).tril()
    mask[0, 0, 7, 3] = False  # a hole: causal, but no padding or packing says it
    mark = ledger.mark()
    got = _run(frost_model, ids, attention_mask=mask)
    problems = _frost_forwards(mark)
    assert len(problems) == 2 and all(p.bias is not None and not p.causal for p in problems)
    expected, reference = _run(sdpa, ids, attention_mask=mask), _run(ref, ids, attention_mask=mask)
    assert_like_sdpa(got[0], expected[0], reference[0], "logits")
    assert_like_sdpa(got[1], expected[1], reference[1], "gradients")
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_packed_batch_matches_separate_sequences():
    ref, sdpa, frost_model = _models(_config())
    lengths = (5, 9, 6)
    ids = torch.randint(0, VOCAB, (1, sum(lengths)), generator=torch.Generator().manual_seed(3))
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    labels = ids.clone()
    labels[0, [0, 5, 14]] = -100  # no prediction across a sequence boundary
    # use_cache=False: with a cache (the default) transformers does not look for packing
    kwargs = dict(position_ids=position_ids, labels=labels, use_cache=False)
    mark = ledger.mark()
    got = _run(frost_model, ids, **kwargs)
    problems = _frost_forwards(mark)
    assert len(problems) == 2 and all(p.layout == "thd" and p.total_q == sum(lengths) for p in problems)
    expected, reference = _run(sdpa, ids, **kwargs), _run(ref, ids, **kwargs)
    # the logits against each sequence run alone (float32, sdpa): the packing is exact
    starts = [0, 5, 14, 20]
    separate = torch.cat([_run(ref, ids[:, a:b], backward=False, use_cache=False)[0] for a, b in zip(starts, starts[1:])], dim=1)
    assert_like_sdpa(got[0], expected[0], separate, "logits")
    assert_like_sdpa(got[1], expected[1], reference[1], "gradients")
    # and a cross-contaminated run (one sequence of 20) is far from them: the check can fail
    assert (_run(ref, ids, backward=False, use_cache=False)[0] - separate).abs().max() > 10 * (got[0] - separate).abs().max()
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_sliding_window_mistral():
    ref, sdpa, frost_model = _models(_config("mistral", sliding_window=5))
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    kwargs = dict(attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    mark = ledger.mark()
    got = _run(frost_model, ids, **kwargs)
    problems = _frost_forwards(mark)
    # transformers' window w keeps keys j > i - w: frost's window_left is w - 1
    assert len(problems) == 2 and all(p.window_left == 4 and p.window_right == 0 for p in problems)
    expected, reference = _run(sdpa, ids, **kwargs), _run(ref, ids, **kwargs)
    assert_like_sdpa(got[0], expected[0], reference[0], "logits")
    assert_like_sdpa(got[1], expected[1], reference[1], "gradients")
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_decoding_with_a_cache():
    models = _models(_config())
    generator = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, VOCAB, (2, 10), generator=generator)
    steps = torch.randint(0, VOCAB, (2, 3), generator=generator)
    logits = []
    mark = ledger.mark()
    with torch.no_grad():
        for model in models:
            # transformers 5 calls it ``cache``, earlier releases ``past_key_values`` (and ignore ``cache``)
            name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
            cached = {name: transformers.DynamicCache(config=model.config), "use_cache": True}
            outs = [model(prompt, **cached).logits[:, -1].float()]
            for t in range(steps.shape[1]):
                outs.append(model(steps[:, t : t + 1], **cached).logits[:, -1].float())
            logits.append(torch.stack(outs, dim=1))
    problems = _frost_forwards(mark)
    # one query against the cache: full attention over it, as sdpa does without a mask
    assert [p.seqlen_q for p in problems] == [10, 10, 1, 1, 1, 1, 1, 1]
    assert all(not p.causal for p in problems[2:]) and [p.seqlen_k for p in problems[2::2]] == [11, 12, 13]
    reference, expected, got = logits
    assert_like_sdpa(got, expected, reference, "logits")
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_float32_model_under_autocast():
    ref, sdpa, frost_model = _models(_config())
    sdpa.float(), frost_model.float()
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(14))
    results = []
    mark = ledger.mark()
    for model in (sdpa, frost_model):
        # RoPE's float32 tables make q and k float32 under autocast: the adapter casts them
        # to autocast's dtype, as autocast does for sdpa
        with torch.autocast("cpu", dtype=BF16):
            results.append(_run(model, ids))
    problems = _frost_forwards(mark)
    assert len(problems) == 2 and all(p.dtype == BF16 for p in problems)
    (expected, expected_grads), (got, got_grads) = results
    reference, reference_grads = _run(ref, ids)
    assert_like_sdpa(got, expected, reference, "logits")
    assert_like_sdpa(got_grads, expected_grads, reference_grads, "gradients")
    assert not adapter.fallbacks()


def _assert_falls_back(caplog, reason_part, frost_model, sdpa, ids, calls=2, seed=None, **kwargs):
    """Every call of the frost model is sdpa's, bit for bit; the reason is logged once."""
    mark = ledger.mark()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(calls):
            if seed is not None:
                torch.manual_seed(seed)
            got = _run(frost_model, ids, **kwargs)
            if seed is not None:
                torch.manual_seed(seed)
            expected = _run(sdpa, ids, **kwargs)
            assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert not _frost_forwards(mark), "frost served a call it should have left to sdpa"
    logged = [r for r in caplog.records if r.name == LOGGER]
    assert len(logged) == 1 and reason_part in logged[0].getMessage(), [r.getMessage() for r in logged]
    counts = adapter.fallbacks()
    assert len(counts) == 1 and reason_part in next(iter(counts)) and sum(counts.values()) == 2 * calls


@pytest.mark.L0
def test_fallback_output_attentions(caplog):
    _, sdpa, frost_model = _models(_config())
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(6))
    _assert_falls_back(caplog, "output_attentions", frost_model, sdpa, ids, output_attentions=True)


@pytest.mark.L0
def test_fallback_dropout_in_training(caplog):
    _, sdpa, frost_model = _models(_config(attention_dropout=0.3))
    sdpa.train(), frost_model.train()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(9))
    # the same seed before each: sdpa's dropout draws the same mask in both
    _assert_falls_back(caplog, "dropout", frost_model, sdpa, ids, seed=10)


@pytest.mark.L0
def test_fallback_float32_outside_autocast(caplog):
    _, sdpa, frost_model = _models(_config())
    sdpa.float(), frost_model.float()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(15))
    _assert_falls_back(caplog, "float32 outside autocast", frost_model, sdpa, ids, calls=1)


# --- the mask reading, at the attention-function level --------------------------------------


def _sdpa_mask(batch, q_len, kv_len, mask_function, q_offset=0, padding=None):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](
        batch_size=batch, q_length=q_len, kv_length=kv_len, q_offset=q_offset, kv_offset=0,
        mask_function=mask_function, attention_mask=padding, allow_is_causal_skip=False, device="cpu",
    )  # fmt: skip


def _padding(lengths, total, left=False):
    positions = torch.arange(total)[None]
    lengths = torch.tensor(lengths)[:, None]
    return positions >= total - lengths if left else positions < lengths


def _on_positions(mask_function, positions):
    """``mask_function`` judged on each token's position in its own sequence instead of its index
    in the packed row (what newer transformers call remap_positions_for_packed_sequence; written
    here so the cases build on every transformers the adapter supports)."""
    def remapped(batch_idx, head_idx, q_idx, kv_idx):
        return mask_function(batch_idx, head_idx, positions[batch_idx, q_idx], positions[batch_idx, kv_idx])

    return remapped


def _mask_cases():
    from transformers import masking_utils as mu

    causal = mu.causal_mask_function
    packed_ids = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2]])
    packed_positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1, 2]])
    packed = mu.and_masks(_on_positions(causal, packed_positions),
                          mu.packed_sequence_mask_function(packed_ids))  # fmt: skip
    return {
        # name: (mask, Sq, Sk, keywords for the attention function, expected plan fields or fallback reason)
        "right-padding": (_sdpa_mask(3, 8, 8, causal, padding=_padding((8, 5, 1), 8)), {},
                          dict(packed=False, causal=True, causal_align="top_left", seqlens_k=[8, 5, 1])),
        "cache-offset": (_sdpa_mask(2, 3, 10, causal, q_offset=7), {},
                         dict(packed=False, causal=True, causal_align="bottom_right", seqlens_k=None)),
        "cache-offset-padded": (_sdpa_mask(2, 3, 10, causal, q_offset=7, padding=_padding((10, 10), 10)), {},
                                dict(causal_align="bottom_right", seqlens_k=None)),
        "sliding": (_sdpa_mask(2, 12, 12, mu.sliding_window_causal_mask_function(4), padding=_padding((12, 9), 12)),
                    dict(sliding_window=4), dict(packed=False, window_left=3, seqlens_k=[12, 9])),
        "packed": (_sdpa_mask(1, 10, 10, packed), dict(position_ids=packed_positions),
                   dict(packed=True, cu_seqlens=[0, 3, 7, 10], max_seqlen=4)),
        "packed-no-hint": (_sdpa_mask(1, 10, 10, packed), {}, dict(packed=True, cu_seqlens=[0, 3, 7, 10])),
        "left-padding": (_sdpa_mask(2, 8, 8, causal, padding=_padding((8, 5), 8, left=True)), {},
                         dict(causal=True, causal_align="top_left", seqlens_k=None, bias=True)),
        "cache-left-padding": (_sdpa_mask(2, 1, 10, causal, q_offset=9, padding=_padding((10, 6), 10, left=True)),
                               {}, dict(causal=True, causal_align="bottom_right", seqlens_k=None, bias=True)),
        # a static cache's prefill: the keys past the prompts are unfilled rows
        "static-cache-left-padding": (_sdpa_mask(2, 6, 10, causal, padding=_padding((6, 4), 6, left=True)), {},
                                      dict(causal=True, causal_align="top_left", seqlens_k=[6, 6], bias=True)),
        "static-cache-decoding": (_sdpa_mask(2, 1, 10, causal, q_offset=6, padding=_padding((7, 7), 7)), {},
                                  dict(causal=True, causal_align="bottom_right", seqlens_k=[7, 7], bias=False)),
        "hole": (_sdpa_mask(2, 8, 8, mu.and_masks(causal, lambda b, h, q, kv: (q != 5) | (kv != 2))), {},
                 dict(causal=False, seqlens_k=[8, 8], bias=True)),
        "bidirectional-padded": (_sdpa_mask(2, 6, 6, mu.bidirectional_mask_function, padding=_padding((6, 4), 6)),
                                 dict(is_causal=False), dict(causal=False, seqlens_k=[6, 4])),
    }  # fmt: skip


def _qkv(batch, q_len, kv_len, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, q_len, 16, generator=generator)
    k, v = (torch.randn(batch, 2, kv_len, 16, generator=generator) for _ in range(2))
    return tuple(x.to(dtype) for x in (q, k, v))


_MODULE = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)


@pytest.mark.L0
@pytest.mark.parametrize("name", list(_mask_cases()))
def test_reads_transformers_masks(name):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    mask, keywords, expected = _mask_cases()[name]
    plan = adapter._read_mask(mask, keywords.get("sliding_window"), keywords)
    if isinstance(expected, str):
        assert isinstance(plan, str) and expected in plan
        return
    assert isinstance(plan, adapter.MaskPlan), plan
    for field, value in expected.items():
        got = getattr(plan, field)
        if field == "bias":  # whether the plan masks keys through a bias
            got = got is not None
        assert (got.tolist() if isinstance(got, torch.Tensor) else got) == value, (field, got)
    # and the served call gives sdpa's output (the rule of the module docstring)
    batch, _, q_len, kv_len = mask.shape
    q, k, v = _qkv(batch, q_len, kv_len, seed=11)
    reference = sdpa_attention_forward(_MODULE, q, k, v, mask, **keywords)[0]
    q, k, v = (x.to(BF16) for x in (q, k, v))
    mark = ledger.mark()
    got = adapter.frost_attention_forward(_MODULE, q, k, v, mask, **keywords)[0]
    assert len(_frost_forwards(mark)) == 1 and got.shape == reference.shape and got.is_contiguous()
    baseline = sdpa_attention_forward(_MODULE, q, k, v, mask, **keywords)[0]
    assert_like_sdpa(got.float(), baseline.float(), reference, name)


@pytest.mark.L0
def test_mask_forms_frost_declines():
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    per_head = causal.expand(1, 2, 6, 6).clone()
    per_head[0, 1, 5, 0] = False
    assert "per head" in adapter._read_mask(per_head, None, {})
    additive = torch.zeros(1, 1, 6, 6).masked_fill(~causal, torch.finfo(torch.float32).min)
    plan = adapter._read_mask(additive, None, {})
    assert isinstance(plan, adapter.MaskPlan) and plan.causal and plan.seqlens_k is None
    assert "bias" in adapter._read_mask(additive + 0.5, None, {})
    empty_row = additive.clone()
    empty_row[0, 0, 0, 0] = torch.finfo(torch.float32).min
    assert "fully masked" in adapter._read_mask(empty_row, None, {})


class _SinkModule(torch.nn.Module):
    """What gpt-oss's attention module offers its eager function: sinks and the GQA group."""

    num_key_value_groups = 2

    def __init__(self):
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.linspace(-1.0, 1.5, 4))


@contextlib.contextmanager
def _posing_as(model_module):
    """_SinkModule posing as ``model_module``'s attention class, for the adapter's lookup of
    the model's eager function."""
    _SinkModule.__module__ = model_module.__name__
    try:
        yield
    finally:
        _SinkModule.__module__ = __name__


@pytest.mark.L0
def test_sinks_as_gpt_oss_eager_computes_them():
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    module = _SinkModule().eval()
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool).tril()
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    results = []
    for dtype, frost_path in ((torch.float32, False), (BF16, False), (BF16, True)):
        q, k, v = (x.requires_grad_() for x in _qkv(2, 9, 9, seed=12, dtype=dtype))
        module.sinks.grad = None
        if frost_path:
            out = adapter.frost_attention_forward(module, q, k, v, mask, scaling=0.25, s_aux=module.sinks)[0]
        else:
            out = gpt_oss.eager_attention_forward(module, q, k, v, additive.to(dtype), scaling=0.25)[0]
        out.float().square().sum().backward()
        results.append([out.detach().float(), q.grad.float(), k.grad.float(), module.sinks.grad.clone()])
    reference, eager, got = results
    for name, r, e, g in zip(("o", "dq", "dk", "dsinks"), reference, eager, got):
        assert_like_sdpa(g, e, r, name)
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_sinks_fall_back_to_the_models_eager_function(caplog):
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    module = _SinkModule().eval()
    causal = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    additive = torch.zeros(causal.shape, dtype=BF16).masked_fill(~causal, torch.finfo(BF16).min)
    additive[0, 0, 4, 1] = -1.5  # a bias, not a mask: the adapter leaves it to the model
    q, k, v = _qkv(1, 6, 6, seed=13, dtype=BF16)
    with _posing_as(gpt_oss), caplog.at_level(logging.WARNING, logger=LOGGER):
        got = adapter.frost_attention_forward(module, q, k, v, additive, scaling=0.25, s_aux=module.sinks)[0]
    expected = gpt_oss.eager_attention_forward(module, q, k, v, additive, scaling=0.25)[0]
    assert torch.equal(got, expected)
    assert "values other than 0 and -inf" in next(iter(adapter.fallbacks()))


@pytest.mark.L0
def test_sinks_fall_back_causal_without_a_mask(caplog):
    """Without a mask (sdpa's builder leaves plain causal out) the eager fallback is still
    causal: the eager functions read no ``is_causal``."""
    gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    module = _SinkModule().eval()
    q, k, v = _qkv(2, 7, 7, seed=14)  # float32 outside autocast: frost declines
    with _posing_as(gpt_oss), caplog.at_level(logging.WARNING, logger=LOGGER):
        got = adapter.frost_attention_forward(module, q, k, v, None, scaling=0.25, s_aux=module.sinks)[0]
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    additive = torch.zeros(1, 1, 7, 7).masked_fill(~causal, torch.finfo(torch.float32).min)
    expected = gpt_oss.eager_attention_forward(module, q, k, v, additive, scaling=0.25)[0]
    assert torch.equal(got, expected)
    full = gpt_oss.eager_attention_forward(module, q, k, v, None, scaling=0.25)[0]
    assert not torch.allclose(got, full)  # the case tells causal from full attention
    assert "float32 outside autocast" in next(iter(adapter.fallbacks()))


@pytest.mark.L0
@pytest.mark.parametrize("padded", [False, True])
def test_softcap_falls_back_to_the_models_eager_function(caplog, padded):
    """Gemma 2's logit softcap: transformers' sdpa raises on it, so the call runs the
    model's eager function, bit for bit as ``attn_implementation="eager"`` does."""
    if not hasattr(transformers, "Gemma2Config"):
        pytest.skip("this transformers has no Gemma 2")
    config = transformers.Gemma2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=6,
        query_pre_attn_scalar=24, pad_token_id=0,
    )  # fmt: skip
    eager, frost_model = _models(config, copies=(("eager", BF16), ("frost", BF16)))
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(16))
    kwargs = {}
    if padded:
        kwargs["attention_mask"] = torch.ones_like(ids)
        kwargs["attention_mask"][1, 9:] = 0
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        got = _run(frost_model, ids, **kwargs)
    expected = _run(eager, ids, **kwargs)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert list(adapter.fallbacks()) == ["logit softcap"]


@pytest.mark.L0
@pytest.mark.parametrize("padded", [False, True])
def test_t5_position_bias_as_bias(padded):
    """T5's learned relative-position bias travels as frost's ``bias``, its gradient (dbias)
    back to the bias embedding: every attention call is frost's, none falls back."""
    config = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                   decoder_start_token_id=0, dropout_rate=0.0)  # fmt: skip
    models = _models(config, build=transformers.T5ForConditionalGeneration)
    ref, sdpa, frost_model = models
    generator = torch.Generator().manual_seed(17)
    ids, decoder_ids = torch.randint(1, VOCAB, (2, 10), generator=generator), torch.randint(1, VOCAB, (2, 6), generator=generator)
    kwargs = dict(decoder_input_ids=decoder_ids, labels=decoder_ids)
    if padded:
        kwargs["attention_mask"] = torch.ones_like(ids)
        kwargs["attention_mask"][1, 7:] = 0
    mark = ledger.mark()
    got = _run(frost_model, ids, **kwargs)
    problems = _frost_forwards(mark)
    # encoder self, decoder self and cross attention in each of the two blocks
    assert len(problems) == 6 and all(p.bias is not None for p in problems)
    assert sum(p.has_seqlens for p in problems) == (4 if padded else 0)  # encoder self and cross attention
    expected, reference = _run(sdpa, ids, **kwargs), _run(ref, ids, **kwargs)
    assert_like_sdpa(got[0], expected[0], reference[0], "logits")
    assert_like_sdpa(got[1], expected[1], reference[1], "gradients")
    name = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    grads = [dict(m.named_parameters())[name].grad.float() for m in models]
    assert grads[2].abs().max() > 0
    assert_like_sdpa(grads[2], grads[1], grads[0], "relative bias gradient")
    assert not adapter.fallbacks()


@pytest.mark.L0
def test_position_bias_with_packing_falls_back():
    """Packed sequences restart frost's bias positions; a row-wide position_bias does not."""
    from transformers import masking_utils as mu

    q, k, v = _qkv(1, 8, 8, seed=18, dtype=BF16)
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    packed = mu.and_masks(_on_positions(mu.causal_mask_function, position_ids),
                          mu.packed_sequence_mask_function(torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])))  # fmt: skip
    mask = _sdpa_mask(1, 8, 8, packed)
    bias = torch.randn(1, 4, 8, 8, dtype=BF16)
    module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    got = adapter.frost_attention_forward(module, q, k, v, mask, scaling=0.25, position_bias=bias,
                                          position_ids=position_ids)[0]  # fmt: skip
    assert "position_bias with packed sequences" in next(iter(adapter.fallbacks()))
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    expected = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25, position_bias=bias)[0]
    assert torch.equal(got, expected)
