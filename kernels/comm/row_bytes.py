"""Several per-row tensors as one byte tensor, so that one all-to-all carries them all.

A quantized payload is two tensors per row, the FP8 elements and their scales (float32 or
e8m0 bytes), and gloo has no FP8 dtype. Viewed as bytes and put side by side, row by row,
they travel in one ``all_to_all_single`` whose rows are permuted with the payload's: one
collective per exchange rather than one per part, each of which would pay the
collective's latency and, with uneven splits, its split bookkeeping again. The scales
cost a few bytes per row (4 for one float32 per row, 1 per 32 elements for e8m0).
"""
from __future__ import annotations

import math

import torch

Layout = tuple[tuple[torch.dtype, tuple[int, ...]], ...]
"""Each part's dtype and shape per row, in the order of the bytes."""


def layout(*parts: torch.Tensor) -> Layout:
    """What :func:`unpack` needs to take :func:`pack`'s bytes of ``parts`` apart again."""
    return tuple((p.dtype, tuple(p.shape[1:])) for p in parts)


def pack(*parts: torch.Tensor) -> torch.Tensor:
    """(T, bytes per row) uint8: each part (T, ...) as its bytes, the parts side by side."""
    rows = parts[0].shape[0]
    if any(p.shape[0] != rows for p in parts):
        raise ValueError(f"every part needs the same rows, got shapes {[tuple(p.shape) for p in parts]}")
    return torch.cat([p.contiguous().reshape(rows, -1 if rows else 0).view(torch.uint8)
                      .reshape(rows, math.prod(p.shape[1:]) * p.element_size()) for p in parts], dim=1)


def unpack(rows: torch.Tensor, parts: Layout) -> list[torch.Tensor]:
    """The parts :func:`pack` put into ``rows`` (any permutation of its rows), one tensor each,
    each a packed copy, as a kernel reads its operands (in ``rows`` a part's rows lie
    ``rows.shape[1]`` bytes apart, the whole row's width)."""
    return _parts(rows, parts, copy=True)


def views(rows: torch.Tensor, parts: Layout) -> list[torch.Tensor]:
    """:func:`unpack`'s parts as views into ``rows`` where a part's bytes can be viewed in its
    dtype (its offset in a row and the row's length multiples of its item size), else copied:
    for a reader that takes any strides (a dequantization), one copy of every row's bytes saved."""
    return _parts(rows, parts, copy=False)


def _parts(rows: torch.Tensor, parts: Layout, copy: bool) -> list[torch.Tensor]:
    out, start = [], 0
    for dtype, shape in parts:
        width = math.prod(shape) * dtype.itemsize
        piece = rows[:, start:start + width]
        aligned = all(n % dtype.itemsize == 0 for n in (rows.stride(0), piece.storage_offset(), width))
        if copy or not aligned or rows.shape[0] == 0:   # fresh strides: an empty slice keeps its parent's
            piece = rows.new_empty((rows.shape[0], width)).copy_(piece)
        out.append(piece.view(dtype).reshape(rows.shape[0], *shape))
        start += width
    if start != rows.shape[1]:
        raise ValueError(f"rows of {rows.shape[1]} bytes do not hold the layout {parts} ({start} bytes)")
    return out
