"""frost behind Hugging Face transformers: ``attn_implementation="frost"``.

Importing this module calls ``register()``, which adds "frost" to transformers'
``AttentionInterface`` (the attention function) and ``AttentionMaskInterface`` (the mask
builder). Models then take ``attn_implementation="frost"`` (``from_pretrained``,
``from_config``) or ``model.set_attn_implementation("frost")``.

The rule: frost serves a call only when its keywords describe exactly the attention that
transformers' own ``sdpa`` function computes from the same arguments; every other call
goes to that sdpa function (or, with sinks or a logit softcap, to the model's eager
function: sdpa ignores sinks and raises on a softcap), and the reason is logged once per
reason on the logger ``frost.integrations.transformers`` (``fallbacks()`` counts them,
``reset_fallbacks()`` forgets them).

The mask. "frost" registers transformers' sdpa mask builder as its mask function, so the
attention function receives what sdpa receives: ``None`` (plain causal; full attention
for a single query or ``is_causal=False``) or a 4-D boolean mask ``[B, 1, Sq, Sk]``.
Without a registered mask function transformers would pass no mask at all (it treats
unknown implementations like TGI/vLLM backends), and padding would be lost. A 4-D mask is
read once per forward pass (cached per mask object, so the layers after the first reuse
the result): a candidate set of frost keywords is derived from it, the mask those keywords
imply is built, and an element-for-element match is served; a mask no candidate matches is
served whole as a bias:

- dense: each sequence's keys end after the last key any query sees, ``E_b`` ->
  ``seqlens_k`` (dropped when every ``E_b == Sk``); keys before ``E_b`` that no query sees
  (left padding, of a prompt or in a cache) -> -inf in a float32 key bias ``[B, 1, Sq, Sk]``
  holding one row per sequence (stride 0 over the queries), so padding on either side copies
  nothing; visibility causal top-left (training, prefill) or bottom-right (a cache: the queries
  are the last ``Sq`` of the ``E_b`` keys), or full; a sliding window ``w`` (transformers keeps
  keys ``j > i - w``) -> ``window=(w - 1, 0)``. Only ``seqlens_k`` and never ``seqlens_q``:
  transformers' right-padded query rows still attend to the valid keys (their outputs are
  garbage that the loss ignores), and ``seqlens_q`` would make frost write zeros there instead;
  left-padded query rows see no key in sdpa's mask nor in frost's, and both write o = 0.
- packed: ``Sq == Sk`` and the mask is block-diagonal causal (several sequences in one
  row, found from ``cu_seq_lens_q``, restarting ``position_ids``, or the mask's first
  visible key per row) -> the batch flattened to THD ``[B*S, H, D]`` with ``cu_seqlens``
  and ``max_seqlen``.
- any other boolean mask -> the mask itself as a float32 bias, 0 where a key is visible and
  -inf where not (every engine reads a -inf bias as a masked key, and a row masked everywhere
  as empty, o = 0, as sdpa leaves it), with ``seqlens_k = E_b`` (``_bias_plan``): exact for
  every mask, at the cost of an Sq x Sk bias per sequence, as sdpa's own mask costs.

A float (additive) mask is read as boolean when its entries are only 0 and -inf / the dtype's
minimum and no query row is fully masked (sdpa turns such a row into a uniform average, frost
into zeros). Also falling back: dropout > 0, ``output_attentions``, ``head_mask``, ``softcap``,
masks that differ per head, other additive masks, and dtypes other than float16 / bfloat16
(frost's io dtypes) outside autocast (under autocast q, k, v take autocast's dtype first, as
sdpa's do). Sinks (gpt-oss's ``s_aux``) -> ``sinks`` (float32, differentiable). T5's
``position_bias`` ([1, H, Sq, Sk], learned) -> ``bias`` (differentiable: dbias reaches the
relative-position embedding; a mask's bias is added to it), except with packed sequences, whose
positions restart where the bias's do not.

Generation (``model.generate``). The model appends each step's keys and values to its cache
before the attention function runs, which then attends the cache as it is: ``key`` / ``value``
hold every cached row (the dynamic cache: the tokens so far; the static cache: its capacity,
the rows past the tokens so far unfilled; a sliding-window layer: the window's last rows). The
prefill's mask is None (no padding: causal top-left, which also keeps a static cache's unfilled
rows out) or sdpa's ``[B, 1, S, Sk]``; a decoding step's is None (the dynamic cache without
padding: one query sees every key) or ``[B, 1, 1, Sk]``, built from the 2-D padding mask and the
query's position in the cache. The reading above serves all of them: the queries are the newest
tokens (bottom-right), a static cache's unfilled rows lie past ``E_b`` (``seqlens_k``), and a
batch of left-padded prompts gets the key bias, at prefill and at every step. With the static
cache transformers compiles the decoding step and builds its mask outside the compiled graph
(``prepare_inputs_for_generation``), so the traced step receives that 4-D mask (below). These
calls go to ``frost.attention`` and not to ``frost.attention_with_kvcache``: the cache is
transformers', already holding the step's keys, so what is left of the KV-cache call is its
closing forward (``seqlens_k``, bottom-right alignment), which is ``frost.attention`` with those
keywords (prefill, decoding and training through one call); and left padding, for which the
KV-cache call has no argument (FlashAttention's ``cache_leftpad``), needs the key bias.

Under ``torch.compile`` nothing is read on the host, so ``fullgraph=True`` traces a model whole
and a step at the same shapes reuses its graph. The mask function (``frost_mask``) then gives
what transformers gives its flash-attention path where it can (no cache: None, or the 2-D
padding mask) and sdpa's builder's 4-D mask otherwise; the attention function takes causality
from the module, the window from the ``sliding_window`` keyword, sinks from ``s_aux``, and
(``_traced_plan``):

- a padding mask -> each row's valid tokens moved first, in order (a gather of q, k, v and back
  of the output: padding on either side, as transformers' flash path unpads it) and
  ``seqlens_k`` = the valid counts; padded query rows then see every valid key, as right-padded
  ones do under sdpa, and the loss ignores them;
- a 4-D boolean mask (a cache: every decoding step; overlays such as image tokens'
  bidirectional blocks; chunked attention; or the caller's own) -> the whole mask as a bias with
  ``seqlens_k``, computed on the device (``_bias_plan``): exact whatever the mask holds, so
  nothing needs reading; additive or per-head 4-D masks fall back;
- ``cu_seq_lens_q/k`` and ``max_length_q/k`` (DataCollatorWithFlattening's keywords) -> THD
  with those (``max_length`` may be a symbolic size under dynamic shapes);
- restarting ``position_ids`` in a batch of one row (the flattening collator's shape; in a wider
  batch they are not read as packing, as in transformers' flash path) -> THD with a
  ``cu_seqlens`` of one slot per token built on the device; frost reads it back once per call
  (a launch needs the number of sequences), so a compiled step is not captured in a CUDA graph
  on this route (pass ``cu_seq_lens_*`` and ``max_length_*`` for that);
- whatever frost does not serve falls back, inside the graph, to sdpa with the boolean mask
  transformers' sdpa builder would have made (built on the device from the keywords, or the 4-D
  mask as given), and the reason is counted while tracing.
"""
from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections import Counter
from typing import NamedTuple

import torch

import frost

logger = logging.getLogger(__name__)

NAME = "frost"
_IO_DTYPES = (torch.float16, torch.bfloat16)


class MaskPlan(NamedTuple):
    """The frost keywords that serve one call: read from its 4-D mask (eager), or from its
    arguments while torch.compile traces it."""

    packed: bool
    causal: bool
    causal_align: str
    window_left: int
    seqlens_k: torch.Tensor | None  # int32 [B], dense only
    cu_seqlens: torch.Tensor | None  # int32 [segments + 1], packed only (q's; k's too unless cu_seqlens_k)
    max_seqlen: int | None
    cu_seqlens_k: torch.Tensor | None = None  # packed: k's, where it differs from q's
    max_seqlen_k: int | None = None
    order: torch.Tensor | None = None  # dense, traced: each row's positions, valid tokens first [B, S]
    bias: torch.Tensor | None = None  # dense: float32 [B|1, 1, Sq, Sk], -inf at the keys the mask hides


# ---------------------------------------------------------------------------------------
# registration and fallback bookkeeping


def register(name: str = NAME) -> None:
    """Register frost as ``attn_implementation=name`` (idempotent)."""
    from transformers import AttentionInterface

    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    except ImportError as error:  # before transformers 4.53 there is no mask interface
        raise ImportError("frost's transformers adapter needs transformers >= 4.53 (masking_utils)") from error
    AttentionInterface.register(name, frost_attention_forward)
    AttentionMaskInterface.register(name, frost_mask)


def frost_mask(**arguments):
    """The mask function registered with "frost": transformers' sdpa mask builder (the 4-D mask
    that eager calls read and verify), except while torch.compile traces a call that starts at
    position 0 with as many queries as keys and a standard mask: then, as transformers' mask
    function for flash attention, the 2-D padding mask (or None), whose values are never read
    on the host (``_traced_plan``; a traced call with a cache gets sdpa's 4-D mask, which the
    attention function serves as a bias without reading it either)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    # looked up rather than imported by name: its name moved between versions
    sdpa = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    if not torch.compiler.is_compiling():
        return sdpa(**arguments)
    padding, kv_length = arguments.get("attention_mask"), arguments["kv_length"]
    positions = arguments.get("cache_position")  # transformers before 5 names the queries by position
    q_length = arguments["q_length"] if positions is None else positions.shape[0]
    offset = arguments.get("q_offset", 0)
    custom = arguments.get("use_vmap") or getattr(arguments.get("config"), "attention_chunk_size", None)
    if custom or q_length != kv_length or arguments.get("kv_offset", 0) != 0 or not isinstance(offset, int) or offset:
        return sdpa(**arguments)  # an overlay, chunks, or a cache: a mask that only sdpa's builder makes
    return None if padding is None else padding[:, -kv_length:]


_fallback_counts: Counter[str] = Counter()
_fallback_lock = threading.Lock()


def fallbacks() -> Counter[str]:
    """How many calls fell back, per reason, since the process started (a copy)."""
    with _fallback_lock:
        return Counter(_fallback_counts)


def reset_fallbacks() -> None:
    """Forget the counts, so each reason is logged again on its next fallback."""
    with _fallback_lock:
        _fallback_counts.clear()


@torch.compiler.assume_constant_result  # under torch.compile: run once, while tracing, not in the graph
def _note_fallback(reason: str) -> bool:
    with _fallback_lock:
        first = reason not in _fallback_counts
        _fallback_counts[reason] += 1
    if first:  # once per reason: a training loop would log it in every layer of every step
        logger.warning("frost attention falls back to transformers' implementation: %s", reason)
    return first


def _fallback(reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    _note_fallback(reason)
    # transformers' sdpa ignores sinks and raises on a softcap: those go to the model's eager function
    if kwargs.get("s_aux") is not None or kwargs.get("softcap") is not None:
        return _eager(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS["sdpa"](
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


def _sdpa_causal(module, query, is_causal) -> bool:
    """What sdpa does without a mask: causal (top-left) unless a single query or is_causal=False."""
    return query.shape[2] > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True))


def _eager(module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs):
    """The model's own eager function, for what transformers' sdpa does not compute (sinks,
    a logit softcap), given the mask sdpa would apply: the eager functions read no
    ``is_causal``, so the causal mask that sdpa's mask builder left out is built here."""
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None:
        raise NotImplementedError(f"frost cannot serve this call and {type(module).__name__} has no eager function")
    if attention_mask is None and _sdpa_causal(module, query, is_causal):
        rows, cols = query.shape[2], key.shape[2]
        attention_mask = torch.ones(rows, cols, dtype=torch.bool, device=query.device).tril()[None, None]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        # the eager functions add the mask to the logits: they expect the additive form
        additive = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        attention_mask = additive.masked_fill(~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)


def _unsupported(query, key, value, dropout, kwargs) -> str | None:
    """Why frost cannot serve this call whatever its mask, or None."""
    dtypes = {query.dtype, key.dtype, value.dtype}
    device = query.device.type
    autocast = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) in _IO_DTYPES
    if not autocast and (len(dtypes) > 1 or query.dtype not in _IO_DTYPES):
        names = "/".join(sorted(str(d) for d in dtypes))
        return f"dtype {names} outside autocast (frost computes in float16 / bfloat16, one dtype for q, k, v)"
    if dropout and dropout > 0:
        return "attention dropout > 0"
    if kwargs.get("output_attentions"):
        return "output_attentions=True (frost does not materialize attention weights)"
    if kwargs.get("head_mask") is not None:  # transformers 4.x: a per-head factor on the weights
        return "head_mask"
    if kwargs.get("softcap") is not None:
        return "logit softcap"
    return None


# ---------------------------------------------------------------------------------------
# the attention function


def frost_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q, k, v as [B, H, S, D], returns
    (attn_output [B, Sq, Hq, Dv] contiguous, None)."""
    reason = _unsupported(query, key, value, dropout, kwargs)
    traced = torch.compiler.is_compiling()
    plan = None
    if traced:
        plan = _traced_plan(attention_mask, module, query, is_causal, kwargs)
    elif reason is None and attention_mask is not None:
        plan = _plan_for(attention_mask, module, query.shape[0], kwargs)
    bias = kwargs.get("position_bias")
    if isinstance(plan, str):
        reason, plan, traced = reason or plan, None, False  # the mask as given is sdpa's
    elif reason is None and bias is not None and plan is not None and (plan.packed or plan.order is not None):
        reason = "position_bias with packed sequences or reordered padding (its positions are the row's)"
    if reason is not None:
        if traced and (attention_mask is None or attention_mask.dim() == 2):
            # sdpa gets the mask that transformers' sdpa builder would have made (a 4-D one is that mask)
            attention_mask = _traced_mask(plan, attention_mask, query, key.shape[2])
        return _fallback(reason, module, query, key, value, attention_mask, dropout, scaling, is_causal, kwargs)

    sinks = kwargs.get("s_aux")
    if sinks is not None:
        sinks = sinks.float()
    if bias is not None and bias.stride(-1) != 1:  # T5's relative bias is a permuted embedding
        bias = bias.contiguous()
    if plan is not None and plan.bias is not None:  # the keys the mask hides
        bias = plan.bias if bias is None else bias + plan.bias
    # (under autocast frost.attention casts q, k, v to autocast's dtype, as sdpa's are)
    # frost's dense layout is BSHD: transformers' [B, H, S, D] transposed is that, with
    # other strides (frost takes any strides whose last is 1)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if plan is None:
        out = frost.attention(q, k, v, scale=scaling, causal=_sdpa_causal(module, query, is_causal), sinks=sinks,
                              bias=bias)  # fmt: skip
    elif plan.packed:
        batch, seqlen = q.shape[:2]
        own_k = plan.cu_seqlens_k is not None  # else k's sequences are q's
        out = frost.attention(
            q.reshape(batch * seqlen, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
            scale=scaling, causal=plan.causal, window=(plan.window_left, 0 if plan.causal else -1),
            cu_seqlens_q=plan.cu_seqlens, cu_seqlens_k=plan.cu_seqlens_k if own_k else plan.cu_seqlens,
            max_seqlen_q=plan.max_seqlen, max_seqlen_k=plan.max_seqlen_k if own_k else plan.max_seqlen, sinks=sinks,
        ).view(batch, seqlen, *q.shape[2:3], v.shape[-1])  # fmt: skip
    else:
        if plan.order is not None:  # valid tokens first, in their order: right padding
            q, k, v = (_along_rows(x, plan.order) for x in (q, k, v))
        out = frost.attention(
            q, k, v, scale=scaling, causal=plan.causal, causal_align=plan.causal_align,
            window=(plan.window_left, 0 if plan.causal else -1), seqlens_k=plan.seqlens_k, sinks=sinks, bias=bias,
        )  # fmt: skip
        if plan.order is not None:
            out = _along_rows(out, torch.argsort(plan.order, dim=1))
    return out.contiguous(), None


def _along_rows(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``x`` [B, S, ...] with each row's positions taken in ``order`` [B, S] (differentiable)."""
    return x.gather(1, order.view(*order.shape, *(1,) * (x.dim() - 2)).expand_as(x))


# ---------------------------------------------------------------------------------------
# a call traced by torch.compile: keywords from the arguments, no value read on the host


def _traced_plan(mask, module, query, is_causal, kwargs) -> MaskPlan | str | None:
    """The keywords of a call that torch.compile traces, read as transformers' flash-attention
    path reads them (``frost_mask`` gave a 2-D padding mask or None): causality from the
    module, the window from the ``sliding_window`` keyword, packing from ``cu_seq_lens_q/k`` (+
    ``max_length_q/k``) or, in a batch of one row, from restarting ``position_ids``; a padding
    mask keeps each row's valid tokens first, in order; a 4-D mask (sdpa's builder's, where a
    cache or an overlay needs one) is served whole as a bias. None: plain sdpa-style causal.
    Nothing here reads a tensor's values, so the graph does not break; ``frost.attention``'s
    traced ops read back only what a launch needs (a packed call without ``max_length``)."""
    batch, seqlen = query.shape[0], query.shape[2]
    if mask is not None and mask.dim() == 4:  # sdpa's builder made it (a cache), or the caller did
        if mask.dtype != torch.bool or mask.shape[1] != 1:
            return "an additive or per-head 4-D mask under torch.compile (its values cannot be read while tracing)"
        return _bias_plan(mask, batch)
    if mask is not None and mask.dim() != 2:
        return f"a {mask.dim()}-D attention mask under torch.compile"
    causal = _sdpa_causal(module, query, is_causal)
    window = kwargs.get("sliding_window")
    window_left = window - 1 if window is not None and window > 0 else -1
    if window_left >= 0 and not causal:
        return "a sliding window without causal masking"
    if mask is not None:
        if mask.shape != (batch, seqlen):
            return f"a padding mask of shape {tuple(mask.shape)} for {seqlen} queries"
        order = torch.argsort(~mask.bool(), dim=1, stable=True)
        lengths = mask.sum(dim=1, dtype=torch.int32)
        return MaskPlan(False, causal, "top_left", window_left, lengths, None, None, order=order)
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        max_q, max_k = _size(kwargs, "max_length_q"), _size(kwargs, "max_length_k")
        return MaskPlan(True, causal, "top_left", window_left, None, cu_q.to(torch.int32), max_q,
                        cu_k.to(torch.int32), max_k)  # fmt: skip
    positions = kwargs.get("position_ids")
    if positions is not None and batch == 1 and seqlen > 1 and causal and positions.shape[-1] == seqlen:
        # one slot per token: the sequences past the last are empty, which frost leaves out when it
        # reads the lengths back (the one host read of a traced step, its launch needs the count)
        segments = _segments(positions.reshape(1, seqlen))[0]
        slots = torch.arange(seqlen + 1, device=segments.device)
        cu_seqlens = torch.searchsorted(segments, slots, out_int32=True)
        return MaskPlan(True, True, "top_left", window_left, None, cu_seqlens, None)
    if window_left >= 0:
        return MaskPlan(False, True, "top_left", window_left, None, None, None)
    return None


def _size(kwargs, name: str):
    """A length keyword as an int (SymInt under dynamic shapes), or None for a tensor: its value
    is then read where frost needs it, not while tracing."""
    value = kwargs.get(name)
    return value if isinstance(value, (int, torch.SymInt)) else None


def _segments(positions: torch.Tensor) -> torch.Tensor:
    """Sequence ids [B, S] of restarting positions (transformers' rule: a new sequence wherever
    the position does not grow by 1)."""
    step = torch.diff(positions, prepend=positions[:, :1] - 1, dim=-1)
    return (step != 1).cumsum(-1)


def _traced_mask(plan: MaskPlan | None, padding, query: torch.Tensor, seqlen_k: int) -> torch.Tensor | None:
    """The boolean [B|1, 1, Sq, Sk] mask of a traced plan (the one sdpa gets on a fallback), or
    None for plain causal, which sdpa applies by itself."""
    if plan is None:
        return None
    batch, seqlen_q, device = query.shape[0], query.shape[2], query.device
    visible = _visibility(seqlen_q, seqlen_k, plan.causal, plan.window_left, 0, device)
    if plan.packed:
        cu_seqlens_k = plan.cu_seqlens if plan.cu_seqlens_k is None else plan.cu_seqlens_k

        def segments(cu_seqlens, seqlen):  # the sequence of each token, [B, S]
            tokens = torch.arange(batch * seqlen, device=device, dtype=cu_seqlens.dtype)
            return torch.searchsorted(cu_seqlens[1:], tokens, right=True).view(batch, seqlen)

        same = segments(plan.cu_seqlens, seqlen_q)[:, :, None] == segments(cu_seqlens_k, seqlen_k)[:, None, :]
        visible = visible & same
    if padding is not None:
        visible = visible & padding.bool()[:, None, :]
    return visible[:, None]


def _visibility(seqlen_q: int, seqlen_k: int, causal: bool, window_left: int, delta, device) -> torch.Tensor:
    """SEMANTICS.md's causal / left-window visibility as [B|1, Sq, Sk]; ``delta`` is the alignment
    offset (an int, or [B, 1, 1])."""
    rows = torch.arange(seqlen_q, device=device)[None, :, None] + delta
    cols = torch.arange(seqlen_k, device=device)[None, None, :]
    visible = torch.ones(1, seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if causal:
        visible = visible & (cols <= rows)
    if window_left >= 0:
        visible = visible & (cols >= rows - window_left)
    return visible


# ---------------------------------------------------------------------------------------
# reading a 4-D mask

_plans: dict[int, tuple] = {}  # id(mask) -> (weakref to mask, mask._version, hint key, plan)
_plans_lock = threading.Lock()


def _plan_for(mask: torch.Tensor, module, batch: int, kwargs) -> MaskPlan | str:
    """The plan for this mask (a MaskPlan), or why there is none (a str); cached per mask
    object and version, so the layers of one forward pass read the mask once. A mask of one
    row broadcast over the ``batch`` sequences is read as ``batch`` rows (lengths per sequence)."""
    window_hint = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    hint_key = (window_hint, kwargs.get("position_ids") is not None, kwargs.get("cu_seq_lens_q") is not None, batch)
    entry = _plans.get(id(mask))
    if entry is not None and entry[0]() is mask and entry[1] == mask._version and entry[2] == hint_key:
        return entry[3]
    broadcast = mask.dim() == 4 and mask.shape[0] == 1
    plan = _read_mask(mask.expand(batch, -1, -1, -1) if broadcast else mask, window_hint, kwargs)
    with _plans_lock:
        for ident in [ident for ident, (ref, *_) in _plans.items() if ref() is None]:
            del _plans[ident]  # masks of finished forward passes
        _plans[id(mask)] = (weakref.ref(mask), mask._version, hint_key, plan)
    return plan


def _read_mask(mask: torch.Tensor, window_hint, kwargs) -> MaskPlan | str:
    if mask.dim() != 4:
        return f"a {mask.dim()}-D attention mask (frost reads 4-D [B, 1, Sq, Sk] masks)"
    if mask.shape[1] != 1 and not bool((mask == mask[:, :1]).all()):
        return "a mask that differs per head"
    mask = mask[:, 0]
    if mask.dtype != torch.bool:
        zero, masked = mask == 0, (mask == float("-inf")) | (mask == torch.finfo(mask.dtype).min)
        if not bool((zero | masked).all()):
            return "an additive mask with values other than 0 and -inf (a bias)"
        mask = zero
        if not bool(mask.any(dim=-1).all()):
            return "an additive mask with a fully masked query row (sdpa averages it, frost writes zeros)"
    window_lefts = [-1] if window_hint is None or window_hint <= 0 else [window_hint - 1, -1]
    plan = _dense_plan(mask, window_lefts)
    if plan is None:
        plan = _packed_plan(mask, window_lefts, kwargs)
    return plan if plan is not None else _bias_plan(mask[:, None], mask.shape[0])


def _dense_plan(mask: torch.Tensor, window_lefts: list[int]) -> MaskPlan | None:
    """Dense padding with causal, windowed or full visibility: the keywords whose mask equals
    ``mask`` [B, Sq, Sk], or None. Each sequence's keys end after the last one any query sees
    (``seqlens_k``, dropped when every sequence keeps all ``Sk``); keys before that end that no
    query sees (left padding, in a cache too) are -inf in a key bias, so padding may lie on
    either side without copying q, k or v."""
    batch, seqlen_q, seqlen_k = mask.shape
    key_seen = mask.any(dim=1)
    extent = _extent(key_seen)
    positions = torch.arange(seqlen_k, device=mask.device)
    seqlens_k = None if bool((extent == seqlen_k).all()) else extent.to(torch.int32)
    holes = bool((~key_seen & (positions < extent[:, None])).any())
    # one bias row per sequence, read by every query (stride 0 over Sq)
    bias = _masking_bias(key_seen)[:, None, None, :].expand(-1, 1, seqlen_q, -1) if holes else None
    candidates = [(True, align, left) for left in window_lefts for align in ("top_left", "bottom_right")]
    for causal, align, left in candidates + [(False, "top_left", -1)]:
        if torch.equal(_dense_mask(key_seen, extent, seqlen_q, causal, align, left), mask):
            return MaskPlan(False, causal, align, left, seqlens_k, None, None, bias=bias)
    return None


def _dense_mask(key_seen, extent, seqlen_q, causal, align, window_left) -> torch.Tensor:
    """SEMANTICS.md's visibility of the keys ``key_seen`` [B, Sk] (``seqlens_k = extent``, the
    holes masked by the key bias) as [B, Sq, Sk]."""
    extent = extent[:, None, None]
    delta = extent - seqlen_q if align == "bottom_right" else torch.zeros_like(extent)
    # full shape: torch.equal compares shapes too
    return key_seen[:, None, :].expand(-1, seqlen_q, -1) & _visibility(seqlen_q, key_seen.shape[-1], causal,
                                                                       window_left, delta, key_seen.device)  # fmt: skip


def _extent(key_seen: torch.Tensor) -> torch.Tensor:
    """[...]: one past the last key seen in each row of ``key_seen`` [..., Sk] (0: none)."""
    positions = torch.arange(1, key_seen.shape[-1] + 1, device=key_seen.device)
    return (key_seen * positions).amax(dim=-1)


def _masking_bias(visible: torch.Tensor) -> torch.Tensor:
    """``visible`` as frost's additive float32 bias: 0 where True, -inf where False (every engine
    reads a -inf bias as a masked key, and a row masked everywhere as empty: o = 0, as sdpa's
    boolean mask leaves it)."""
    zeros = torch.zeros(visible.shape, dtype=torch.float32, device=visible.device)
    return zeros.masked_fill(~visible, float("-inf"))


def _bias_plan(mask: torch.Tensor, batch: int) -> MaskPlan:
    """Any boolean mask [B|1, 1, Sq, Sk] as frost's additive bias (``_masking_bias``), with
    ``seqlens_k`` ending each of the ``batch`` sequences' keys after the last one any query sees,
    so that the keys past it (a static cache's unfilled rows) are not read. Exact for every mask,
    so it needs no reading of values (a decoding step's mask under torch.compile); for one query
    per sequence the bias is a row of Sk floats, a small fraction of the K and V the step reads."""
    extent = _extent(mask.any(dim=2)[:, 0]).expand(batch)
    return MaskPlan(False, False, "top_left", -1, extent.to(torch.int32), None, None, bias=_masking_bias(mask))


def _packed_plan(mask: torch.Tensor, window_lefts: list[int], kwargs) -> MaskPlan | None:
    """Several causal sequences packed into each row: the THD keywords whose mask equals
    ``mask`` [B, S, S], or None."""
    batch, seqlen_q, seqlen_k = mask.shape
    if seqlen_q != seqlen_k:
        return None
    for segments in _segment_candidates(mask, kwargs):
        rows = torch.arange(seqlen_q, device=mask.device)[:, None]
        cols = torch.arange(seqlen_k, device=mask.device)[None, :]
        same = (segments[:, :, None] == segments[:, None, :]) & (cols <= rows)
        for left in window_lefts:
            expected = same & (cols >= rows - left) if left >= 0 else same
            if torch.equal(expected, mask):
                return _packed_keywords(segments, left)
    return None


def _segment_candidates(mask: torch.Tensor, kwargs):
    """Segment ids [B, S] that may describe the packing: from the flash-attention kwargs,
    from restarting position_ids (transformers' own rule: a new sequence wherever the
    position does not grow by 1), and from the mask (a row whose first visible key is
    itself starts a sequence). Each is verified against the mask by the caller."""
    batch, seqlen = mask.shape[:2]
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None and batch == 1 and int(cu[-1]) == seqlen:
        starts = torch.zeros(seqlen, dtype=torch.long, device=mask.device)
        starts[cu[:-1].to(device=mask.device, dtype=torch.long).clamp(max=seqlen - 1)] = 1
        yield (starts.cumsum(0) - 1)[None]
    position_ids = kwargs.get("position_ids")
    if position_ids is not None and position_ids.dim() == 2 and position_ids.shape[-1] == seqlen:
        yield _segments(position_ids.to(mask.device).expand(batch, -1))
    first = mask.to(torch.uint8).argmax(dim=-1)  # the first visible key of each row
    yield (first == torch.arange(seqlen, device=mask.device)).cumsum(-1)


def _packed_keywords(segments: torch.Tensor, window_left: int) -> MaskPlan:
    batch, seqlen = segments.shape
    flat = segments.reshape(-1)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1]
    starts[::seqlen] = True  # each batch row starts its own sequence
    bounds = torch.nonzero(starts).flatten()
    total = torch.tensor([batch * seqlen], device=bounds.device)
    cu_seqlens = torch.cat([bounds, total]).to(torch.int32)
    max_seqlen = int(torch.diff(cu_seqlens).max())
    return MaskPlan(True, True, "top_left", window_left, None, cu_seqlens, max_seqlen)


register()  # importing the adapter is how it is enabled
