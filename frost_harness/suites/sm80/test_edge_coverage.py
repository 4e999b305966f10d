"""Does the L0 GPU grid put a band edge where a block-range mutant changes a decision?

The needs-mask mutants of ``frost_harness.fuzz.mutants`` move one bound of
``AttentionMask.needs_mask`` (frost/kernels/sm80/mask.py) by one, so a tile that crosses an
edge by exactly one key takes the unmasked path. Only a problem whose tiles (as the dispatch
picks them) put an edge on that one key can see it. This module replays the mask's block
arithmetic in Python for every case of the L0 GPU grid, with the tiles of the records the
engines would compile, and names the cases where each mutant's decision differs on a tile the
kernel visits and where a valid query row then sees a key it must not. It runs on a CPU: the
grid's cases are built there and only their problems' records are asked for.

On the H200 (2026-12-03) the four mutants of this kind ran a whole call without a verdict:
their focus tests passed. The model showed why: no grid case put the right edge on a tile's
next-to-last key (offsets congruent to -2 modulo the tile, hence the edge_right_m2 cases), and
the left one was met only by window_br, outside the focus.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
from _pytest.mark.expression import Expression

from frost.engines.sm80 import Sm80Backward, Sm80Forward
from frost.problem import prepare
from frost_harness.fuzz.mutants import FOCUS
from frost_harness.suites.harness import make_inputs
from frost_harness.suites.sm80 import gpu_cases

pytestmark = pytest.mark.L0


@dataclasses.dataclass(frozen=True)
class Band:
    """One sequence's mask, as AttentionMask holds it (``None``: that side unbounded)."""

    seqlen_q: int
    seqlen_k: int
    delta: int
    left: int | None
    right: int | None

    def visible(self, row: int, key: int) -> bool:
        return (row < self.seqlen_q and key < self.seqlen_k
                and (self.left is None or key >= row + self.delta - self.left)
                and (self.right is None or key <= row + self.delta + self.right))


def needs_mask(band: Band, tm: int, tn: int, m: int, n: int, mask_rows: bool, shift: dict) -> bool:
    """mask.py's needs_mask, each bound moved by ``shift[side]`` (the mutants: 1 each)."""
    key_first, row_first = n * tn, m * tm
    key_last, row_last = key_first + tn - 1, row_first + tm - 1
    masked = key_last >= band.seqlen_k + shift.get("seqlen", 0)
    if mask_rows:
        masked = masked or row_last >= band.seqlen_q
    if band.right is not None:
        masked = masked or key_last > row_first + band.delta + band.right + shift.get("right", 0)
    if band.left is not None:
        masked = masked or key_first < row_last + band.delta - band.left - shift.get("left", 0)
    return masked


def visited(band: Band, tm: int, tn: int, direction: str):
    """The (m_block, n_block) tiles the kernel computes (mask.py's n_block_range / m_block_range)."""
    if direction == "forward":
        for m in range(math.ceil(band.seqlen_q / tm)):
            first, last = m * tm, min(m * tm + tm, band.seqlen_q) - 1
            n_max = math.ceil(band.seqlen_k / tn)
            if band.right is not None:
                n_max = min(n_max, math.ceil(max(last + band.delta + band.right + 1, 0) / tn))
            n_min = max(first + band.delta - band.left, 0) // tn if band.left is not None else 0
            yield from ((m, n) for n in range(n_min, n_max))
    else:
        for n in range(math.ceil(band.seqlen_k / tn)):
            first, last = n * tn, min(n * tn + tn, band.seqlen_k) - 1
            m_max = math.ceil(band.seqlen_q / tm)
            m_min = max(first - band.delta - band.right, 0) // tm if band.right is not None else 0
            if band.left is not None:
                m_max = min(m_max, math.ceil(max(last - band.delta + band.left + 1, 0) / tm))
            yield from ((m, n) for m in range(m_min, m_max))


def wrongly_unmasked(band: Band, tm: int, tn: int, direction: str, side: str) -> bool:
    """Whether the mutant of ``side`` sends a visited tile down the unmasked path while a valid
    query row of it must not see one of its keys (within the sequence's padded extent)."""
    mask_rows = direction == "backward"
    for m, n in visited(band, tm, tn, direction):
        if needs_mask(band, tm, tn, m, n, mask_rows, {}) and not needs_mask(band, tm, tn, m, n, mask_rows,
                                                                             {side: 1}):
            rows = range(m * tm, min(m * tm + tm, band.seqlen_q))
            if any(not band.visible(r, key) for r in rows for key in range(n * tn, n * tn + tn)):
                return True
    return False


def bands_and_tiles(direction: str, feature: str, dtype, dims) -> list[tuple[Band, int, int]]:
    """Each sequence's band with the main kernel's (tile_m, tile_n) for one grid case."""
    case = dataclasses.replace(gpu_cases.case(direction, feature, dtype, dims), device="cpu", poison=False)
    inputs = make_inputs(case)
    kw = inputs.keywords
    problem, _ = prepare("forward", inputs.q, inputs.k, inputs.v, **kw)
    if direction == "forward":
        params = Sm80Forward().records(problem)[0]
    else:  # the records read facts only: the forward's, as a backward
        params = Sm80Backward().records(dataclasses.replace(problem, direction="backward"))[1]
    lengths = (list(zip(case.lengths_q, case.lengths_k)) if case.lengths_q is not None  # packed or padded
               else [(case.seqlen_q, case.seqlen_k)])
    left, right = problem.window_left, problem.window_right
    bands = []
    for sq, sk in lengths:
        delta = sk - sq if problem.causal_align == "bottom_right" and (left >= 0 or right >= 0) else 0
        bands.append(Band(sq, sk, delta, left if left >= 0 else None, right if right >= 0 else None))
    return [(band, params.tile_m, params.tile_n) for band in bands]


def _grid_values(direction: str) -> list[tuple]:
    return [p.values if hasattr(p, "values") else p for p in gpu_cases.l0_grid(direction)]


@pytest.fixture(scope="module")
def exercised() -> dict[tuple[str, str], set[str]]:
    """(side, direction) -> the L0 grid features whose tiles let that mutant change a visible key."""
    found: dict[tuple[str, str], set[str]] = {}
    for direction in ("forward", "backward"):
        for feature, dtype, dims in _grid_values(direction):
            for band, tm, tn in bands_and_tiles(direction, feature, dtype, dims):
                for side in ("right", "left", "seqlen"):
                    if wrongly_unmasked(band, tm, tn, direction, side):
                        found.setdefault((side, direction), set()).add(feature)
    return found


def test_the_model_sees_an_edge_one_key_off_and_nothing_where_the_band_is_clear():
    causal = Band(seqlen_q=256, seqlen_k=256 + 62, delta=62, left=None, right=0)  # offset -2 mod 64
    assert wrongly_unmasked(causal, 64, 64, "forward", "right")
    assert not wrongly_unmasked(Band(256, 256, 0, None, 0), 64, 64, "forward", "right")  # offset 0
    assert wrongly_unmasked(Band(100, 127, 0, None, None), 128, 128, "forward", "seqlen")  # Sk = -1 mod 128
    assert not wrongly_unmasked(Band(100, 128, 0, None, None), 128, 128, "forward", "seqlen")


@pytest.mark.parametrize("side, mutant", [("right", "needs-mask-right"), ("left", "needs-mask-left"),
                                          ("seqlen", "needs-mask-seqlen")])
def test_each_needs_mask_mutant_meets_an_edge_in_its_focus(exercised, side, mutant):
    """Some forward grid case its focus selects (a ``-k`` expression on the forward test) puts
    the moved bound on a visited tile's key; the backward grid is reported alongside."""
    forward = exercised.get((side, "forward"), set())
    focus = FOCUS[mutant]
    chosen = {feature for feature in forward if _selects(focus, feature)}
    assert chosen, f"{mutant}: forward cases exercising it {sorted(forward)}; its focus {focus!r} selects none"


def _selects(expression: str, feature: str) -> bool:
    """Whether a FOCUS ``-k`` expression picks the forward test of ``feature`` (pytest's own
    matching: a name matches as a case-insensitive substring of the test's id)."""
    test_id = f"test_fwd_sm80_matches_oracle[{feature}-torch.float16-(64, 64)]"
    names = ["test_fwd_gpu.py", test_id, "test_fwd_sm80_matches_oracle", "L0", "gpu"]
    return Expression.compile(expression).evaluate(lambda sub, /, **_: any(sub.lower() in n.lower() for n in names))
