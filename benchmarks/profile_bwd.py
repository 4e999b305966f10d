"""Run one backward shape a few times, for a profiler or to print each kernel's time (--kernels).

A profiler run captures frost's and FlashAttention-2's kernels; ``--kernels`` prints each
backward path's device time per kernel of its chain.

    ncu --clock-control none -k regex:"sdpa_bwd|flash_bwd" --launch-skip 2 --launch-count 4 \\
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis_Tables \\
        python3 benchmarks/profile_bwd.py --d 64 --s 8192 --runs frost,wide,flash
    python3 benchmarks/profile_bwd.py --b 2 --s 4096 --hq 8 --hkv 1 --d 128 --causal --kernels \\
        --runs frost,det,det_rec,flash

Same inputs as ``bench_sdpa.py`` (bf16; by default 16k tokens and hidden 2048, MHA; ``--b``,
``--hq``, ``--hkv`` set a GQA / MQA shape). ``--runs`` picks the backward paths, each run
``--iters`` times in the order given: ``frost`` (the routed plan), ``wide`` (dQ reduced four
floats at a time, SM90), ``det`` (deterministic), any of ``bench_sdpa.DET_VARIANTS``' columns
(``det_rec``, ``det_s_w1``, ...: deterministic mode with that engine choice forced), ``flash``
(torch's FlashAttention-2 backward), or ``frost/...`` / ``det/...`` with engine choices forced
by name (``det/split=2/dq_slices=8``, ``frost/cluster_sum=False``: ``Sm80Backward``'s
keywords). Prints each path's median time, so a profiled run can be read
against an unprofiled one; with ``--kernels`` also the mean device time of each kernel per call
(torch.profiler), which says what share of a path the pre, main, convert and combine kernels take.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import frost  # noqa: E402
from frost.engines.sm80 import Sm80Backward  # noqa: E402
from frost.problem import prepare  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sdpa import DET_VARIANTS, _inputs, _torch_call  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
PATHS = ("frost", "wide", "det", *DET_VARIANTS, "flash")


def backward_paths(b: int, s: int, hq: int, hkv: int, d: int, causal: bool, forced=()) -> dict:
    """Each path's name -> a function that builds it (plan, workspace) and returns one call; with
    ``forced`` names (``forced_choice``) their paths too."""
    q, k, v, do = _inputs(b, s, hq, hkv, d, grad_out=True)
    o, lse = frost.sdpa_forward(q, k, v, causal=causal)
    grads = frost.Grads(torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))

    def plan_run(deterministic: bool, **choice):
        problem, tensors = prepare("backward", q, k, v, o=o, lse=lse, do=do, causal=causal,
                                   deterministic=deterministic)
        plan = Sm80Backward(**choice).compile(problem)
        workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
        return lambda: plan.execute(tensors, out=grads, workspace=workspace)

    def flash():
        sdpa, inputs, _ = _torch_call("flash", q, k, v, causal)  # K/V repeated where flash refuses GQA
        inputs = tuple(x.detach().requires_grad_(True) for x in inputs)
        out = sdpa(*inputs)
        return lambda: torch.autograd.grad(out, inputs, do.transpose(1, 2), retain_graph=True)

    paths = {"frost": lambda: plan_run(False), "wide": lambda: plan_run(False, dq_reduce_width=4),
             "det": lambda: plan_run(True), "flash": flash}
    for name, choice in DET_VARIANTS.items():
        paths[name] = lambda choice=choice: plan_run(True, **choice)
    for name in forced:
        paths[name] = lambda forced_run=forced_choice(name): plan_run(forced_run[0], **forced_run[1])
    return paths


def forced_choice(name: str) -> tuple[bool, dict] | None:
    """``frost/k=v/...`` or ``det/k=v/...``: (deterministic, Sm80Backward keywords), else None."""
    base, *pairs = name.split("/")
    if not pairs or base not in ("frost", "det") or not all("=" in pair for pair in pairs):
        return None
    return base == "det", {key: ast.literal_eval(value) for key, value in (pair.split("=", 1) for pair in pairs)}


def median_ms(fn, iters: int) -> float:
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def kernel_times_us(fn, iters: int) -> dict[str, float]:
    """Mean device time per call of each kernel ``fn`` launches, by kernel name (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", 0)
        if total:
            times[event.key] = times.get(event.key, 0.0) + total / iters
    return times


def short_name(kernel: str, width: int = 60) -> str:
    return kernel if len(kernel) <= width else kernel[:width // 2 - 1] + ".." + kernel[1 - width // 2:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--s", type=int, default=8192)
    parser.add_argument("--b", type=int, help="sequences (default: 16k tokens)")
    parser.add_argument("--hq", type=int, help="query heads (default: hidden 2048 / d)")
    parser.add_argument("--hkv", type=int, help="key/value heads (default: --hq)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--runs", default="frost,flash")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--kernels", action="store_true", help="print each path's time per kernel")
    args = parser.parse_args(argv)
    hq = args.hq or HIDDEN // args.d
    hkv = args.hkv or hq
    b = args.b or max(TOKENS // args.s, 1)
    shape = f"B={b} S={args.s} Hq={hq} Hkv={hkv} d={args.d} causal={args.causal}"
    runs = args.runs.split(",")
    for name in runs:
        if name not in PATHS and forced_choice(name) is None:
            parser.error(f"--runs: unknown path {name!r} (known: {', '.join(PATHS)}, frost/k=v, det/k=v)")
    paths = backward_paths(b, args.s, hq, hkv, args.d, args.causal, [n for n in runs if n not in PATHS])
    for name in runs:
        fn = paths[name]()
        fn()  # compiles or loads the plan's kernels outside the timed runs
        print(f"{name}: median {median_ms(fn, args.iters):.3f} ms over {args.iters} runs ({shape})")
        if args.kernels:
            for kernel, us in sorted(kernel_times_us(fn, args.iters).items(), key=lambda item: -item[1]):
                print(f"    {us:9.1f} us  {short_name(kernel)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
