"""The sliced dQ's fused convert (``BwdParams.dq_fused_convert``): the main kernel's CTA that
writes a query block's last slice sums the slices into dq, so no ``sm80/bwd_convert`` runs.

Without a left window the key blocks of a slice's walk (``sm80/bwd``, "Sliced dQ") ascend and
each sees the query blocks from its ``start`` to the sequence's last (both ends of
``m_block_range`` grow with the key block; a key block that sees no row starts at the end).
So once the pass of key block n is done, its slice is done with blocks [start(n),
start(next)) (next: the walk's next key block; none: the end), and slice s writes block m iff
start(s) <= m: a block expects an arrival from each slice s < min(slices, key blocks) whose
first key block s starts at or below it.

After a pass, each finished (query head, block) gets one ``atom.add.acq_rel.gpu`` on its
counter (zeroed by ``sm80/bwd_pre``), a thread each, after the CTA barrier that follows the
pass's dQ stores: the barrier orders every thread's stores before the atomic, whose release
is cumulative (the ordered dQ's pattern, ``sm80/bwd.pass_turn``). The thread whose atomic
brings the count to the expected arrivals has acquired every other slice's stores; it tells
the CTA through shared memory, and after a barrier the CTA sums the block's slices in slice
order from 0.0 and stores it (``sm80/dq_chunks``: bit for bit ``sm80/bwd_convert``'s dq),
staged through the first Q stage, free between passes. Slice 0's CTA writes zeros into the
blocks no slice writes (before its first key block's start; dense padding past the last
valid row; every block of a sequence without keys), as the convert does for those chunks.
"""
from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from frost.kernels.sm80 import dq_chunks
from frost.kernels.sm80.mask import AttentionMask
from frost.kernels.sm80.seqlen import SeqlenInfo


@dataclass(frozen=True)
class FusedConvert:
    """What the fused convert needs after a pass (built where it is used: nothing of it stays
    live across the main loop but what the pass keeps anyway)."""

    chunks: cutlass.Constexpr[dq_chunks.DqChunks]
    check_hdim: cutlass.Constexpr[bool]
    mdQ: cute.Tensor
    mdQaccum: cute.Tensor
    mdQcounters: cute.Tensor    # int32 (B, H, query blocks)
    sFinished: cute.Tensor      # int32 (threads,): whether thread t's atomic was its block's last
    sdQ: cute.Tensor            # (tile_m, tile_hdim) io dtype: the staging tile
    tiled_mma_dq: cute.TiledMma
    gmem_tiled_copy_store: cute.TiledCopy
    mask: AttentionMask
    seqlen: SeqlenInfo
    tidx: Int32
    batch: Int32
    first_head: Int32
    heads_per_cta: Int32
    heads: Int32                # query heads: the accumulator's slice stride
    num_slices: Int32
    num_key_blocks: Int32
    scale: Float32

    def end(self):
        """One past the last query block with a valid row."""
        return cute.ceil_div(self.mask.seqlen_q, self.chunks.tile_m)

    @cute.jit
    def start(self, n_block):
        """The first query block key block ``n_block`` sees; the end when it sees none (or is past
        the keys)."""
        m_min, m_max = self.mask.m_block_range(n_block)
        first = self.end()
        if n_block < self.num_key_blocks and m_min < m_max:
            first = m_min
        return first

    @cute.jit
    def expected(self, m_block) -> Int32:
        """The slices that write query block ``m_block`` (module docstring)."""
        count = Int32(0)
        for s in cutlass.range(cutlass.min(self.num_slices, self.num_key_blocks), unroll=1):
            if self.start(s) <= m_block:
                count += 1
        return count

    @cute.jit
    def zero_unreached(self):
        """Slice 0's CTA: zeros into the blocks no slice writes, for each of its heads."""
        acc = self.fragment()
        first, end = self.start(Int32(0)), self.end()
        blocks = cute.ceil_div(self.seqlen.rows_q, self.chunks.tile_m)
        for i in cutlass.range(self.heads_per_cta * blocks, unroll=1):
            m_block = i % blocks
            if m_block < first or m_block >= end:
                acc.fill(0.0)
                self.store(acc, self.first_head + i // blocks, m_block)

    @cute.jit
    def pass_done(self, n_block, next_block):
        """After the pass of key block ``n_block`` (and the barrier after it): count this slice's
        arrival at each block it is now done with, and sum and store those it arrived at last.
        ``next_block``: the walk's next key block (past the keys: none)."""
        lo, hi = self.start(n_block), self.start(next_block)
        span = hi - lo
        count = self.heads_per_cta * cutlass.max(span, 0)
        acc = self.fragment()
        for base in cutlass.range(0, count, self.chunks.num_threads, unroll=1):
            cute.arch.barrier()  # the previous group's flags were read
            item = base + self.tidx
            last = Int32(0)
            if item < count:
                m_block = lo + item % span
                counter = self.mdQcounters.iterator + cute.crd2idx(
                    (self.batch, self.first_head + item // span, m_block), self.mdQcounters.layout)
                arrived = cute.arch.atomic_add(counter, Int32(1), sem="acq_rel", scope="gpu") + 1
                if arrived == self.expected(m_block):
                    last = Int32(1)
            self.sFinished[self.tidx] = last
            cute.arch.barrier()
            for k in cutlass.range(cutlass.min(self.chunks.num_threads, count - base), unroll=1):
                if self.sFinished[k] != 0:
                    head, m_block = self.first_head + (base + k) // span, lo + (base + k) % span
                    dq_chunks.sum_slices(self.chunks, acc, self.mdQaccum, self.seqlen, self.mask, self.num_slices,
                                         self.batch, head, self.heads, m_block, self.tidx)
                    self.store(acc, head, m_block)

    @cute.jit
    def store(self, acc: cute.Tensor, head, m_block):
        """Block ``m_block`` of ``head`` (this thread's unscaled fragment) into dq, then a barrier:
        the staging tile is free again."""
        dq_chunks.store_block(self.chunks, acc, self.scale, self.tiled_mma_dq, self.gmem_tiled_copy_store, self.tidx,
                              self.sdQ, self.mdQ, self.seqlen, self.batch, head, m_block, self.check_hdim)
        cute.arch.barrier()

    def fragment(self) -> cute.Tensor:
        """(frag): this thread's dQ MMA fragment of a (tile_m, tile_hdim) block, fp32."""
        thr_mma = self.tiled_mma_dq.get_slice(self.tidx)
        return cute.make_rmem_tensor(thr_mma.partition_shape_C((self.chunks.tile_m, self.chunks.tile_hdim)), Float32)
