"""Training steps of a small Llama-style model with attn_implementation "frost" and "sdpa".

    python benchmarks/train_step.py [--device cuda|cpu] [--steps N] [--configs NAME,...] [--tiny]

Each config is a random-init ``LlamaForCausalLM`` (never downloaded) trained for
``--steps`` steps of AdamW on random token ids (labels = inputs), once per attention
implementation, from the same initial weights and on the same batches. Mixed precision
as in practice: float32 master weights and optimizer state, the forward and backward
under ``torch.autocast`` in bf16 (on CPU too: frost computes in fp16 / bf16 only).
Printed per config: tokens/s of each implementation (tokens per step over the median
step time, steps after ``--warmup`` steps, which absorb compiling and plan building;
each step ends with ``loss.item()``, which synchronizes CUDA), the
ratio frost/sdpa, the largest |loss_frost - loss_sdpa| over the steps, and the engines
that served frost's attention calls (``frost.dispatch.ledger``) with the adapter's
fallbacks, so a run that silently fell back to sdpa is visible. The Markdown table
comes last.

Configs: GQA 8/2 and 32/8 query/kv heads, head dims 64 and 128, 4096 tokens per step;
``--tiny`` (the default on CPU) is one small config that runs in seconds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frost import dispatch  # noqa: E402
from frost.integrations import transformers as adapter  # noqa: E402  (registers "frost")


class Config(NamedTuple):
    heads_q: int
    heads_kv: int
    head_dim: int
    layers: int
    batch: int
    seqlen: int
    vocab: int = 32000


CONFIGS = {
    "h8kv2-d64": Config(8, 2, 64, layers=4, batch=2, seqlen=2048),
    "h8kv2-d128": Config(8, 2, 128, layers=4, batch=1, seqlen=4096),
    "h32kv8-d64": Config(32, 8, 64, layers=2, batch=2, seqlen=2048),
    "h32kv8-d128": Config(32, 8, 128, layers=2, batch=1, seqlen=4096),
}
TINY = {"tiny-h4kv2-d16": Config(4, 2, 16, layers=2, batch=2, seqlen=64, vocab=256)}


class Result(NamedTuple):
    tokens_per_s: float
    losses: list[float]


def build(config: Config, device: str, impl: str = "sdpa", weights: dict | None = None):
    """The random-init model (float32) with attention ``impl``; ``weights`` (a state dict)
    makes both implementations start from the same ones."""
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


def batches(config: Config, steps: int, device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, config.vocab, (config.batch, config.seqlen), generator=generator).to(device)
            for _ in range(steps)]  # fmt: skip


def train(model, data: list[torch.Tensor], warmup: int, device: str) -> Result:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")
    losses, seconds = [], []
    for step, ids in enumerate(data):
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # .item() synchronizes: the step is finished when timed
        if step >= warmup:
            seconds.append(time.perf_counter() - start)
    # the median step: on a shared machine one step slowed by a neighbour moves it least
    return Result(data[0].numel() / statistics.median(seconds), losses)


def run_config(name: str, config: Config, steps: int, warmup: int, device: str) -> dict:
    weights = {name: tensor.clone() for name, tensor in build(config, "cpu").state_dict().items()}
    data = batches(config, steps, device)
    results, engines = {}, ""
    for impl in ("sdpa", "frost"):
        model = build(config, device, impl, weights)
        assert model.config._attn_implementation == impl
        model.train()
        adapter.reset_fallbacks()
        mark = dispatch.ledger.mark()
        results[impl] = train(model, data, warmup, device)
        if impl == "frost":
            served = sorted({d.engine for d in dispatch.ledger.since(mark)})
            fallbacks = sum(adapter.fallbacks().values())
            engines = "/".join(served) + (f", {fallbacks} fallbacks" if fallbacks else "")
        del model
    gap = max(abs(f - s) for f, s in zip(results["frost"].losses, results["sdpa"].losses))
    row = dict(config=name, tokens=config.batch * config.seqlen, sdpa=results["sdpa"].tokens_per_s,
               frost=results["frost"].tokens_per_s, gap=gap, engines=engines,
               loss=(results["sdpa"].losses[0], results["sdpa"].losses[-1]))  # fmt: skip
    row["ratio"] = row["frost"] / row["sdpa"]
    print(f"{name}: sdpa {row['sdpa']:.0f} tok/s, frost {row['frost']:.0f} tok/s, ratio {row['ratio']:.2f}, "
          f"max |loss gap| {gap:.2e} (sdpa loss {row['loss'][0]:.3f} -> {row['loss'][1]:.3f}), frost: {engines}",
          flush=True)  # fmt: skip
    return row


def table(rows: list[dict], device: str, steps: int, warmup: int) -> str:
    lines = [
        f"train_step on {device}: {steps} steps ({warmup} warm-up, untimed; tok/s from the median step), AdamW, bf16 autocast",
        "",
        "| config | tokens/step | sdpa tok/s | frost tok/s | frost/sdpa | max abs loss gap | frost served by |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(f"| {r['config']} | {r['tokens']} | {r['sdpa']:.0f} | {r['frost']:.0f} | {r['ratio']:.2f} "
                     f"| {r['gap']:.2e} | {r['engines']} |")  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default: 3, 1 if --steps < 4)")
    parser.add_argument("--configs", default=None, help=f"comma-separated, of {', '.join(CONFIGS)} (default: all)")
    parser.add_argument("--tiny", action="store_true", help="one small config (the default on CPU)")
    args = parser.parse_args(argv)
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
    rows = [run_config(name, config, args.steps, warmup, args.device) for name, config in chosen.items()]
    print()
    print(table(rows, args.device, args.steps, warmup))


if __name__ == "__main__":
    main()
