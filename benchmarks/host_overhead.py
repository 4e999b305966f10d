"""Host time per call: frost's public API against torch's scaled_dot_product_attention.

    python3 benchmarks/host_overhead.py [--calls N] [--repeats R] [--threads T]

The tiny shape B1 S128 H4 D64, where the work is small and the cost of the call
around it shows. Measured, in one run, with the default engine routing:

- ``frost.sdpa_forward`` against ``F.scaled_dot_product_attention``;
- ``frost.sdpa_backward`` against torch's backward alone (``autograd.grad`` on a
  retained graph);
- ``frost.attention`` forward+backward against SDPA forward+backward with autograd.

Each figure is the median over ``--repeats`` loops of ``--calls`` calls, after a
warm-up, divided by the calls: the per-call host time. frost's and torch's loops
alternate, so a busy neighbour on a shared machine slows both alike; ``--threads 1``
steadies a CPU that others use too. On CUDA the device is
synchronized before and after each loop and only the issuing loop is timed, so
the figure is host time (what the CPU spends per call), not kernel time. On a CPU
the host time includes the arithmetic itself.

frost's io dtypes are fp16 and bf16, so frost runs bf16; torch runs bf16 and, on
the CPU, float32 too (frost's CPU engines compute in float32 copies, which that row
prices). The Markdown table ends with the ratio frost/torch.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import frost  # noqa: E402

SHAPE = (1, 128, 4, 64)  # B, S, H, D


def _loop_us(fn, device: torch.device, calls: int) -> float:
    """One timed loop of ``calls`` calls: microseconds per call of host time."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter_ns() - start
    if cuda:
        torch.cuda.synchronize(device)
    return elapsed / calls / 1e3


def paired_us(frost_fn, torch_fn, device: torch.device, calls: int, repeats: int, warmup: int) -> tuple[float, float]:
    """Median per-call host times of the two, their loops interleaved so that a noisy
    neighbour on a shared machine slows both alike."""
    for _ in range(warmup):
        frost_fn()
        torch_fn()
    frost_samples, torch_samples = [], []
    for _ in range(repeats):
        frost_samples.append(_loop_us(frost_fn, device, calls))
        torch_samples.append(_loop_us(torch_fn, device, calls))
    return statistics.median(frost_samples), statistics.median(torch_samples)


def _inputs(device, dtype, *, requires_grad=False, bhsd=False):
    gen = torch.Generator().manual_seed(0)
    shape = (SHAPE[0], SHAPE[2], SHAPE[1], SHAPE[3]) if bhsd else SHAPE
    q, k, v, do = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
    if requires_grad:
        q, k, v = (x.requires_grad_() for x in (q, k, v))
    return q, k, v, do


def frost_calls(device) -> dict[str, callable]:
    """The three frost calls, bf16, with their inputs bound."""
    q, k, v, do = _inputs(device, torch.bfloat16)
    o, lse = frost.sdpa_forward(q, k, v)
    qg, kg, vg, _ = _inputs(device, torch.bfloat16, requires_grad=True)

    def attention_fwd_bwd():
        out = frost.attention(qg, kg, vg)
        return torch.autograd.grad(out, (qg, kg, vg), do)

    return {
        "forward": lambda: frost.sdpa_forward(q, k, v),
        "backward": lambda: frost.sdpa_backward(do, q, k, v, o, lse),
        "forward+backward": attention_fwd_bwd,
    }


def torch_calls(device, dtype) -> dict[str, callable]:
    """torch SDPA's forward, backward alone and forward+backward (BHSD inputs)."""
    q, k, v, do = _inputs(device, dtype, requires_grad=True, bhsd=True)
    o = F.scaled_dot_product_attention(q, k, v)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v)
        return torch.autograd.grad(out, (q, k, v), do)

    def forward_no_grad():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v)

    return {
        "forward": forward_no_grad,
        "backward": lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
        "forward+backward": fwd_bwd,
    }


def measure(devices, calls: int, repeats: int, warmup: int) -> list[tuple]:
    rows = []
    for device in devices:
        frost_fns = frost_calls(device)
        dtypes = (torch.bfloat16,) if device.type == "cuda" else (torch.bfloat16, torch.float32)
        for dtype in dtypes:
            for name, torch_fn in torch_calls(device, dtype).items():
                frost_us, torch_us = paired_us(frost_fns[name], torch_fn, device, calls, repeats, warmup)
                rows.append((device.type, str(dtype).removeprefix("torch."), name, frost_us, torch_us))
    return rows


def table(rows) -> str:
    lines = [
        "| device | torch dtype | call | frost us | torch us | frost/torch |",
        "|---|---|---|---|---|---|",
    ]
    for device, dtype, name, frost_us, torch_us in rows:
        lines.append(f"| {device} | {dtype} | {name} | {frost_us:.1f} | {torch_us:.1f} | {frost_us / torch_us:.2f} |")
    return "\n".join(lines)


def profile(device, calls: int, path: str) -> None:
    """cProfile ``calls`` calls of each frost call on ``device`` (after a warm-up): where the
    host time goes, top functions by own time and by cumulative time, written to ``path``."""
    import cProfile
    import io
    import pstats

    sections = []
    for name, fn in frost_calls(device).items():
        for _ in range(30):
            fn()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            fn()
        profiler.disable()
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(30)
            sections.append(f"## {device.type} {name}: {calls} calls, by {order}\n{text.getvalue()}")
    sections.append(_phases(device, calls))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("\n".join(sections))


def _phases(device, calls: int) -> str:
    """Host us per call of each phase of ``frost.attention`` forward+backward. cProfile sees
    only the calling thread, and on CUDA autograd runs the backward on its device thread."""
    q, k, v, do = _inputs(device, torch.bfloat16, requires_grad=True)
    outs = [frost.attention(q, k, v) for _ in range(calls)]
    cuda = device.type == "cuda"

    def timed(fn) -> float:
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter_ns()
        fn()
        elapsed = time.perf_counter_ns() - start
        if cuda:
            torch.cuda.synchronize(device)
        return elapsed / calls / 1e3

    o, lse = frost.sdpa_forward(q.detach(), k.detach(), v.detach())
    rows = {
        "attention forward (grad on)": timed(lambda: [frost.attention(q, k, v) for _ in range(calls)]),
        "autograd.grad of a kept output": timed(lambda: [torch.autograd.grad(x, (q, k, v), do) for x in outs]),
        "sdpa_backward in this thread": timed(
            lambda: [frost.sdpa_backward(do, q.detach(), k.detach(), v.detach(), o, lse) for _ in range(calls)]),
    }
    text = f"## {device.type} phases of attention forward+backward (host us per call)\n" + "\n".join(
        f"- {name}: {us:.1f}" for name, us in rows.items())
    # torch's profiler sees every thread's operators and CUDA runtime calls (a sync would show)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(50):
            torch.autograd.grad(frost.attention(q, k, v), (q, k, v), do)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    return f"{text}\n\n## torch.profiler, 50 calls of attention forward+backward\n{table}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=21, help="timed loops; the median is reported")
    parser.add_argument("--warmup", type=int, default=30, help="untimed calls first")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--profile", metavar="PATH", help="also cProfile frost's calls on the last device into PATH")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices.append(torch.device("cuda"))
    rows = measure(devices, args.calls, args.repeats, args.warmup)
    b, s, h, d = SHAPE
    print(f"host time per call, B{b} S{s} H{h} D{d}, frost in bf16, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; median of {args.repeats} loops of {args.calls} calls\n")  # fmt: skip
    print(table(rows))
    if args.profile:
        profile(devices[-1], 300, args.profile)


if __name__ == "__main__":
    main()
