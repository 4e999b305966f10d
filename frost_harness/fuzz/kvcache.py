"""The KV-cache call's properties (``frost.attention_with_kvcache``): rewrites that change no bit.

A drawn dense Case reads as one decoding step. Its keys and values are what each sequence holds
after the step (``lengths_k`` rows, else all Sk), of which the step appends the last
``S_new = min(Sq, the shortest sequence)`` and the cache held the rest before; its queries are the
step's (all valid: ``KVCACHE_DRAWS`` draws no ``lengths_q``), its mask, sinks and scale the step's,
aligned to the bottom right as the call aligns them (the Case's ``causal_align`` is not read).
Bias, RoPE and packed layouts are not the call's and are not drawn.

- ``kvcache_append_equals_concatenation``: the step on a contiguous cache of Sk rows (garbage
  past ``cache_seqlens``) == ``frost.sdpa_forward`` over the whole keys with ``seqlens_k``, o and lse
  bit for bit; the cache then holds the keys' valid rows, and its other rows are as they were;
- ``kvcache_paged_equals_contiguous``: the step on a paged cache (pages of 64 rows in a shuffled
  order, a spare page, out-of-range table entries past every sequence's pages) == the same step on
  a contiguous cache of the same capacity: o, lse and every cached page bit for bit, the spare
  page untouched. Each sequence first gets a lead of random rows that puts the middle of its
  appended rows on a page boundary (``across_a_page``), so the append and the reads cross pages.

Both are bitwise: each side serves one problem (the same shapes, lengths, masks, and values where
the contract reads) on one engine; what differs between them, the garbage in rows past each
sequence's keys, must change nothing (SEMANTICS.md). ``engine`` is not used: the call has no
``engine=``, it runs where the forward routes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import frost
from frost.kvcache import PAGE_MULTIPLE
from frost_harness.fuzz.failures import PropertyFailure
from frost_harness.suites.harness import Case, bits_equal, make_inputs

# Case fields a step fixes for frost_harness.fuzz.strategies.cases: no query padding, bias, RoPE,
# or non-contiguous inputs (the cache is the call's own buffer).
KVCACHE_DRAWS = {"lengths_q": None, "bias": None, "rope": False, "strided": False}


@dataclass
class Step:
    """One decoding step drawn from a Case: q, and each sequence's keys and values after it."""

    q: torch.Tensor
    keys: torch.Tensor  # [B, Sk, Hkv, D], contiguous; NaN past each sequence's rows
    values: torch.Tensor
    lengths: list[int]  # rows each sequence holds after the step
    new_rows: int  # S_new: rows the step appends
    keywords: dict  # causal, window, scale, sinks

    @property
    def cached(self) -> torch.Tensor:
        """``cache_seqlens``: rows each sequence held before the step."""
        return torch.tensor([n - self.new_rows for n in self.lengths], dtype=torch.int32, device=self.q.device)

    def appended(self, source: torch.Tensor) -> torch.Tensor:
        """The rows the step appends to each sequence: ``[B, S_new, Hkv, D]`` of ``source``."""
        rows = self.cached.long()[:, None] + torch.arange(self.new_rows, device=source.device)
        return source[torch.arange(source.shape[0], device=source.device)[:, None], rows]

    def cache(self, source: torch.Tensor, capacity: int) -> torch.Tensor:
        """A contiguous cache of ``capacity`` rows per sequence: ``source``'s rows before the step,
        +inf past them (garbage unlike the NaN in ``source``'s unread rows)."""
        cache = torch.full((source.shape[0], capacity, *source.shape[2:]), math.inf, dtype=source.dtype,
                           device=source.device)  # fmt: skip
        for b, held in enumerate(self.cached.tolist()):
            cache[b, :held] = source[b, :held]
        return cache

    def run(self, k_cache: torch.Tensor, v_cache: torch.Tensor, **table) -> tuple[torch.Tensor, torch.Tensor]:
        return frost.attention_with_kvcache(
            self.q, k_cache, v_cache, cache_seqlens=self.cached, k=self.appended(self.keys),
            v=self.appended(self.values), return_lse=True, **table, **self.keywords,
        )  # fmt: skip


def step_of(case: Case) -> Step:
    """The decoding step a dense Case without query padding, bias or RoPE describes."""
    if case.layout != "bshd" or case.lengths_q is not None or case.bias is not None or case.rope:
        raise ValueError(f"a KV-cache step is a dense Case without lengths_q, bias or rope; got {case.id}")
    inputs = make_inputs(case)
    lengths = list(case.lengths_k or (case.seqlen_k,) * case.batch)
    kw = inputs.keywords
    keywords = {"causal": kw["causal"], "window": kw["window"], "scale": kw["scale"], "sinks": kw.get("sinks")}
    return Step(inputs.q, inputs.k.contiguous(), inputs.v.contiguous(), lengths,
                min(case.seqlen_q, *lengths), keywords)  # fmt: skip


def across_a_page(step: Step, seed: int) -> Step:
    """The step with ``lead[b]`` random rows before each sequence's keys, so that its appended rows
    start ``ceil(S_new / 2)`` rows before the end of a page (any step of the cpu regime fits a page)."""
    cached = step.cached.tolist()
    lead = [(PAGE_MULTIPLE - (step.new_rows + 1) // 2 - held) % PAGE_MULTIPLE for held in cached]
    generator = torch.Generator().manual_seed(seed)
    shifted = []
    for source in (step.keys, step.values):
        rows = torch.full((source.shape[0], source.shape[1] + max(lead), *source.shape[2:]), math.nan,
                          dtype=source.dtype, device=source.device)  # fmt: skip
        for b, (extra, held) in enumerate(zip(lead, step.lengths)):
            rows[b, :extra] = torch.randn((extra, *source.shape[2:]), generator=generator).to(rows)
            rows[b, extra : extra + held] = source[b, :held]
        shifted.append(rows)
    lengths = [extra + held for extra, held in zip(lead, step.lengths)]
    return Step(step.q, *shifted, lengths, step.new_rows, step.keywords)


def _bits_differ(got: tuple, want: tuple) -> list[str]:
    return [f"{name}: bits differ" for name, a, b in zip(("o", "lse"), got, want) if not bits_equal(a, b)]


def kvcache_append_equals_concatenation(case: Case, engine: str | None = None) -> None:
    """Append, then attend == ``frost.sdpa_forward`` on the concatenation; the cache holds it after."""
    prop = "kvcache_append_equals_concatenation"
    step = step_of(case)
    seqlens_k = torch.tensor(step.lengths, dtype=torch.int32, device=step.q.device)
    want = frost.sdpa_forward(step.q, step.keys, step.values, seqlens_k=seqlens_k, causal_align="bottom_right",
                              **step.keywords)  # fmt: skip
    k_cache, v_cache = step.cache(step.keys, step.keys.shape[1]), step.cache(step.values, step.keys.shape[1])
    problems = _bits_differ(step.run(k_cache, v_cache), want)
    for name, cache, source in (("k_cache", k_cache, step.keys), ("v_cache", v_cache, step.values)):
        for b, held in enumerate(step.lengths):
            if not bits_equal(cache[b, :held], source[b, :held]):
                problems.append(f"{name}[{b}]: rows 0 .. {held - 1} are not the keys' (wrong rows written)")
            if not torch.isposinf(cache[b, held:]).all():
                problems.append(f"{name}[{b}]: rows past {held - 1} were written")
    if problems:
        raise PropertyFailure(prop, case, None, "; ".join(problems))


def kvcache_paged_equals_contiguous(case: Case, engine: str | None = None) -> None:
    """The step on shuffled pages == on a contiguous cache of the same capacity, bit for bit."""
    prop = "kvcache_paged_equals_contiguous"
    step = across_a_page(step_of(case), case.seed)
    batch, per_sequence = step.q.shape[0], max(1, math.ceil(step.keys.shape[1] / PAGE_MULTIPLE))
    capacity = (per_sequence + 1) * PAGE_MULTIPLE  # a table column past every sequence's rows
    pages = batch * per_sequence + 1  # and a spare page no sequence uses
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(case.seed)).to(step.q.device)
    beyond = torch.tensor([[-1 if b % 2 else pages] for b in range(batch)], device=step.q.device)  # out of range
    table = torch.cat((order[:-1].view(batch, per_sequence), beyond), dim=1).to(torch.int32)
    contiguous, paged = [], []
    for source in (step.keys, step.values):
        cache = step.cache(source, capacity)
        held = torch.full((pages, PAGE_MULTIPLE, *source.shape[2:]), math.inf, dtype=source.dtype,
                          device=source.device)  # fmt: skip
        held[order[-1]] = torch.randn(held.shape[1:], generator=torch.Generator().manual_seed(case.seed)).to(held)
        held[table[:, :per_sequence]] = cache[:, : per_sequence * PAGE_MULTIPLE].unflatten(1, (per_sequence, -1))
        contiguous.append(cache)
        paged.append(held)
    spare = [x[order[-1]].clone() for x in paged]
    problems = _bits_differ(step.run(*paged, block_table=table), step.run(*contiguous))
    for name, cache, held, before in zip(("k_cache", "v_cache"), contiguous, paged, spare):
        seen = held[table[:, :per_sequence]].flatten(1, 2)
        if not bits_equal(seen, cache[:, : per_sequence * PAGE_MULTIPLE]):
            problems.append(f"{name}: the pages through block_table differ from the contiguous cache")
        if not bits_equal(held[order[-1]], before):
            problems.append(f"{name}: the spare page was written")
    if problems:
        raise PropertyFailure(prop, case, None, "; ".join(problems))


PROPERTIES = {prop.__name__: prop for prop in (kvcache_append_equals_concatenation, kvcache_paged_equals_contiguous)}
