"""The device-side tile schedule of the one-launch rungs: which group a row tile belongs to,
found from the offsets on the device (no host sync).

Group g owns row tiles cum[g-1]:cum[g], where cum is the running sum (``tl.cumsum``)
of each group's cdiv(rows, BLOCK_M), zero for an empty group. :func:`group_tiles`
reads the G ends once (a BLOCK_G-wide vector); :func:`locate` maps a row tile to its
group and rows. v2 does both per program; v4's persistent programs read the offsets
once and locate every tile they walk.

The ends are read through :func:`row_ends`, never raw: a call with ``check_offsets=False``
hands the kernels offsets nobody looked at, and a row end past T or below the previous
one would otherwise move a tile outside x and out (a crash, or another allocation
overwritten). Clamped to [0, T] and raised to the largest end before them, the ends
of any offsets describe disjoint row ranges inside [0, T], so the schedule keeps the
bound its grid is sized by (at most cdiv(T, BLOCK_M) + G row tiles) and no two
programs store one row.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _larger(a, b):
    return tl.maximum(a, b)


@triton.jit
def row_ends(ptrs, mask, T):
    """The offsets at ``ptrs`` (0 where masked) clamped to [0, T], then their running maximum
    along the vector: for checked offsets the offsets themselves."""
    ends = tl.minimum(tl.maximum(tl.load(ptrs, mask=mask, other=0), 0), T)
    return tl.associative_scan(ends, 0, _larger)


@triton.jit
def group_tiles(offsets_ptr, G, T, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """Per group (BLOCK_G lanes, zero past G): first row, end row, row tiles, their running sum."""
    # exercise begin: tiles
    gs = tl.arange(0, BLOCK_G)
    ends = row_ends(offsets_ptr + gs, gs < G, T)
    starts = row_ends(offsets_ptr + gs - 1, (gs > 0) & (gs < G), T)
    tiles = tl.where(gs < G, tl.cdiv(ends - starts, BLOCK_M), 0)
    return starts, ends, tiles, tl.cumsum(tiles, 0)
    # exercise end


@triton.jit
def locate(tile, starts, ends, tiles, cum, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """(group, first row, end row of the group) of row tile ``tile``; group >= G past the last tile."""
    # exercise begin: locate
    group = tl.sum((cum <= tile).to(tl.int32), 0)
    mine = tl.arange(0, BLOCK_G) == group
    first_tile = tl.sum(tl.where(mine, cum - tiles, 0), 0)
    start = tl.sum(tl.where(mine, starts, 0), 0) + (tile - first_tile) * BLOCK_M
    return group, start, tl.sum(tl.where(mine, ends, 0), 0)
    # exercise end


@triton.jit
def group_rows(offsets_ptr, group, G, T, BLOCK_G: tl.constexpr):
    """(first row, end row) of one group, on :func:`row_ends`' terms (the dW kernel's range)."""
    gs = tl.arange(0, BLOCK_G)
    ends = row_ends(offsets_ptr + gs, gs < G, T)
    start = tl.sum(tl.where(gs == group - 1, ends, 0), 0)
    return start, tl.sum(tl.where(gs == group, ends, 0), 0)
