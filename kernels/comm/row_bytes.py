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
    """The parts :func:`pack` put into ``rows`` (any permutation of its rows), one tensor each."""
    out, start = [], 0
    for dtype, shape in parts:
        width = math.prod(shape) * dtype.itemsize
        piece = rows.new_empty((rows.shape[0], width))   # fresh strides: an empty slice keeps its parent's
        out.append(piece.copy_(rows[:, start:start + width]).view(dtype).reshape(rows.shape[0], *shape))
        start += width
    if start != rows.shape[1]:
        raise ValueError(f"rows of {rows.shape[1]} bytes do not hold the layout {parts} ({start} bytes)")
    return out
