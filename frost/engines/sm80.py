"""frost's own SM80 engines: the CuTe-DSL kernels of ``frost.kernels.sm80`` behind the engine contract.

``sdpa_fwd_sm80`` serves the forward (FlashAttention-2 style, see
``frost/kernels/sm80/fwd.py``); ``sdpa_bwd_sm80`` the backward chain
(``bwd_pre`` -> ``bwd`` -> dQ conversion; ``bwd_dq`` in place of the conversion when the
deterministic mode recomputes dQ). With ``rope=`` both run on q and k rotated by the
RoPE pass, and the backward rotates dq and dk back (``sm80_rope.py``).
Their Capabilities rows say what they accept (an additive bias included: float32 or the io
dtype, every broadcast of [B|1, Hq|1, Sq, Sk], dense, padded and packed; dbias in the bias's
dtype, deterministic mode included; frost/kernels/sm80/bias.py); ``check_support`` adds the facts
a row cannot express (a CUDA device of compute capability 8.x or 9.x, at most 65535
sequences, query heads and 64-position blocks per sequence (a grid's y / z), a
positive scale, 16-byte aligned rows, the DSL installed).

Lowering: ``frost.kernels.sm80.config`` turns the problem into frozen params
records (flavor, tiles, feature flags); ``frost.kernels.sm80.compile`` returns
the cached artifact for each. Nothing here imports the DSL until a plan is
compiled.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import threading
import weakref

import torch

from frost import devices
from frost.engines.base import Capabilities, Engine, Plan, allocate_backward, allocate_forward, lse_template
from frost.engines.sm80_rope import RopePass, rope_records
from frost.problem import Grads, Problem, Tensors

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_BIAS_DTYPE_NAMES = {torch.float32: "float32", **_DTYPE_NAMES}
VECTOR_ELEMENTS = 8  # one 16-byte cp.async vector of fp16/bf16

SM80_CAPABILITIES = Capabilities(
    dtypes=frozenset(_DTYPE_NAMES),
    layouts=frozenset({"bshd", "thd"}),
    # bias: float32 or the io dtype, every broadcast of [B|1, Hq|1, Sq, Sk], dense, padded and
    # packed layouts; dbias in the bias's dtype, deterministic mode included (kernels/sm80/bias.py)
    features=frozenset(
        {"thd", "padding", "gqa", "mqa", "causal", "bottom_right", "window", "bias", "sinks", "rope", "dqk_ne_dv",
         "strided"}
    ),
    device_types=frozenset({"cuda"}),
    head_dim_multiple=VECTOR_ELEMENTS,
    max_head_dim=256,  # any Dqk, Dv up to 256 (multiples of 8): config.FLAVORS covers every pair
    deterministic=True,
)


@functools.lru_cache(maxsize=None)
def _dsl_installed() -> bool:
    return importlib.util.find_spec("cutlass") is not None


# CUDA launches at most 65535 CTAs along a grid's y and z. The kernels put the batch, the
# query heads and the sequence blocks there (which goes where depends on the launch order:
# kernels/sm80/fwd.py, bwd.py), so each must fit; blocks counted at the smallest tile of the
# records a plan compiles.
_GRID_YZ_MAX = 65535


def sm80_decline(problem: Problem) -> str | None:
    """What every SM80 engine needs beyond its Capabilities row, before its records are made."""
    device = devices.of_device(problem.device)
    major, minor = device.compute_capability
    if major not in (8, 9):
        return f"needs an SM80-class GPU (compute capability 8.x or 9.x), got {major}.{minor}"
    forced = devices.forced()
    if forced is not None and forced.runs_on(device) is not None:
        return f"the forced device profile does not run here: {forced.runs_on(device)}"
    if problem.scale <= 0:
        return f"needs a positive scale, got {problem.scale}"
    if not problem.vector_aligned:
        return "needs 16-byte aligned rows (data pointers and all strides but the last a multiple of 8 elements)"
    if problem.bias is not None and not problem.bias.unit_last_stride:
        return "needs a bias whose last dimension has stride 1"
    if not _dsl_installed():
        return "nvidia-cutlass-dsl is not installed"
    return None


def records_decline(problem: Problem, records) -> str | None:
    """Why the device cannot launch a plan's records: shared memory past the profile's opt-in
    limit per block, or a grid dimension past CUDA's (blocks of the smallest tile)."""
    profile = _problem_profile(problem)
    for record in records:
        smem = record.smem_bytes() if hasattr(record, "smem_bytes") else 0
        if smem > profile.smem_per_block_optin:
            return (f"{type(record).__name__} needs {smem} B of shared memory per block; {profile.name} allows "
                    f"{profile.smem_per_block_optin} B")
    tile = min((t for r in records for t in (getattr(r, "tile_m", 0), getattr(r, "tile_n", 0)) if t > 0), default=64)
    blocks = -(-max(problem.seqlen_q, problem.seqlen_k) // tile)
    for name, extent in (("sequences", problem.batch), ("query heads", problem.heads_q),
                         (f"blocks of {tile} positions in the longest sequence", blocks)):  # fmt: skip
        if extent > _GRID_YZ_MAX:
            return f"{extent} {name}: a CUDA grid dimension holds at most {_GRID_YZ_MAX}"
    return None


class Sm80Forward(Engine):
    name = "sdpa_fwd_sm80"
    family = "sm80"
    direction = "forward"
    native = False
    capabilities = SM80_CAPABILITIES

    def check_support(self, problem: Problem) -> str | None:
        reason = super().check_support(problem) or sm80_decline(problem)
        return reason or records_decline(problem, self.records(problem))

    def records(self, problem: Problem) -> tuple:
        """The params records a plan for ``problem`` compiles (for filling a cache ahead of time):
        the forward's, then the RoPE pass's (sm80_rope.py) when the problem has one."""
        from frost.kernels.sm80.config import fwd_params_for

        params = fwd_params_for(
            dtype=_DTYPE_NAMES[problem.dtype], head_dim_qk=problem.head_dim_qk, head_dim_v=problem.head_dim_v,
            layout=problem.layout, has_seqlens=problem.has_seqlens, window_left=problem.window_left,
            window_right=problem.window_right, bottom_right=problem.causal_align == "bottom_right",
            has_sinks=problem.has_sinks, bias_dtype=bias_dtype_name(problem),
        )
        if forward_heavy_first(problem, params):
            params = dataclasses.replace(params, heavy_first=True).validate()
        return (params,) + rope_records(problem)

    def compile(self, problem: Problem) -> Plan:
        from frost.kernels.sm80 import compile as sm80_compile

        params = self.records(problem)[0]
        return _Sm80ForwardPlan(problem, params, sm80_compile.compile_fwd(params), RopePass.compile(problem))


def forward_heavy_first(problem: Problem, params) -> bool:
    """Whether the d64 forward (plain order by default, ``config.fwd_params_for``) launches its
    longest query blocks first: under a right-bounded mask without a bias, while a wave still
    holds two CTAs per head (sequence x query head), as the backward's
    ``heavy_first_keeps_locality``. With more heads heavy-first runs one query block of each
    head at a time and their K / V reads stop sharing L2. Measured on the H200
    (docs/DECISIONS.md, "Forward: heavy-first launch with few heads"): heavy-first +5.5% at B2
    S8192 H32 causal (64 heads), +36% at B4 S2048 Hq8/2 causal (32); -1.5% at B4 S4096 H32
    (128), -10% at B16 S1024 H32 (512).
    The wider flavors launch heavy-first under every right-bounded mask: they lost 3-26% without
    it, at 16 to 256 heads. A bias was not measured, so it keeps the plain order."""
    from frost.kernels.sm80.space import heavy_first_on_few_heads

    return heavy_first_on_few_heads(params) and 2 * problem.batch * problem.heads_q <= _problem_sms(problem)


class Sm80Backward(Engine):
    """The backward chain. Per problem and device (the ``frost.devices`` profile the plans are made
    for: a forced one, or the GPU's own) it chooses (``backward_choices``):

    - the main kernel's tiles: the largest of ``config.BWD_TILES`` whose shared memory fits the
      device's opt-in limit per block (``bwd_tile_for``); ``check_support`` declines, naming the
      shared memory, where none fits or another record of the chain would not;
    - the dQ reduce width: 4 floats per reduction (red.global.add.v4.f32) for d64 without a
      bias on SM90, with the dQ product first in a step (``config.bwd_params_for``): +2-3% on
      the d64 benchmark shapes on the H200, where 4 floats alone or the order alone gained
      nothing (docs/DECISIONS.md, "Backward: 4-float dQ reductions and the dQ product first for
      d64"); 1 float otherwise (d128: 1-4% slower with 4; a bias: not measured); the sliced dQ
      (below) 4 floats on SM90, 1 elsewhere;
      ``dq_reduce_width`` forces a width in either mode (2 and 4 need SM90);
    - the GQA split: the query heads of a group are spread over CTAs when the unsplit grid
      would be under two waves of the device's SMs (with the sliced dQ: chosen with its slices,
      ``sliced_group_split``; ``split`` forces a count; 1 disables);
    - heavy-first launch order for causal / right-windowed problems with few heads, where a wave
      still holds two CTAs per head (``heavy_first_keeps_locality``; ``heavy_first`` forces it);
    - for a dbias reduced over the batch (a bias broadcast over it, default mode): sequences
      launched fastest (``batch_inner``, in place of heavy-first) and two floats per reduction
      on SM90 (``dbias_reduce_width``); ``bias_batch_inner`` and ``backward_choices`` say when;
    - a float32 bias staged through shared memory where the device has room (``bias_staged``);
    - in deterministic mode, how dQ is made: by the sliced dQ (sm80/bwd.py, "Sliced dQ": each
      CTA reduces into a slice of its own, bwd_convert sums the slices in order; the GQA split and
      the slices of least scratch among those near the least estimated chain time,
      ``sliced_chain_seconds``, whose slices beyond the first fit ``SLICED_EXTRA_SCRATCH``, or
      ``dq_slices`` forced), or by the ``bwd_dq`` recompute pass where filling the SMs would take
      more slices than fit (``sliced_fills_the_device``; a forced ``dq_slices`` that does not
      fit likewise) or with ``dq_recompute=True``. Without a left window the sliced dQ's CTAs
      write their slices whole (``BwdParams.dq_slice_stores``: the first key block stores, the
      chunks the walk never reaches stay unwritten and bwd_convert skips them, so bwd_pre zeroes
      no slice; on the H200 it cost 0.998-1.211 against 1.007-1.321 with the slices zeroed,
      docs/DECISIONS.md, "Sliced dQ: slices written whole"). Summing the slices in the main
      kernel instead (the last slice to finish a query block sums it) was measured and removed:
      on the H200 that chain took 1.02-1.38x this one's on all 18 benchmark shapes
      (docs/DECISIONS.md, "bwd_convert: a separate pass sums the slices").
    - on SM90, a group split in 2 sums dK and dV in clusters of its CTAs instead of fp32 partials
      and bwd_combine (``cluster_sums``, ``BwdParams.split_cluster``: no partials, no combine);
      ``cluster_sum`` False keeps the partials.
    """

    name = "sdpa_bwd_sm80"
    family = "sm80"
    direction = "backward"
    native = False
    capabilities = SM80_CAPABILITIES

    def __init__(self, dq_reduce_width: int | None = None, split: int | None = None,
                 heavy_first: bool | None = None, batch_inner: bool | None = None,
                 dbias_reduce_width: int | None = None, bias_staged: bool | None = None,
                 dq_slices: int | None = None, dq_recompute: bool = False, cluster_sum: bool | None = None):
        self.dq_reduce_width = dq_reduce_width
        self.split = split
        self.heavy_first = heavy_first
        self.batch_inner = batch_inner
        self.dbias_reduce_width = dbias_reduce_width
        self.bias_staged = bias_staged
        self.dq_slices = dq_slices  # forces the sliced dQ's count (dq_slice_count otherwise)
        self.dq_recompute = dq_recompute  # deterministic mode: the bwd_dq recompute instead of the sliced dQ
        self.cluster_sum = cluster_sum  # a split group's dK / dV summed in clusters (backward_choices)

    def check_support(self, problem: Problem) -> str | None:
        from frost.kernels.sm80.config import bwd_tile_for, flavor_for

        reason = super().check_support(problem) or sm80_decline(problem)
        if reason is not None:
            return reason
        flavor, profile = flavor_for(problem.head_dim_qk, problem.head_dim_v), _problem_profile(problem)
        if bwd_tile_for(flavor, profile.smem_per_block_optin) is None:
            return (f"no backward tile of {flavor} fits the {profile.smem_per_block_optin} B of shared memory per block "
                    f"of {profile.name}")
        return records_decline(problem, self.records(problem))

    def records(self, problem: Problem) -> tuple:
        """The chain's params records for ``problem``: (preprocess, main, last pass), the combine
        of the dK / dV partials when the plan splits a GQA group, then the RoPE pass's (rotation
        and transpose, sm80_rope.py) when the problem has one."""
        return self._chain(problem)[0] + rope_records(problem)

    def _chain(self, problem: Problem) -> tuple[tuple, int]:
        from frost.kernels.sm80.config import BwdCombineParams, BwdConvertParams, BwdDqParams, BwdPreParams

        def choices(sliced_dq: bool):
            return backward_choices(problem, self.dq_reduce_width, self.split, self.heavy_first, self.batch_inner,
                                    self.dbias_reduce_width, self.bias_staged, sliced_dq, self.cluster_sum)

        main, splits = choices(problem.deterministic and not self.dq_recompute)
        forced = self.dq_slices
        if main.dq_slices and not (extra_slices_fit(problem, forced) if forced
                                   else sliced_fills_the_device(problem, main)):
            main, splits = choices(False)  # the slices would not fit: the recompute
        pre = BwdPreParams.of(main, problem.has_sinks)
        last = BwdConvertParams.of(main) if main.reduces_dq else BwdDqParams.of(main, _problem_smem(problem))
        combine = (BwdCombineParams.of(main),) if splits > 1 and not main.split_cluster else ()
        return (pre, main, last, *combine), splits

    def slice_count(self, problem: Problem, main, splits: int) -> int:
        """The sliced dQ's slices: forced (``dq_slices``) or ``dq_slice_count``'s."""
        return self.dq_slices or dq_slice_count(problem, main, splits)

    def compile(self, problem: Problem) -> Plan:
        from frost.kernels.sm80 import compile as sm80_compile

        records, splits = self._chain(problem)
        slices = self.slice_count(problem, records[1], splits) if records[1].dq_slices else 1
        return _Sm80BackwardPlan(problem, splits, records, tuple(map(sm80_compile.compile_record, records)),
                                 RopePass.compile(problem), slices)


def _problem_profile(problem: Problem) -> devices.DeviceProfile:
    """The device the plans for ``problem`` are made for (``frost.devices.profile_for``: a forced
    profile, else the GPU's own, else for a CPU problem, whose records are cross-compiled, the H100's)."""
    return devices.profile_for(problem.device)


def _problem_sms(problem: Problem) -> int:
    return _problem_profile(problem).sm_count


def _problem_smem(problem: Problem) -> int:
    """Shared memory a CTA may opt in to on the problem's device."""
    return _problem_profile(problem).smem_per_block_optin


def _problem_sm90(problem: Problem) -> bool:
    """Whether the problem's device has SM90's instructions."""
    return _problem_profile(problem).sm90


def group_split(problem: Problem, tile_n: int, sm_count: int) -> int:
    """How many CTAs share a GQA group's query heads: the smallest divisor of the group that
    brings the grid to about two waves (1.9) of ``sm_count`` CTAs, else the whole group."""
    group = problem.heads_q // problem.heads_kv
    ctas = math.ceil(problem.seqlen_k / tile_n) * problem.heads_kv * problem.batch
    for split in range(1, group + 1):
        if group % split == 0 and ctas * split >= 1.9 * sm_count:
            return split
    return group


def backward_choices(problem: Problem, dq_reduce_width: int | None = 1, split=None, heavy_first=None,
                     batch_inner: bool | None = False, dbias_reduce_width: int | None = 1,
                     bias_staged: bool | None = False, sliced_dq: bool = False, cluster_sum: bool | None = False):
    """The main kernel's params and the GQA split count for a problem (see Sm80Backward).
    ``sliced_dq``: deterministic, the sliced dQ (else the bwd_dq recompute). ``cluster_sum``: a
    split group's dK and dV summed in clusters (``cluster_sums``: None, the device's default)
    where the shared memory allows (``BwdParams.split_cluster``). ``dq_reduce_width`` None:
    ``default_dq_reduce_width``, with the sliced dQ 4 on SM90, else 1. For a dbias reduced over
    broadcast dims, ``batch_inner`` None: ``bias_batch_inner`` unless ``heavy_first`` is forced;
    ``dbias_reduce_width`` None: 2 floats per reduction on SM90 where the accumulator's rows are
    8-byte aligned (it is contiguous: an even Sk), else 1. ``bias_staged`` None: a float32 bias
    tile comes through shared memory (cp.async a step ahead) where the device has the room; read
    where the scores need it, it cost half the step (H200, docs/DECISIONS.md, "Backward: float32
    bias staged through shared memory")."""
    from frost.kernels.sm80.config import bwd_params_for

    sliced_dq = sliced_dq and problem.deterministic
    if dq_reduce_width is None:
        dq_reduce_width = (4 if _problem_sm90(problem) else 1) if sliced_dq else default_dq_reduce_width(problem)
    main = bwd_params_for(
        dtype=_DTYPE_NAMES[problem.dtype], head_dim_qk=problem.head_dim_qk, head_dim_v=problem.head_dim_v,
        layout=problem.layout, has_seqlens=problem.has_seqlens, window_left=problem.window_left,
        window_right=problem.window_right, bottom_right=problem.causal_align == "bottom_right",
        deterministic=problem.deterministic, dq_reduce_width=dq_reduce_width, dq_slices=sliced_dq,
        bias_dtype=bias_dtype_name(problem), bias_broadcast=bias_broadcast(problem),
        bias_grad=problem.bias is None or problem.bias.grad, smem_limit=_problem_smem(problem),
    )
    sms = _problem_sms(problem)
    if split is None:
        split = sliced_group_split(problem, main) if main.dq_slices else group_split(problem, main.tile_n, sms)
    split = math.gcd(split, problem.heads_q // problem.heads_kv)  # a forced count must divide the group
    if batch_inner is None:
        batch_inner = heavy_first is None and bias_batch_inner(problem, main)
    if main.dq_slices:  # the grid's x holds the slices: no other launch order
        heavy_first, batch_inner = False, False
    elif heavy_first is None:
        heavy_first = main.has_window_right and not batch_inner and heavy_first_keeps_locality(problem, split, sms)
    if not main.dbias_reduce or problem.bias.shape[-1] % 2:  # no reductions, or rows not 8-byte aligned
        dbias_reduce_width = 1
    elif dbias_reduce_width is None:
        dbias_reduce_width = 2 if _problem_sm90(problem) else 1
    main = dataclasses.replace(main, split_group=split > 1, heavy_first=heavy_first, batch_inner=batch_inner,
                               dbias_reduce_width=dbias_reduce_width)
    if bias_staged is None:
        bias_staged = main.bias_dtype == "float32"
    if bias_staged and dataclasses.replace(main, bias_staged=True).smem_bytes() <= _problem_smem(problem):
        main = dataclasses.replace(main, bias_staged=True)
    if cluster_sums(problem, main, split, cluster_sum):
        main = dataclasses.replace(main, split_cluster=split)
    return main.validate(), split


def cluster_sums(problem: Problem, main, split: int, forced: bool | None = None) -> bool:
    """Whether ``split`` parts of a GQA group sum dK and dV in clusters of their CTAs rather than
    through fp32 partials and bwd_combine: by default (``forced`` None) and when forced, for a
    split that is a cluster size (config.SPLIT_CLUSTERS: 2) where ``main`` allows it
    (``BwdParams.cluster_fits``), on SM90 only. Measured (H100,
    docs/DECISIONS.md, "Backward: cluster sum of a 2-way split"): with 2 splits the main kernel
    took about what the combine saved, and the chain is one launch shorter."""
    from frost.kernels.sm80.config import SPLIT_CLUSTERS

    return (forced is not False and split in SPLIT_CLUSTERS[1:] and main.cluster_fits(split)
            and _problem_sm90(problem))


def default_dq_reduce_width(problem: Problem) -> int:
    """Floats per dQ reduction in the default mode (Sm80Backward): 4 for d64 without a bias on
    SM90 (its dQ product then comes first: ``config.bwd_params_for``), else 1."""
    from frost.kernels.sm80.config import flavor_for

    d64 = flavor_for(problem.head_dim_qk, problem.head_dim_v) == "d64"
    return 4 if d64 and problem.bias is None and _problem_sm90(problem) else 1


def heavy_first_keeps_locality(problem: Problem, split: int, sm_count: int) -> bool:
    """Whether the default mode's heavy-first launch order (right-bounded masks) still lets the
    CTAs of one head share its query-side tiles in L2.

    Heavy-first launches the longest key blocks of every head first, so one wave holds the same
    key block of ``sm_count`` different heads (sequence x kv head x split part) when there are
    that many: then no two running CTAs read the same q, dO and dQ rows, and with the wide
    flavors' 64x64 tiles those reads go to DRAM. Key blocks fastest (the plain order) runs a
    head's key blocks together instead. So heavy-first stays where a wave holds at least two
    CTAs per head; there are then few heads, few waves, and its balance is what pays (causal
    GQA/MQA: 1.2-1.5x). Measured on the H200 (docs/DECISIONS.md, "Backward: heavy-first launch
    while a wave holds two CTAs per head"): without heavy-first d256 / d192 / d192x128 B16
    S1024 causal ran 1.30x / 1.34x / 1.40x faster; with it d256 B4 S4096 causal (32 heads) 1.04x
    faster."""
    return 2 * problem.batch * problem.heads_kv * split <= sm_count


def bias_batch_inner(problem: Problem, main) -> bool:
    """Whether the main kernel launches sequences fastest (``BwdParams.batch_inner``): for a dbias
    reduced over the batch, so that the sequences adding into one tile run together and their
    reductions (and bias reads) meet in L2. Launched key blocks fastest, or heavy-first, they
    are a batch or a head's worth of CTAs apart (H200, [1, H, S, S] float32 bias: backward
    1.05-1.3x faster, causal ones too, where it replaces heavy-first; docs/DECISIONS.md,
    "Backward: sequences launched fastest for a dbias summed over the batch")."""
    return main.dbias_reduce and problem.bias.broadcast_batch and problem.batch > 1


# the sliced dQ's most slices: each is a whole fp32 dQ accumulator that the main kernel writes
# whole (or bwd_pre zeroes) and bwd_convert reads back
MAX_DQ_SLICES = 8
# the sliced dQ's slices beyond the first take at most this; deterministic mode's default takes the
# bwd_dq recompute where filling the SMs would take more (the default mode's accumulator is one slice already)
SLICED_EXTRA_SCRATCH = 1 << 30


# the sliced dQ's plan (GQA split and slices) is chosen by its estimated chain time
# (``sliced_chain_seconds``, ``_sliced_plan``): the main kernel's FLOPs at SLICED_MAIN_FLOPS on
# the SMs its grid keeps busy (and its last round's), SPLIT_MAIN_COST slower with a split group, plus the q and dO
# rows each key block's pass streams, read once for the slices of a head (they run together), at
# SLICED_STREAM_BYTES; and the bytes the split's fp32 partials (written by the main kernel, read
# by bwd_combine) and the slices (read by bwd_convert) move at SLICED_PASS_BYTES. Fitted on the
# H200's GQA shapes (docs/DECISIONS.md, "Sliced dQ: plan by the estimated chain time"): it picks
# the measured best or within 1.6% of it, e.g. Hq32 / Hkv8 B2 S4096 d128 unsplit with 8 slices
# (3% faster than split 4 with 2 slices, 8% on the H100), d64 Hq8 / Hkv2 split 4 x 4. The
# streaming term from the H100's MHA shapes: with one or two slices a head's q and dO went from
# memory once per key block; the chains of the plans it now picks cost 1.040-1.128x the
# default's kernel time where those cost 1.075-1.184x. Among the plans within SLICED_PLAN_SLACK of
# the least estimate, the one of least scratch.
SLICED_MAIN_FLOPS = 300e12
SLICED_PASS_BYTES = 3.3e12
SPLIT_MAIN_COST = 0.05
SLICED_STREAM_BYTES = 5e12
SLICED_PLAN_SLACK = 0.01


def _mask_offset(problem: Problem) -> int:
    """How far the mask's diagonal is shifted right: Sk - Sq bottom-right aligned, else 0."""
    return problem.seqlen_k - problem.seqlen_q if problem.causal_align == "bottom_right" else 0


def _first_row_seeing(problem: Problem, key: int) -> int:
    """The first query row that sees key ``key`` under the problem's right bound (0 without one)."""
    if problem.window_right < 0:
        return 0
    return min(max(key - _mask_offset(problem) - problem.window_right, 0), problem.seqlen_q)


def _visible_fraction(problem: Problem) -> float:
    """The share of (query, key) pairs the mask keeps, from 64 sampled keys."""
    offset = _mask_offset(problem)
    keys = range(0, problem.seqlen_k, max(problem.seqlen_k // 64, 1))
    seen = 0
    for key in keys:
        last = problem.seqlen_q if problem.window_left < 0 else min(key - offset + problem.window_left + 1,
                                                                   problem.seqlen_q)
        seen += max(last - _first_row_seeing(problem, key), 0)
    return seen / (len(keys) * problem.seqlen_q)


def sliced_chain_seconds(problem: Problem, main, splits: int, slices: int, streaming: bool = True) -> float:
    """The sliced dQ chain's estimated time with ``splits`` parts of each GQA group and ``slices``
    slices (the constants above). A CTA does 1 / (splits * slices) of its (sequence, kv head)'s
    work, one CTA per SM (the main kernel's residency). With ``dq_slice_stores`` slice s holds
    the query blocks from the first one its first key block (key block s) sees on; otherwise
    bwd_pre zeroes the slices whole and bwd_convert reads them whole."""
    if problem.seqlen_q == 0 or problem.seqlen_k == 0:  # nothing to run: every plan costs nothing
        return 0.0
    rows_q = problem.total_q or problem.batch * problem.seqlen_q
    rows_k = problem.total_k or problem.batch * problem.seqlen_k
    dqk, dv = problem.head_dim_qk, problem.head_dim_v
    ctas = problem.batch * problem.heads_kv * splits * slices
    busy = ctas / (math.ceil(ctas / _problem_sms(problem)) * _problem_sms(problem))
    visible = _visible_fraction(problem)
    flops = 2.5 * 2 * rows_q * problem.seqlen_k * problem.heads_q * (dqk + dv) * visible
    # the CTAs of the last round wait on those with one key block more
    key_blocks = math.ceil(problem.seqlen_k / main.tile_n)
    round_imbalance = math.ceil(key_blocks / slices) * slices / key_blocks
    main_seconds = flops / SLICED_MAIN_FLOPS / busy * round_imbalance * (1 + SPLIT_MAIN_COST * (splits > 1))
    # each pass streams its query heads' q and dO rows, which the slices of one (sequence, kv head,
    # split part), launched together, read at about the same time: from memory once for all of them
    streamed = key_blocks * rows_q * problem.heads_q * (dqk + dv) * 2 * visible / slices
    main_seconds += streamed / SLICED_STREAM_BYTES if streaming else 0.0
    partials = rows_k * problem.heads_kv * (dqk + dv) * (4 * splits * 2 + 2) if splits > 1 else 0
    if cluster_sums(problem, main, splits):  # no partials: the main kernel writes dk and dv
        partials = 0
    if main.dq_slice_stores:
        sliced_rows = sum(problem.seqlen_q - _first_row_seeing(problem, s * main.tile_n) // main.tile_m * main.tile_m
                          for s in range(slices)) * rows_q / problem.seqlen_q
    else:
        sliced_rows = 2 * slices * rows_q
    convert = sliced_rows * problem.heads_q * dqk * 4 + rows_q * problem.heads_q * dqk * 2
    return main_seconds + (partials + convert) / SLICED_PASS_BYTES


def _sliced_plans(problem: Problem, main, splits: int | None = None) -> list[tuple[int, int]]:
    """The (splits, slices) the sliced dQ may take: a divisor of the group (or ``splits``), at most
    MAX_DQ_SLICES and the key blocks."""
    group = problem.heads_q // problem.heads_kv
    key_blocks = max(math.ceil(problem.seqlen_k / main.tile_n), 1)
    return [(n, slices) for n in ((splits,) if splits else range(1, group + 1)) if group % n == 0
            for slices in range(1, min(MAX_DQ_SLICES, key_blocks) + 1)]


def extra_slices_fit(problem: Problem, slices: int) -> bool:
    """Whether the sliced dQ's slices beyond the first (each a whole fp32 dQ accumulator) take at
    most SLICED_EXTRA_SCRATCH bytes."""
    accumulator = problem.batch * problem.seqlen_q * problem.heads_q * problem.head_dim_qk * 4
    return (slices - 1) * accumulator <= SLICED_EXTRA_SCRATCH


def _sliced_plan(problem: Problem, main, splits: int | None = None) -> tuple[int, int]:
    """The sliced dQ's (splits, slices) of least scratch (``_scratch_units``) among the plans that
    fit (``extra_slices_fit``) within SLICED_PLAN_SLACK of their least ``sliced_chain_seconds``: a
    slice more costs a whole fp32 dQ for a gain under the estimate's precision."""
    plans = {plan: sliced_chain_seconds(problem, main, *plan)
             for plan in _sliced_plans(problem, main, splits) if extra_slices_fit(problem, plan[1])}
    best = min(plans.values())
    return min((plan for plan, seconds in plans.items() if seconds <= best * (1 + SLICED_PLAN_SLACK)),
               key=lambda plan: (_scratch_units(problem, plan), plans[plan]))


def _scratch_units(problem: Problem, plan: tuple[int, int]) -> int:
    """A sliced plan's scratch in fp32 K-sized units: a slice takes the group's size, a split two partials."""
    splits, slices = plan
    return slices * (problem.heads_q // problem.heads_kv) + (2 * splits if splits > 1 else 0)


def sliced_fills_the_device(problem: Problem, main) -> bool:
    """Whether the plan of least ``sliced_chain_seconds`` without the streaming term (the SMs its
    grid keeps busy, and the passes' byte counts) fits SLICED_EXTRA_SCRATCH. Not (a long sequence
    of few heads, whose slices within the bound would leave SMs idle): deterministic mode takes the
    bwd_dq recompute, whose main kernel launches every key block at once and needs no scratch for dQ."""
    plans = _sliced_plans(problem, main)
    return extra_slices_fit(problem, min(plans, key=lambda plan: (
        sliced_chain_seconds(problem, main, *plan, streaming=False), _scratch_units(problem, plan)))[1])


def dq_slice_count(problem: Problem, main, splits: int) -> int:
    """The sliced dQ's slices (``BwdParams.dq_slices``) for ``splits`` parts of each GQA group: CTAs
    per (sequence, kv head, split part), each walking every slices-th key block (``_sliced_plan``)."""
    return _sliced_plan(problem, main, splits)[1]


def sliced_group_split(problem: Problem, main) -> int:
    """The GQA split for the sliced dQ, chosen with its slices (``_sliced_plan``)."""
    return _sliced_plan(problem, main)[0]


def bias_dtype_name(problem: Problem) -> str | None:
    """The params records' name of the bias dtype ("float32" or the io dtype), None without one."""
    return None if problem.bias is None else _BIAS_DTYPE_NAMES[problem.bias.dtype]


def bias_broadcast(problem: Problem) -> bool:
    """Whether dbias sums over batches or heads: the bias has size 1 where the problem has more."""
    bias = problem.bias
    return bias is not None and ((bias.broadcast_batch and problem.batch > 1) or
                                 (bias.broadcast_heads and problem.heads_q > 1))


def _dbias_covered(problem: Problem) -> bool:
    """Whether the main kernel's dS stores reach every element of dbias (or of its partials): dense,
    unpadded, unwindowed, non-empty problems visit every tile, each element valid. Otherwise the
    target is zero-filled first, so padded and never-visible positions read 0."""
    return (problem.layout == "bshd" and not problem.has_seqlens and problem.window_left < 0
            and problem.window_right < 0 and min(problem.batch, problem.seqlen_q, problem.seqlen_k) > 0)


_VECTORS = ("sinks", "seqlens_q", "seqlens_k", "cu_seqlens_q", "cu_seqlens_k")


def _unit_stride_vectors(t: Tensors) -> Tensors:
    """The call's tensors with its 1-D vectors at unit stride: the kernels take them so
    (compile.fake_vector), and a strided view (every other element of a buffer) is legal
    input. They hold a few numbers each, so a copy costs nothing that matters."""
    if (t.sinks is None and t.seqlens_q is None and t.seqlens_k is None and t.cu_seqlens_q is None
            and t.cu_seqlens_k is None):
        return t  # the usual dense call: no vector, tested without a loop
    strided = {}
    for name in _VECTORS:
        x = getattr(t, name)
        if x is not None and x.numel() > 1 and x.stride(0) != 1:
            strided[name] = x.contiguous()
    return dataclasses.replace(t, **strided) if strided else t


def _pairs_aligned(x: torch.Tensor) -> bool:
    """Whether every even column of ``x`` starts an 8-byte aligned pair of floats."""
    return x.data_ptr() % 8 == 0 and all(s % 2 == 0 for s in x.stride()[:-1]) and x.stride(-1) == 1


def _vector_aligned(x: torch.Tensor) -> bool:
    return x.data_ptr() % 16 == 0 and all(s % VECTOR_ELEMENTS == 0 for s in x.stride()[:-1]) and x.stride(-1) == 1


class _Sm80ForwardPlan(Plan):
    def __init__(self, problem: Problem, params, compiled, rope: RopePass | None = None):
        super().__init__(problem)
        self.params = params
        self._compiled = compiled
        self.rope = rope
        self._lse_like = lse_template(problem)

    @property
    def workspace_bytes(self) -> int:
        return self.rope.nbytes if self.rope is not None else 0

    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        from frost.kernels.sm80.compile import copy_rows, launch_fwd

        p, tensors = self.problem, _unit_stride_vectors(tensors)
        if self.rope is not None:  # the forward runs on q and k rotated into the workspace
            if workspace is None:
                workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=tensors.q.device)
            tensors = self.rope.rotate(tensors, workspace)
        # dense: the kernel writes every row of o and lse; packed rows past cu_seqlens[-1] must read as zeros
        if out is None:
            o, lse = allocate_forward(p, zero=p.layout == "thd", q=tensors.q, lse_like=self._lse_like)
        else:
            o, lse = out
        # a caller's o with rows the 16-byte stores cannot address goes through a staging copy
        # (allocate_forward's are aligned and contiguous)
        staged = out is not None and not _vector_aligned(o)
        o_kernel = torch.empty(p.o_shape, dtype=p.dtype, device=o.device) if staged else o
        launch_fwd(
            self._compiled, tensors.q, tensors.k, tensors.v, o_kernel, lse,
            scale=p.scale, window_left=p.window_left, window_right=p.window_right,
            cu_seqlens_q=tensors.cu_seqlens_q, cu_seqlens_k=tensors.cu_seqlens_k,
            seqlens_q=tensors.seqlens_q, seqlens_k=tensors.seqlens_k, sinks=tensors.sinks, bias=tensors.bias,
            max_seqlen_q=p.seqlen_q,
        )
        if o_kernel is not o:
            copy_rows(o, o_kernel, tensors.cu_seqlens_q)
        return o, lse


class _Workspace:
    """The backward's scratch, carved from one byte buffer: D and lse2 (lse-shaped fp32);
    the flat fp32 dQ accumulator (default mode, and ``slices`` of it for the sliced deterministic
    dQ; layout in sm80/seqlen.py); per-block dsink partials (with sinks); fp32 dK / dV partials (split GQA groups); for
    a broadcast bias (kernels/sm80/bias.py) fp32 dbias partials [B, Hq, Sq, Sk] (deterministic
    mode: 4 bytes per element, B*Hq/(B'*H') times the bias's element count) or, default mode
    with a bias in the io dtype, an fp32 accumulator shaped like the bias."""

    ALIGN = 256

    def __init__(self, problem: Problem, splits: int, pre, main, slices: int = 1):
        p = problem
        self.parts: list[tuple[str, tuple[int, ...]]] = [("d", p.lse_shape), ("lse2", p.lse_shape)]
        if main.reduces_dq:  # sliced dQ: the slices one after another on the head axis (sm80/seqlen.py)
            heads = p.heads_q * slices
            if p.layout == "thd":
                accum = (heads, (p.total_q + p.batch * main.tile_m) * main.tile_hdim_qk)
            else:
                accum = (p.batch, heads, math.ceil(p.seqlen_q / main.tile_m) * main.dq_chunk)
            self.parts.append(("dq_accum", accum))
        if p.has_sinks:
            self.parts.append(("dsink_partial", (p.heads_q, p.batch * pre.num_m_blocks(p.seqlen_q))))
        if main.dbias_dtype is not None and bias_broadcast(p):
            extents = p.bias.shape[2:]
            if not main.dbias_reduce:
                self.parts.append(("dbias_partial", (p.batch, p.heads_q, *extents)))
            elif p.bias.dtype != torch.float32:  # a float32 dbias is its own accumulator
                self.parts.append(("dbias_accum", p.bias.shape))
        if splits > 1 and not main.split_cluster:  # a cluster sum writes dk and dv itself
            rows = (p.total_k,) if p.layout == "thd" else (p.batch, p.seqlen_k)
            for name, width in (("dk_partial", main.tile_hdim_qk), ("dv_partial", main.tile_hdim_v)):
                self.parts.append((name, (splits, *rows, p.heads_kv, width)))
        self.words = {}  # name -> (offset in 4-byte words, contiguous strides)
        offset = 0
        for name, shape in self.parts:
            strides = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
            self.words[name] = (offset // 4, strides)
            offset += -(-4 * math.prod(shape) // self.ALIGN) * self.ALIGN
        self.nbytes = offset

    def carve(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parts as float32 views of ``buffer`` (bytes): one strided view each (each operator
        costs host time on every call)."""
        words = buffer.view(torch.float32)
        views = {}
        for name, shape in self.parts:
            offset, strides = self.words[name]
            views[name] = words.as_strided(shape, strides, words.storage_offset() + offset)
        return views


class _KeptScratch:
    """A backward plan's own workspace, kept for the next call when it is small.

    The next call on the same stream may reuse it: its kernels start after this call's
    (stream order), and the chain rewrites what it reads (bwd_pre zeroes the accumulator). A call on another stream gets a fresh buffer, which is then the one kept (the
    old one goes back to the caching allocator, which orders its reuse after the old
    stream's work). Under a graph capture the buffer is always fresh: a graph owns its
    memory. Workspaces above ``PER_PLAN`` bytes, or past ``TOTAL`` bytes kept over all
    plans, are never kept: they would hold memory between calls, and a call whose kernels
    run long enough to need them hides its host time anyway. The kept buffer's carved views
    are kept with it: carving is a few operators per call.
    """

    PER_PLAN = 1 << 20
    TOTAL = 64 << 20
    _kept_bytes = 0

    def __init__(self, nbytes: int, carve, device_type: str):
        self.nbytes, self._carve = nbytes, carve
        self.keepable = device_type == "cuda" and nbytes <= self.PER_PLAN
        self.stream = None  # the raw stream handle the kept buffer was last used on
        self.kept = None  # (buffer, its carved views)

    def get(self, like: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(a workspace buffer, the chain's views of it) for a call on ``like``'s device."""
        # a capture comes first: also one on the kept buffer's stream gets a fresh buffer
        if not self.keepable or torch._C._cuda_isCurrentStreamCapturing():
            return self._fresh(like)
        stream = torch._C._cuda_getCurrentRawStream(like.get_device())
        if self.kept is not None and stream == self.stream:
            return self.kept
        fresh = self._fresh(like)
        if self.kept is None:
            if not self._reserve(self.nbytes):
                return fresh
            weakref.finalize(self, _KeptScratch._release, self.nbytes)
        self.stream, self.kept = stream, fresh
        return fresh

    def _fresh(self, like: torch.Tensor):
        buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=like.device)
        return buffer, self._carve(buffer)

    @classmethod
    def _reserve(cls, nbytes: int) -> bool:
        with _kept_lock:
            if cls._kept_bytes + nbytes > cls.TOTAL:
                return False
            cls._kept_bytes += nbytes
            return True

    @classmethod
    def _release(cls, nbytes: int) -> None:
        with _kept_lock:
            cls._kept_bytes -= nbytes


_kept_lock = threading.Lock()


class _Sm80BackwardPlan(Plan):
    def __init__(self, problem: Problem, splits: int, params, compiled, rope: RopePass | None = None,
                 slices: int = 1):
        from frost.kernels.sm80.compile import BwdLaunch

        super().__init__(problem)
        self.params = params  # (pre, main, convert or deterministic dq[, combine])
        self.slices = slices  # the sliced dQ's (its accumulator's head axis carries the count to the kernels)
        self._launch = BwdLaunch(*compiled[:3], compiled[3] if len(compiled) > 3 else None, splits,
                                 params[0].accum_tile_m > 0,
                                 params[1].dq_slice_stores,
                                 problem.scale, problem.window_left, problem.window_right, problem.batch,
                                 problem.seqlen_q, problem.seqlen_k)
        self._workspace = _Workspace(problem, splits, params[0], params[1], slices)
        self.rope = rope  # its rotated q and k lead the workspace
        self._kept = _KeptScratch(self.workspace_bytes, self._carve, problem.device_type)

    @property
    def splits(self) -> int:
        """The GQA group's split count (its dK / dV partials combined by bwd_combine)."""
        return self._launch.splits

    @property
    def workspace_bytes(self) -> int:
        return self._workspace.nbytes + (self.rope.nbytes if self.rope is not None else 0)

    def _carve(self, workspace: torch.Tensor) -> dict[str, torch.Tensor]:
        """The chain's scratch: the workspace after the RoPE pass's lead."""
        return self._workspace.carve(workspace[self.rope.nbytes :] if self.rope is not None else workspace)

    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        from frost.kernels.sm80.compile import copy_rows, launch_bwd

        p, t = self.problem, _unit_stride_vectors(tensors)
        # dense: the chain writes every element (padded rows as zeros); packed tails must read as zeros
        grads = Grads(*out) if out is not None else allocate_backward(p, t, zero=p.layout == "thd")
        if workspace is None:
            workspace, scratch = self._kept.get(t.q)
        else:
            scratch = self._carve(workspace)
        if self.rope is not None:  # the chain runs on q and k rotated into the workspace's lead
            t = self.rope.rotate(t, workspace)
        if grads.dbias is not None:
            target = scratch.get("dbias_partial", scratch.get("dbias_accum", grads.dbias))
            if target is grads.dbias and self.params[1].dbias_reduce_width > 1 and not _pairs_aligned(target):
                # a caller's float32 dbias whose rows the two-float reductions cannot address
                target = torch.empty(target.shape, dtype=torch.float32, device=target.device)
            if self.params[1].dbias_reduce or not _dbias_covered(p):
                target.zero_()
            scratch = {**scratch, "dbias_target": target}  # the kept views stay the plan's parts only
        staged = grads[:3] if out is None else [  # allocate_backward's are aligned and contiguous
            g if _vector_aligned(g) else torch.empty(g.shape, dtype=g.dtype, device=g.device) for g in grads[:3]]
        launch_bwd(self._launch, t, Grads(*staged, grads.dbias, grads.dsinks), scratch)
        if self.rope is not None:  # gradients w.r.t. the unrotated q and k
            self.rope.rotate_back(t, staged[0], staged[1])
        if out is not None:
            for kernel_out, given, rows in zip(staged, grads[:3], (t.cu_seqlens_q, t.cu_seqlens_k, t.cu_seqlens_k)):
                if kernel_out is not given:
                    copy_rows(given, kernel_out, rows)
        return grads
