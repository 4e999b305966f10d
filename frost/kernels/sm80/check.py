"""Runnable check of the SM80 templates, for the person who changes them.

    python -m frost.kernels.sm80.check fwd            # compile a grid; on a GPU, run it against the oracle
    python -m frost.kernels.sm80.check fwd --ptx      # also report registers / spills / instruction counts

No dispatch and no acceptance rule: the forward launches the compiled kernel
directly; the backward runs the ``sdpa_bwd_sm80`` engine's plan (it needs a
Problem to choose its params and size its workspace). Outputs are poisoned
with NaN before each launch and compared with the float64 oracle
(``frost_harness.oracle.reference``) by relative L2 error and NaN count. The suites (frost_harness/suites/sm80/) are the real gate; this is the
quick loop. Without a GPU it only compiles (CUTE_DSL_ARCH=sm_80).
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import time

import torch

from frost.case import CaseFields
from frost.kernels.sm80 import compile as sm80_compile
from frost.kernels.sm80.config import FwdParams, fwd_params_for


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case(CaseFields):
    """One problem of the grids, in the harness's vocabulary (``frost.case.CaseFields``)."""

    dtype: torch.dtype = torch.bfloat16
    seqlen_q: int = 300
    seqlen_k: int = 300
    head_dim_qk: int = 128

    def params(self) -> FwdParams:
        left, right = self.window
        return fwd_params_for(
            dtype=str(self.dtype).removeprefix("torch."), head_dim_qk=self.head_dim_qk, head_dim_v=self.dim_v,
            layout=self.layout, has_seqlens=self.padded, window_left=left, window_right=0 if self.causal else right,
            bottom_right=self.causal_align == "bottom_right", has_sinks=self.sinks,
        )

    def __post_init__(self):
        if self.bias is not None or self.rope:
            raise ValueError("the SM80 check script runs no bias and no RoPE (the kernels take no RoPE; a bias "
                             "is checked by the GPU suites, frost_harness/suites/sm80)")

    def keywords(self) -> dict:
        """The scale and mask keywords of frost's API and of the oracle."""
        return dict(scale=self.scale, causal=self.causal, causal_align=self.causal_align, window=self.window)


BR = dict(causal_align="bottom_right")


def _padded(seqlen_q: int = 300, seqlen_k: int = 300) -> dict:
    """Dense padding for batch 2: one full query sequence and one half; keys 40 short and empty."""
    return dict(seqlen_q=seqlen_q, seqlen_k=seqlen_k, lengths_q=(seqlen_q, seqlen_q // 2),
                lengths_k=(max(1, seqlen_k - 40), 0))


def _packed(seqlen_q: int = 300, seqlen_k: int = 300) -> dict:
    """Four packed sequences (one without queries) and rows past the last one."""
    return dict(layout="thd", lengths_q=(seqlen_q, 0, max(1, seqlen_q // 3), seqlen_q + 17),
                lengths_k=(seqlen_k, 5, max(1, seqlen_k // 2), seqlen_k + 29), tail_q=7, tail_k=3)


def fwd_grid() -> list[Case]:
    base = Case()
    cases = [base]
    head_dims = ((128, 128), (64, 64), (96, 96), (72, 40), (192, 128), (256, 256), (168, 168), (160, 96))
    for dtype, (dqk, dv) in itertools.product((torch.bfloat16, torch.float16), head_dims):
        cases.append(dataclasses.replace(base, dtype=dtype, head_dim_qk=dqk, head_dim_v=dv))
    more = [
        dict(causal=True), dict(causal=True, **BR, seqlen_q=200, seqlen_k=333),
        dict(causal=True, **BR, seqlen_q=333, seqlen_k=200), dict(causal=True, seqlen_q=333, seqlen_k=200),
        dict(window=(37, 5)), dict(window=(0, 0)), dict(window=(64, -1)), dict(window=(-1, 20), **BR),
        dict(window=(1000, 1000)), dict(heads_q=8, heads_kv=2), dict(heads_q=8, heads_kv=1, causal=True),
        _padded(), dict(_padded(), causal=True, **BR), dict(_padded(), causal=True),
        dict(_padded(), **BR, window=(-1, 30)), dict(causal=True, **BR, seqlen_k=260),
        dict(_padded(), window=(20, 20)), dict(sinks=True),
        dict(sinks=True, window=(0, 0), **BR, seqlen_q=400, seqlen_k=100),
        _packed(), dict(_packed(), causal=True, heads_q=8, heads_kv=2),
        dict(_packed(), window=(50, 10), sinks=True, head_dim_qk=64, head_dim_v=64),
        dict(_packed(), causal=True, **BR, dtype=torch.float16),
        dict(seqlen_q=1, seqlen_k=1), dict(seqlen_q=1, seqlen_k=1000, causal=True, **BR),
    ]
    cases += [dataclasses.replace(base, **m) for m in more]
    return cases


def bwd_grid() -> list[Case]:
    base = Case()
    more = [
        dict(), dict(dtype=torch.float16, head_dim_qk=64, head_dim_v=64), dict(head_dim_qk=72, head_dim_v=40),
        dict(causal=True), dict(causal=True, **BR, seqlen_q=200, seqlen_k=333),
        dict(causal=True, **BR, seqlen_q=333, seqlen_k=200), dict(window=(37, 5)),
        dict(heads_q=8, heads_kv=2, causal=True),
        dict(heads_q=8, heads_kv=1, window=(50, 0), head_dim_qk=64, head_dim_v=64),
        _padded(), dict(_padded(), causal=True, **BR), dict(sinks=True),
        dict(sinks=True, window=(0, 0), **BR, seqlen_q=400, seqlen_k=100),
        dict(_packed(), causal=True, heads_q=8, heads_kv=2),
        dict(_packed(), window=(50, 10), sinks=True, head_dim_qk=64, head_dim_v=64),
        # the wide flavors: d192x128, d256 (a GQA group, packed), d192 with partial tiles
        dict(head_dim_qk=192, head_dim_v=128, causal=True), dict(head_dim_qk=160, head_dim_v=96, window=(37, 5)),
        dict(_packed(), causal=True, heads_q=8, heads_kv=2, head_dim_qk=256, head_dim_v=256),
        dict(_padded(), sinks=True, head_dim_qk=168, head_dim_v=168),
    ]
    return [dataclasses.replace(base, **m) for m in more]


def _inputs(case: Case, device, gen):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device="cpu").to(device=device, dtype=case.dtype)

    kw: dict = {}
    if case.layout == "thd":
        cu_q = torch.tensor([0, *itertools.accumulate(case.lengths_q)], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, *itertools.accumulate(case.lengths_k)], dtype=torch.int32, device=device)
        tq, tk = int(cu_q[-1]) + case.tail_q, int(cu_k[-1]) + case.tail_k  # rows past the last sequence stay untouched
        # strided: q/k/v are slices of one buffer with a head gap
        buf_q = rnd(tq, case.heads_q + 1, case.head_dim_qk)
        q = buf_q[:, 1:]
        k = rnd(tk, case.heads_kv, case.head_dim_qk)
        v = rnd(tk, case.heads_kv, case.dim_v)
        kw.update(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        max_seqlen_q = max(case.lengths_q)
    else:
        q = rnd(case.batch, case.heads_q, case.seqlen_q, case.head_dim_qk).transpose(1, 2)  # BHSD storage
        k = rnd(case.batch, case.seqlen_k, case.heads_kv, case.head_dim_qk)
        v = rnd(case.batch, case.seqlen_k, case.heads_kv, case.dim_v)
        max_seqlen_q = case.seqlen_q
        if case.padded:
            kw["seqlens_q"] = torch.tensor(case.lengths_q, dtype=torch.int32, device=device)
            kw["seqlens_k"] = torch.tensor(case.lengths_k, dtype=torch.int32, device=device)
    if case.sinks:
        kw["sinks"] = (torch.randn(case.heads_q, generator=gen) * 2).to(device)
    return q, k, v, kw, max_seqlen_q


def run_fwd_case(case: Case, device="cuda", seed=0):
    from frost_harness.oracle import reference

    gen = torch.Generator().manual_seed(seed)
    q, k, v, kw, max_seqlen_q = _inputs(case, device, gen)
    compiled = sm80_compile.compile_fwd(case.params())
    packed = case.layout == "thd"
    o = torch.full((*q.shape[:-1], case.dim_v), float("nan"), dtype=q.dtype, device=device)
    lse_shape = (case.heads_q, q.shape[0]) if packed else (case.batch, case.heads_q, case.seqlen_q)
    lse = torch.full(lse_shape, float("nan"), dtype=torch.float32, device=device)
    left, right = case.window
    if case.causal:
        right = 0
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(case.head_dim_qk)
    sm80_compile.launch_fwd(
        compiled, q, k, v, o, lse, scale=scale, window_left=left, window_right=right,
        max_seqlen_q=max_seqlen_q, **kw,
    )
    torch.cuda.synchronize()
    ref_o, ref_lse = reference.forward(q, k, v, **case.keywords(), **kw)
    valid = ~torch.isnan(ref_o)
    o64 = o.double()
    nan_bad = int((torch.isnan(o64) & valid).sum()) + int((~torch.isnan(o64) & ~valid).sum())
    err = (o64 - ref_o)[valid].norm() / ref_o[valid].norm().clamp_min(1e-30)
    lse_valid = ~torch.isnan(ref_lse)
    lse64 = lse.double()
    both_inf = torch.isinf(ref_lse) & (lse64 == ref_lse)
    finite = lse_valid & ~torch.isinf(ref_lse)
    lse_bad = int((lse_valid & ~finite & ~both_inf).sum()) + int((torch.isnan(lse64) & lse_valid).sum())
    lse_err = float((lse64 - ref_lse)[finite].abs().max()) if finite.any() else 0.0
    if err > 2e-2:  # say where: the index of the worst element and the rows that are off
        diff = torch.nan_to_num((o64 - ref_o).abs(), nan=0.0)
        worst = torch.nonzero(diff == diff.max())[0].tolist()
        bad_rows = torch.nonzero(diff.amax(dim=-1) > 0.05)
        print(f"    worst at {worst}: got {float(o64[tuple(worst)]):.4f} want {float(ref_o[tuple(worst)]):.4f}; "
              f"{len(bad_rows)} bad (row, head) pairs, first {bad_rows[:8].tolist()}")
    return float(err), lse_err, nan_bad, lse_bad


def _rel(x, ref) -> float:
    """Relative L2 error over the positions where the oracle is defined; inf if NaN leaked in."""
    valid = ~torch.isnan(ref)
    x64 = x.double()
    if bool((torch.isnan(x64) & valid).any()):
        return float("inf")
    return float((x64 - ref)[valid].norm() / ref[valid].norm().clamp_min(1e-30))


def run_bwd_case(case: Case, deterministic=False, device="cuda", seed=0):
    """The SM80 backward engine on one case (o, lse from the oracle, rounded), vs the oracle's grads."""
    from frost.engines.sm80 import Sm80Backward
    from frost.problem import prepare
    from frost_harness.oracle import reference

    gen = torch.Generator().manual_seed(seed)
    q, k, v, kw, _ = _inputs(case, device, gen)
    do = torch.randn(*q.shape[:-1], case.dim_v, generator=gen).to(device=device, dtype=q.dtype)
    mask_kw = case.keywords()
    o64, lse64 = reference.forward(q, k, v, **mask_kw, **kw)
    o, lse = torch.nan_to_num(o64).to(q.dtype), lse64.float()
    problem, tensors = prepare("backward", q, k, v, o=o, lse=lse, do=do, deterministic=deterministic, **mask_kw, **kw)
    plan = Sm80Backward().compile(problem)
    runs = []
    for _ in range(2 if deterministic else 1):
        out = [torch.full_like(x, float("nan")) for x in (q, k, v)]
        dsinks = torch.full_like(kw["sinks"], float("nan")) if "sinks" in kw else None
        runs.append(plan.execute(tensors, out=(*out, None, dsinks)))
    torch.cuda.synchronize()
    ref = reference.backward(do, q, k, v, **mask_kw, **kw)
    errs = {name: _rel(getattr(runs[0], name), getattr(ref, name)) for name in ("dq", "dk", "dv")}
    if "sinks" in kw:
        errs["dsinks"] = _rel(runs[0].dsinks, ref.dsinks)
    bitwise = all(torch.equal(a, b) for a, b in zip(runs[0][:3], runs[-1][:3]))
    return errs, bitwise


def bench_fwd(iters: int = 30):
    """bf16, 16k tokens, hidden 2048: head dims 64/128, seqlens 1k/4k/8k, causal or not, vs torch backends."""
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for d, s, causal in itertools.product((64, 128), (1024, 4096, 8192), (False, True)):
        h, b = 2048 // d, 16384 // s
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        case = Case(batch=b, seqlen_q=s, seqlen_k=s, heads_q=h, heads_kv=h, head_dim_qk=d, head_dim_v=d, causal=causal)
        compiled = sm80_compile.compile_fwd(case.params())
        o = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        fn = lambda: sm80_compile.launch_fwd(compiled, q, k, v, o, lse, scale=d ** -0.5, window_left=-1,
                                              window_right=0 if causal else -1, max_seqlen_q=s)
        t_frost = triton.testing.do_bench(fn, warmup=25, rep=iters * 4, return_mode="median")
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        row = {"d": d, "S": s, "causal": causal, "frost": flops / t_frost / 1e9}
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    f = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    t = triton.testing.do_bench(f, warmup=25, rep=iters * 4, return_mode="median")
                row[name] = flops / t / 1e9
            except RuntimeError:
                row[name] = float("nan")
        row["frost/flash"] = row["frost"] / row["flash"]
        rows.append(row)
    return rows


def bench_variants(iters: int = 30):
    """Tile / schedule variants on the shapes where the default is weakest."""
    import triton.testing

    shapes = [(64, 1024, True), (128, 1024, True), (64, 4096, True), (64, 1024, False)]
    variants = [dict(tile_m=128, tile_n=128), dict(tile_m=128, tile_n=128, heavy_first=True),
                dict(tile_m=128, tile_n=64, heavy_first=True), dict(tile_m=64, tile_n=128, heavy_first=True),
                dict(tile_m=64, tile_n=64, heavy_first=True), dict(tile_m=128, tile_n=64),
                dict(tile_m=64, tile_n=64)]
    for d, s, causal in shapes:
        h, b = 2048 // d, 16384 // s
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        base = Case(batch=b, seqlen_q=s, seqlen_k=s, heads_q=h, heads_kv=h, head_dim_qk=d, head_dim_v=d, causal=causal)
        o = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        line = []
        for var in variants:
            params = dataclasses.replace(base.params(), **var)
            try:
                compiled = sm80_compile.compile_fwd(params)
            except Exception as exc:  # report and go on: this is a sweep
                line.append(f"{var}: {type(exc).__name__}")
                continue
            fn = lambda: sm80_compile.launch_fwd(compiled, q, k, v, o, lse, scale=d ** -0.5, window_left=-1,
                                                  window_right=0 if causal else -1, max_seqlen_q=s)
            t = triton.testing.do_bench(fn, warmup=25, rep=iters * 4, return_mode="median")
            line.append(f"{var['tile_m']}x{var['tile_n']}{' hf' if var.get('heavy_first') else ''}={flops / t / 1e9:.0f}")
        print(f"d={d} S={s} causal={causal}: " + "  ".join(line))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", choices=["fwd", "bwd"])
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--variants", action="store_true")
    parser.add_argument("--only-failing", action="store_true", help="run only cases matching --filter")
    parser.add_argument("--filter", default="", help="substring of the case repr")
    args = parser.parse_args(argv)
    cases = [c for c in fwd_grid() if args.filter in repr(c)]
    if not torch.cuda.is_available():
        t0 = time.time()
        for case in cases:
            sm80_compile.compile_fwd(case.params())  # the backward needs a GPU to build its Problem
        print(f"compiled {sm80_compile.FWD_CACHE.stats()} in {time.time() - t0:.1f}s (no GPU: not run)")
        return 0
    failures = 0
    if args.kernel == "bwd":
        cases = [c for c in bwd_grid() if args.filter in repr(c)]
        for case in cases:
            for deterministic in (False, True):
                errs, bitwise = run_bwd_case(case, deterministic=deterministic)
                ok = all(e < 2e-2 for e in errs.values()) and bitwise
                failures += not ok
                shown = " ".join(f"{n}={e:.2e}" for n, e in errs.items())
                print(f"{'ok  ' if ok else 'FAIL'} det={deterministic:d} bitwise={bitwise:d} {shown} {case}")
        print(f"{2 * len(cases) - failures}/{2 * len(cases)} backward runs ok")
        return 1 if failures else 0
    for case in cases:
        err, lse_err, nan_bad, lse_bad = run_fwd_case(case)
        ok = err < 2e-2 and lse_err < 1e-2 and nan_bad == 0 and lse_bad == 0
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} o_rel={err:.2e} lse_abs={lse_err:.2e} nan_bad={nan_bad} lse_bad={lse_bad} {case}")
    print(f"{len(cases) - failures}/{len(cases)} cases ok; cache {sm80_compile.FWD_CACHE.stats()}")
    if args.variants:
        bench_variants()
    if args.bench:
        rows = bench_fwd()
        print(f"{'d':>4} {'S':>5} {'causal':>6} {'frost':>7} {'flash':>7} {'cudnn':>7} {'effic':>7} {'ratio':>6}")
        for r in rows:
            print(f"{r['d']:>4} {r['S']:>5} {r['causal']!s:>6} {r['frost']:7.1f} {r['flash']:7.1f} {r['cudnn']:7.1f} {r['efficient']:7.1f} {r['frost/flash']:6.3f}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
