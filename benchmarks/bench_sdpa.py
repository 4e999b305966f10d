"""Side-by-side attention timings on one GPU: frost's SM80 engines against torch's backends.

    python benchmarks/bench_sdpa.py [--direction fwd|bwd|both] [--out DIR]

The issue shapes: bf16, batch x seqlen = 16k tokens, hidden 2048 (H = 2048 / D),
head dims 64 and 128, seqlens 1k / 4k / 8k, causal and not (12 shapes). Each
time is the median of ``triton.testing.do_bench`` (CUDA events, L2 flushed
between runs) after warm-up; frost and torch's flash (FlashAttention-2), cuDNN
and efficient backends are timed in the same process on the same inputs.

TFLOP/s = 4*B*H*S^2*D (halved for causal) / time for the forward; the backward
counts 2.5x the forward's FLOPs. frost is timed through its public API
(``frost.sdpa_forward`` with preallocated outputs: validation, routing and the
launch included) and, for reference, through its compiled plan alone.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import frost  # noqa: E402
from frost import dispatch  # noqa: E402
from frost.engines.sm80 import Sm80Backward  # noqa: E402
from frost.problem import prepare  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
TORCH_BACKENDS = ("flash", "cudnn", "efficient")


def shapes():
    for d, s, causal in itertools.product((64, 128), (1024, 4096, 8192), (False, True)):
        yield d, s, causal


def _bench(fn, reps_ms: int) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=reps_ms, return_mode="median")


def _torch_sdpa(backend: str, q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]  # fmt: skip
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def run():
        with sdpa_kernel(chosen):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    return run


def forward_row(d: int, s: int, causal: bool, reps_ms: int) -> dict:
    h, b = HIDDEN // d, TOKENS // s
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    o = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    row = {"direction": "fwd", "d": d, "S": s, "B": b, "H": h, "causal": causal}

    def api():
        frost.sdpa_forward(q, k, v, causal=causal, out=(o, lse))

    problem, tensors = prepare("forward", q, k, v, causal=causal)
    decision = dispatch.route(problem)
    plan = next(e for e in dispatch.engines("forward") if e.name == decision.engine).compile(problem)
    row["engine"] = decision.engine
    row["frost"] = flops / _bench(api, reps_ms) / 1e9
    row["frost_plan"] = flops / _bench(lambda: plan.execute(tensors, out=(o, lse)), reps_ms) / 1e9
    for backend in TORCH_BACKENDS:
        try:
            row[backend] = flops / _bench(_torch_sdpa(backend, q, k, v, causal), reps_ms) / 1e9
        except RuntimeError as error:  # a backend that refuses the shape
            row[backend] = float("nan")
            row[f"{backend}_error"] = str(error).splitlines()[0]
    row["frost/flash"] = row["frost"] / row["flash"]
    return row


def backward_row(d: int, s: int, causal: bool, reps_ms: int) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, b = HIDDEN // d, TOKENS // s
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    flops = 2.5 * 4 * b * h * s * s * d / (2 if causal else 1)
    o, lse = frost.sdpa_forward(q, k, v, causal=causal)
    grads = frost.Grads(torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    row = {"direction": "bwd", "d": d, "S": s, "B": b, "H": h, "causal": causal}

    def api(deterministic=False):
        return lambda: frost.sdpa_backward(do, q, k, v, o, lse, causal=causal, deterministic=deterministic, out=grads)

    problem, tensors = prepare("backward", q, k, v, o=o, lse=lse, do=do, causal=causal)
    decision = dispatch.route(problem)
    plan = next(e for e in dispatch.engines("backward") if e.name == decision.engine).compile(problem)
    workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    row["engine"] = decision.engine
    row["frost"] = flops / _bench(api(), reps_ms) / 1e9
    row["frost_plan"] = flops / _bench(lambda: plan.execute(tensors, out=grads, workspace=workspace), reps_ms) / 1e9
    row["frost_det"] = flops / _bench(api(deterministic=True), reps_ms) / 1e9
    if torch.cuda.get_device_capability() >= (9, 0):  # the dQ-pair reductions under measurement
        vector_plan = Sm80Backward(vector_dq_atomics=True).compile(problem)
        vector = lambda: vector_plan.execute(tensors, out=grads, workspace=workspace)
        row["frost_vec"] = flops / _bench(vector, reps_ms) / 1e9
    qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
    dot = do.transpose(1, 2)
    for backend in TORCH_BACKENDS:
        chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                  "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]  # fmt: skip
        try:
            with sdpa_kernel(chosen):
                out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            run = lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)
            row[backend] = flops / _bench(run, reps_ms) / 1e9
        except RuntimeError as error:
            row[backend] = float("nan")
            row[f"{backend}_error"] = str(error).splitlines()[0]
    row["frost/flash"] = row["frost"] / row["flash"]
    row["det/default"] = row["frost_det"] / row["frost"]
    if "frost_vec" in row:
        row["vec/plan"] = row["frost_vec"] / row["frost_plan"]
    return row


def print_table(rows: list[dict]) -> None:
    extra = ["frost_det", "det/default"] if rows and "frost_det" in rows[0] else []
    extra += ["frost_vec", "vec/plan"] if rows and "frost_vec" in rows[0] else []
    cols = ["direction", "d", "S", "causal", "frost", "frost_plan", *extra, *TORCH_BACKENDS, "frost/flash"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = [f"{r[c]:.3f}" if "/" in c else f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c])
                 for c in cols]  # fmt: skip
        print("| " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direction", choices=["fwd", "bwd", "both"], default="both")
    parser.add_argument("--reps-ms", type=int, default=200)
    parser.add_argument("--out", default=os.environ.get("OUT", "frost-out/bench"))
    args = parser.parse_args(argv)
    tables = []
    if args.direction in ("fwd", "both"):
        tables.append([forward_row(d, s, causal, args.reps_ms) for d, s, causal in shapes()])
    if args.direction in ("bwd", "both"):
        tables.append([backward_row(d, s, causal, args.reps_ms) for d, s, causal in shapes()])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_sdpa.json").write_text(json.dumps([r for t in tables for r in t], indent=1))
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  (TFLOP/s; ratio = frost API / torch flash)")
    for rows in tables:
        print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
