"""Training steps of small Llama-style models with transformers' attention implementations and frost's.

    python benchmarks/train_step.py [--device cuda|cpu] [--modes eager,compile] [--compile] [--steps N]
                                    [--configs NAME,...] [--tiny] [--compiled-backends]

Each config is a random-init ``LlamaForCausalLM`` (never downloaded) trained for ``--steps``
steps of AdamW on random token ids, once per attention implementation and mode, from the same
initial weights and on the same batches. Mixed precision as in practice: float32 master weights
and optimizer state, the forward and backward under ``torch.autocast`` in bf16. Mode ``eager``
runs the model as it is, ``compile`` runs ``torch.compile(model)`` (inductor, the default mode;
``--compile-backend`` picks another, e.g. ``aot_eager`` on a CPU).

The implementations (columns):

- ``sdpa``: transformers' sdpa with torch's default backend choice; the attention kernels it ran
  are read from the profiler (one profiled step) and printed below the table;
- ``sdpa-flash`` / ``sdpa-cudnn``: the same with ``sdpa_kernel`` forcing torch's FlashAttention-2
  or cuDNN backend (n/a where that backend refuses the problem, e.g. flash and a packed batch's
  mask); in ``compile`` mode only with ``--compiled-backends`` (each costs a compile);
- ``frost``: ``attn_implementation="frost"`` as a user gets it (on SM90 the dispatch ranks
  torch's cuDNN kernels first where they measure faster: ``frost.engines.native.CUDNN_FASTER_ON``);
- ``frost-kernels``: the same inside ``frost.dispatch.table_order()``, frost's own kernels
  serving every call (only where that differs from ``frost``: a device family with a native
  engine ranked first).

Printed per run: tokens/s (tokens per step over the median step time, after ``--warmup``
untimed steps that absorb compiling and plan building; each step ends with ``loss.item()``,
which synchronizes), the ratio to ``sdpa`` (and ``frost-kernels`` to ``sdpa-flash``), the
largest |loss - sdpa's loss| over the steps, graph breaks and recompiles after the first step
(``torch._dynamo.utils.counters``) in ``compile`` mode, and for frost the engines that served
its calls (``frost.dispatch.ledger``) and the adapter's fallbacks. The Markdown table comes last.

Configs (the four of frost issue 44, and one packed batch): ``l2-h32kv8-d128`` (2 layers,
32/8 heads, d128, 1 x 4096), ``l2-h28kv4-d128`` (1 x 4096), ``l4-h16kv4-d64`` (4 x 2048),
``l2-h16kv1-d128`` (2 x 4096), ``packed-h32kv8-d128``: the first model on one row of 4096
tokens packed from sequences of 64 to 1536 tokens (the same packing every step, as
DataCollatorWithFlattening gives it: ``position_ids`` restarting, ``cu_seq_lens_q/k`` and
``max_length_q/k``; sdpa reads the position ids, frost the flash-attention keywords).
``--tiny`` (the default on CPU) is one small config and one small packed config.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frost import dispatch  # noqa: E402
from frost.engines import native  # noqa: E402
from frost.integrations import transformers as adapter  # noqa: E402  (registers "frost")


class Config(NamedTuple):
    heads_q: int
    heads_kv: int
    head_dim: int
    layers: int
    batch: int
    seqlen: int
    vocab: int = 32000
    packed: tuple[int, ...] = ()  # the sequence lengths of one packed row (batch 1)


def _packing(total: int, low: int, high: int, seed: int = 0) -> tuple[int, ...]:
    """Sequence lengths in [low, high] that fill ``total`` tokens (the last one takes the rest)."""
    generator = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while total - sum(lengths) > high:
        lengths.append(int(torch.randint(low, high + 1, (1,), generator=generator)))
    return (*lengths, total - sum(lengths))


CONFIGS = {
    "l2-h32kv8-d128": Config(32, 8, 128, layers=2, batch=1, seqlen=4096),
    "l2-h28kv4-d128": Config(28, 4, 128, layers=2, batch=1, seqlen=4096),
    "l4-h16kv4-d64": Config(16, 4, 64, layers=4, batch=4, seqlen=2048),
    "l2-h16kv1-d128": Config(16, 1, 128, layers=2, batch=2, seqlen=4096),
    "packed-h32kv8-d128": Config(32, 8, 128, layers=2, batch=1, seqlen=4096, packed=_packing(4096, 64, 1536)),
}
TINY = {
    "tiny-h4kv2-d16": Config(4, 2, 16, layers=2, batch=2, seqlen=64, vocab=256),
    "tiny-packed": Config(4, 2, 16, layers=2, batch=1, seqlen=64, vocab=256, packed=(20, 9, 35)),
}
MODES = ("eager", "compile")


class Impl(NamedTuple):
    """One column: transformers' attention implementation and the context its steps run in."""

    name: str
    attn: str
    context: object  # () -> a context manager


def _sdpa_backend(backend: str):
    def context():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, backend))

    return context


def implementations(mode: str, device: str, compiled_backends: bool) -> list[Impl]:
    impls = [Impl("sdpa", "sdpa", contextlib.nullcontext)]
    if device == "cuda" and (mode == "eager" or compiled_backends):
        impls += [Impl("sdpa-flash", "sdpa", _sdpa_backend("FLASH_ATTENTION")),
                  Impl("sdpa-cudnn", "sdpa", _sdpa_backend("CUDNN_ATTENTION"))]  # fmt: skip
    impls.append(Impl("frost", "frost", contextlib.nullcontext))
    if device == "cuda" and torch.cuda.get_device_capability()[0] in native.CUDNN_FASTER_ON:
        impls.append(Impl("frost-kernels", "frost", dispatch.table_order))
    return impls


class Batch(NamedTuple):
    ids: torch.Tensor
    kwargs: dict  # labels and, for a packed row, the packing keywords


def build(config: Config, device: str, impl: str = "sdpa", weights: dict | None = None):
    """The random-init model (float32) with attention ``impl``; ``weights`` (a state dict)
    makes every implementation start from the same ones."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    hidden = config.heads_q * config.head_dim
    llama = LlamaConfig(
        vocab_size=config.vocab, hidden_size=hidden, intermediate_size=int(hidden * 8 / 3) // 64 * 64 or 64,
        num_hidden_layers=config.layers, num_attention_heads=config.heads_q, num_key_value_heads=config.heads_kv,
        head_dim=config.head_dim, max_position_embeddings=config.seqlen, use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    # from_config(attn_implementation=) rather than set_attn_implementation, which 4.x lacks
    model = AutoModelForCausalLM.from_config(llama, attn_implementation=impl)
    if weights is not None:
        model.load_state_dict(weights)
    return model.to(device)


def batches(config: Config, steps: int, device: str) -> list[Batch]:
    generator = torch.Generator().manual_seed(1)
    kwargs = {}
    if config.packed:
        starts = torch.tensor([0, *config.packed]).cumsum(0)
        cu = starts.to(torch.int32).to(device)
        kwargs = dict(position_ids=torch.cat([torch.arange(n) for n in config.packed])[None].to(device),
                      cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(config.packed),
                      max_length_k=max(config.packed))  # fmt: skip
    made = []
    for _ in range(steps):
        ids = torch.randint(0, config.vocab, (config.batch, config.seqlen), generator=generator)
        labels = ids.clone()
        if config.packed:
            labels[0, starts[:-1]] = -100  # no prediction across a sequence boundary
        made.append(Batch(ids.to(device), dict(kwargs, labels=labels.to(device))))
    return made


class Result(NamedTuple):
    tokens_per_s: float
    losses: list[float]
    breaks: int | None  # graph breaks (compile mode)
    recompiles: int | None  # graphs compiled after the first step (compile mode)
    kernels: str  # the attention kernels the profiled step ran ("" unless profiled)


def _attention_kernels(run) -> str:
    """The attention kernels one call of ``run`` launches, by name, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
    patterns = ("flash", "fmha", "sdpa", "attention", "cudnn", "sm80")
    names = {e.key for e in prof.key_averages() if any(p in e.key.lower() for p in patterns)}
    return "; ".join(sorted(name[:90] for name in names))


def train(model, data: list[Batch], warmup: int, device: str, profile_kernels: bool) -> Result:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")
    counters = torch._dynamo.utils.counters
    counters.clear()
    losses, seconds, after_first, kernels = [], [], None, ""

    def step(batch: Batch) -> float:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(batch.ids, **batch.kwargs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()  # .item() synchronizes: the step is finished when timed

    for n, batch in enumerate(data):
        start = time.perf_counter()
        losses.append(step(batch))
        if n >= warmup:
            seconds.append(time.perf_counter() - start)
        if n == 0:
            after_first = counters["stats"]["unique_graphs"]
    if profile_kernels and device == "cuda":
        kernels = _attention_kernels(lambda: step(data[-1]))
    compiled = isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
    breaks = sum(counters["graph_break"].values()) if compiled else None
    recompiles = counters["stats"]["unique_graphs"] - after_first if compiled else None
    # the median step: on a shared machine one step slowed by a neighbour moves it least
    return Result(data[0].ids.numel() / statistics.median(seconds), losses, breaks, recompiles, kernels)


def run_config(name: str, config: Config, mode: str, args, warmup: int) -> dict:
    device = args.device
    weights = {key: tensor.clone() for key, tensor in build(config, "cpu").state_dict().items()}
    data = batches(config, args.steps, device)
    row = dict(config=name, mode=mode, tokens=config.batch * config.seqlen, results={}, engines="", kernels="")
    for impl in implementations(mode, device, args.compiled_backends):
        model = build(config, device, impl.attn, weights)
        assert model.config._attn_implementation == impl.attn
        model.train()
        if mode == "compile":
            torch._dynamo.reset()
            model = torch.compile(model, backend=args.compile_backend)
        adapter.reset_fallbacks()
        mark = dispatch.ledger.mark()
        try:
            with impl.context():
                result = train(model, data, warmup, device, profile_kernels=impl.name == "sdpa")
        except RuntimeError as error:  # a forced backend that refuses the problem
            print(f"{name} {mode} {impl.name}: n/a ({str(error).splitlines()[0][:100]})", flush=True)
            continue
        finally:
            del model
            if device == "cuda":
                torch.cuda.empty_cache()
        row["results"][impl.name] = result
        if impl.name == "sdpa":
            row["kernels"] = result.kernels
        if impl.name == "frost":
            served = sorted({d.engine for d in dispatch.ledger.since(mark)})
            fallbacks = sum(adapter.fallbacks().values())
            row["engines"] = "/".join(served) + (f", {fallbacks} fallbacks" if fallbacks else "")
        print(f"{name} {mode} {impl.name}: {result.tokens_per_s:.0f} tok/s, losses {result.losses[0]:.3f} -> "
              f"{result.losses[-1]:.3f}" + (f", breaks {result.breaks}, recompiles {result.recompiles}"
                                           if result.breaks is not None else ""), flush=True)  # fmt: skip
    return row


COLUMNS = ("sdpa", "sdpa-flash", "sdpa-cudnn", "frost", "frost-kernels")


def table(rows: list[dict], args, warmup: int) -> str:
    lines = [
        f"train_step on {args.device}: {args.steps} steps ({warmup} warm-up, untimed; tok/s from the median step), "
        "AdamW, bf16 autocast; ratios to sdpa (frost-kernels: to sdpa-flash); gap: max |loss - sdpa's loss|; "
        "compile: graph breaks / recompiles after the first step",
        "",
        "| config | mode | tokens/step | " + " | ".join(f"{c} tok/s" for c in COLUMNS)
        + " | frost/sdpa | frost-kernels/sdpa-flash | max loss gap | breaks/recompiles | frost served by |",
        "|---|---|---:|" + "---:|" * len(COLUMNS) + "---:|---:|---:|---|---|",
    ]
    for r in rows:
        res = r["results"]
        speed = {c: res[c].tokens_per_s for c in COLUMNS if c in res}
        cells = [f"{speed[c]:.0f}" if c in speed else "n/a" for c in COLUMNS]
        frost_ratio = f"{speed['frost'] / speed['sdpa']:.3f}" if {"frost", "sdpa"} <= speed.keys() else "n/a"
        kernels = ("frost-kernels" if "frost-kernels" in speed else "frost", "sdpa-flash")
        kernel_ratio = f"{speed[kernels[0]] / speed[kernels[1]]:.3f}" if set(kernels) <= speed.keys() else "n/a"
        gaps = [max(abs(a - b) for a, b in zip(res[c].losses, res["sdpa"].losses)) for c in res if c != "sdpa"]
        compiled = [res[c] for c in res if res[c].breaks is not None]
        graphs = (f"{sum(x.breaks for x in compiled)}/{sum(x.recompiles for x in compiled)}" if compiled else "-")
        lines.append(f"| {r['config']} | {r['mode']} | {r['tokens']} | " + " | ".join(cells)
                     + f" | {frost_ratio} | {kernel_ratio} | {max(gaps, default=0):.2e} | {graphs} | {r['engines']} |")
    lines += ["", "sdpa's attention kernels (profiler, one step):"]
    lines += [f"- {r['config']} {r['mode']}: {r['kernels'] or 'n/a'}" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--modes", default=",".join(MODES), help="comma list of eager, compile (default: both)")
    parser.add_argument("--compile", action="store_true", help="compile mode only (--modes compile)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (default inductor)")
    parser.add_argument("--compiled-backends", action="store_true",
                        help="in compile mode also sdpa-flash and sdpa-cudnn (a compile each)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default: 3, 1 if --steps < 4)")
    parser.add_argument("--configs", default=None, help=f"comma-separated, of {', '.join(CONFIGS)} (default: all)")
    parser.add_argument("--tiny", action="store_true", help="small configs (the default on CPU)")
    args = parser.parse_args(argv)
    modes = ["compile"] if args.compile else args.modes.split(",")
    if set(modes) - set(MODES):
        parser.error(f"--modes: of {', '.join(MODES)}")
    warmup = args.warmup if args.warmup is not None else (3 if args.steps >= 4 else 1)
    if args.steps <= warmup:
        parser.error(f"--steps must exceed the {warmup} warm-up steps")
    chosen = dict(CONFIGS)
    if args.tiny or (args.device == "cpu" and args.configs is None):
        chosen = dict(TINY)
    if args.configs:
        unknown = [n for n in args.configs.split(",") if n not in CONFIGS and n not in TINY]
        if unknown:
            parser.error(f"unknown configs {unknown}; known: {', '.join([*CONFIGS, *TINY])}")
        chosen = {n: {**CONFIGS, **TINY}[n] for n in args.configs.split(",")}
    if args.device == "cuda":
        print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = [run_config(name, config, mode, args, warmup) for mode in modes for name, config in chosen.items()]
    print()
    print(table(rows, args, warmup))


if __name__ == "__main__":
    main()
