"""The device-side tile schedule of the one-launch rungs: which group a row tile belongs to,
found from the offsets on the device (no host sync).

Group g owns row tiles cum[g-1]:cum[g], where cum is the running sum (``tl.cumsum``)
of each group's cdiv(rows, BLOCK_M), zero for an empty group. :func:`group_tiles`
reads the G ends once (a BLOCK_G-wide vector); :func:`locate` maps a row tile to its
group and rows. v2 does both per program; v4's persistent programs read the offsets
once and locate every tile they walk.

The offsets are read through :func:`clamped`, never raw, and a group whose end lies
below its start has no rows: a call with ``check_offsets=False`` hands the kernels
offsets nobody looked at, and a row end past T, below 0 or below the previous one
would otherwise put a tile outside x and out (a crash, or another allocation
overwritten). Group g then owns rows clamp(offsets[g-1]) up to clamp(offsets[g]), none
if that decreases: for valid offsets exactly ``torch._grouped_mm``'s ``offs``.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def clamped(ptrs, mask, T):
    """The offsets at ``ptrs`` (0 where masked), clamped to the rows [0, T]."""
    return tl.minimum(tl.maximum(tl.load(ptrs, mask=mask, other=0), 0), T)


@triton.jit
def group_tiles(offsets_ptr, G, T, BLOCK_M: tl.constexpr, BLOCK_G: tl.constexpr):
    """Per group (BLOCK_G lanes, zero past G): first row, end row, row tiles, their running sum."""
    # exercise begin: tiles
    gs = tl.arange(0, BLOCK_G)
    ends = clamped(offsets_ptr + gs, gs < G, T)
    starts = clamped(offsets_ptr + gs - 1, (gs > 0) & (gs < G), T)
    tiles = tl.where(gs < G, tl.cdiv(tl.maximum(ends - starts, 0), BLOCK_M), 0)
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
def super_rows(pid, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid`` over tiles_m x tiles_n tiles in super-row
    order: GROUP_M row tiles form a super-row, whose programs walk its column panels one
    after another with the GROUP_M row tiles of a panel consecutive (the last super-row
    may be shorter). Programs that run together then share a few row tiles, so a row
    tile's A rows stay in cache across its column panels instead of being read again
    once per panel, as a row-tile-fastest order over the whole grid would."""
    per_super_row = GROUP_M * tiles_n
    first = (pid // per_super_row) * GROUP_M
    height = tl.minimum(tiles_m - first, GROUP_M)
    return first + (pid % per_super_row) % height, (pid % per_super_row) // height
