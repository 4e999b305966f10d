"""The launch grid of the block kernels (forward, backward chain, RoPE): its extents, derived from
the tensors, and which grid axis carries the row blocks, the heads and the sequences, said once
for the launcher (``launch_grid``) and for the CTA that reads its coordinates (``grid_coords``).

Orders (a kernel's record picks one: ``grid_order``). CUDA launches a grid x fastest, then y, z:

- ``BLOCKS_FASTEST`` ``[blocks, heads, sequences]``: the blocks of one head launch together.
- ``BLOCKS_SLOWEST`` ``[heads, sequences, blocks]`` (heavy-first): every CTA of block 0 launches
  before any of block 1, so under a causal mask the longest CTAs start first and the short ones
  fill the tail. The backward's longest are its first key blocks (key block n sees the query blocks
  from n on); the forward's are its last query blocks, which it reads reversed
  (``grid_coords(..., reverse_blocks=True)``).
- ``SEQUENCES_FASTEST`` ``[sequences, blocks, heads]`` (the backward's ``batch_inner``): the CTAs
  of one block and head across the batch run together, so a bias broadcast over the batch stays
  in L2 between its readers.
"""
from __future__ import annotations

import cutlass.cute as cute
from cutlass import const_expr

BLOCKS_FASTEST, BLOCKS_SLOWEST, SEQUENCES_FASTEST = "blocks_fastest", "blocks_slowest", "sequences_fastest"


def grid_order(heavy_first: bool = False, batch_inner: bool = False) -> str:
    """The order a record's ``heavy_first`` / ``batch_inner`` flags ask for (validation keeps them apart)."""
    if heavy_first:
        return BLOCKS_SLOWEST
    return SEQUENCES_FASTEST if batch_inner else BLOCKS_FASTEST


def launch_extents(mX: cute.Tensor, cu_seqlens: cute.Tensor | None, max_seqlen, tile: int, packed: bool):
    """(row blocks, heads, sequences) of a grid over the rows of q/k-like ``mX``: dense (B, S, H, D)
    or packed (T, H, D) with ``cu_seqlens`` and the longest sequence ``max_seqlen``."""
    if const_expr(packed):
        return cute.ceil_div(max_seqlen, tile), mX.shape[1], cu_seqlens.shape[0] - 1
    return cute.ceil_div(mX.shape[1], tile), mX.shape[2], mX.shape[0]


def launch_grid(order: str, blocks, heads, sequences) -> list:
    """The grid's (x, y, z) for ``blocks`` x ``heads`` x ``sequences`` CTAs in ``order``."""
    if const_expr(order == BLOCKS_SLOWEST):
        return [heads, sequences, blocks]
    if const_expr(order == SEQUENCES_FASTEST):
        return [sequences, blocks, heads]
    return [blocks, heads, sequences]


def grid_coords(order: str, reverse_blocks: bool = False):
    """(block, head, sequence) of this CTA in a grid that ``launch_grid(order, ...)`` sized;
    ``reverse_blocks``: the block index counts down from the last."""
    x, y, z = cute.arch.block_idx()
    if const_expr(order == BLOCKS_SLOWEST):
        block, head, sequence, axis = z, x, y, 2
    elif const_expr(order == SEQUENCES_FASTEST):
        block, head, sequence, axis = y, z, x, 1
    else:
        block, head, sequence, axis = x, y, z, 0
    if const_expr(reverse_blocks):
        block = cute.arch.grid_dim()[axis] - 1 - block
    return block, head, sequence
