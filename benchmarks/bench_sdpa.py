"""Side-by-side attention timings on one GPU: frost's SM80 engines against torch's backends.

    python benchmarks/bench_sdpa.py [--direction fwd|bwd|both] [--variants [det|all]] [--det-variants NAMES]
                                    [--hdims] [--bias] [--rope] [--out DIR]

The shapes: bf16, batch x seqlen = 16k tokens, hidden 2048 (H = 2048 / D),
head dims 64 and 128, seqlens 1k / 4k / 8k, causal and not (12 MHA shapes);
then GQA/MQA: B2 S4096 Hq32 Hkv8 d128, B2 S4096 Hq8 Hkv1 d128, B4 S2048 Hq8
Hkv2 d64, causal and not. Each time is the median of ``triton.testing.do_bench``
(CUDA events, L2 flushed between runs) after warm-up; frost and torch's flash
(FlashAttention-2), cuDNN and efficient backends are timed in the same process
on the same inputs. torch's backends get GQA through ``enable_gqa=True``; a
backend that refuses it gets K and V repeated to Hq heads beforehand (outside
the timed region), and the row says so. The last line of each table is the
minimum frost/flash ratio.

``--hdims`` times the wide head-dim flavors instead: bf16, 16k tokens, d256 (8
heads), d192x128 (Dqk 192, Dv 128) and d192 (16 heads each), seqlens 1k / 4k / 8k,
causal and not. torch's flash backend refuses Dqk != Dv (a NaN and a note in its
column); the minimum frost/flash ratio is over the rows it serves.

``--bias`` times an additive bias instead: a float32 ``[1, H, S, S]`` bias, bf16, 16k tokens,
hidden 2048, d64 and d128, seqlens 2k and 8k, causal and not; forward and backward (dbias
included: a reduction over the batch; ``frost_no_dbias`` is the backward of a bias that takes no
gradient, ``bias_grad=False``). torch's backends get the same bias as ``attn_mask`` (the
efficient backend, and cuDNN where it serves it, take it only in the io dtype, so they get it
rounded to bf16, with the causal mask folded in as -inf since torch takes no ``is_causal`` beside
a mask; the mask requires grad in the backward); the ratio column is frost / efficient.
With ``--variants`` the backward also runs with its bias choices forced (``BIAS_VARIANTS``).

``--variants`` adds backward columns for the engine's choices, forced one at a
time through the plan. Deterministic mode's (``--variants det`` times only these): ``det_rec``
(dQ recomputed by the bwd_dq pass instead of reduced into slices, ``Sm80Backward(dq_recompute=True)``:
what problems whose slices would not fit take), ``det_s_w1`` (the sliced dQ reducing one float at
a time instead of 4, as SM80 devices do), ``det_partials`` (a 2-way split group's dK and dV
summed through fp32 partials and bwd_combine instead of clusters, ``cluster_sum=False``), each
with its ``cost``, its time over the default plan's; ``--det-variants det_rec,...`` times only the
named ones (with or without ``--variants``). The default mode's (``--variants`` or ``--variants
all``): ``w4`` (dQ reduced 4 floats at a time, SM90), ``hf_off`` / ``hf_on`` (launch order),
``nosplit`` (GQA group unsplit), ``partials`` (``cluster_sum=False``).
``--variants all`` adds forward columns ``f<m>x<n>w<warps>``: the forward compiled with other
tiles (config.FWD_TILES is the default), launched on the same tensors.

``--rope`` times fused RoPE instead: forward + backward (``frost.attention`` and autograd)
with ``rope=(cos, sin)`` (the SM80 engines' rotation pass) against q and k rotated by torch
ops (SEMANTICS.md's formula in fp32, rounded to bf16, differentiable) and then
``frost.attention`` without RoPE; bf16, ``ROPE_SHAPES``; the ratio is the torch-rotated
time over the fused one (target >= 1.1).

``--profile NAME`` times the records frost plans for another device (``frost.devices.PROFILES``:
``l4``, ``a100``, ...) on the GPU at hand: on an H100 it shows what the smaller parts' tiles cost
against the large ones, beside the same torch backends.

frost's own kernels are timed everywhere: the run is in ``frost.dispatch.table_order()``, so on
SM90 torch-cudnn (ranked first there) does not serve frost's columns. The default run ends with
the native-engine table of the device's family: per direction, on the shapes torch-cudnn serves
(the 18 above), cuDNN's time over frost's, and whether cuDNN was faster on every one of them,
beside what ``frost.engines.native.CUDNN_FASTER_ON`` says for this family: the measurement that
ranks torch-cudnn first, or not, on the device at hand.

TFLOP/s = 2*B*H*S^2*(Dqk + Dv) (4*B*H*S^2*D when they are equal; halved for causal) / time
for the forward; the backward counts 2.5x the forward's FLOPs. frost is timed through its public API
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
from frost import devices, dispatch  # noqa: E402
from frost.engines import native  # noqa: E402
from frost.engines.sm80 import Sm80Backward  # noqa: E402
from frost.problem import prepare  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
TORCH_BACKENDS = ("flash", "cudnn", "efficient")


GQA_SHAPES = ((2, 4096, 32, 8, 128), (2, 4096, 8, 1, 128), (4, 2048, 8, 2, 64))  # B, S, Hq, Hkv, D
ROPE_SHAPES = ((2, 4096, 16, 16, 128, False), (2, 4096, 16, 16, 128, True), (2, 4096, 32, 8, 128, True),
               (4, 2048, 16, 2, 64, True))  # B, S, Hq, Hkv, D, causal
HDIM_SHAPES = (((256, 256), 8), ((192, 128), 16), ((192, 192), 16))  # (Dqk, Dv), heads


def shapes(hdims: bool = False):
    """(B, S, Hq, Hkv, D, causal): the 12 MHA shapes, then the GQA/MQA ones; with ``hdims`` the wide
    head-dim shapes instead (D a (Dqk, Dv) pair)."""
    if hdims:
        for (dims, h), s, causal in itertools.product(HDIM_SHAPES, (1024, 4096, 8192), (False, True)):
            yield TOKENS // s, s, h, h, dims, causal
        return
    for d, s, causal in itertools.product((64, 128), (1024, 4096, 8192), (False, True)):
        yield TOKENS // s, s, HIDDEN // d, HIDDEN // d, d, causal
    for (b, s, hq, hkv, d), causal in itertools.product(GQA_SHAPES, (False, True)):
        yield b, s, hq, hkv, d, causal


def _dims(d) -> tuple[int, int]:
    """(Dqk, Dv) of a shape's D: one head dim for both, or a pair."""
    return (d, d) if isinstance(d, int) else tuple(d)


def _d_name(d) -> int | str:
    """A row's ``d``: the head dim, or ``"192x128"`` when Dqk != Dv."""
    dqk, dv = _dims(d)
    return dqk if dqk == dv else f"{dqk}x{dv}"


def _bench(fn, reps_ms: int) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=reps_ms, return_mode="median")


def _inputs(b, s, hq, hkv, d, grad_out=False):
    dqk, dv = _dims(d)
    q = torch.randn(b, s, hq, dqk, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, s, hkv, dqk, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, s, hkv, dv, device="cuda", dtype=torch.bfloat16)
    if not grad_out:
        return q, k, v
    return q, k, v, torch.randn(b, s, hq, dv, device="cuda", dtype=torch.bfloat16)


def _torch_call(backend: str, q, k, v, causal: bool, mask=None):
    """(sdpa(q, k, v) -> o in BHSD, note) for one torch backend; K and V repeated when it refuses GQA.
    ``mask``: an additive attn_mask (BHSD), which then carries the causal mask too."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
              "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]  # fmt: skip
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    gqa = qt.shape[1] != kt.shape[1]

    def call(qt, kt, vt, **extra):
        with sdpa_kernel(chosen):
            if mask is not None:
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, **extra)
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **extra)

    if not gqa:
        return (lambda qt=qt, kt=kt, vt=vt: call(qt, kt, vt)), (qt, kt, vt), ""
    try:
        call(qt, kt, vt, enable_gqa=True)
        return (lambda qt=qt, kt=kt, vt=vt: call(qt, kt, vt, enable_gqa=True)), (qt, kt, vt), ""
    except RuntimeError:
        group = qt.shape[1] // kt.shape[1]
        kr, vr = (x.repeat_interleave(group, dim=1) for x in (kt, vt))
        return (lambda qt=qt, kr=kr, vr=vr: call(qt, kr, vr)), (qt, kr, vr), f"{backend}: K/V repeated"


def _flops(b, s, hq, d, causal):
    return 2 * b * hq * s * s * sum(_dims(d)) / (2 if causal else 1)


def _plan(direction, q, k, v, **kw):
    problem, tensors = prepare(direction, q, k, v, **kw)
    decision = dispatch.route(problem)
    return decision, next(e for e in dispatch.engines(direction) if e.name == decision.engine), problem, tensors


def forward_row(b, s, hq, hkv, d, causal, reps_ms: int, variants: bool = False) -> dict:
    q, k, v = _inputs(b, s, hq, hkv, d)
    flops = _flops(b, s, hq, d, causal)
    o = torch.empty(*q.shape[:-1], v.shape[-1], device="cuda", dtype=q.dtype)
    lse = torch.empty(b, hq, s, device="cuda", dtype=torch.float32)
    row = {"direction": "fwd", "d": _d_name(d), "S": s, "B": b, "Hq": hq, "Hkv": hkv, "causal": causal, "notes": []}
    decision, engine, problem, tensors = _plan("forward", q, k, v, causal=causal)
    plan = engine.compile(problem)
    row["engine"] = decision.engine
    row["frost"] = flops / _bench(lambda: frost.sdpa_forward(q, k, v, causal=causal, out=(o, lse)), reps_ms) / 1e9
    row["frost_plan"] = flops / _bench(lambda: plan.execute(tensors, out=(o, lse)), reps_ms) / 1e9
    if variants and decision.engine == "sdpa_fwd_sm80":
        from frost.kernels.sm80.compile import compile_fwd, launch_fwd

        for name, params in forward_variants(plan.params).items():
            compiled = compile_fwd(params)
            run = lambda: launch_fwd(compiled, q, k, v, o, lse, scale=problem.scale, window_left=-1,  # noqa: E731
                                     window_right=0 if causal else -1, max_seqlen_q=s)
            row[name] = flops / _bench(run, reps_ms) / 1e9
    for backend in TORCH_BACKENDS:
        try:
            run, _, note = _torch_call(backend, q, k, v, causal)
            row[backend] = flops / _bench(run, reps_ms) / 1e9
            row["notes"] += [note] if note else []
        except RuntimeError as error:  # a backend that refuses the shape
            row[backend] = float("nan")
            row["notes"].append(f"{backend}: {str(error).splitlines()[0][:60]}")
    row["frost/flash"] = row["frost"] / row["flash"]
    return row


FWD_VARIANT_TILES = ((128, 64, 8), (64, 64, 4), (128, 128, 8), (128, 32, 8))  # (tile_m, tile_n, warps); 64x128 spills


def forward_variants(default) -> dict:
    """``--variants all``: the forward's params with other tiles, by column name (tiles the
    record's validator refuses, e.g. for shared memory, are left out). For d64, 128x128 with 8
    warps is the spill-free form of the default 128x128 with 4 (sm_90: 205 registers, no stack,
    against 255 and 96 B; docs/DECISIONS.md, "Forward: tiles per head-dim flavor")."""
    import dataclasses

    found = {}
    for tile_m, tile_n, warps in FWD_VARIANT_TILES:
        if (tile_m, tile_n, warps) == (default.tile_m, default.tile_n, default.num_warps):
            continue
        try:
            params = dataclasses.replace(default, tile_m=tile_m, tile_n=tile_n, num_warps=warps).validate()
        except ValueError:
            continue
        found[f"f{tile_m}x{tile_n}w{warps}"] = params
    return found


# deterministic mode's forced engine choices, by column name (``--variants det``, ``--det-variants``)
DET_VARIANTS = {"det_rec": dict(dq_recompute=True), "det_s_w1": dict(dq_reduce_width=1),
                "det_partials": dict(cluster_sum=False)}


def backward_variants(hq: int, hkv: int) -> dict[str, Sm80Backward]:
    """The default mode's forced engine choices ``--variants all`` times, by column name."""
    forced = {"hf_off": dict(heavy_first=False), "hf_on": dict(heavy_first=True)}
    if torch.cuda.get_device_capability() >= (9, 0):
        forced["w4"] = dict(dq_reduce_width=4)
    if hq != hkv:
        forced["nosplit"] = dict(split=1)
        forced["partials"] = dict(cluster_sum=False)
    return {name: Sm80Backward(**choice) for name, choice in forced.items()}


def det_variants(names: str, variants: str) -> tuple[str, ...]:
    """The DET_VARIANTS columns to time: ``names`` (a comma list) when given, else all of them
    with ``variants``, else none."""
    chosen = tuple(n for n in names.split(",") if n) if names else tuple(DET_VARIANTS) if variants else ()
    unknown = [n for n in chosen if n not in DET_VARIANTS]
    if unknown:
        raise ValueError(f"--det-variants: unknown {unknown}; known: {', '.join(DET_VARIANTS)}")
    return chosen


def precompile(chosen, direction: str, variants: str, jobs: int, rope: bool = False,
               det: tuple[str, ...] = ()) -> None:
    """Build every kernel the run will time in ``jobs`` parallel workers into the disk cache
    first, so that the timed loop's compiles are loads (serially they take minutes). With
    ``rope`` the calls with RoPE too (``--rope``); ``det``: the DET_VARIANTS columns timed."""
    from frost.kernels.prebuild import build_records

    records = []
    for b, s, hq, hkv, d, causal in chosen:
        q, k, v, do = _inputs(b, s, hq, hkv, d, grad_out=True)
        extra = [dict(rope=_rope_tables(s, _dims(d)[0]))] if rope else []
        for more in [{}, *extra]:
            _, engine, problem, _ = _plan("forward", q, k, v, causal=causal, **more)
            records += engine.records(problem)  # a backward row runs a forward first too
        if direction in ("bwd", "both"):
            o, lse = torch.empty_like(do), torch.empty(b, hq, s, device="cuda")  # o: (B, S, Hq, Dv)
            kw = dict(o=o, lse=lse, do=do, causal=causal)
            for more in extra:
                _, rope_engine, rope_problem, _ = _plan("backward", q, k, v, **kw, **more)
                records += rope_engine.records(rope_problem)
            _, engine, problem, _ = _plan("backward", q, k, v, **kw)
            records += engine.records(problem)
            det_problem = _plan("backward", q, k, v, deterministic=True, **kw)[2]
            records += engine.records(det_problem)
            if isinstance(engine, Sm80Backward):
                for name in det:
                    records += Sm80Backward(**DET_VARIANTS[name]).records(det_problem)
            if variants == "all" and isinstance(engine, Sm80Backward):
                for variant in backward_variants(hq, hkv).values():
                    records += variant.records(problem)
        if variants == "all" and direction in ("fwd", "both"):
            _, engine, problem, _ = _plan("forward", q, k, v, causal=causal)
            if engine.name == "sdpa_fwd_sm80":
                records += list(forward_variants(engine.records(problem)[0]).values())
    counts = build_records(records, jobs)
    print(f"precompile: {counts}", flush=True)


def backward_row(b, s, hq, hkv, d, causal, reps_ms: int, variants: str, det: tuple[str, ...] = ()) -> dict:
    q, k, v, do = _inputs(b, s, hq, hkv, d, grad_out=True)
    flops = 2.5 * _flops(b, s, hq, d, causal)
    o, lse = frost.sdpa_forward(q, k, v, causal=causal)
    grads = frost.Grads(torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    row = {"direction": "bwd", "d": _d_name(d), "S": s, "B": b, "Hq": hq, "Hkv": hkv, "causal": causal, "notes": []}

    def api(deterministic=False):
        return lambda: frost.sdpa_backward(do, q, k, v, o, lse, causal=causal, deterministic=deterministic, out=grads)

    decision, engine, problem, tensors = _plan("backward", q, k, v, o=o, lse=lse, do=do, causal=causal)
    plan = engine.compile(problem)
    workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
    row["engine"] = decision.engine
    row["split"] = getattr(plan, "splits", 1)
    row["frost"] = flops / _bench(api(), reps_ms) / 1e9
    row["frost_plan"] = flops / _bench(lambda: plan.execute(tensors, out=grads, workspace=workspace), reps_ms) / 1e9
    row["frost_det"] = flops / _bench(api(deterministic=True), reps_ms) / 1e9
    if det and decision.engine == "sdpa_bwd_sm80":
        det_problem, det_tensors = prepare("backward", q, k, v, o=o, lse=lse, do=do, causal=causal,
                                           deterministic=True)
        for name in det:
            variant = Sm80Backward(**DET_VARIANTS[name]).compile(det_problem)
            space = torch.empty(variant.workspace_bytes, dtype=torch.uint8, device="cuda")
            row[name] = flops / _bench(lambda: variant.execute(det_tensors, out=grads, workspace=space),
                                       reps_ms) / 1e9
            row[f"{name} cost"] = row["frost_plan"] / row[name]
    if variants == "all" and decision.engine == "sdpa_bwd_sm80":
        for name, variant_engine in backward_variants(hq, hkv).items():
            variant = variant_engine.compile(problem)
            space = torch.empty(variant.workspace_bytes, dtype=torch.uint8, device="cuda")
            row[name] = flops / _bench(lambda: variant.execute(tensors, out=grads, workspace=space), reps_ms) / 1e9
    for backend in TORCH_BACKENDS:
        try:
            sdpa, (qt, kt, vt), note = _torch_call(backend, q, k, v, causal)
            qt, kt, vt = (x.detach().requires_grad_(True) for x in (qt, kt, vt))
            out = sdpa(qt, kt, vt)
            dot = do.transpose(1, 2)
            run = lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)  # noqa: E731
            row[backend] = flops / _bench(run, reps_ms) / 1e9
            row["notes"] += [note] if note else []
        except RuntimeError as error:
            row[backend] = float("nan")
            row["notes"].append(f"{backend}: {str(error).splitlines()[0][:60]}")
    row["frost/flash"] = row["frost"] / row["flash"]
    row["det cost"] = row["frost"] / row["frost_det"]  # deterministic time / default time
    return row


BIAS_SHAPES = tuple(itertools.product((64, 128), (2048, 8192), (False, True)))  # d, S, causal


def _bias_inputs(s, d, causal):
    """q, k, v, do of a --bias row, its float32 [1, H, S, S] bias, and torch's bf16 attn_mask
    (the bias with the causal mask folded in)."""
    b, h = TOKENS // s, HIDDEN // d
    q, k, v, do = _inputs(b, s, h, h, d, grad_out=True)
    bias = torch.randn(1, h, s, s, device="cuda", dtype=torch.float32)
    mask = bias.to(torch.bfloat16)
    if causal:
        mask = mask.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    return (b, h), (q, k, v, do), bias, mask


# how the bias reaches the scores and dbias is reduced (engines/sm80.py, backward_choices), forced,
# by column name (``--bias --variants``): "before" is the bias path without those choices (bias
# read from global memory, key blocks launched fastest or heavy-first, one float per reduction)
BIAS_VARIANTS = {"before": dict(bias_staged=False, batch_inner=False, dbias_reduce_width=1),
                 "unstaged": dict(bias_staged=False),
                 "staged_grid": dict(batch_inner=False)}


def bias_rows(d, s, causal, reps_ms: int, variants: bool = False) -> list[dict]:
    """``--bias``: a forward and a backward row of one shape, frost against torch's backends;
    with ``variants`` the backward's dbias reductions forced each way (BIAS_VARIANTS)."""
    (b, h), (q, k, v, do), bias, mask = _bias_inputs(s, d, causal)
    flops = _flops(b, s, h, d, causal)
    rows = []
    for direction in ("fwd", "bwd"):
        row = {"direction": direction, "d": d, "S": s, "B": b, "Hq": h, "Hkv": h, "causal": causal, "notes": []}
        o, lse = frost.sdpa_forward(q, k, v, causal=causal, bias=bias)
        if direction == "fwd":
            work = flops
            run = lambda: frost.sdpa_forward(q, k, v, causal=causal, bias=bias, out=(o, lse))  # noqa: E731
            row["engine"] = _plan("forward", q, k, v, causal=causal, bias=bias)[0].engine
        else:
            work = 2.5 * flops
            grads = frost.Grads(*(torch.empty_like(x) for x in (q, k, v, bias)))
            run = lambda: frost.sdpa_backward(do, q, k, v, o, lse, causal=causal, bias=bias, out=grads)  # noqa: E731
            row["engine"] = _plan("backward", q, k, v, o=o, lse=lse, do=do, causal=causal, bias=bias)[0].engine
            det = lambda: frost.sdpa_backward(do, q, k, v, o, lse, causal=causal, bias=bias,  # noqa: E731
                                              deterministic=True, out=grads)
            row["frost_det"] = work / _bench(det, reps_ms) / 1e9
            fixed = lambda: frost.sdpa_backward(do, q, k, v, o, lse, causal=causal, bias=bias,  # noqa: E731
                                                bias_grad=False, out=grads._replace(dbias=None))
            row["frost_no_dbias"] = work / _bench(fixed, reps_ms) / 1e9  # a bias that takes no gradient
            if variants:
                problem, tensors = prepare("backward", q, k, v, o=o, lse=lse, do=do, causal=causal, bias=bias)
                for name, choice in BIAS_VARIANTS.items():
                    plan = Sm80Backward(**choice).compile(problem)
                    space = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device="cuda")
                    row[name] = work / _bench(lambda: plan.execute(tensors, out=grads, workspace=space), reps_ms) / 1e9
        row["frost"] = work / _bench(run, reps_ms) / 1e9
        for backend in ("cudnn", "efficient"):
            try:
                m = mask.detach().requires_grad_(direction == "bwd")
                sdpa, (qt, kt, vt), note = _torch_call(backend, q, k, v, causal, mask=m)
                if direction == "fwd":
                    row[backend] = work / _bench(sdpa, reps_ms) / 1e9
                else:
                    qt, kt, vt = (x.detach().requires_grad_(True) for x in (qt, kt, vt))
                    out = sdpa(qt, kt, vt)
                    run = lambda: torch.autograd.grad(out, (qt, kt, vt, m), do.transpose(1, 2),  # noqa: E731
                                                      retain_graph=True)
                    row[backend] = work / _bench(run, reps_ms) / 1e9
                row["notes"] += [note] if note else []
            except RuntimeError as error:  # a backend that refuses the mask or the shape
                row[backend] = float("nan")
                row["notes"].append(f"{backend}: {str(error).splitlines()[0][:60]}")
        row["frost/efficient"] = row["frost"] / row["efficient"]
        rows.append(_progress(row))
        del o, lse
    return rows


def precompile_bias(chosen, variants: bool, jobs: int) -> None:
    """``--bias --precompile J``: build every kernel the bias rows time (forward; backward default,
    deterministic and without dbias; with ``variants`` BIAS_VARIANTS) in ``jobs`` workers first."""
    from frost.kernels.prebuild import build_records

    records = []
    for d, s, causal in chosen:
        _, (q, k, v, do), bias, _ = _bias_inputs(s, d, causal)
        _, engine, problem, _ = _plan("forward", q, k, v, causal=causal, bias=bias)
        records += engine.records(problem)
        o, lse = torch.empty_like(do), torch.empty(q.shape[0], q.shape[2], s, device="cuda")
        kw = dict(o=o, lse=lse, do=do, causal=causal, bias=bias)
        for extra in (dict(), dict(deterministic=True), dict(bias_grad=False)):
            _, engine, problem, _ = _plan("backward", q, k, v, **kw, **extra)
            records += engine.records(problem)
            if variants and not extra:
                records += [r for choice in BIAS_VARIANTS.values() for r in Sm80Backward(**choice).records(problem)]
    print(f"precompile: {build_records(records, jobs)}", flush=True)


def print_bias_table(rows: list[dict]) -> None:
    cols = ["direction", "B", "S", "Hq", "d", "causal", "frost", "frost_det", "frost_no_dbias",
            *[c for c in BIAS_VARIANTS if any(c in r for r in rows)],
            "cudnn", "efficient", "frost/efficient"]
    print("| " + " | ".join(cols) + " | notes |")
    print("|" + "---|" * (len(cols) + 1))
    for r in rows:
        cells = [f"{r[c]:.3f}" if c == "frost/efficient" else f"{r[c]:.1f}" if isinstance(r.get(c), float)
                 else str(r.get(c, "")) for c in cols]  # fmt: skip
        print("| " + " | ".join(cells) + " | " + "; ".join(r["notes"]) + " |")


def _rope_tables(s: int, d: int):
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d // 2, device="cuda", dtype=torch.float32) * 2 / d))
    angles = torch.arange(s, device="cuda", dtype=torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos(), angles.sin()


def _torch_rotate(x, cos, sin):
    """SEMANTICS.md's rot(x, p) over x (B, S, H, D) with torch ops, fp32, rounded to x's dtype."""
    c, s_ = cos[: x.shape[1], None, :], sin[: x.shape[1], None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s_, x2 * c + x1 * s_], dim=-1).to(x.dtype)


def rope_row(b, s, hq, hkv, d, causal, reps_ms: int) -> dict:
    """Forward + backward with fused RoPE against torch-rotated q and k, in ms."""
    q, k, v, do = _inputs(b, s, hq, hkv, d, grad_out=True)
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    rope = _rope_tables(s, d)

    def fused():
        o = frost.attention(q, k, v, causal=causal, rope=rope)
        return torch.autograd.grad(o, (q, k, v), do)

    def rotated_by_torch():
        o = frost.attention(_torch_rotate(q, *rope), _torch_rotate(k, *rope), v, causal=causal)
        return torch.autograd.grad(o, (q, k, v), do)

    def plain():  # the attention alone: what the rotation costs on top of it
        o = frost.attention(q, k, v, causal=causal)
        return torch.autograd.grad(o, (q, k, v), do)

    mark = dispatch.ledger.mark()
    fused()
    engines = sorted({d.engine for d in dispatch.ledger.since(mark)})
    row = {"direction": "fwd+bwd rope", "d": d, "S": s, "B": b, "Hq": hq, "Hkv": hkv, "causal": causal,
           "engines": ",".join(engines), "notes": []}
    row["fused ms"] = _bench(fused, reps_ms)
    row["torch-rotated ms"] = _bench(rotated_by_torch, reps_ms)
    row["no rope ms"] = _bench(plain, reps_ms)
    row["torch-rotated/fused"] = row["torch-rotated ms"] / row["fused ms"]
    return row


def print_rope_table(rows: list[dict]) -> None:
    cols = ["B", "S", "Hq", "Hkv", "d", "causal", "engines", "no rope ms", "fused ms", "torch-rotated ms",
            "torch-rotated/fused"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    worst = min(rows, key=lambda r: r["torch-rotated/fused"])
    print(f"min torch-rotated/fused: {worst['torch-rotated/fused']:.3f} at B{worst['B']} S{worst['S']} "
          f"Hq{worst['Hq']}/{worst['Hkv']} d{worst['d']} causal={worst['causal']} (target >= 1.1)")


def print_table(rows: list[dict]) -> None:
    first = rows[0]
    named = ["split", "frost_det", "det cost", *(f"{n}{cost}" for n in DET_VARIANTS for cost in ("", " cost")), "w4",
             "hf_off", "hf_on", "nosplit", "partials"]
    named += sorted({c for r in rows for c in r if c.startswith("f") and c[1:2].isdigit()})  # forward variants
    extra = [c for c in named if any(c in r for r in rows)]
    cols = ["direction", "B", "S", "Hq", "Hkv", "d", "causal", "frost", "frost_plan", *extra, *TORCH_BACKENDS,
            "frost/flash"]
    print("| " + " | ".join(cols) + " | notes |")
    print("|" + "---|" * (len(cols) + 1))
    for r in rows:
        cells = [f"{r[c]:.3f}" if c == "frost/flash" or c.endswith("cost") else f"{r[c]:.1f}" if isinstance(r.get(c), float)
                 else str(r.get(c, "")) for c in cols]  # fmt: skip
        print("| " + " | ".join(cells) + " | " + "; ".join(r["notes"]) + " |")
    served = [r for r in rows if r["frost/flash"] == r["frost/flash"]]  # flash refuses Dqk != Dv: NaN
    if served:
        worst = min(served, key=lambda r: r["frost/flash"])
        print(f"min frost/flash ({first['direction']}): {worst['frost/flash']:.3f} at B{worst['B']} S{worst['S']} "
              f"Hq{worst['Hq']}/{worst['Hkv']} d{worst['d']} causal={worst['causal']}")
    if "det cost" in first:
        print(f"max det cost ({first['direction']}): {max(r['det cost'] for r in rows):.3f}")


def print_native_table(tables: list[list[dict]]) -> None:
    """Whether torch's cuDNN attention beats frost's kernels on this device family (the rows are
    frost's and cuDNN's TFLOP/s of the same shapes): ``CUDNN_FASTER_ON``'s entry, measured."""
    major, minor = torch.cuda.get_device_capability()
    ranked = native.CUDNN_FASTER_ON.get(major, {})
    print(f"\nnative engine table, compute capability {major}.{minor} ({torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}): cuDNN speed / frost's kernels' speed on the shapes torch-cudnn serves")
    print("| direction | d | shapes | min | median | max | cuDNN faster on all | ranked first |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for rows in tables:
        for d in native.CUDNN_HEAD_DIMS:
            ratios = sorted(r["cudnn"] / r["frost"] for r in rows if r["d"] == d and r["cudnn"] == r["cudnn"])
            if ratios:
                print(f"| {rows[0]['direction']} | {d} | {len(ratios)} | {ratios[0]:.3f} | {ratios[len(ratios) // 2]:.3f} "
                      f"| {ratios[-1]:.3f} | {'yes' if ratios[0] > 1.0 else 'no'} | {'yes' if d in ranked else 'no'} |")


def _progress(row: dict) -> dict:
    """One line per finished row, so a run cut short still leaves its numbers."""
    shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "notes"}
    print(json.dumps(shown), flush=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--direction", choices=["fwd", "bwd", "both"], default="both")
    parser.add_argument("--reps-ms", type=int, default=200)
    parser.add_argument("--variants", nargs="?", const="all", default="", choices=["det", "all"],
                        help="backward: time each engine choice forced (det: deterministic mode's only); "
                             "all: also forward tiles")
    parser.add_argument("--det-variants", default="", metavar="NAMES",
                        help="backward: time only these DET_VARIANTS columns (comma list)")
    parser.add_argument("--hdims", action="store_true", help="the wide head-dim shapes (d256, d192x128, d192)")
    parser.add_argument("--bias", action="store_true",
                        help="a float32 [1, H, S, S] bias, forward and backward, against torch's efficient backend")
    parser.add_argument("--rope", action="store_true",
                        help="fused RoPE (forward + backward) against torch-rotated q and k (ROPE_SHAPES)")
    parser.add_argument("--only", default="", help="comma list of shape indices to run (0-based, MHA then GQA)")
    parser.add_argument("--out", default=os.environ.get("OUT", "frost-out/bench"))
    parser.add_argument("--precompile", type=int, default=0, metavar="J",
                        help="first build every kernel the run needs in J parallel workers (disk cache)")
    parser.add_argument("--profile", default=None, metavar="NAME",
                        help="time the records frost plans for this device (frost.devices.PROFILES) on the GPU at hand")
    args = parser.parse_args(argv)
    # frost's own kernels, where a native engine would rank first; planned for --profile's device
    with dispatch.table_order(), devices.profile(args.profile):
        return _run(args)


def _run(args) -> int:
    if args.rope:
        return rope_main(args)
    if args.bias:
        chosen = [x for i, x in enumerate(BIAS_SHAPES) if not args.only or str(i) in args.only.split(",")]
        if args.precompile:
            precompile_bias(chosen, bool(args.variants), args.precompile)
        rows = [r for shape in chosen for r in bias_rows(*shape, args.reps_ms, bool(args.variants))]
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_sdpa_bias.json").write_text(json.dumps(rows, indent=1))
        print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  (TFLOP/s; ratio = frost / efficient)")
        print_bias_table(rows)
        return 0
    chosen = [x for i, x in enumerate(shapes(args.hdims)) if not args.only or str(i) in args.only.split(",")]
    det = det_variants(args.det_variants, args.variants)
    if args.precompile:
        precompile(chosen, args.direction, args.variants, args.precompile, det=det)
    tables = []
    if args.direction in ("fwd", "both"):
        tables.append([_progress(forward_row(*shape, args.reps_ms, args.variants == "all")) for shape in chosen])
    if args.direction in ("bwd", "both"):
        tables.append([_progress(backward_row(*shape, args.reps_ms, args.variants, det)) for shape in chosen])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_sdpa.json").write_text(json.dumps([r for t in tables for r in t], indent=1))
    planned = f"  frost's records planned for {args.profile}" if args.profile else ""
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}{planned}  (TFLOP/s; ratio = frost API / torch flash)")
    for rows in tables:
        print_table(rows)
    if not args.hdims:
        print_native_table(tables)
    return 0


def rope_main(args) -> int:
    chosen = [x for i, x in enumerate(ROPE_SHAPES) if not args.only or str(i) in args.only.split(",")]
    if args.precompile:
        precompile(chosen, "both", False, args.precompile, rope=True)
    rows = [_progress(rope_row(*shape, args.reps_ms)) for shape in chosen]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench_sdpa_rope.json").write_text(json.dumps(rows, indent=1))
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}  (ms, median; bf16)")
    print_rope_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
