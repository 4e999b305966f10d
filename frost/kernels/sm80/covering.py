"""The L0 records: a pairwise-covering subset of each admitted SM80 space (``space.py``), what
the L0 compile suites build and ``frost-compile --records L0`` fills the disk cache with.

``covering_subset`` picks records that together take every pair of values of any two fields
(per params type, in the space's order), so each feature is compiled beside each other
feature at least once. It is the greedy cover: each round takes the record that covers the
most pairs not yet covered, the first such in the input's order. In torch: a record is a
one-hot row x over (field, value) columns, the pairs not yet covered an upper-triangular 0/1
matrix U, the record's count x U x^T; each record keeps an upper bound of its count (counts
only fall), recounted, a batch of rows at a time, only where the bound is the highest. The
backward's 281k records (every device class): 5 s on a CPU core, where a pass of Python bitmasks
over all records per round took 50 s; both give the same records.

``admitted`` and ``l0`` enumerate a family's records (``"fwd"``, ``"bwd"``, ``"rope"``) once per
process: listing the backward's space takes about 45 s, and several suites read it.
"""
from __future__ import annotations

import dataclasses
import functools
import operator

import torch

from frost.kernels.sm80 import space

# family -> (every admitted record, the records its L0 subset covers): the RoPE pass's L0 takes
# representative head dims (space.ROPE_L0_HEAD_DIMS), its key holding the head dim itself
_SPACES = {
    "fwd": (space.admitted_fwd_params, None),
    "bwd": (space.admitted_bwd_params, None),
    "rope": (space.admitted_rope_params, lambda: space.admitted_rope_params(space.ROPE_L0_HEAD_DIMS)),
}
FAMILIES = tuple(_SPACES)
# rows per recount (20 MB): few, large batches. With batches of 4096 rows torch's two threads took
# 43 s instead of 6 s on two cores busy with other work, waiting on each other
_CHUNK = 65536


@functools.cache
def admitted(family: str) -> tuple:
    """Every record of ``family`` the SM80 engines can produce, in the space's order."""
    return tuple(_SPACES[family][0]())


@functools.cache
def l0(family: str) -> tuple:
    """The records of ``family`` the L0 compile suites build."""
    narrower = _SPACES[family][1]
    return tuple(covering_subset(narrower() if narrower else admitted(family)))


def covering_subset(params) -> list:
    """Records of ``params`` that together take every pair of values of any two fields that
    records of one params type take (the greedy cover of each type's pairs)."""
    kinds: dict[type, list] = {}
    for p in params:
        kinds.setdefault(type(p), []).append(p)
    return [chosen for group in kinds.values() for chosen in _pairwise_cover(group)]


def _pairwise_cover(params: list) -> list:
    names = [field.name for field in dataclasses.fields(params[0])]
    # one column per (field, value), numbered field by field in the order the values first appear
    columns, width = [], 0
    for column in zip(*map(operator.attrgetter(*names), params)):
        number = {value: width + i for i, value in enumerate(dict.fromkeys(column))}
        columns.append(torch.tensor([number[value] for value in column]))
        width += len(number)
    columns = torch.stack(columns, 1)
    onehot = torch.zeros(len(params), width).scatter_(1, columns, 1.0)
    # the pairs of values of two fields that some record takes, as the upper triangle of a
    # (field, value) x (field, value) table; a record's uncovered pairs: x^T U x over its row x
    uncovered = torch.triu(onehot.T @ onehot, diagonal=1) > 0
    bound = torch.full((len(params),), len(names) * (len(names) - 1) // 2)  # at least each record's count
    chosen = []
    while uncovered.any():
        weights = uncovered.float()
        most = int(bound.max())
        top = torch.nonzero(bound == most).flatten()
        for which in top.split(_CHUNK):
            rows = onehot[which]
            bound[which] = ((rows @ weights) * rows).sum(1).round().long()
        # once a recounted record still covers ``most``, no other record covers more, and every
        # record that covers as many was among those recounted: argmax takes the first of them
        if int(bound[top].max()) == most:
            best = int(torch.argmax(bound))
            chosen.append(params[best])
            values = columns[best]
            uncovered[values[:, None], values[None, :]] = False
            bound[best] = 0
    return chosen
