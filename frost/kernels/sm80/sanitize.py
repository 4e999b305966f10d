"""Every SM80 kernel once per feature at a sanitizer-sized problem, for compute-sanitizer.

    python3 -m frost.kernels.sm80.sanitize                # plain run first: compiles (disk cache), checks finiteness
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 1 \\
        python3 -m frost.kernels.sm80.sanitize            # likewise --tool racecheck, synccheck, initcheck

One small problem (one or two tiles each way, so block edges and partial tiles occur) per
feature of the engines' rows: dense, strided views, causal top-left and bottom-right both ways,
windows, padding, packed sequences with empty ones, GQA and MQA (split over CTAs), sinks,
partial head dims, fp16 and bf16, the d64 and d128 flavors and the wide ones (d192x128, d256),
RoPE (its pass: dense with 8-byte accesses, packed, padded), an additive bias (broadcast and
not, float32 and io dtype, dense, padded, packed; GQA and MQA problems this small split their
groups, so bwd_combine runs too). Each runs the forward, the backward in the
default mode, and the deterministic mode three ways (the engine's choice, the sliced dQ; the
dQ recompute pass; the sliced dQ with two slices).
The sm80 engines are forced; nothing here judges accuracy (the GPU suites do that), only that
every output a kernel writes is finite where the contract makes it finite.

Without the caching allocator (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``) each tensor is its own
allocation, so memcheck sees a write past any output or workspace; with it such a write lands
in the pool and goes unseen. ``--only NAME,...`` narrows the run; ``--list`` names the features.
"""
from __future__ import annotations

import argparse
import itertools
import os
import shutil
import sys
from pathlib import Path

import torch

import frost
from frost.engines.sm80 import Sm80Backward
from frost.problem import prepare

# name -> (shape: B, Sq, Sk, Hq, Hkv, Dqk, Dv; call keywords; input form)
# form: "dense", "strided" (non-contiguous views), "padded" (seqlens), "packed" (cu_seqlens)
FEATURES = {
    "dense_d64": ((2, 130, 130, 2, 2, 64, 64), {}, "dense"),
    "dense_d128_fp16": ((1, 70, 200, 2, 2, 128, 128), dict(dtype=torch.float16), "dense"),
    "partial_hdim": ((1, 100, 90, 2, 2, 72, 40), {}, "dense"),
    "strided": ((2, 129, 129, 2, 2, 64, 64), {}, "strided"),
    "causal": ((1, 200, 200, 2, 2, 64, 64), dict(causal=True), "dense"),
    "causal_br_short_q": ((1, 70, 260, 2, 2, 128, 128), dict(causal=True, causal_align="bottom_right"), "dense"),
    "causal_br_long_q": ((1, 260, 70, 2, 2, 64, 64), dict(causal=True, causal_align="bottom_right"), "dense"),
    "window": ((1, 200, 200, 2, 2, 64, 64), dict(window=(37, 5)), "dense"),
    "window_br": ((1, 100, 260, 2, 2, 64, 64), dict(window=(30, 10), causal_align="bottom_right"), "dense"),
    "padded": ((2, 200, 190, 2, 2, 64, 64), dict(causal=True), "padded"),
    "packed": ((3, 160, 150, 4, 2, 64, 64), dict(causal=True, causal_align="bottom_right"), "packed"),
    "gqa": ((1, 200, 200, 8, 2, 128, 128), dict(causal=True), "dense"),
    "mqa": ((1, 150, 150, 6, 1, 64, 64), dict(window=(50, 0)), "dense"),
    "sinks": ((1, 150, 100, 2, 2, 64, 64), dict(sinks=True, window=(0, 0), causal_align="bottom_right"), "dense"),
    "wide_d192x128": ((1, 130, 130, 4, 2, 192, 128), dict(causal=True), "dense"),
    "wide_d256_packed": ((3, 160, 150, 4, 2, 232, 232), dict(window=(40, 7)), "packed"),
    "rope_d72": ((2, 130, 120, 4, 2, 72, 40), dict(rope=True, causal=True), "dense"),
    "rope_packed": ((3, 160, 150, 4, 2, 128, 128), dict(rope=True, window=(40, 7)), "packed"),
    "rope_padded": ((2, 200, 190, 4, 1, 64, 64), dict(rope=True), "padded"),
    # bias: broadcast over the batch (dbias reduced; deterministic: per-(b, h) partials), full
    # shape (dS stored once) on padded rows, and an io-dtype bias broadcast both ways, packed
    "bias_1H": ((2, 130, 150, 4, 2, 64, 64), dict(bias="1H", causal=True), "dense"),
    "bias_BH_padded": ((2, 200, 190, 2, 2, 128, 128), dict(bias="BH", window=(37, 5)), "padded"),
    "bias_11_packed_io": ((3, 160, 150, 4, 2, 64, 64), dict(bias="11", bias_io=True), "packed"),
}
MODES = ("default", "deterministic", "recompute", "sliced")
# deterministic: the engine's choice (the sliced dQ where its slices fit); the modes below force
# one: recompute, the bwd_dq pass; sliced, the sliced dQ with two slices, so that a CTA walks
# several key blocks where there are
_FORCED = {"recompute": dict(dq_recompute=True), "sliced": dict(dq_slices=2)}
_PACKED_Q = (0, 97, 63)   # per-sequence lengths of the packed feature (an empty one first)
_PACKED_K = (5, 80, 65)
_PADDED_Q = (200, 0)      # the padded feature's valid lengths (an empty sequence)
_PADDED_K = (130, 190)


def _inputs(name: str, gen: torch.Generator, device: str) -> tuple[dict, dict]:
    """(tensors, keywords) of one feature's call."""
    (b, sq, sk, hq, hkv, dqk, dv), keywords, form = FEATURES[name]
    keywords = dict(keywords)
    dtype = keywords.pop("dtype", torch.bfloat16)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    if form == "packed":
        tq, tk = sum(_PACKED_Q), sum(_PACKED_K)
        q, k, v, do = rand(tq, hq, dqk), rand(tk, hkv, dqk), rand(tk, hkv, dv), rand(tq, hq, dv)
        keywords.update(
            cu_seqlens_q=_offsets(_PACKED_Q, device), cu_seqlens_k=_offsets(_PACKED_K, device),
            max_seqlen_q=max(_PACKED_Q), max_seqlen_k=max(_PACKED_K),
        )
    elif form == "strided":  # every tensor a view into a wider buffer (head dim not last-contiguous rows)
        q, k, v, do = (rand(b, s, h, 2 * d)[..., :d] for s, h, d in ((sq, hq, dqk), (sk, hkv, dqk), (sk, hkv, dv),
                                                                    (sq, hq, dv)))
    else:
        q, k, v, do = rand(b, sq, hq, dqk), rand(b, sk, hkv, dqk), rand(b, sk, hkv, dv), rand(b, sq, hq, dv)
    if form == "padded":
        keywords.update(seqlens_q=torch.tensor(_PADDED_Q, dtype=torch.int32, device=device),
                        seqlens_k=torch.tensor(_PADDED_K, dtype=torch.int32, device=device))
    if keywords.pop("sinks", False):
        keywords["sinks"] = torch.randn(hq, generator=gen).to(device)
    broadcast = keywords.pop("bias", None)  # "BH", "1H", "B1" or "11": which dims the bias has
    if broadcast:  # packed: the bias covers the longest sequences
        rows, cols = (max(_PACKED_Q), max(_PACKED_K)) if form == "packed" else (sq, sk)
        shape = (b if broadcast[0] == "B" else 1, hq if broadcast[1] == "H" else 1, rows, cols)
        bias_dtype = dtype if keywords.pop("bias_io", False) else torch.float32
        keywords["bias"] = torch.randn(*shape, generator=gen).to(device, bias_dtype)
    if keywords.pop("rope", False):  # tables exactly as long as the padded extents
        angles = torch.rand(max(sq, sk), dqk // 2, generator=gen) * 100
        keywords["rope"] = (angles.cos().to(device), angles.sin().to(device))
    return dict(q=q, k=k, v=v, do=do), keywords


def _offsets(lengths, device: str) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def run_feature(name: str, modes=MODES, seed: int = 0, device: str = "cuda", engine: str | None = "sm80") -> list[str]:
    """Run one feature through the forward and each backward mode; the problems found (non-finite
    outputs), as lines. ``device="cpu", engine=None`` runs the same calls on the CPU engines
    (the recompute and sliced modes are the sm80 engine's own: give them only with that engine)."""
    gen = torch.Generator().manual_seed(seed)
    t, keywords = _inputs(name, gen, device)
    problems = []
    o, lse = frost.sdpa_forward(t["q"], t["k"], t["v"], engine=engine, **keywords)
    problems += _non_finite(name, "forward", o=o)
    for mode in modes:
        call = dict(keywords, deterministic=mode != "default")
        if mode in _FORCED:
            problem, tensors = prepare("backward", t["q"], t["k"], t["v"], o=o, lse=lse, do=t["do"], **call)
            dq, dk, dv, dbias, dsinks = Sm80Backward(**_FORCED[mode]).compile(problem).execute(tensors)
        else:
            dq, dk, dv, dbias, dsinks = frost.sdpa_backward(t["do"], t["q"], t["k"], t["v"], o, lse, engine=engine,
                                                            **call)  # fmt: skip
        problems += _non_finite(name, mode, dq=dq, dk=dk, dv=dv, dbias=dbias, dsinks=dsinks)
    return problems


def _non_finite(name: str, mode: str, **outputs) -> list[str]:
    return [f"{name} {mode}: {key} has non-finite values" for key, x in outputs.items()
            if x is not None and not bool(torch.isfinite(x).all())]


TOOLKIT_HOMES = ("/usr/local/cuda",)  # where a CUDA toolkit lives when no variable says


def compute_sanitizer() -> str | None:
    """The CUDA toolkit's ``compute-sanitizer``: on PATH, else under CUDA_HOME / CUDA_PATH or
    ``TOOLKIT_HOMES``; None when none is found."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *TOOLKIT_HOMES]
    candidates = [Path(home) / sub / "compute-sanitizer" for home in homes if home
                  for sub in ("bin", "compute-sanitizer")]  # fmt: skip
    return next((str(c) for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated feature names")
    parser.add_argument("--list", action="store_true", help="print the feature names and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(FEATURES))
        return 0
    if not torch.cuda.is_available():
        print("frost.kernels.sm80.sanitize: needs a CUDA device", file=sys.stderr)
        return 2
    chosen = [n for n in FEATURES if not args.only or n in args.only.split(",")]
    problems = [line for name in chosen for line in run_feature(name)]
    print("\n".join(problems) or f"sanitize: {len(chosen)} features x (forward + {len(MODES)} backward modes) ran")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
