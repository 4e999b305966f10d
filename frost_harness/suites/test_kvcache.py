"""``frost.attention_with_kvcache`` and ``frost.flash_attn_with_kvcache``: one decoding step over a KV cache.

Each step is drawn fresh (seeded): a cache whose every row but the ones a sequence holds is NaN,
the rows to append, the queries. What the test expects is built independently of frost: the rows
each sequence holds after the step (the appended rows written at ``cache_seqlens[b] + i``, rotated
in float32 and rounded to the io dtype where the step has RoPE) and the queries rotated likewise
at ``cache_seqlens[b] + i``. Checked:

- against the float64 oracle on those keys (``seqlens_k = cache_seqlens + S_new``, the mask aligned
  to the bottom right) with SEMANTICS.md's acceptance rule, into NaN-poisoned guarded outputs
  (``out=``), and the cache bit for bit as expected: the appended rows written, every other row as it
  was (NaN), spare pages untouched: decode on MHA / GQA / MQA, Sq > 1 (speculative decoding, chunked
  prefill) with bottom-right causal, windows, sinks, a scale, Dv != D, fp16, no append, queries
  beyond the appended rows, RoPE; contiguous and paged;
- a prefill from an empty cache with RoPE against the oracle's own RoPE (positions from 0);
- append then attend == ``frost.sdpa_forward`` on the concatenation, paged == contiguous, bit for bit;
- every ValueError names its argument and leaves the cache as it was; values are read only outside a
  CUDA-graph capture (simulated on the CPU) and torch.compile's tracing;
- ``flash_attn_with_kvcache`` against ``attention_with_kvcache``, and what it refuses;
- on CUDA the same, and a decode loop captured in a CUDA graph (the increment of ``cache_seqlens``
  included), replayed with new tokens and new lengths.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import pytest
import torch

import frost
import frost.kvcache
from frost import validation
from frost.kvcache import PAGE_MULTIPLE
from frost_harness.oracle import baseline, operand_slack, reference, tolerance
from frost_harness.oracle.rope import rotate
from frost_harness.suites import canaries
from frost_harness.suites.harness import bits_equal, judged

BF16 = torch.bfloat16
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@dataclass(frozen=True)
class Step:
    """One decoding step by its sizes: sequence b held ``cached[b]`` rows and appends ``new_rows``."""

    cached: tuple[int, ...] = (9, 0, 17)
    new_rows: int = 1
    seqlen_q: int = 1
    heads_q: int = 4
    heads_kv: int = 2
    dim: int = 32
    dim_v: int = 32
    causal: bool = True
    window: tuple[int, int] = (-1, -1)
    sinks: bool = False
    scale: float | None = None
    rope: bool = False
    paged: bool = False
    strided: bool = False  # k_cache and v_cache: the halves of one [..., 2, Hkv, D] buffer
    dtype: torch.dtype = BF16
    seed: int = 0

    @property
    def capacity(self) -> int:
        """Rows per sequence: a few spare ones past the longest (contiguous); whole pages and a table
        column past every sequence's pages (paged)."""
        longest = max(self.cached) + self.new_rows
        if self.paged:
            return (math.ceil(longest / PAGE_MULTIPLE) + 1) * PAGE_MULTIPLE
        return longest + 3

    @property
    def keywords(self) -> dict:
        return {"causal": self.causal, "window": self.window, "scale": self.scale}


@dataclass
class Drawn:
    """A step's tensors: the call's arguments (``arguments``) and what it must produce."""

    arguments: dict  # attention_with_kvcache's, the keywords of the mask left out
    queries: torch.Tensor  # q as attended: rotated at its positions with RoPE
    keys: torch.Tensor  # [B, capacity, Hkv, D]: each sequence's rows after the append, NaN past them
    values: torch.Tensor
    lengths: torch.Tensor  # cache_seqlens + S_new
    caches_after: tuple[torch.Tensor, torch.Tensor]  # k_cache / v_cache as they must be after the call


def _randn(generator, *shape, dtype, device):
    return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: int) -> torch.Tensor:
    """x ``[S, H, D]`` of one sequence rotated at positions start .. start + S - 1, in float32,
    rounded to x's dtype (what the contract says the cache holds)."""
    rows = slice(start, start + x.shape[0])
    return rotate(x.float(), cos[rows], sin[rows]).to(x.dtype)


def _paged(contiguous: torch.Tensor, table: torch.Tensor, pages: int) -> torch.Tensor:
    """The pages of a contiguous cache ``[B, width * PAGE, ...]`` under ``table`` (its last column
    never used); pages no entry names are NaN."""
    held = torch.full((pages, PAGE_MULTIPLE, *contiguous.shape[2:]), math.nan, dtype=contiguous.dtype,
                      device=contiguous.device)  # fmt: skip
    used = table[:, :-1]
    held[used] = contiguous[:, : used.shape[1] * PAGE_MULTIPLE].unflatten(1, (used.shape[1], PAGE_MULTIPLE))
    return held


def draw(step: Step, device: str) -> Drawn:
    """Fresh seeded tensors for ``step`` (see the module docstring)."""
    gen = torch.Generator().manual_seed(step.seed)
    batch, capacity, dtype = len(step.cached), step.capacity, step.dtype
    q = _randn(gen, batch, step.seqlen_q, step.heads_q, step.dim, dtype=dtype, device=device)
    k = _randn(gen, batch, step.new_rows, step.heads_kv, step.dim, dtype=dtype, device=device)
    v = _randn(gen, batch, step.new_rows, step.heads_kv, step.dim_v, dtype=dtype, device=device)
    caches, after = [], []
    queries = q.clone()
    if step.rope:
        positions = capacity + step.seqlen_q
        cos, sin = (_randn(gen, positions, step.dim // 2, dtype=torch.float32, device=device) for _ in range(2))
    for new, dim in ((k, step.dim), (v, step.dim_v)):
        before = torch.full((batch, capacity, step.heads_kv, dim), math.nan, dtype=dtype, device=device)
        for b, held in enumerate(step.cached):
            before[b, :held] = _randn(gen, held, step.heads_kv, dim, dtype=dtype, device=device)
        full = before.clone()
        for b, held in enumerate(step.cached):
            rows = new[b]
            if step.rope and new is k:
                rows = _rotated(rows, cos, sin, held)
            full[b, held : held + step.new_rows] = rows
        caches.append(before)
        after.append(full)
    if step.rope:
        for b, held in enumerate(step.cached):
            queries[b] = _rotated(q[b], cos, sin, held)
    cached = torch.tensor(step.cached, dtype=torch.int32, device=device)
    arguments = dict(q=q, k_cache=caches[0], v_cache=caches[1], cache_seqlens=cached)
    if step.new_rows:
        arguments.update(k=k, v=v)
    if step.rope:
        arguments["rope"] = (cos, sin)
    if step.sinks:
        arguments["sinks"] = _randn(gen, step.heads_q, dtype=torch.float32, device=device) * 2
    keys, values = after
    caches_after = tuple(after)
    if step.paged:
        width = capacity // PAGE_MULTIPLE
        pages = batch * (width - 1) + 2  # two spare pages
        order = torch.randperm(pages, generator=gen)
        beyond = torch.tensor([[-3 if b % 2 else pages + 5] for b in range(batch)])  # never read: out of range
        table = torch.cat((order[: batch * (width - 1)].view(batch, width - 1), beyond), dim=1)
        table = table.to(device=device, dtype=torch.int32)
        arguments.update(k_cache=_paged(caches[0], table, pages), v_cache=_paged(caches[1], table, pages),
                         block_table=table)  # fmt: skip
        caches_after = (_paged(after[0], table, pages), _paged(after[1], table, pages))
    if step.strided:
        buffer = torch.stack((arguments["k_cache"], arguments["v_cache"]), dim=2)
        arguments.update(k_cache=buffer[:, :, 0], v_cache=buffer[:, :, 1])
    return Drawn(arguments, queries, keys, values, cached + step.new_rows, caches_after)


def _oracle_keywords(step: Step, drawn: Drawn) -> dict:
    return dict(seqlens_k=drawn.lengths, causal_align="bottom_right", sinks=drawn.arguments.get("sinks"),
                **step.keywords)  # fmt: skip


def _outputs(drawn: Drawn, step: Step) -> tuple[canaries.Guarded, canaries.Guarded]:
    q = drawn.arguments["q"]
    o = canaries.guarded("o", (*q.shape[:-1], step.dim_v), q.dtype, q.device)
    lse = canaries.guarded("lse", (q.shape[0], q.shape[2], q.shape[1]), torch.float32, q.device)
    return o, lse


def _run(drawn: Drawn, step: Step, **extra):
    return frost.attention_with_kvcache(**drawn.arguments, **step.keywords, return_lse=True, **extra)


def _assert_caches(drawn: Drawn) -> None:
    for name, got, want in zip(("k_cache", "v_cache"), (drawn.arguments["k_cache"], drawn.arguments["v_cache"]),
                               drawn.caches_after):  # fmt: skip
        assert bits_equal(got, want), f"{name}: not the appended rows in place, every other row as it was"


def _assert_like_oracle(got, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, io_dtype, **kw) -> None:
    """``got = (o, lse)`` against the float64 oracle on these queries, keys and values, by
    SEMANTICS.md's acceptance rule."""
    truth = reference.forward(queries, keys, values, **kw)
    base = baseline.forward(queries, keys, values, **kw)
    verdicts = tolerance.check_forward(got, truth, base, io_dtype=io_dtype)
    assert all(v.passed for v in verdicts.values()), tolerance.summary(verdicts)


# name -> the step; each runs contiguous and paged
STEPS = {
    "decode-mha": Step(heads_q=4, heads_kv=4),
    "decode-gqa": Step(heads_q=8, heads_kv=2),
    "decode-mqa-sinks": Step(heads_q=4, heads_kv=1, sinks=True),
    "speculative": Step(seqlen_q=4, new_rows=4),
    "chunked-prefill-window": Step(cached=(20, 0, 3), seqlen_q=16, new_rows=16, window=(8, 0)),
    "window-non-causal": Step(seqlen_q=3, new_rows=3, causal=False, window=(5, 1)),
    "no-append": Step(cached=(10, 1, 30), new_rows=0, seqlen_q=2),
    "queries-beyond-appended": Step(seqlen_q=3, new_rows=1),
    "dv-scale-fp16": Step(dim_v=16, scale=-0.3, dtype=torch.float16, causal=False),
    "rope-decode": Step(rope=True),
    "rope-speculative-gqa": Step(cached=(3, 0, 40), seqlen_q=3, new_rows=3, heads_q=8, heads_kv=2, rope=True),
    "across-pages": Step(cached=(60, 0, 125), seqlen_q=8, new_rows=8, rope=True),  # rows 60 .. 67: pages 0 and 1
    "strided-caches": Step(seqlen_q=2, new_rows=2, strided=True),
}


@pytest.mark.L0
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("name", STEPS)
def test_a_step_matches_the_oracle_and_writes_only_its_rows(name, paged, device):
    step = dataclasses.replace(STEPS[name], paged=paged)
    drawn = draw(step, device)
    o, lse = _outputs(drawn, step)
    got = _run(drawn, step, out=(o.body, lse.body))
    assert got[0] is o.body and got[1] is lse.body
    assert not canaries.damage([o, lse])
    _assert_caches(drawn)
    _assert_like_oracle(got, drawn.queries, drawn.keys, drawn.values, step.dtype, **_oracle_keywords(step, drawn))


@pytest.mark.L0
@pytest.mark.parametrize("device", DEVICES)
def test_rope_from_an_empty_cache_is_frosts_rope(device):
    """A prefill: every row appended at positions 0 .., queries too: the contract's RoPE as
    ``frost.sdpa_forward`` takes it, judged against the oracle's own rotation."""
    step = Step(cached=(0, 0, 0), seqlen_q=12, new_rows=12, rope=True, sinks=True)
    drawn = draw(step, device)
    got = _run(drawn, step)
    args = drawn.arguments
    kw = dict(rope=args["rope"], sinks=args["sinks"], **step.keywords)
    q, k, v = args["q"], args["k"], args["v"]
    truth = reference.forward(q, k, v, **kw)
    base = baseline.forward(q, k, v, **kw)
    verdicts = judged(lambda slack: tolerance.check_forward(got, truth, base, io_dtype=step.dtype, slack=slack),
                      lambda: operand_slack.forward_slack(q, k, v, truth, **kw))  # fmt: skip
    assert all(v.passed for v in verdicts.values()), tolerance.summary(verdicts)


@pytest.mark.L0
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["decode-gqa", "speculative", "chunked-prefill-window", "rope-speculative-gqa"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_append_then_attend_is_the_forward_on_the_concatenation(name, paged, device):
    step = dataclasses.replace(STEPS[name], paged=paged)
    drawn = draw(step, device)
    got = _run(drawn, step)
    want = frost.sdpa_forward(drawn.queries, drawn.keys, drawn.values, **_oracle_keywords(step, drawn))
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])


@pytest.mark.L0
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["decode-mqa-sinks", "chunked-prefill-window", "no-append", "across-pages"])
def test_paged_equals_contiguous_bit_for_bit(name, device):
    """Both from one draw: the paged cache holds the contiguous one's rows in shuffled pages
    (its table's last column out of range, never read), with spare pages."""
    step = dataclasses.replace(STEPS[name], paged=True)
    drawn = draw(step, device)
    table = drawn.arguments["block_table"]
    width = table.shape[1]
    used = (width - 1) * PAGE_MULTIPLE
    contiguous = {}
    for cache_name, x in (("k_cache", drawn.keys), ("v_cache", drawn.values)):
        cache = torch.full((len(step.cached), width * PAGE_MULTIPLE, *x.shape[2:]), math.nan, dtype=x.dtype,
                           device=x.device)  # fmt: skip
        cache[:, :used] = drawn.arguments[cache_name][table[:, :-1]].flatten(1, 2)
        contiguous[cache_name] = cache
    paged = _run(drawn, step)
    flat = _run(dataclasses.replace(drawn, arguments={**drawn.arguments, **contiguous, "block_table": None}), step)
    assert bits_equal(paged[0], flat[0]) and bits_equal(paged[1], flat[1])
    for cache_name, cache in contiguous.items():
        assert bits_equal(drawn.arguments[cache_name][table[:, :-1]].flatten(1, 2), cache[:, :used])


# ValueErrors: (what changes in a valid paged GQA decode step, the argument the message must name)
def _set(**changes):
    return lambda args: args.update(changes)


def _retype(name, dtype):
    return lambda args: args.update({name: args[name].to(dtype)})


def _reshape(name, index):
    return lambda args: args.update({name: args[name][index]})


BAD = {
    "q-float32": (_retype("q", torch.float32), "q"),
    "q-3-dims": (_reshape("q", 0), "q"),
    "k_cache-fp16": (_retype("k_cache", torch.float16), "k_cache"),
    "k_cache-not-a-tensor": (_set(k_cache=[1.0]), "k_cache"),
    "k_cache-on-meta": (lambda args: args.update(k_cache=args["k_cache"].to("meta")), "k_cache"),
    "k_cache-strided-last-dim": (lambda args: args.update(k_cache=args["k_cache"][..., ::2]), "k_cache"),
    "v_cache-fewer-pages": (_reshape("v_cache", slice(1, None)), "v_cache"),
    "k_cache-head-dim": (lambda args: args.update(k_cache=args["k_cache"][..., :16], v_cache=args["v_cache"][..., :16]),
                         "k_cache"),
    "k_cache-heads": (lambda args: args.update(k_cache=args["k_cache"][:, :, :1].expand(-1, -1, 3, -1),
                                               v_cache=args["v_cache"][:, :, :1].expand(-1, -1, 3, -1)), "k_cache"),
    "k_cache-page-size": (lambda args: args.update(k_cache=args["k_cache"][:, :48], v_cache=args["v_cache"][:, :48]),
                          "k_cache"),
    "k-without-v": (_set(v=None), "v"),
    "v-without-k": (_set(k=None), "k"),
    "v-rows-differ-from-k": (_reshape("k", (slice(None), slice(0, 0))), "v"),
    "v-dtype": (_retype("v", torch.float16), "v"),
    "k-heads": (_reshape("k", (slice(None), slice(None), slice(0, 1))), "k"),
    "block_table-int64": (_retype("block_table", torch.int64), "block_table"),
    "block_table-rows": (_reshape("block_table", slice(0, 2)), "block_table"),
    "block_table-1-dim": (_reshape("block_table", (slice(None), 0)), "block_table"),
    "block_table-entry": (lambda args: args["block_table"].__setitem__((1, 0), 99), "block_table"),
    "block_table-negative": (lambda args: args["block_table"].__setitem__((2, 0), -1), "block_table"),
    "cache_batch_idx-with-block_table": (_set(cache_batch_idx=torch.arange(3, dtype=torch.int32)), "cache_batch_idx"),
    "cache_seqlens-int64": (_retype("cache_seqlens", torch.int64), "cache_seqlens"),
    "cache_seqlens-entries": (_reshape("cache_seqlens", slice(0, 2)), "cache_seqlens"),
    "cache_seqlens-past-capacity": (lambda args: args["cache_seqlens"].__setitem__(0, 128), "cache_seqlens"),
    "cache_seqlens-negative": (lambda args: args["cache_seqlens"].__setitem__(2, -1), "cache_seqlens"),
    "cache_seqlens-int-past-capacity": (_set(cache_seqlens=128), "cache_seqlens"),
    "cache_seqlens-float": (_set(cache_seqlens=3.0), "cache_seqlens"),
    "cache_seqlens-none": (_set(cache_seqlens=None), "cache_seqlens"),
    "rope-without-k": (lambda args: args.update(k=None, v=None, rope=args["rope"]), "rope"),
    "rope-float16": (lambda args: args.update(rope=tuple(t.half() for t in args["rope"])), "rope"),
    "rope-too-short": (lambda args: args.update(rope=tuple(t[:100] for t in args["rope"])), "rope"),
    "rope-not-a-pair": (lambda args: args.update(rope=args["rope"][0]), "rope"),
    "sinks-shape": (_set(sinks=torch.zeros(3)), "sinks"),
    "window": (_set(window=(-2, 0)), "window"),
    "scale-nan": (_set(scale=math.nan), "scale"),
    "causal-int": (_set(causal=1), "causal"),
    "out-shape": (lambda args: args.update(out=(args["q"].new_empty(1), torch.empty(3, 4, 1))), "out.o"),
    "out-on-the-cache": (lambda args: args.update(out=(args["k_cache"].view(-1)[:384].view(3, 1, 4, 32),
                                                       torch.empty(3, 4, 1))), "out.o"),
}


@pytest.mark.L0
@pytest.mark.parametrize("bad", BAD)
def test_a_bad_argument_is_named_before_anything_is_written(bad):
    step = Step(paged=True, rope=True)
    drawn = draw(step, "cpu")
    args = {**drawn.arguments, **step.keywords}
    change, name = BAD[bad]
    change(args)
    caches = {n: args[n] for n in ("k_cache", "v_cache") if isinstance(args[n], torch.Tensor)}
    before = {n: x.clone() for n, x in caches.items() if not x.is_meta}
    with pytest.raises(ValueError, match=f"^{name}: "):
        frost.attention_with_kvcache(**args)
    for n, x in before.items():
        assert bits_equal(caches[n], x), f"{n} was written by a call that raised"


@pytest.mark.L0
def test_cache_batch_idx_names_a_sequence_of_the_cache_to_read_and_write():
    """A contiguous cache of 5 sequences, 3 of them used in another order: == a cache of those 3 in
    that order, and the rows land in the sequences named."""
    step = Step()
    drawn = draw(step, "cpu")
    args = drawn.arguments
    index = torch.tensor([4, 0, 2], dtype=torch.int32)
    wide = {n: torch.full((5, *args[n].shape[1:]), math.nan, dtype=args[n].dtype) for n in ("k_cache", "v_cache")}
    for n, cache in wide.items():
        cache[index.long()] = args[n]
    got = frost.attention_with_kvcache(**{**args, **wide}, cache_batch_idx=index, **step.keywords, return_lse=True)
    want = _run(drawn, step)
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])
    for n, cache in wide.items():
        assert bits_equal(cache[index.long()], args[n])
        assert cache[[1, 3]].isnan().all()
    with pytest.raises(ValueError, match=r"^cache_batch_idx: entry \[1\] = 5 is not a sequence"):
        frost.attention_with_kvcache(**{**args, **wide}, cache_batch_idx=torch.tensor([4, 5, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="^k_cache: batch 5 does not match q's 3"):
        frost.attention_with_kvcache(**{**args, **wide})


@pytest.mark.L0
def test_table_entries_past_a_sequences_pages_are_never_read():
    """Entries after the pages a sequence uses may hold anything: the call neither checks nor reads them."""
    step = Step(paged=True)
    drawn = draw(step, "cpu")
    want = _run(drawn, step)
    table = drawn.arguments["block_table"]
    assert (table[:, -1] < 0).any() and (table[:, -1] >= drawn.arguments["k_cache"].shape[0]).any()
    again = draw(step, "cpu")
    again.arguments["block_table"][:, -1] = torch.tensor([2**30, -(2**30), 7], dtype=torch.int32)
    got = _run(again, step)
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])


def _no_reads(monkeypatch):
    """Fail the test on any read of lengths or table values back to the host."""
    for owner, name in ((frost.kvcache, "_check_length_values"), (frost.kvcache, "_check_table_values"),
                        (validation, "_check_int_vector")):  # fmt: skip
        monkeypatch.setattr(owner, name, lambda *a, name=name: pytest.fail(f"{name} read values back"))


@pytest.mark.L0
def test_a_captured_step_reads_no_values(monkeypatch):
    """While a CUDA graph is captured (``validation.capturing``, simulated), no value is read back:
    the eager call before it made the plan and checked the values."""
    step = Step(paged=True, rope=True, seqlen_q=2, new_rows=2)
    eager = _run(draw(step, "cpu"), step)
    reads = []
    for name in ("_check_length_values", "_check_table_values"):
        real = getattr(frost.kvcache, name)
        monkeypatch.setattr(frost.kvcache, name, lambda *a, real=real: reads.append(real) or real(*a))
    _run(draw(step, "cpu"), step)
    assert len(reads) == 2  # outside a capture: both value checks
    monkeypatch.setattr(validation, "capturing", lambda x: True)
    _no_reads(monkeypatch)
    captured = _run(draw(step, "cpu"), step)
    assert bits_equal(captured[0], eager[0]) and bits_equal(captured[1], eager[1])


@pytest.mark.L0
def test_a_compiled_step_matches_eager_and_reads_no_values(monkeypatch):
    """torch.compile(fullgraph=True) traces the step (no graph break); the compiled step, run on new
    ``cache_seqlens``, reads no value back."""
    step = Step(paged=True, rope=True, sinks=True)
    eager, compiled = draw(step, "cpu"), draw(step, "cpu")

    def decode(arguments):
        return frost.attention_with_kvcache(**arguments, **step.keywords, return_lse=True)

    want = decode(eager.arguments)
    torch.compiler.reset()
    run = torch.compile(decode, backend="aot_eager", fullgraph=True)
    got = run(compiled.arguments)
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])
    for name in ("k_cache", "v_cache"):
        assert bits_equal(compiled.arguments[name], eager.arguments[name])
    _no_reads(monkeypatch)
    for drawn in (eager, compiled):
        drawn.arguments["cache_seqlens"] += 1  # the next decode step
    got = run(compiled.arguments)
    monkeypatch.undo()
    want = decode(eager.arguments)
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])
    # out= compiles too, with a graph break: its overlap check reads data pointers
    torch.compiler.reset()
    o, lse = _outputs(compiled, step)
    got = torch.compile(decode, backend="aot_eager")({**compiled.arguments, "out": (o.body, lse.body)})
    want = decode(eager.arguments)
    torch.compiler.reset()
    assert got[0] is o.body and bits_equal(o.body, want[0]) and bits_equal(lse.body, want[1])
    assert not canaries.damage([o, lse])


# flash_attn_with_kvcache ----------------------------------------------------------------


def _fa2(drawn: Drawn, step: Step, **changes):
    """FA2's call for a drawn step: the same arguments under FA2's names."""
    args = drawn.arguments
    rope = args.get("rope")
    call = dict(k=args.get("k"), v=args.get("v"), cache_seqlens=args["cache_seqlens"],
                block_table=args.get("block_table"), softmax_scale=step.scale, causal=step.causal,
                window_size=step.window, rotary_cos=None if rope is None else rope[0].to(step.dtype),
                rotary_sin=None if rope is None else rope[1].to(step.dtype), rotary_interleaved=False,
                return_softmax_lse=True)  # fmt: skip
    return frost.flash_attn_with_kvcache(args["q"], args["k_cache"], args["v_cache"], **{**call, **changes})


@pytest.mark.L0
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["decode-gqa", "chunked-prefill-window", "rope-speculative-gqa", "no-append"])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_flash_attn_with_kvcache_is_attention_with_kvcache(name, paged, device):
    """FA2's names for the same step; its rotary tables in the io dtype are frost's rounded to it."""
    step = dataclasses.replace(STEPS[name], paged=paged)
    fa2, frosts = draw(step, device), draw(step, device)
    if step.rope:  # FA2's tables come in the io dtype
        frosts.arguments["rope"] = tuple(t.to(step.dtype).float() for t in frosts.arguments["rope"])
    got = _fa2(fa2, step, num_splits=3)  # a hint, taken and ignored
    want = _run(frosts, step)
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])
    for cache in ("k_cache", "v_cache"):
        assert bits_equal(fa2.arguments[cache], frosts.arguments[cache])


@pytest.mark.L0
def test_flash_attn_with_kvcache_reads_fa2s_window_lengths_and_outputs():
    """causal sets the window's right side to 0 and a negative side is unbounded; an int
    ``cache_seqlens`` is every sequence's, None (nothing appended) the full cache; out alone without
    ``return_softmax_lse``."""
    step = Step(cached=(7, 7, 7), seqlen_q=3, new_rows=3, window=(4, -1))
    drawn = draw(step, "cpu")
    want = _run(drawn, step)
    got = _fa2(draw(step, "cpu"), step, cache_seqlens=7, window_size=(4, 9))
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])
    args = draw(Step(cached=(14, 14, 14), new_rows=0, seqlen_q=2), "cpu").arguments
    q, k_cache, v_cache = args["q"], args["k_cache"][:, :14], args["v_cache"][:, :14]
    want = frost.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=14, window=(3, -1))
    got = frost.flash_attn_with_kvcache(q, k_cache, v_cache, window_size=(3, -5))
    assert bits_equal(got, want)


def _fa2_rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                 interleaved: bool) -> torch.Tensor:
    """x ``[S, H, D]`` of one sequence rotated as FlashAttention-2 documents it, row i at
    ``positions[i]``: the first ``2 * cos.shape[1]`` dims, pairs ``(2j, 2j + 1)`` when interleaved,
    else ``(j, j + R/2)``; built from the oracle's rotation of the halves on the pairs laid out as
    halves, in float32, rounded to x's dtype."""
    rotated = 2 * cos.shape[1]
    order = (torch.cat((torch.arange(0, rotated, 2), torch.arange(1, rotated, 2))) if interleaved
             else torch.arange(rotated)).to(x.device)  # fmt: skip
    part = x[..., :rotated].float()
    turned = torch.empty_like(part)
    turned[..., order] = rotate(part[..., order], cos[positions], sin[positions])
    return torch.cat((turned.to(x.dtype), x[..., rotated:]), dim=-1)


# name -> (the step, drawn without frost's RoPE; the rotary dim; interleaved)
FA2_ROTARY = {
    "interleaved-decode-gqa": (Step(heads_q=8, heads_kv=2), 32, True),
    "interleaved-partial-speculative": (Step(seqlen_q=3, new_rows=3), 16, True),
    "halves-partial-window": (Step(cached=(20, 0, 3), seqlen_q=4, new_rows=4, window=(6, 0)), 16, False),
    "halves-one-position-non-causal": (Step(seqlen_q=3, new_rows=2, causal=False), 32, False),
    "interleaved-one-position-non-causal": (Step(seqlen_q=2, new_rows=2, causal=False, heads_kv=1), 8, True),
}


@pytest.mark.L0
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("name", FA2_ROTARY)
def test_flash_attn_with_kvcache_rotates_as_fa2(name, paged, device):
    """FA2's rotary arguments: k's rows at ``cache_seqlens + i``; q's there with causal or a window,
    else all at ``cache_seqlens``; interleaved or halves pairs; a partial rotary dim. The caches bit
    for bit as built here, the output against the oracle on the keys and queries built here."""
    step, rotary_dim, interleaved = FA2_ROTARY[name]
    step = dataclasses.replace(step, paged=paged)
    drawn = draw(step, device)
    args = drawn.arguments
    gen = torch.Generator().manual_seed(7)
    cos, sin = (_randn(gen, step.capacity + step.seqlen_q, rotary_dim // 2, dtype=BF16, device=device)
                for _ in range(2))  # fmt: skip
    table32 = (cos.float(), sin.float())
    keys, queries = drawn.keys, drawn.queries
    masked = step.causal or step.window != (-1, -1)
    for b, held in enumerate(step.cached):
        new = torch.arange(held, held + step.new_rows, device=device)
        keys[b, held : held + step.new_rows] = _fa2_rotated(args["k"][b], *table32, new, interleaved)
        rows = torch.arange(held, held + step.seqlen_q, device=device) if masked else torch.full_like(new[:1], held)
        queries[b] = _fa2_rotated(args["q"][b], *table32, rows.expand(step.seqlen_q), interleaved)
    want_caches = (keys, drawn.values)
    if paged:
        table = args["block_table"]
        want_caches = tuple(_paged(c, table, args["k_cache"].shape[0]) for c in want_caches)
    got = _fa2(drawn, step, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    for name_, cache, want in zip(("k_cache", "v_cache"), (args["k_cache"], args["v_cache"]), want_caches):
        assert bits_equal(cache, want), f"{name_}: not FA2's rotated rows in place"
    _assert_like_oracle(got, queries, keys, drawn.values, step.dtype, **_oracle_keywords(step, drawn))


@pytest.mark.L0
@pytest.mark.parametrize("interleaved", [False, True])
def test_attention_with_kvcache_takes_fa2s_rotations(interleaved):
    """``rope`` over the first R dims (tables of R/2 columns) and ``rope_interleaved``: the causal
    FA2 call with the same tables, bit for bit, caches included."""
    step = Step(seqlen_q=2, new_rows=2, paged=True)
    ours, theirs = draw(step, "cpu"), draw(step, "cpu")
    gen = torch.Generator().manual_seed(3)
    cos, sin = (_randn(gen, step.capacity + 2, 8, dtype=torch.float32, device="cpu") for _ in range(2))
    got = frost.attention_with_kvcache(**ours.arguments, **step.keywords, rope=(cos, sin), rope_interleaved=interleaved,
                                       return_lse=True)  # fmt: skip
    want = _fa2(theirs, step, rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    assert bits_equal(got[0], want[0]) and bits_equal(got[1], want[1])
    for cache in ("k_cache", "v_cache"):
        assert bits_equal(ours.arguments[cache], theirs.arguments[cache])


@pytest.mark.L0
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("name", ["decode-gqa", "chunked-prefill-window", "rope-speculative-gqa"])
def test_cache_leftpad_masks_the_rows_before_it(name, paged, device):
    """FA2's ``cache_leftpad``: each sequence attends its rows from ``cache_leftpad[b]`` on; the rows
    and their positions stay where they are. Judged against the oracle with those rows masked by a
    -inf bias built here."""
    step = dataclasses.replace(STEPS[name], paged=paged)
    drawn = draw(step, device)
    leftpad = torch.tensor([held // 2 + (held % 3 == 1) for held in step.cached], dtype=torch.int32, device=device)
    rope = drawn.arguments.get("rope")  # in float32, as the expected caches were rotated
    tables = {} if rope is None else dict(rotary_cos=rope[0], rotary_sin=rope[1])
    got = _fa2(drawn, step, cache_leftpad=leftpad, **tables)
    _assert_caches(drawn)
    columns = torch.arange(step.capacity, device=device)
    hidden = (columns[None, :] < leftpad[:, None].long())[:, None, None, :]
    bias = torch.zeros(hidden.shape, device=device).masked_fill(hidden, -math.inf).expand(-1, 1, step.seqlen_q, -1)
    _assert_like_oracle(got, drawn.queries, drawn.keys, drawn.values, step.dtype, bias=bias,
                        **_oracle_keywords(step, drawn))  # fmt: skip
    unpadded = _fa2(draw(step, device), step, **tables)
    assert not bits_equal(got[0], unpadded[0])  # the rows before the pads were attended otherwise


FA2_REFUSED = {
    "rotary_sin-missing": dict(rotary_sin=None),
    "rotary_cos-without-k": dict(k=None, v=None),
    "rotary_interleaved-not-a-bool": dict(rotary_interleaved="yes"),
    "rotary_cos-wider-than-the-head-dim": dict(rotary_cos=torch.zeros(200, 24, dtype=BF16),
                                               rotary_sin=torch.zeros(200, 24, dtype=BF16)),
    "cache_seqlens-none-with-k": dict(cache_seqlens=None),
    "cache_leftpad-int64": dict(cache_leftpad=torch.zeros(3, dtype=torch.int64)),
    "cache_leftpad-past-the-rows-held": dict(cache_leftpad=torch.tensor([0, 0, 99], dtype=torch.int32)),
    "alibi_slopes": dict(alibi_slopes=torch.zeros(4)),
    "softcap": dict(softcap=30.0),
    "window_size": dict(window_size=(1, 2, 3)),
}


@pytest.mark.L0
@pytest.mark.parametrize("refused", FA2_REFUSED)
def test_flash_attn_with_kvcache_refuses_what_frost_cannot_do(refused):
    step = Step(paged=True, rope=True, seqlen_q=2, new_rows=2)
    drawn = draw(step, "cpu")
    before = drawn.arguments["k_cache"].clone()
    with pytest.raises(ValueError, match=f"^{refused.split('-')[0]}: "):
        _fa2(drawn, step, **FA2_REFUSED[refused])
    assert bits_equal(drawn.arguments["k_cache"], before)


# CUDA graphs -------------------------------------------------------------------------------


@pytest.mark.L0
@pytest.mark.gpu
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_a_decode_loop_captured_in_a_cuda_graph_replays_like_eager(paged):
    """docs/USAGE.md's loop: one step, the increment of ``cache_seqlens`` included, captured after
    its eager warm-up on a side stream; then new lengths, and each replay with a new token written
    into the captured q, k, v: outputs and caches equal an eager loop's on the same values."""
    step = Step(heads_q=8, heads_kv=2, rope=True, sinks=True, paged=paged)
    args = draw(step, "cuda").arguments
    eager = {**args, **{name: args[name].clone() for name in ("k_cache", "v_cache", "cache_seqlens")}}

    def decode(arguments):
        out = frost.attention_with_kvcache(**arguments, **step.keywords, return_lse=True)
        arguments["cache_seqlens"].add_(step.new_rows)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode(args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = decode(args)
    for lengths in (args["cache_seqlens"], eager["cache_seqlens"]):  # within either capacity for 3 steps
        lengths.copy_(torch.tensor([15, 2, 11], dtype=torch.int32))
    for seed in range(1, 4):
        later = draw(dataclasses.replace(step, seed=seed), "cuda").arguments
        for name in ("q", "k", "v"):  # shared by both loops
            args[name].copy_(later[name])
        graph.replay()
        want = decode(eager)
        torch.cuda.synchronize()
        assert bits_equal(outputs[0], want[0]) and bits_equal(outputs[1], want[1]), f"step {seed}"
    for name in ("k_cache", "v_cache", "cache_seqlens"):
        assert bits_equal(args[name], eager[name]), name


# the wider grid ----------------------------------------------------------------------------

GRID_HEADS = [(1, 1), (4, 4), (8, 2), (8, 1)]
GRID_ROWS = [(1, 1), (5, 5), (7, 2), (3, 0)]  # (Sq, S_new)
GRID_MASKS = [(False, (-1, -1)), (True, (-1, -1)), (True, (6, -1)), (False, (4, 3))]


@pytest.mark.L1
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [BF16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("heads", "rows", "mask", "paged"),
                         list(itertools.product(GRID_HEADS, GRID_ROWS, GRID_MASKS, [False, True])))  # fmt: skip
def test_grid_matches_the_oracle(heads, rows, mask, paged, dtype, device):
    step = Step(cached=(0, 63, 64, 130), heads_q=heads[0], heads_kv=heads[1], seqlen_q=rows[0], new_rows=rows[1],
                causal=mask[0], window=mask[1], paged=paged, dtype=dtype, sinks=heads[1] == 1,
                rope=rows[1] > 0 and heads[0] == 8, seed=10 * heads[0] + rows[0])  # fmt: skip
    drawn = draw(step, device)
    got = _run(drawn, step)
    _assert_caches(drawn)
    _assert_like_oracle(got, drawn.queries, drawn.keys, drawn.values, dtype, **_oracle_keywords(step, drawn))
