"""Run one backward shape a few times, for a profiler to capture frost's and FlashAttention-2's kernels.

    ncu --clock-control none -k regex:"sdpa_bwd|flash_bwd" --launch-skip 2 --launch-count 4 \\
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis_Tables \\
        python3 benchmarks/profile_bwd.py --d 64 --s 8192 --runs frost,wide,flash

Same inputs as ``bench_sdpa.py`` (bf16, 16k tokens, hidden 2048). ``--runs`` picks the
backward paths, each run ``--iters`` times in the order given: ``frost`` (the routed plan),
``wide`` (dQ reduced four floats at a time, SM90), ``det`` (deterministic), ``flash`` (torch's
FlashAttention-2 backward). Prints each path's median time so a profiled run can be read
against an unprofiled one.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import frost  # noqa: E402
from frost.engines.sm80 import Sm80Backward  # noqa: E402
from frost.problem import prepare  # noqa: E402

TOKENS, HIDDEN = 16384, 2048


def backward_paths(d: int, s: int, causal: bool) -> dict:
    h, b = HIDDEN // d, TOKENS // s
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    o, lse = frost.sdpa_forward(q, k, v, causal=causal)
    grads = frost.Grads(torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))

    def plan_run(deterministic: bool, wide: bool):
        problem, tensors = prepare("backward", q, k, v, o=o, lse=lse, do=do, causal=causal,
                                   deterministic=deterministic)
        plan = Sm80Backward(dq_reduce_width=4 if wide else 1).compile(problem)
        workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
        return lambda: plan.execute(tensors, out=grads, workspace=workspace)

    def flash():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.transpose(1, 2).detach().requires_grad_(True) for x in (q, k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return lambda: torch.autograd.grad(out, (qt, kt, vt), do.transpose(1, 2), retain_graph=True)

    return {"frost": lambda: plan_run(False, False), "wide": lambda: plan_run(False, True),
            "det": lambda: plan_run(True, False), "flash": flash}  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--s", type=int, default=8192)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--runs", default="frost,flash")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    paths = backward_paths(args.d, args.s, args.causal)
    for name in args.runs.split(","):
        fn = paths[name]()
        times = []
        for _ in range(args.iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        print(f"{name}: median {sorted(times)[len(times) // 2]:.3f} ms over {args.iters} runs "
              f"(d={args.d} S={args.s} causal={args.causal})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
