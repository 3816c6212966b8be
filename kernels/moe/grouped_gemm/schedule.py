"""The device-side tile schedule of the one-launch rungs: which group a row tile belongs to,
found from the offsets on the device (no host sync).

Group g owns row tiles cum[g-1]:cum[g], where cum is the running sum (``tl.cumsum``)
of each group's cdiv(rows, BLOCK_M), zero for an empty group. :func:`group_tiles`
reads the G ends once (a BLOCK_G-wide vector); :func:`locate` maps a row tile to its
group and rows. v2 does both per program; v4's persistent programs read the offsets
once and locate every tile they walk.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def group_tiles(offsets_ptr, G, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """Per group (BLOCK_G lanes, zero past G): first row, end row, row tiles, their running sum."""
    # exercise begin: tiles
    gs = tl.arange(0, BLOCK_G)
    ends = tl.load(offsets_ptr + gs, mask=gs < G, other=0)
    starts = tl.load(offsets_ptr + gs - 1, mask=(gs > 0) & (gs < G), other=0)
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
