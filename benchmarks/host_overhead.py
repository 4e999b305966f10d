"""Host time per call: frost's public API against torch's scaled_dot_product_attention.

    python3 benchmarks/host_overhead.py [--calls N] [--repeats R] [--threads T]

The tiny shape B1 S128 H4 D64, where the work is small and the cost of the call
around it shows. Measured, in one run, with the tables' engine order (``dispatch.table_order``:
frost's own engines, also on SM90 where torch-cudnn would rank first):

- ``frost.sdpa_forward`` against ``F.scaled_dot_product_attention``;
- ``frost.sdpa_backward`` against torch's backward alone (``autograd.grad`` on a
  retained graph);
- ``frost.attention`` forward+backward against SDPA forward+backward with autograd;
- the same with ``torch.autograd.set_multithreading_enabled(False)``: on CUDA autograd
  otherwise runs every backward on its own device thread, where frost's Python costs
  about twice what it costs on the calling thread (docs/DECISIONS.md, "Host: the backward
  served from the forward's plan").

Each figure is the median over ``--repeats`` loops of ``--calls`` calls, after a
warm-up, divided by the calls: the per-call host time. frost's and torch's loops
alternate, so a busy neighbour on a shared machine slows both alike; ``--threads 1``
steadies a CPU that others use too. On CUDA the device is
synchronized before and after each loop and only the issuing loop is timed, so
the figure is host time (what the CPU spends per call), not kernel time. On a CPU
the host time includes the arithmetic itself.

frost's io dtypes are fp16 and bf16, so frost runs bf16; torch runs bf16 and, on
the CPU, float32 too (frost's CPU backward computes in float32 copies, and so does its
forward on a CPU without bf16 dot products, which that row prices). The Markdown table ends with the ratio frost/torch of the medians and the
median of the per-pair ratios (each frost loop against the torch loop right after it).
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
from frost import dispatch  # noqa: E402

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


def paired_us(frost_fn, torch_fn, device: torch.device, calls: int, repeats: int, warmup: int
              ) -> tuple[float, float, float]:  # fmt: skip
    """Median per-call host times of the two, their loops interleaved so that a noisy
    neighbour on a shared machine slows both alike, and the median of the ratios of each
    pair of neighbouring loops: a host whose speed drifts during the run (it does, on the
    GPU machine, by up to 2x between runs) moves both loops of a pair alike."""
    for _ in range(warmup):
        frost_fn()
        torch_fn()
    frost_samples, torch_samples = [], []
    for _ in range(repeats):
        frost_samples.append(_loop_us(frost_fn, device, calls))
        torch_samples.append(_loop_us(torch_fn, device, calls))
    ratios = [f / t for f, t in zip(frost_samples, torch_samples)]
    return statistics.median(frost_samples), statistics.median(torch_samples), statistics.median(ratios)


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

    def attention_fwd_bwd_one_thread():
        with torch.autograd.set_multithreading_enabled(False):
            return attention_fwd_bwd()

    return {
        "forward": lambda: frost.sdpa_forward(q, k, v),
        "backward": lambda: frost.sdpa_backward(do, q, k, v, o, lse),
        "forward+backward": attention_fwd_bwd,
        "forward+backward, backward on the calling thread": attention_fwd_bwd_one_thread,
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

    def fwd_bwd_one_thread():
        with torch.autograd.set_multithreading_enabled(False):
            return fwd_bwd()

    return {
        "forward": forward_no_grad,
        "backward": lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
        "forward+backward": fwd_bwd,
        # torch.autograd.set_multithreading_enabled(False): no hop to autograd's device thread
        "forward+backward, backward on the calling thread": fwd_bwd_one_thread,
    }


def measure(devices, calls: int, repeats: int, warmup: int) -> list[tuple]:
    rows = []
    for device in devices:
        frost_fns = frost_calls(device)
        dtypes = (torch.bfloat16,) if device.type == "cuda" else (torch.bfloat16, torch.float32)
        for dtype in dtypes:
            for name, torch_fn in torch_calls(device, dtype).items():
                frost_us, torch_us, pair_ratio = paired_us(frost_fns[name], torch_fn, device, calls, repeats, warmup)
                rows.append((device.type, str(dtype).removeprefix("torch."), name, frost_us, torch_us, pair_ratio))
    return rows


def table(rows) -> str:
    lines = [
        "| device | torch dtype | call | frost us | torch us | frost/torch | per pair |",
        "|---|---|---|---|---|---|---|",
    ]
    for device, dtype, name, frost_us, torch_us, pair_ratio in rows:
        lines.append(f"| {device} | {dtype} | {name} | {frost_us:.1f} | {torch_us:.1f} | {frost_us / torch_us:.2f} "
                     f"| {pair_ratio:.2f} |")
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


def _in_thread(fn) -> None:
    """Run ``fn`` on a fresh Python thread and wait: is a second thread itself slow?"""
    import threading

    worker = threading.Thread(target=fn)
    worker.start()
    worker.join()


def _trivial_backward_us(device, calls: int, timed) -> float:
    """autograd.grad through a Python Function whose backward returns its input: the cost of
    autograd's engine and its device thread alone."""

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    x = torch.zeros(SHAPE, device=device, dtype=torch.bfloat16, requires_grad=True)
    outs = [Identity.apply(x) for _ in range(calls)]
    grad = torch.ones_like(x)
    def run():
        for y in outs:
            torch.autograd.grad(y, (x,), grad)

    return timed(run)


def _device_thread_split(device, calls: int) -> str:
    """Wall time per call of each stage of frost's backward as it runs on autograd's thread,
    from perf_counter stamps around the functions it calls (cProfile cannot see that thread
    on every Python)."""
    import collections
    import threading

    from frost import api, plans
    from frost.engines import sm80 as sm80_engine

    totals: dict[str, list] = collections.defaultdict(lambda: [0, 0])
    patched = []

    def stamp(owner, name, label):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.perf_counter_ns()
            try:
                return original(*args, **kwargs)
            finally:
                entry = totals[(label, threading.current_thread() is threading.main_thread())]
                entry[0] += time.perf_counter_ns() - start
                entry[1] += 1

        setattr(owner, name, wrapper)
        patched.append((owner, name, original))

    stamp(api, "serve", "api.serve")
    for cls_name in dir(plans):
        cls = getattr(plans, cls_name)
        if isinstance(cls, type) and "serve" in vars(cls):
            stamp(cls, "serve", f"plans.{cls_name}.serve")
    for cls_name in dir(sm80_engine):
        cls = getattr(sm80_engine, cls_name)
        if isinstance(cls, type) and cls.__module__ == sm80_engine.__name__:
            for method in ("execute", "carve"):
                if method in vars(cls):
                    stamp(cls, method, f"sm80.{cls_name}.{method}")
    from frost.kernels.sm80 import compile as sm80_compile

    stamp(sm80_compile, "launch_fwd", "sm80 launch_fwd")
    stamp(sm80_compile, "launch_bwd", "sm80 launch_bwd")
    stamp(torch, "empty", "torch.empty")
    try:
        q, k, v, do = _inputs(device, torch.bfloat16, requires_grad=True)
        for _ in range(20):
            torch.autograd.grad(frost.attention(q, k, v), (q, k, v), do)
        totals.clear()
        outs = [frost.attention(q, k, v) for _ in range(calls)]
        for x in outs:
            torch.autograd.grad(x, (q, k, v), do)
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        o, lse = frost.sdpa_forward(qd, kd, vd)
        for _ in range(calls):
            frost.sdpa_backward(do, qd, kd, vd, o, lse)
    finally:
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)
    lines = [f"## {device.type} stage times (us per call; main = the calling thread)"]
    for (label, main), (ns, count) in sorted(totals.items()):
        lines.append(f"- {label} [{'main' if main else 'other thread'}]: {ns / max(count, 1) / 1e3:.1f} x {count}")
    return "\n".join(lines)


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
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    def each(fn, items):  # every result dropped at once: no loop pays the caching allocator's growth
        def run():
            for item in items:
                fn(item)
        return run

    calls_range = range(calls)
    rows = {
        "attention forward (grad on)": timed(each(lambda _: frost.attention(q, k, v), calls_range)),
        "autograd.grad of a kept output": timed(each(lambda x: torch.autograd.grad(x, (q, k, v), do), outs)),
        "sdpa_backward in this thread": timed(each(lambda _: frost.sdpa_backward(do, qd, kd, vd, o, lse), calls_range)),
        "sdpa_backward in a worker thread": timed(
            lambda: _in_thread(each(lambda _: frost.sdpa_backward(do, qd, kd, vd, o, lse), calls_range))),
        "autograd.grad of a trivial Function": _trivial_backward_us(device, calls, timed),
    }
    text = f"## {device.type} phases of attention forward+backward (host us per call)\n" + "\n".join(
        f"- {name}: {us:.1f}" for name, us in rows.items())
    import threading

    text += f"\n- Python threads: {[t.name for t in threading.enumerate()]}; switch interval {sys.getswitchinterval()}"
    text += "\n\n" + _device_thread_split(device, calls)
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
    with dispatch.table_order():  # frost's own engines, also where a native one ranks first (SM90)
        rows = measure(devices, args.calls, args.repeats, args.warmup)
    b, s, h, d = SHAPE
    print(f"host time per call, B{b} S{s} H{h} D{d}, frost in bf16, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; median of {args.repeats} loops of {args.calls} calls\n")  # fmt: skip
    print(table(rows))
    if args.profile:
        profile(devices[-1], 300, args.profile)


if __name__ == "__main__":
    main()
