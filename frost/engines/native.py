"""The native engines: torch fallbacks that run anywhere, the baseline the routing
report measures frost's own kernels against.

``torch-sdpa`` serves dense (BSHD) problems with torch's fused attention kernels,
called through their aten ops because those return the logsumexp that
``F.scaled_dot_product_attention`` hides. Forward: on CPU the flash kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` on float32 copies of the inputs,
which is what torch's CPU math backend does with fp16/bf16 (it upcasts). Given fp16
inputs the CPU flash kernel sums probabilities rounded to fp16, so its lse misses the
acceptance rule wherever the logits are small (found by the fuzz: head dim 1, scale
0.05, lse L2 error 3.4 times the allowance; 10 of 10 seeds fail at head dim 1..8,
scale 0.05, 256 keys). bf16 on a CPU with native bf16 dot products (AVX512-BF16 or
AMX) is the exception: there the kernel runs on the bf16 inputs, twice as fast as on copies
(its matmuls accumulate in float32), and the few lse rows its fast exponential leaves
outside the rule are recomputed exactly (``_exact_lse_rows``). Its fp16/bf16 backward
missed the rule too (fuzz: dq/dk up to 1.48 times the allowance on causal problems with 2
keys), so the CPU backward runs on float32 copies in every case. On CUDA the memory-efficient
kernel ``aten._scaled_dot_product_efficient_attention`` (the flash and cuDNN CUDA
kernels take no additive mask; one CUDA kernel keeps the fallback uniform). Top-left
causal is torch's ``is_causal``; bias and bottom-right causal travel as an additive
mask. Rows whose mask is entirely -inf (a bias can do that) get a zero mask row and are
then set to ``o = 0``, ``lse = -inf``, so no kernel's handling of empty rows leaks in.

Backward: on CPU ``aten._scaled_dot_product_flash_attention_for_cpu_backward``, which
takes the given o and lse as SEMANTICS.md does but returns no gradient for the mask, so
the backward declines bias. Recomputing the forward under autograd was rejected: inside
the ``frost::sdpa_backward`` custom op autograd is switched off below the dispatcher,
so no graph is recorded. The CUDA backward kernels' aten ops want their forward's
private state (philox seeds, a padded lse), so on CUDA the backward declines too.

``unfused`` serves every problem SEMANTICS.md describes, with plain torch ops
(``frost.engines.unfused_math``), packed (THD) inputs one sequence at a time.

``torch-cudnn`` is torch's cuDNN attention (``aten._scaled_dot_product_cudnn_attention`` and its
backward), for the problems it computes exactly as the contract says: dense BSHD without
padding, bias, sinks, RoPE or windows, full or top-left causal (torch's ``is_causal``), MHA, GQA
and MQA (K and V passed with their own head count, as ``enable_gqa`` does), head dims 64 and
128 (those measured), Dqk == Dv, fp16 / bf16; its backward takes the given o and lse (natural
log, as cuDNN's softmax statistics) and is not deterministic, so ``deterministic=True`` stays with
frost. What torch itself would refuse (``torch.backends.cuda.can_use_cudnn_attention``) is
declined when the plan is made. It is ranked first (``Engine.ranks_first``) only on the device
families of ``CUDNN_FASTER_ON``, where it measured faster than frost's SM80 kernels; elsewhere it
sits last in the tables, serving only when forced (``engine="torch-cudnn"``). Benchmarks of
frost's kernels run in ``frost.dispatch.table_order()``.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from frost import devices
from frost.engines import unfused_math
from frost.engines.base import Capabilities, Declined, Engine, Plan, allocate_backward, allocate_forward
from frost.problem import FEATURES, Grads, Problem, Tensors

_IO_DTYPES = frozenset({torch.float16, torch.bfloat16})
_NEG_INF = float("-inf")

TORCH_SDPA_CAPABILITIES = Capabilities(
    dtypes=_IO_DTYPES,
    layouts=frozenset({"bshd"}),
    features=frozenset({"gqa", "mqa", "causal", "bottom_right", "bias", "strided"}),
    device_types=frozenset({"cpu", "cuda"}),
)
TORCH_SDPA_BACKWARD_CAPABILITIES = dataclasses.replace(
    TORCH_SDPA_CAPABILITIES,
    features=TORCH_SDPA_CAPABILITIES.features - {"bias"},
    device_types=frozenset({"cpu"}),
)

UNFUSED_CAPABILITIES = Capabilities(
    dtypes=_IO_DTYPES,
    layouts=frozenset({"bshd", "thd"}),
    features=frozenset(FEATURES),
)

# The CUDA efficient kernel reads an attention bias whose rows start on 16 bytes.
_CUDA_BIAS_ALIGN = 8


# The largest float32; a scale whose products exceed it overflows torch's fp32 logits.
_F32_MAX = torch.finfo(torch.float32).max
_LOG2_E = 1.4426950408889634


def _torch_sdpa_decline(problem: Problem) -> str | None:
    """What torch's kernels cannot do faithfully beyond the Capabilities row."""
    # torch's kernels compute fp32 logits with no overflow guard: once a logit is +inf the
    # softmax forms inf - inf = NaN. Unit-magnitude q and k give logits up to head_dim, and
    # fused kernels fold log2(e) into the scale, so that product must stay finite.
    if abs(problem.scale) * problem.head_dim_qk * _LOG2_E > _F32_MAX:
        return f"scale={problem.scale:g} overflows float32 logits (scale * head_dim * log2(e) > {_F32_MAX:.3g})"
    if problem.seqlen_q == 0 or problem.seqlen_k == 0:
        return "empty sequences (Sq or Sk is 0)"
    if problem.causal_align == "bottom_right" and problem.seqlen_q > problem.seqlen_k:
        return "bottom-right alignment with Sq > Sk leaves query rows without keys"
    if problem.device_type == "cuda":
        if problem.head_dim_qk % 8 or problem.head_dim_v % 8:
            return "torch's CUDA efficient kernel needs head dims that are multiples of 8"
        if problem.bias is not None and problem.bias.dtype != problem.dtype:
            return "torch's CUDA efficient kernel takes the bias only in the io dtype (a float32 bias would be rounded)"
    return None


class TorchSdpaForward(Engine):
    name = "torch-sdpa"
    direction = "forward"
    native = True
    capabilities = TORCH_SDPA_CAPABILITIES

    def check_support(self, problem: Problem) -> str | None:
        return super().check_support(problem) or _torch_sdpa_decline(problem)

    def compile(self, problem: Problem) -> Plan:
        return _TorchSdpaForwardPlan(problem)


class TorchSdpaBackward(Engine):
    name = "torch-sdpa"
    direction = "backward"
    native = True
    capabilities = TORCH_SDPA_BACKWARD_CAPABILITIES

    def check_support(self, problem: Problem) -> str | None:
        return super().check_support(problem) or _torch_sdpa_decline(problem)

    def compile(self, problem: Problem) -> Plan:
        return _TorchSdpaBackwardPlan(problem)


class UnfusedForward(Engine):
    name = "unfused"
    direction = "forward"
    native = True
    capabilities = UNFUSED_CAPABILITIES

    def compile(self, problem: Problem) -> Plan:
        return _UnfusedForwardPlan(problem)


class UnfusedBackward(Engine):
    name = "unfused"
    direction = "backward"
    native = True
    capabilities = UNFUSED_CAPABILITIES

    def compile(self, problem: Problem) -> Plan:
        return _UnfusedBackwardPlan(problem)


# torch-cudnn -----------------------------------------------------------------------

# Device families (compute capability major) -> head dims where torch's cuDNN attention measured
# faster than frost's SM80 kernels on the problems torch-cudnn serves, with the measurement that
# decided it. ``benchmarks/train_step.py`` (frost-kernels against sdpa-cudnn) and
# ``benchmarks/bench_sdpa.py`` (its last table) measure it on the device at hand; on SM8x frost's
# kernels are the fast path (torch itself picks FlashAttention-2 there). d64 stays with frost's
# kernels on SM90: in the same train_step run they trained 4.7% faster than cuDNN (4 layers,
# 16/4 heads, 4 x 2048 tokens: 332.5k against 317.5k tokens/s).
CUDNN_FASTER_ON = {
    9: {128: "torch's cuDNN attention trained 2.0-4.9% faster than frost's sm80 kernels on SM90 (H100, torch 2.11, "
             "benchmarks/train_step.py --modes eager, bf16, d128: 2 layers of 32/8, 28/4 and 16/1 heads)"},
}
CUDNN_HEAD_DIMS = (64, 128)  # the head dims torch-cudnn serves (those measured against frost's kernels)

TORCH_CUDNN_CAPABILITIES = Capabilities(
    dtypes=_IO_DTYPES,
    layouts=frozenset({"bshd"}),
    features=frozenset({"gqa", "mqa", "causal", "strided"}),
    device_types=frozenset({"cuda"}),
    head_dim_multiple=8,
    max_head_dim=max(CUDNN_HEAD_DIMS),
    deterministic=False,  # cuDNN's backward sums dQ with atomics
)


def compute_capability(device: str) -> tuple[int, int] | None:
    """The compute capability the plans for a CUDA device (``"cuda:0"``) are made for (its
    ``frost.devices`` profile: a forced profile's), None for other devices: the key of the
    per-device-family tables."""
    if not device.startswith("cuda"):
        return None
    return devices.profile_for(device).compute_capability


class _TorchCudnnEngine(Engine):
    """What both directions of torch-cudnn share: the support rules and the family ranking."""

    name = "torch-cudnn"
    native = True
    capabilities = TORCH_CUDNN_CAPABILITIES
    plan_type: type[Plan]

    def check_support(self, problem: Problem) -> str | None:
        reason = super().check_support(problem) or _torch_sdpa_decline(problem)
        if reason is None and (problem.head_dim_qk not in CUDNN_HEAD_DIMS or problem.head_dim_v != problem.head_dim_qk):
            reason = f"head dims {problem.head_dim_qk}/{problem.head_dim_v}: only d64 and d128 (Dqk == Dv) are measured"
        if reason is None and not problem.vector_aligned:
            reason = "cuDNN reads rows on 16-byte boundaries: an input's pointer or strides are not aligned"
        return reason

    def ranks_first(self, problem: Problem) -> str | None:
        capability = compute_capability(problem.device)
        return None if capability is None else CUDNN_FASTER_ON.get(capability[0], {}).get(problem.head_dim_qk)

    def compile(self, problem: Problem) -> Plan:
        reason = self._refused_by_torch(problem)
        if reason is not None:
            raise Declined(reason)
        return self.plan_type(problem)

    def _refused_by_torch(self, problem: Problem) -> str | None:
        """Why torch's own checks would not run cuDNN here (None: they would), on small tensors of
        the problem's heads, head dims, dtype and device."""
        seqlen_q, seqlen_k = min(problem.seqlen_q, 64), min(problem.seqlen_k, 64)
        q = torch.empty(1, problem.heads_q, seqlen_q, problem.head_dim_qk, dtype=problem.dtype, device=problem.device)
        k = torch.empty(1, problem.heads_kv, seqlen_k, problem.head_dim_qk, dtype=problem.dtype, device=problem.device)
        v = torch.empty(1, problem.heads_kv, seqlen_k, problem.head_dim_v, dtype=problem.dtype, device=problem.device)
        params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, problem.causal, problem.group_size > 1)
        if not torch.backends.cuda.can_use_cudnn_attention(params, False):
            return "torch's cuDNN attention refuses this problem (torch.backends.cuda.can_use_cudnn_attention)"
        return None


class _TorchCudnnForwardPlan(Plan):
    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        problem = self.problem
        q, k, v = (x.transpose(1, 2) for x in (tensors.q, tensors.k, tensors.v))
        o_bhsd, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, problem.causal, False, scale=problem.scale
        )[:2]
        lse = lse.view(problem.lse_shape)  # cuDNN's softmax statistics: [B, H, Sq, 1]
        if out is None:
            return o_bhsd.transpose(1, 2), lse
        o, lse_out = out
        o.copy_(o_bhsd.transpose(1, 2))
        lse_out.copy_(lse)
        return o, lse_out


class _TorchCudnnBackwardPlan(Plan):
    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        problem = self.problem
        q, k, v, o, do = (x.transpose(1, 2) for x in (tensors.q, tensors.k, tensors.v, tensors.o, tensors.do))
        lse = tensors.lse.unsqueeze(-1)
        seed = torch.zeros((), dtype=torch.int64, device=q.device)  # dropout's seed and offset: no dropout
        # no bias (None), no packed sequences (None, None)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, o, lse, seed, seed, None, None, None, problem.seqlen_q, problem.seqlen_k, 0.0,
            problem.causal, scale=problem.scale,
        )  # fmt: skip
        grads = out if out is not None else Grads(dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2))
        if out is not None:
            for given, computed in zip(out, (dq, dk, dv)):
                given.copy_(computed.transpose(1, 2))
        return grads


class TorchCudnnForward(_TorchCudnnEngine):
    direction = "forward"
    plan_type = _TorchCudnnForwardPlan


class TorchCudnnBackward(_TorchCudnnEngine):
    direction = "backward"
    plan_type = _TorchCudnnBackwardPlan


# torch-sdpa ------------------------------------------------------------------------


def _additive_mask(problem: Problem, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Bias plus any causal mask that ``is_causal`` (top-left only, no mask) cannot carry.

    Shape ``[B|1, Hq|1, Sq, Sk]``; None when neither is needed. A scale <= 0 always takes
    the mask: torch's ``is_causal`` path fills masked logits with -inf before it scales
    them, so a negative scale turns them into +inf and a zero one into NaN (o mostly NaN,
    lse +inf on CPU); an additive mask joins after the scale.
    """
    needs_mask = problem.causal_align == "bottom_right" or bias is not None or problem.scale <= 0
    causal_mask = problem.causal and needs_mask
    if bias is None and not causal_mask:
        return None
    mask = None if bias is None else bias.to(dtype)
    if causal_mask:
        sq, sk = problem.seqlen_q, problem.seqlen_k
        delta = sk - sq if problem.causal_align == "bottom_right" else 0
        causal = torch.full((sq, sk), _NEG_INF, dtype=dtype, device=problem.device).triu(delta + 1)
        causal = causal.view(1, 1, sq, sk)
        mask = causal if mask is None else mask + causal
    return mask


def _without_dead_rows(mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(mask with all-(-inf) rows zeroed, those rows as bool [B|1, Hq|1, Sq, 1])``."""
    if mask is None:
        return None, None
    dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
    return mask.masked_fill(dead, 0.0), dead


def _is_causal(problem: Problem, mask: torch.Tensor | None) -> bool:
    return problem.causal and mask is None


def _repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """BHSD kv heads repeated for each query head of their group (the aten kernels need equal heads)."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def _cuda_mask(mask: torch.Tensor, problem: Problem) -> torch.Tensor:
    """The mask in a row-aligned buffer, expanded to ``[B, Hq, Sq, Sk]``, for the efficient kernel."""
    sk = mask.shape[-1]
    padded = mask.new_empty((*mask.shape[:-1], -(-sk // _CUDA_BIAS_ALIGN) * _CUDA_BIAS_ALIGN))
    aligned = padded[..., :sk]
    aligned.copy_(mask)
    return aligned.expand(problem.batch, problem.heads_q, problem.seqlen_q, sk)


class _TorchSdpaForwardPlan(Plan):
    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        problem = self.problem
        cpu = problem.device_type == "cpu"
        mask_dtype = torch.float32 if cpu else problem.dtype
        mask, dead = _without_dead_rows(_additive_mask(problem, tensors.bias, mask_dtype))
        q = tensors.q.transpose(1, 2)
        k = _repeat_kv(tensors.k.transpose(1, 2), problem.group_size)
        v = _repeat_kv(tensors.v.transpose(1, 2), problem.group_size)
        causal = _is_causal(problem, mask)
        if cpu:
            direct = problem.dtype == torch.bfloat16 and CPU_NATIVE_BF16
            o_bhsd, lse_bhs = _dead_rows_cleared(*_cpu_flash(q, k, v, mask, causal, problem.scale,
                                                             upcast=not direct), dead)  # fmt: skip
            if direct:
                lse_bhs = _exact_lse_rows(lse_bhs, q, k, mask, causal, problem.scale)
            if lse_bhs is None:  # too many rows to recompute one by one: the float32 kernel whole
                o_bhsd, lse_bhs = _dead_rows_cleared(*_cpu_flash(q, k, v, mask, causal, problem.scale,
                                                                 upcast=True), dead)  # fmt: skip
        else:
            attn_bias = None if mask is None else _cuda_mask(mask, problem)
            o_bhsd, lse_bhs = torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, attn_bias, True, 0.0, causal, scale=problem.scale
            )[:2]
            o_bhsd, lse_bhs = _dead_rows_cleared(o_bhsd, lse_bhs[..., : problem.seqlen_q], dead)
        if out is None:  # dense only, and o and lse are written whole: no zero fill to define
            return o_bhsd.transpose(1, 2).to(problem.dtype).contiguous(), lse_bhs.contiguous()
        o, lse = out
        o.copy_(o_bhsd.transpose(1, 2))
        lse.copy_(lse_bhs)
        return o, lse


def _dead_rows_cleared(o: torch.Tensor, lse: torch.Tensor, dead: torch.Tensor | None):
    """``(o, lse)`` with the rows ``_without_dead_rows`` found set to 0 and -inf."""
    if dead is None:
        return o, lse
    return o.masked_fill(dead, 0.0), lse.masked_fill(dead.squeeze(-1), _NEG_INF)


def _cpu_flash(q, k, v, mask, causal: bool, scale: float, *, upcast: bool):
    """torch's CPU flash kernel on BHSD views: ``(o, lse)``, on float32 copies with ``upcast``."""
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, 0.0, causal, attn_mask=mask, scale=scale
    )[:2]


def _native_bf16() -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX512-BF16 or AMX tiles)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private torch.cpu helpers
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


# The bf16 forward's route (``_TorchSdpaForwardPlan``); tests set it to run either route on any host.
CPU_NATIVE_BF16 = _native_bf16()
# torch's bf16 CPU kernel sums exp(s - max) from a fast vector exponential whose relative error
# reaches ~1e-4 (measured: 9.5e-5; 5.3e-5 at 0, so a row that sees one key gets lse 5.3e-5 low),
# where float32's would be ~1e-7. Its lse rows are then within 1e-4 of the truth, which the rule's
# floor (two bf16 units of lse) covers from |lse| >= 2^-6 on: rows below 2^-5 are recomputed.
# Where every |lse| is below 1, a bf16 unit of the largest is under 2^-7, and an error of 1e-4 on
# every row would weigh in rule 2 against a baseline that may be exact there: all rows are.
_LSE_EXACT_BELOW = 2.0 ** -5
_LSE_EXACT_ALL_BELOW = 1.0
# Above this many gathered key elements (rows x the keys they may see x head dim) the float32 kernel
# reruns whole.
_EXACT_ROWS_GATHER = 1 << 22


def _exact_lse_rows(lse, q, k, mask, causal: bool, scale: float):
    """``lse`` with the rows named above recomputed in float32 from the bf16 inputs; None where
    they are too many to gather (the caller reruns the float32 kernel)."""
    magnitude = lse.abs()  # rows without keys hold -inf: never recomputed
    smallest, largest = (float(x) for x in magnitude.aminmax())
    if math.isinf(largest):
        largest = float(magnitude.where(torch.isfinite(magnitude), 0.0).max())
    if largest < _LSE_EXACT_ALL_BELOW:
        rows = torch.isfinite(magnitude)
    elif smallest < _LSE_EXACT_BELOW:
        rows = magnitude < _LSE_EXACT_BELOW
    else:
        return lse
    b, h, i = rows.nonzero(as_tuple=True)
    if b.numel() == 0:
        return lse
    seqlen_k, dim = k.shape[-2:]
    # torch's is_causal is top-left: row i sees keys 0..i, so the rows near 0 (most of those
    # recomputed) need only the first keys
    width = min(seqlen_k, int(i.max()) + 1) if causal and mask is None else seqlen_k
    if b.numel() * width * dim > _EXACT_ROWS_GATHER:
        return None
    # q and k [B, H, S, D] views; one row of logits per recomputed (b, h, i): [rows, width]
    logits = torch.bmm(k[b, h, :width].float(), q[b, h, i].float().unsqueeze(-1)).squeeze(-1) * scale
    if mask is not None:
        logits = logits + mask.expand(*lse.shape, seqlen_k)[b, h, i]
    elif causal:
        keys = torch.arange(width, device=lse.device)
        logits = logits.masked_fill(keys > i.unsqueeze(-1), _NEG_INF)
    lse = lse.clone()
    lse[b, h, i] = torch.logsumexp(logits, dim=-1)
    return lse


class _TorchSdpaBackwardPlan(Plan):
    """CPU only, no bias: the mask (bottom-right causal) never empties a row."""

    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        problem = self.problem
        # dense, no bias, no sinks: dq, dk and dv are copied whole
        grads = out if out is not None else allocate_backward(problem, tensors, zero=False)
        group = problem.group_size
        mask = _additive_mask(problem, None, torch.float32)
        f32 = torch.float32  # as in the forward: float32 copies, what torch's CPU math backend computes in
        q = tensors.q.transpose(1, 2).to(f32)
        k = _repeat_kv(tensors.k.transpose(1, 2), group).to(f32)
        v = _repeat_kv(tensors.v.transpose(1, 2), group).to(f32)
        causal = _is_causal(problem, mask)
        # o and lse from the kernel's own float32 forward instead of the given ones. The kernel
        # takes D = rowsum(do * o), and the given o is rounded to the io dtype: D passes that
        # rounding to every dS of its row, and in a peaked row, where dP - D is small, it is
        # most of the result (measured: dq 1.5 to 5.6 times over the rule on small bf16/fp16
        # problems, 10 of 3000 drawn). The lse that comes with it normalizes the same logits.
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, causal, attn_mask=mask, scale=problem.scale
        )[:2]
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            tensors.do.transpose(1, 2).to(f32), q, k, v, o, lse, 0.0, causal, attn_mask=mask, scale=problem.scale,
        )  # fmt: skip
        grads.dq.copy_(dq.transpose(1, 2))
        grads.dk.copy_(_sum_groups(dk, group).transpose(1, 2))
        grads.dv.copy_(_sum_groups(dv, group).transpose(1, 2))
        return grads


def _sum_groups(x: torch.Tensor, group: int) -> torch.Tensor:
    """BHSD per-query-head gradients summed into their kv heads (fp32 sum, io dtype result)."""
    if group == 1:
        return x
    batch, heads, seqlen, dim = x.shape
    return x.view(batch, heads // group, group, seqlen, dim).sum(dim=2, dtype=torch.float32).to(x.dtype)


# unfused ---------------------------------------------------------------------------


def _blocks(problem: Problem, tensors: Tensors):
    """``(rows_q, rows_k, bias_index, Block)``: the whole dense call (rows None), or one
    per packed sequence, with the bias batch entry it reads."""
    t = tensors
    if problem.layout == "bshd":
        yield None, None, None, unfused_math.Block(
            t.q, t.k, t.v, t.seqlens_q, t.seqlens_k, t.bias, t.sinks, t.rope_cos, t.rope_sin
        )
        return
    cu_q = t.cu_seqlens_q.tolist()
    cu_k = t.cu_seqlens_k.tolist()
    for b in range(problem.batch):
        rows_q, rows_k = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        bias_index, bias = None, None
        if t.bias is not None:
            bias_index = b if t.bias.shape[0] > 1 else 0
            extent_q, extent_k = rows_q.stop - rows_q.start, rows_k.stop - rows_k.start
            bias = t.bias[bias_index : bias_index + 1, :, :extent_q, :extent_k]
        yield rows_q, rows_k, bias_index, unfused_math.Block(
            t.q[rows_q][None], t.k[rows_k][None], t.v[rows_k][None], None, None,
            bias, t.sinks, t.rope_cos, t.rope_sin,
        )  # fmt: skip


class _UnfusedForwardPlan(Plan):
    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        problem = self.problem
        # packed rows past cu_seqlens_q[-1] are never written and must read as zeros
        o, lse = out if out is not None else allocate_forward(problem, zero=problem.layout == "thd", q=tensors.q)
        for rows_q, _, _, block in _blocks(problem, tensors):
            o_block, lse_block = unfused_math.forward(problem, block)
            if rows_q is None:
                o.copy_(o_block)
                lse.copy_(lse_block)
            else:
                o[rows_q] = o_block[0]
                lse[:, rows_q] = lse_block[0]
        return o, lse


class _UnfusedBackwardPlan(Plan):
    def execute(self, tensors: Tensors, *, out=None, workspace=None):
        problem = self.problem
        t = tensors
        # packed rows past cu_seqlens[-1] are never written and must read as zeros; dbias
        # and dsinks are copied whole from their accumulators
        grads = out if out is not None else allocate_backward(problem, t, zero=problem.layout == "thd")
        # dbias and dsinks sum over sequences: accumulate in fp32, cast once.
        dbias = None if grads.dbias is None else torch.zeros(t.bias.shape, dtype=torch.float32, device=t.bias.device)
        dsinks = None if t.sinks is None else torch.zeros_like(t.sinks)
        for rows_q, rows_k, bias_index, block in _blocks(problem, t):
            if rows_q is None:
                g = unfused_math.backward(problem, block, t.do)
                grads.dq.copy_(g.dq)
                grads.dk.copy_(g.dk)
                grads.dv.copy_(g.dv)
                if dbias is not None:
                    dbias += g.dbias
            else:
                g = unfused_math.backward(problem, block, t.do[rows_q][None])
                grads.dq[rows_q] = g.dq[0]
                grads.dk[rows_k] = g.dk[0]
                grads.dv[rows_k] = g.dv[0]
                if dbias is not None:
                    extent_q, extent_k = g.dbias.shape[2:]
                    dbias[bias_index : bias_index + 1, :, :extent_q, :extent_k] += g.dbias
            if dsinks is not None:
                dsinks += g.dsinks
        if dbias is not None:
            grads.dbias.copy_(dbias)
        if dsinks is not None:
            grads.dsinks.copy_(dsinks)
        return grads
