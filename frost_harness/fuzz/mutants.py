"""The catalogue of ``frost-mutate``: realistic one-line faults in the SM80 kernel templates.

Each ``Mutant`` replaces one exact piece of text (``find``, which must occur exactly once in
its file) by a faulty one. They are the bugs a kernel author really writes: mask and
block-range off-by-ones on either side, a wrong bottom-right offset, a wrong GQA head map, a
missing or doubled scale, a dropped or mis-signed sink term, wrong packed (THD) offsets or
lengths, wrong lse / D rows, a wrong predicate on a partial head dim, a missing barrier or
cp.async wait (a race), an accumulator never zeroed, a wrong dQ accumulator layout or slice;
and in the newer kernels, a split group's partials combined short, a bias in the wrong units
or read past its broadcast extent, dbias written past the sequence, a RoPE rotation with the
wrong sign forward or back.

``equivalent`` holds the written argument when a mutant cannot change any output the
contract defines (it is then left out of the score, not counted as a survivor).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

K = "frost/kernels/sm80/"

# The tests most likely to kill a mutant, as a pytest -k expression over the GPU suites' test ids:
# per mutant (``FOCUS``, a handful of tests, so that a kill costs only their few compiles: every
# mutant changes template sources, so nothing it runs is in the disk cache), else per fault family
# (``FIRST_TESTS``). They run first, in one process; a mutant they miss then runs the whole
# selection, so a focus can speed a kill up but never decide a survivor.
FIRST_TESTS = {
    "mask": "causal or window or bottom or br or edges",
    "block range": "causal or window or bottom or br or edges",
    "gqa": "gqa or mqa or split",
    "scale": "test_fwd_sm80_matches_oracle or test_bwd_sm80_matches_oracle",
    "sinks": "sinks",
    "thd": "thd or packed",
    "lse/D": "test_fwd_sm80_matches_oracle or test_bwd_sm80_matches_oracle",
    "partial head dim": "every_dtype_and_flavor or hdim",
    "head dim": "every_dtype_and_flavor or hdim",
    "race": "test_fwd_sm80_matches_oracle or test_bwd_sm80_matches_oracle or bitwise or racecheck",
    "zeroing": "test_fwd_sm80_matches_oracle or test_bwd_sm80_matches_oracle",
    "dq accumulator": "other_dq_reduce_width or deterministic",
    "bias": "bias",
    "rope": "rope",
}

_FWD, _BWD = "test_fwd_sm80_matches_oracle and ", "test_bwd_sm80_matches_oracle and "
_EDGES = "(edge_window or edge_br or causal-torch)"
FOCUS = {
    "mask-right-edge": _FWD + "causal-torch",
    "mask-left-edge": _FWD + "window_left",
    "mask-seqlen-k": _FWD + "(padding-torch or edge_lengths)",
    "mask-rows": _BWD + "(padding-torch or edge_lengths)",
    "bottom-right-offset": _FWD + "(causal_br_sq_gt_sk or causal_br_sq_lt_sk)",
    "n-range-right": _FWD + _EDGES,
    "n-range-left": _FWD + "(edge_window or window_left or window_both)",
    "m-range-right": _BWD + _EDGES,
    "m-range-left": _BWD + "(edge_window or window_left or window_both)",
    "needs-mask-right": _FWD + "(edge_right_m2 or edge_window or edge_br)",
    "needs-mask-left": _FWD + "(edge_left_m2 or edge_window or window_left)",
    "needs-mask-seqlen": _FWD + "(edge_seqlen_dense or edge_lengths or padding-torch)",
    "fwd-gqa-map": _FWD + "(gqa-torch or thd_causal_gqa)",
    "bwd-gqa-map": _BWD + "(gqa-torch or thd_causal_gqa)",
    "bwd-dq-gqa-map": "test_bwd_sm80_recompute_deterministic_matches_oracle and gqa",
    "dk-scale-missing": _BWD + "dense",
    "dq-convert-scale-missing": _BWD + "dense",
    "dq-det-scale-doubled": "test_bwd_sm80_recompute_deterministic_matches_oracle and (gqa or window_left)",
    "fwd-scale-log2": _FWD + "dense",
    "sink-dropped": _FWD + "(sinks-torch or large_logits_sinks)",
    "dsink-sign": _BWD + "(sinks-torch or large_logits_sinks) and not window_zero_sinks",  # that one: a strict xfail once
    "thd-seqlen-k": _FWD + "(thd_causal_gqa or thd_br_window_sinks or edge_thd)",
    "thd-lse-offset": _BWD + "(thd_causal_gqa or thd_br_window_sinks or edge_thd)",
    "thd-accum-slab": _BWD + "(thd-torch or edge_thd or thd_causal_gqa)",
    "lse2-no-log2e": _BWD + "dense",
    "row-stats-edge": _BWD + "(padding-torch or edge_lengths or edge_thd or padding_causal_br)",
    "d-padded-rows": _BWD + "(padding-torch or edge_lengths or padding_causal_br)",
    "hdim-predicate": _FWD + "(causal_br_sq_lt_sk or edge_window_129 or edge_lengths)",
    "store-rows-edge": _FWD + "(edge_lengths or padding-torch or edge_thd or single_row)",
    "bwd-pds-barrier": "test_bwd_sm80_deterministic_is_bitwise_stable_over_20_runs or " + _BWD + "dense",
    "fwd-v-wait": _FWD + "(dense or causal-torch or window_right)",
    # the refill may overwrite sK under a lagging warp's read, but in three GPU runs the numerical
    # tests reached no verdict on it in 190-265 s: racecheck sees the missing synchronisation itself
    "bwd-dq-k-barrier": "racecheck or test_bwd_sm80_recompute_deterministic_matches_oracle and (causal or gqa)",
    "accum-zero-last-block": _BWD + "(dense or thd-torch or edge_thd)",
    "fwd-acc-o-unzeroed": _FWD + "dense",
    "dp-unzeroed": _BWD + "dense",
    "dq-layout-width": "test_bwd_sm80_other_dq_reduce_width_matches_oracle and (dense or causal-torch)",
    "dq-slice-skip-edge": "test_bwd_sm80_sliced_dq_matches_oracle_and_is_bitwise_stable and "
                          "(causal_k_longer or gqa_split_window_br) and device_width",
    "combine-last-split": "test_bwd_sm80_split_group_matches_oracle and (gqa_dense or mqa_window)",
    "combine-rows-per-pass": "test_hdim_bwd_matches_oracle and (d192x128 or d168)",
    "combine-head-dim-guard": "test_hdim_bwd_matches_oracle and (d168 or d160x96)",
    "bias-units": "test_fwd_sm80_bias_matches_oracle and (bias_BH-torch or bias_1H_causal)",
    "bias-broadcast-heads": "test_fwd_sm80_bias_matches_oracle and (bias_1H_causal or bias_11_gqa)",
    # one key past the sequence is a padded key (dS = 0 there: harmless) unless the sequence
    # fills the bias: then it is the next row's first key, or past the end into the guard
    # (bias_BH: 300 keys, not a tile multiple, dbias stored, not added)
    "dbias-cols": "test_bwd_sm80_bias_matches_oracle and bias_BH-torch and default",
    "rope-inverse-sign": "test_rope_sm80_backward_matches_oracle",
    "rope-second-half": "test_rope_pass_alone_matches_the_rotation",
}


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    category: str
    path: str          # relative to the repository root
    find: str          # exact text, exactly once in the file
    replace: str
    why: str           # what a user would see
    equivalent: str | None = None

    @property
    def first_tests(self) -> str:
        """The -k expression of the tests run first against this mutant (``FOCUS``, else ``FIRST_TESTS``)."""
        return FOCUS.get(self.name, FIRST_TESTS[self.category])

    def apply(self, root: Path) -> None:
        """Write the faulty file under ``root`` (a copy of the repository, never the checkout)."""
        target = Path(root) / self.path
        text = target.read_text()
        if text.count(self.find) != 1:
            raise ValueError(f"mutant {self.name}: its text occurs {text.count(self.find)} times in {self.path}")
        target.write_text(text.replace(self.find, self.replace))


def _m(name, category, path, find, replace, why, equivalent=None) -> Mutant:
    return Mutant(name, category, K + path, find, replace, why, equivalent)


CATALOGUE: tuple[Mutant, ...] = (
    # ---- element mask (mask.py: AttentionMask.apply) ---------------------------------------
    _m("mask-right-edge", "mask", "mask.py",
       "row + self.delta + self.window_right + 1 - col_base)",
       "row + self.delta + self.window_right - col_base)",
       "causal rows lose their diagonal key"),
    _m("mask-left-edge", "mask", "mask.py",
       "col_lo = row + self.delta - self.window_left - col_base",
       "col_lo = row + self.delta - self.window_left + 1 - col_base",
       "a left window one key too narrow"),
    _m("mask-seqlen-k", "mask", "mask.py",
       "seqlen_limit = self.seqlen_k - col_base",
       "seqlen_limit = self.seqlen_k + 1 - col_base",
       "the first padded key becomes visible"),
    _m("mask-rows", "mask", "mask.py",
       "if row >= self.seqlen_q:",
       "if row > self.seqlen_q:",
       "the first padded query row feeds dK and dV",
       equivalent=("row Sq has its Q and dO tiles zero-filled (bwd.py QdoLoads: load_rows stops at seqlen_q), "
                   "bwd_pre writes lse2 = +inf and D = 0 for rows past the sequence and the bias is read only "
                   "in the valid region, so the unmasked row has p = exp2(0 - inf) = 0 and dp = D = 0: it adds "
                   "exact zeros to dK, dV and the dQ accumulator (the H200 run of 2026-12-03: no test killed "
                   "it within 470 s)")),
    _m("bottom-right-offset", "mask", "mask.py",
       "delta = seqlen.seqlen_k - seqlen.seqlen_q if",
       "delta = seqlen.seqlen_q - seqlen.seqlen_k if",
       "bottom-right alignment mirrored"),
    # ---- block ranges (mask.py: n_block_range, m_block_range, needs_mask) -------------------
    _m("n-range-right", "block range", "mask.py",
       "key_end = cutlass.max(row_last + self.delta + self.window_right + 1, 0)",
       "key_end = cutlass.max(row_last + self.delta + self.window_right, 0)",
       "the forward skips the key block holding a band's last key"),
    _m("n-range-left", "block range", "mask.py",
       "key_start = cutlass.max(row_first + self.delta - self.window_left, 0)",
       "key_start = cutlass.max(row_first + self.delta - self.window_left + 1, 0)",
       "the forward skips the key block holding a left window's first key"),
    _m("m-range-right", "block range", "mask.py",
       "row_start = cutlass.max(key_first - self.delta - self.window_right, 0)",
       "row_start = cutlass.max(key_first - self.delta - self.window_right + 1, 0)",
       "the backward skips the query block that first sees a key block"),
    _m("m-range-left", "block range", "mask.py",
       "row_end = cutlass.max(key_last - self.delta + self.window_left + 1, 0)",
       "row_end = cutlass.max(key_last - self.delta + self.window_left, 0)",
       "the backward skips the query block that last sees a key block"),
    _m("needs-mask-right", "block range", "mask.py",
       "masked = masked or key_last > row_first + self.delta + self.window_right",
       "masked = masked or key_last > row_first + self.delta + self.window_right + 1",
       "a tile crossing the band's right edge by one key takes the unmasked path"),
    _m("needs-mask-left", "block range", "mask.py",
       "masked = masked or key_first < row_last + self.delta - self.window_left",
       "masked = masked or key_first < row_last + self.delta - self.window_left - 1",
       "a tile crossing the left window's edge by one key takes the unmasked path"),
    _m("needs-mask-seqlen", "block range", "mask.py",
       "masked = key_last >= self.seqlen_k",
       "masked = key_last > self.seqlen_k",
       "a tile ending one key past the sequence takes the unmasked path"),
    # ---- GQA head maps ----------------------------------------------------------------------
    _m("fwd-gqa-map", "gqa", "fwd.py",
       "head_kv = head // (heads_of(mQ, PACKED) // heads_of(mK, PACKED))",
       "head_kv = head % heads_of(mK, PACKED)",
       "query heads read the wrong kv head (interleaved instead of grouped)"),
    _m("bwd-gqa-map", "gqa", "bwd.py",
       "first_head = head_kv * group + split * heads_per_cta",
       "first_head = head_kv + split * heads_per_cta",
       "a kv head's CTA walks the wrong query heads"),
    _m("bwd-dq-gqa-map", "gqa", "bwd_dq.py",
       "head_kv = head // (heads_of(mQ, PACKED) // heads_of(mK, PACKED))",
       "head_kv = head % heads_of(mK, PACKED)",
       "deterministic dQ reads the wrong kv head"),
    # ---- scales -----------------------------------------------------------------------------
    _m("dk-scale-missing", "scale", "bwd.py",
       "acc_dK.store(acc_dK.load() * scale)",
       "acc_dK.store(acc_dK.load())",
       "dK off by the softmax scale"),
    _m("dq-convert-scale-missing", "scale", "dq_chunks.py",
       "    acc.store(acc.load() * scale)\n",
       "",
       "dQ off by the softmax scale"),
    _m("dq-det-scale-doubled", "scale", "bwd_dq.py",
       "acc_dQ.store(acc_dQ.load() * scale)",
       "acc_dQ.store(acc_dQ.load() * scale * scale)",
       "deterministic dQ scaled twice"),
    _m("fwd-scale-log2", "scale", "compile.py",
       "             scale * LOG2_E, window_left, window_right, max_seqlen_q)",
       "             scale, window_left, window_right, max_seqlen_q)",
       "the forward's exp2 fold forgets log2(e)"),
    # ---- sinks ------------------------------------------------------------------------------
    _m("sink-dropped", "sinks", "softmax.py",
       "denom = total * keys_weight + cute.math.exp2(sink_log2 - top, fastmath=True)",
       "denom = total * keys_weight",
       "the sink's mass leaves the denominator"),
    _m("dsink-sign", "sinks", "bwd_pre.py",
       "sink_share = sink_share - cute.math.exp(mSinks[head] - lse) * d_row",
       "sink_share = sink_share + cute.math.exp(mSinks[head] - lse) * d_row",
       "dsink with the wrong sign"),
    # ---- packed (THD) offsets and lengths ---------------------------------------------------
    _m("thd-seqlen-k", "thd", "seqlen.py",
       "seqlen_k = lengths.cu_seqlens_k[batch + 1] - offset_k",
       "seqlen_k = lengths.cu_seqlens_k[batch + 1] - offset_q",
       "packed key lengths taken against the query offsets"),
    _m("thd-lse-offset", "thd", "seqlen.py",
       "return cute.domain_offset((self.offset_q,), mLSE[head, None])",
       "return cute.domain_offset((self.offset_k,), mLSE[head, None])",
       "packed lse / D rows read at the key offsets"),
    _m("thd-accum-slab", "thd", "seqlen.py",
       "cute.domain_offset(((self.offset_q + batch * tile_m) * tile_hdim,), mAcc[head, None])",
       "cute.domain_offset((self.offset_q * tile_hdim,), mAcc[head, None])",
       "packed sequences' dQ chunks overlap the next sequence's"),
    # ---- lse and D rows ---------------------------------------------------------------------
    _m("lse2-no-log2e", "lse/D", "bwd_pre.py",
       "gLSE2[row] = Float32.inf if lse == -Float32.inf else lse * LOG2_E",
       "gLSE2[row] = Float32.inf if lse == -Float32.inf else lse",
       "the backward's lse in natural instead of log2 units"),
    _m("row-stats-edge", "lse/D", "recompute.py",
       "        if row < rows_left:\n            row_lse2[r] = gLSE2[row]",
       "        if row <= rows_left:\n            row_lse2[r] = gLSE2[row]",
       "the first padded query row reads another row's lse and D"),
    _m("d-padded-rows", "lse/D", "bwd_pre.py",
       "gD[row] = d_row if valid else Float32(0.0)",
       "gD[row] = d_row",
       "padded rows' D from whatever o and dO held",
       equivalent=("bwd_pre reads o and dO only for rows below seqlen_q, into fragments filled with +0.0 "
                   "first, so a padded row's d_row is a sum of +0.0 * +0.0: the +0.0 the guarded store "
                   "writes, bit for bit (the H200 run of 2026-12-03: no test killed it within 395 s)")),
    # ---- head-dim predicates and row guards -------------------------------------------------
    _m("hdim-predicate", "partial head dim", "tiles.py",
       "pred[v, 0, k] = cute.elem_less(tXcX[(0, v), 0, k][1], limit)",
       "pred[v, 0, k] = cute.elem_less(tXcX[(0, v), 0, k][1], limit + 8)",
       "copies read and write one vector past a partial head dim"),
    _m("store-rows-edge", "partial head dim", "tiles.py",
       "        if tXcX[0, m, 0][0] < written_rows:\n            if const_expr(check_hdim):",
       "        if tXcX[0, m, 0][0] <= written_rows:\n            if const_expr(check_hdim):",
       "stores one row past a tile's last row"),
    # ---- barriers and waits (races) ---------------------------------------------------------
    _m("bwd-pds-barrier", "race", "bwd.py",
       "        cute.arch.barrier()  # P, dS complete in shared memory",
       "        pass  # P, dS complete in shared memory",
       "dV and dK read P and dS before every warp wrote them"),
    _m("fwd-v-wait", "race", "fwd.py",
       "        cute.arch.cp_async_wait_group(0)\n        cute.arch.barrier()  # V[n] landed; every warp is done with sK",
       "        cute.arch.barrier()  # V[n] landed; every warp is done with sK",
       "P.V reads V before its copy landed"),
    _m("bwd-dq-k-barrier", "race", "bwd_dq.py",
       "        cute.arch.barrier()  # sK is free",
       "        pass  # sK is free",
       "the next K overwrites sK while dS.K still reads it"),
    # ---- accumulator zeroing ----------------------------------------------------------------
    _m("accum-zero-last-block", "zeroing", "bwd_pre.py",
       "if m_block * TILE_M < slab_rows:",
       "if (m_block + 1) * TILE_M < slab_rows:",
       "the last block of each dQ slab is never zeroed"),
    _m("fwd-acc-o-unzeroed", "zeroing", "fwd.py",
       "    acc_O.fill(0.0)\n",
       "",
       "O starts from whatever the registers held",
       equivalent=("the first key block's step (softmax.py) scales acc_O by exp2(-inf) = 0 before P.V adds "
                   "to it (scales are positive: sm80 declines scale <= 0), so finite leftovers vanish; only "
                   "NaN or Inf bit patterns left in the registers would show, and the values there are the "
                   "thread's earlier finite operands (the H200 run of 2026-12-03: no kill within 265 s)")),
    _m("dp-unzeroed", "zeroing", "recompute.py",
       "    acc_dP.fill(0.0)\n",
       "",
       "dP starts from whatever the registers held"),
    # ---- the flat dQ accumulator and its slices ---------------------------------------------
    _m("dq-layout-width", "dq accumulator", "seqlen.py",  # the layout bwd and bwd_convert share
       "return chunk.iterator + (j * threads + tidx) * width",
       "return chunk.iterator + (j * threads + tidx)",
       "wide (v4) dQ reductions overlap each other; the scalar width is unaffected"),
    _m("dq-slice-skip-edge", "dq accumulator", "dq_chunks.py",
       "return m_block >= seen_min and m_block < seen_max",
       "return m_block > seen_min and m_block < seen_max",
       "the sliced dQ loses each slice's first reached query block (a causal or right-window slice)"),
    # ---- split GQA groups (bwd_combine.py) ----------------------------------------------------
    _m("combine-last-split", "gqa", "bwd_combine.py",
       "    num_splits = mPart.shape[0]\n",
       "    num_splits = mPart.shape[0] - 1\n",
       "a split group's dk and dv lose the last split's query heads"),
    _m("combine-rows-per-pass", "block range", "bwd_combine.py",
       "for step in cutlass.range_constexpr((ROWS + rows_per_pass - 1) // rows_per_pass):",
       "for step in cutlass.range_constexpr(ROWS // rows_per_pass):",
       "with 192-wide partials the last rows of each block are never written"),
    _m("combine-head-dim-guard", "head dim", "bwd_combine.py",
       "column_vector * VEC < mOut.shape[-1]",
       "column_vector * VEC <= mOut.shape[-1]",
       "a partial head dim writes one vector past its row (into the next head's dk / dv)"),
    # ---- additive bias (bias.py) ---------------------------------------------------------------
    _m("bias-units", "bias", "bias.py",
       "acc_S_mn[r, c] * self.scale_log2 + value * LOG2_E",
       "acc_S_mn[r, c] * self.scale_log2 + value",
       "the bias is added in log2 units as if natural: o and lse off wherever the bias varies"),
    _m("bias-broadcast-heads", "bias", "bias.py",
       "cutlass.min(head, mBias.shape[1] - 1)",
       "cutlass.min(head, mBias.shape[1])",
       "a bias shared by all heads is read past its end for heads >= 1"),
    _m("dbias-cols", "bias", "bias.py",
       "                if row_valid and col < cols_left:",
       "                if row_valid and col <= cols_left:",
       "dbias gets a value one key past the sequence (a padded position that must stay 0)"),
    # ---- RoPE pass (rope.py) ----------------------------------------------------------------------
    _m("rope-inverse-sign", "rope", "rope.py",
       "            sin = -sin\n",
       "            sin = sin\n",
       "dq and dk rotated forward again instead of back"),
    _m("rope-second-half", "rope", "rope.py",
       "rY[None, 1, h].store((x2 * cos + x1 * sin).to(DTYPE))",
       "rY[None, 1, h].store((x2 * cos - x1 * sin).to(DTYPE))",
       "the second half of each rotated row has the wrong sign of sin"),
)


def by_name() -> dict[str, Mutant]:
    return {m.name: m for m in CATALOGUE}
