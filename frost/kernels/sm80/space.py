"""The params the SM80 engines can produce: every combination their Capabilities rows admit.

Enumerated through the engines' own lowering (``fwd_params_for``,
``backward_choices``, the backward plan's derived records and ``rope_params_for``) over every fact
that changes code: dtype, whether each head dim fills its flavor, layout and
padding, which window sides are bounded, alignment, sinks, the bias's dtype (and, in the
backward, whether it broadcasts and whether its gradient is wanted), deterministic mode,
and the backward's device and size choices (dQ reduce width 1 on SM80 / 4 on
SM90, GQA group split or not, how a bias is read and its dbias reduced, and the tiles that fit each
device's shared memory: ``device_classes``); for the RoPE pass,
dtype, layout, direction and the exact head dim (static there). Sizes, head counts, token
totals and window values are runtime and do not multiply it.

``covering.py`` lists these per family once per process and picks the L0 compile suites'
pairwise-covering subsets; ``frost-compile --records L0|all`` fills the disk cache with either.
"""
from __future__ import annotations

import dataclasses
import itertools

from frost import devices
from frost.kernels.sm80.config import (
    BwdCombineParams, BwdConvertParams, BwdDqParams, BwdPreParams, SPLIT_CLUSTERS, FwdParams, bwd_params_for,
    fwd_params_for,
)
from frost.kernels.sm80.rope_params import MAX_HEAD_DIM, RopeParams, rope_params_for

HEAD_DIMS = {  # (head_dim_qk, head_dim_v) -> which flavor / partial flags they select
    "d64": (64, 64), "d64 partial qk": (48, 64), "d64 partial v": (64, 40), "d64 partial both": (56, 24),
    "d128": (128, 128), "d128 partial qk": (96, 128), "d128 partial v": (128, 72), "d128 partial both": (80, 88),
    "d192x128": (192, 128), "d192x128 partial qk": (160, 128), "d192x128 partial v": (192, 96),
    "d192x128 partial both": (136, 104),
    "d192": (192, 192), "d192 partial qk": (176, 192), "d192 partial v": (192, 152), "d192 partial both": (168, 144),
    "d256": (256, 256), "d256 partial qk": (232, 256), "d256 partial v": (256, 200), "d256 partial both": (200, 232),
}
LAYOUTS = {"bshd": ("bshd", False), "padded": ("bshd", True), "thd": ("thd", False)}
WINDOWS = {"none": (-1, -1), "causal": (-1, 0), "left": (16, -1), "right": (-1, 16), "both": (16, 4)}
ROPE_HEAD_DIMS = tuple(range(8, MAX_HEAD_DIM + 1, 8))  # the RoPE pass's key holds the head dim itself
# what the L0 sweep compiles of them: 16- and 8-byte accesses (D a multiple of 16 or not), one thread
# per row (8) up to 31 (248), a CTA of 128 threads (64, 128, 256) and of fewer (40, 72, 136, 248)
ROPE_L0_HEAD_DIMS = (8, 40, 64, 72, 128, 136, 248, 256)
ROPE_LAYOUTS = ("bshd", "thd")  # dense padding changes nothing in the pass (module doc of sm80/rope.py)


BIASES = (None, "float32", "io")  # no bias, a float32 bias, a bias in the io dtype


def _bias_dtype(bias: str | None, dtype: str) -> str | None:
    return dtype if bias == "io" else bias


def heavy_first_on_few_heads(params: FwdParams) -> bool:
    """Whether a forward record launches heavy-first only when the problem has few heads
    (``engines/sm80.forward_heavy_first`` decides from the head count): the d64 records under a
    right-bounded mask without a bias, which ``fwd_params_for`` lowers in the plain order."""
    return (params.flavor == "d64" and params.has_window_right and params.bias_dtype is None
            and not params.heavy_first)


def admitted_fwd_params() -> list[FwdParams]:
    seen: dict[FwdParams, None] = {}
    for dtype, dims, layout, window, bottom_right, sinks, bias in itertools.product(
        ("float16", "bfloat16"), HEAD_DIMS.values(), LAYOUTS.values(), WINDOWS.values(), (False, True), (False, True),
        BIASES,
    ):
        params = fwd_params_for(
            dtype=dtype, head_dim_qk=dims[0], head_dim_v=dims[1], layout=layout[0], has_seqlens=layout[1],
            window_left=window[0], window_right=window[1], bottom_right=bottom_right, has_sinks=sinks,
            bias_dtype=_bias_dtype(bias, dtype),
        )
        seen[params] = None
        if heavy_first_on_few_heads(params):
            seen[dataclasses.replace(params, heavy_first=True).validate()] = None
    return list(seen)


# a GQA group unsplit (None), split with fp32 partials and bwd_combine (0), or split and summed by
# clusters (BwdParams.split_cluster, SM90: engines/sm80.cluster_sums)
SPLITS = (None, 0, *SPLIT_CLUSTERS[1:])


def device_classes() -> list[tuple[int, bool]]:
    """What of a device changes the backward's records: (opt-in shared memory per block, SM90's
    instructions), one per class of the named parts (frost/devices.py), largest first."""
    return sorted({(p.smem_per_block_optin, p.sm90) for p in devices.PROFILES.values()}, reverse=True)


def admitted_bwd_params() -> list:
    """Every params record of every kernel of the backward chain (bwd_pre, bwd, bwd_convert or
    bwd_dq, and bwd_combine for split groups), as ``frost.engines.sm80.backward_choices`` can
    produce them on any named device."""
    seen: dict = {}
    for smem, sm90 in device_classes():
        _admit_bwd_params(seen, smem, sm90)
    return list(seen)


def _admit_bwd_params(seen: dict, smem: int, sm90: bool) -> None:
    """``admitted_bwd_params`` of one device class, into ``seen``."""
    # (deterministic, reduce width, sliced dQ): the default mode, the recompute, the sliced dQ; 4 floats on SM90
    modes = [(d, w, s) for d, w, s in ((False, 1, False), (False, 4, False), (True, 1, False), (True, 1, True),
                                       (True, 4, True)) if w == 1 or sm90]  # fmt: skip
    # (dtype, broadcast, gradient wanted); without a gradient the broadcast changes no code
    biases = ((None, False, True), ("float32", False, True), ("float32", True, True), ("io", False, True),
              ("io", True, True), ("float32", False, False), ("io", False, False))
    splits = SPLITS if sm90 else SPLITS[:2]  # clusters need SM90
    for dtype, dims, layout, window, bottom_right in itertools.product(
        ("float16", "bfloat16"), HEAD_DIMS.values(), LAYOUTS.values(), WINDOWS.values(), (False, True)
    ):
        # sinks and the split change only bwd_pre's record and the main record's split fields: one main
        # record per mode and bias, visited in the order of the product with them (the list's order)
        mains = {(mode, bias): bwd_params_for(
            dtype=dtype, head_dim_qk=dims[0], head_dim_v=dims[1], layout=layout[0], has_seqlens=layout[1],
            window_left=window[0], window_right=window[1], bottom_right=bottom_right, deterministic=mode[0],
            dq_reduce_width=mode[1], dq_slices=mode[2], bias_dtype=_bias_dtype(bias[0], dtype),
            bias_broadcast=bias[1], bias_grad=bias[2], smem_limit=smem,
        ) for mode in modes for bias in biases}  # fmt: skip
        for mode, split, bias in itertools.product(modes, splits, biases):
            main = mains[mode, bias]
            _admit_main_variants(seen, main, split, smem, sm90)
            seen[BwdPreParams.of(main, False)] = None
            seen[BwdConvertParams.of(main) if main.reduces_dq else BwdDqParams.of(main, smem)] = None
            if split == 0:
                seen[BwdCombineParams.of(main)] = None
        for main in mains.values():
            seen[BwdPreParams.of(main, True)] = None


def _admit_main_variants(seen: dict, main, split, smem: int, sm90: bool) -> None:
    """The main kernel's records of ``main`` for one split choice: each way of the bias, each launch order."""
    for bias_way in _bias_ways(main, smem, sm90):
        # the launch order as engines/sm80.backward_choices: the slices', or heavy-first for a
        # right-bounded mask with few heads (heavy_first_keeps_locality) and plain with many
        orders = ((False, True) if main.has_window_right and not bias_way["batch_inner"] and not main.dq_slices
                  else (False,))
        for heavy_first in orders:
            record = dataclasses.replace(main, split_group=split is not None, heavy_first=heavy_first,
                                         split_cluster=split or 0, **bias_way)
            if split and not record.cluster_fits(split):
                continue  # backward_choices sums those splits through partials
            seen[record.validate()] = None


def _bias_ways(main, smem: int, sm90: bool) -> list[dict]:
    """How the bias reaches the scores and dS reaches dbias, as engines/sm80.backward_choices may
    choose per device and problem: a float32 bias staged in shared memory or not (where the
    device has the room); a reduced dbias with sequences launched fastest or not (a bias
    broadcast over the batch) and one or two floats per reduction (SM90, an even Sk)."""
    fits = dataclasses.replace(main, bias_staged=True).smem_bytes() <= smem
    staged = (False, True) if main.bias_dtype == "float32" and fits else (False,)
    batch_inner = (False, True) if main.dbias_reduce else (False,)
    widths = (1, 2) if main.dbias_reduce and sm90 else (1,)
    return [dict(bias_staged=s, batch_inner=b, dbias_reduce_width=w)
            for s, b, w in itertools.product(staged, batch_inner, widths)]


def admitted_rope_params(head_dims=ROPE_HEAD_DIMS) -> list[RopeParams]:
    """The RoPE pass's records (rotation and transpose) for every dtype, layout and head dim."""
    combinations = itertools.product(("float16", "bfloat16"), head_dims, ROPE_LAYOUTS)
    return [record for dtype, head_dim, layout in combinations
            for record in rope_params_for(dtype=dtype, head_dim=head_dim, layout=layout)]
