"""Online softmax over key blocks, and its finalization with sinks and empty rows.

State per query row this thread holds: ``row_max`` (largest raw score seen,
-inf while none) and ``row_sum`` (this thread's partial sum of
exp2((s - row_max) * scale_log2); the quad's four partials are combined only
in ``finalize``, once). Scores stay unscaled in the accumulator; the scale
folds into the exp2 argument as one FFMA. That fold is only order-preserving
for a positive scale, which the engine requires.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

from frost.kernels.sm80 import tiles

LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453


@dataclass(frozen=True)
class OnlineSoftmax:
    scale_log2: Float32
    row_max: cute.Tensor
    row_sum: cute.Tensor

    @staticmethod
    def create(scale_log2: Float32, num_rows: int) -> "OnlineSoftmax":
        row_max = cute.make_rmem_tensor(num_rows, Float32)
        row_sum = cute.make_rmem_tensor(num_rows, Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        return OnlineSoftmax(scale_log2, row_max, row_sum)

    @cute.jit
    def step(self, acc_S: cute.Tensor, acc_O: cute.Tensor):
        """Turn a score block into unnormalized probabilities in place; rescale acc_O."""
        acc_S_mn = tiles.acc_mn_view(acc_S)
        acc_O_mn = tiles.acc_mn_view(acc_O)
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            scores = acc_S_mn[r, None].load()
            block_max = tiles.quad_allreduce(
                scores.reduce(cute.ReductionOp.MAX, -Float32.inf, 0), tiles.fmax
            )
            prev_max = self.row_max[r]
            new_max = cute.arch.fmax(prev_max, block_max)
            self.row_max[r] = new_max
            # a row with nothing visible yet keeps max -inf; subtract 0 so exp2 gives 0, not NaN
            safe_max = 0.0 if new_max == -Float32.inf else new_max
            max_scaled = safe_max * self.scale_log2
            probs = cute.math.exp2(scores * self.scale_log2 - max_scaled, fastmath=True)
            rescale = cute.math.exp2(prev_max * self.scale_log2 - max_scaled, fastmath=True)
            self.row_sum[r] = self.row_sum[r] * rescale + probs.reduce(cute.ReductionOp.ADD, Float32.zero, 0)
            acc_S_mn[r, None].store(probs)
            acc_O_mn[r, None].store(acc_O_mn[r, None].load() * rescale)

    @cute.jit
    def finalize(self, o_scale: cute.Tensor, lse: cute.Tensor, sink, has_sink: cutlass.Constexpr[bool]):
        """Per row: the factor that normalizes acc_O, and the natural-log lse.

        With a sink, Z = exp(sink) + sum exp(s): a row with no visible key gets
        o = 0 and lse = sink. Without one such a row gets o = 0, lse = -inf.
        """
        for r in cutlass.range_constexpr(cute.size(self.row_max)):
            total = tiles.quad_allreduce(self.row_sum[r], tiles.fadd)
            max_log2 = self.row_max[r] * self.scale_log2
            if const_expr(has_sink):
                sink_log2 = sink * LOG2_E
                top = cute.arch.fmax(max_log2, sink_log2)
                keys_weight = cute.math.exp2(max_log2 - top, fastmath=True)
                denom = total * keys_weight + cute.math.exp2(sink_log2 - top, fastmath=True)
                o_scale[r] = keys_weight / denom
                lse[r] = (top + cute.math.log2(denom, fastmath=True)) * LN_2
            else:
                empty = total == 0.0
                o_scale[r] = 0.0 if empty else cute.arch.rcp_approx(total)
                lse[r] = -Float32.inf if empty else (max_log2 + cute.math.log2(total, fastmath=True)) * LN_2
