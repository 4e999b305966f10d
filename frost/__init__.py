"""frost: scaled-dot-product attention with one contract (docs/SEMANTICS.md) and many engines.

Public API:

- ``sdpa_forward(q, k, v, **keywords) -> (o, lse)``
- ``sdpa_backward(do, q, k, v, o, lse, **keywords) -> Grads(dq, dk, dv, dbias, dsinks)``
- ``attention(q, k, v, **keywords) -> o``: differentiable, a torch.library custom op
  (``frost::sdpa_forward`` / ``frost::sdpa_backward``) that works under torch.compile
- ``route(q, k, v, **keywords, direction="forward") -> Decision``: which engine would
  serve the call and why the ones ranked before it declined
- ``attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., k=..., v=...) -> o``: one
  decoding step over a KV cache (contiguous or paged), appending k and v in place first
  (``frost.kvcache``; forward only)
- ``flash_attn_func`` / ``flash_attn_varlen_func`` / ``flash_attn_with_kvcache``: FlashAttention-2's
  function API (``frost.flash_attn``), so that code written for ``flash_attn`` switches by an import
- ``device_profile(name)`` (a context manager) / ``use_device_profile(name)``: make every plan
  for the named GPU (``frost.devices.PROFILES``), as ``FROST_DEVICE_PROFILE=name`` does

The routing ledger is ``frost.dispatch.ledger``; repeated calls reuse their plan through
``frost.plans.cache`` (``stats()``: hits, misses). Importing frost does not import the
CuTe DSL.
"""
from frost.api import route, sdpa_backward, sdpa_forward
from frost.dispatch import Decision
from frost.flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from frost.kvcache import attention_with_kvcache
from frost.ops import attention
from frost import plans  # noqa: F401  (frost.plans.cache)
from frost.devices import profile as device_profile, use as use_device_profile
from frost.problem import Grads, Problem

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

__all__ = ["Decision", "Grads", "Problem", "attention", "attention_with_kvcache", "device_profile", "flash_attn_func",
           "flash_attn_varlen_func", "flash_attn_with_kvcache", "route", "sdpa_backward", "sdpa_forward",
           "use_device_profile"]
