"""What SwiGLU's two elementwise kernels over sorted rows share: :mod:`.swiglu_forward`
(``h = silu(g)·u``) and :mod:`.swiglu_backward` (its derivative, the routing weights'
gradient, h·w).

Both read and write (R, H) tensors of one dtype, each row's columns contiguous, and tile
them alike: a program owns BLOCK_R rows and walks their columns BLOCK_H at a time; over
NUM_WARPS warps that is 8 consecutive columns a thread, so a bf16 row moves 16 bytes per
thread per access (their ISA tests check it). Both may take ``rows_end``, a bound on the
device (one int32: the expert-parallel FP8 owner's ``offsets[-1:]``): rows at or past it
read nothing, so every input there is 0, and no host read of the bound. Here are the tile,
the checks of those operands, the row and column blocks a program works on, and the
launch's grid and constexprs, for a call and for an ahead-of-time compile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import validate
from ...registry import AotKernel
from ...triton_support import accumulated, aot_launch, cdiv, interp_bf16, run_kwargs
from .spec import DTYPES

BLOCK_R, BLOCK_H, NUM_WARPS = 16, 128, 4


@triton.jit
def row_block(R, end_ptr, BOUNDED: tl.constexpr, BLOCK_R: tl.constexpr):
    """This program's rows (int64: R·H may pass 2^31), the live ones (< R: written) and the
    read ones (live, and under ``BOUNDED`` before ``*end_ptr``)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    live = rows < R
    read = live
    if BOUNDED:
        read = live & (rows < tl.load(end_ptr))
    return rows.to(tl.int64), live, read


@triton.jit
def col_block(start, H, live, read, BLOCK_H: tl.constexpr):
    """Columns ``start`` .. ``start + BLOCK_H`` and the masks of a tile: written (live rows)
    and read (read rows), both within H columns."""
    cols = start + tl.arange(0, BLOCK_H)
    inside = cols[None, :] < H
    return cols, live[:, None] & inside, read[:, None] & inside


@triton.jit
def load_rows(ptr, rows, stride, cols, mask):
    """A tile of a row-major operand (row stride ``stride``, unit column stride) in fp32 (float64
    for a float64 operand: :func:`~kernels.triton_support.accumulated`), 0 where ``mask`` is off."""
    return accumulated(tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0))


def check_rows(**named: torch.Tensor) -> None:
    """Every tensor (R, H) of one dtype of :data:`.spec.DTYPES` on one device, the first's
    shape, each row's columns contiguous (the kernels read rows)."""
    for name, t in named.items():
        validate.tensor(name, t, ndim=2, dtypes=DTYPES, allow_empty=True)
    validate.same_device(**named)
    validate.same_dtype(**named)
    first, shape = next(iter(named)), next(iter(named.values())).shape
    for name, t in named.items():
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; it must be {first}'s {tuple(shape)}")
        check_unit_columns(name, t)


def check_unit_columns(name: str, t: torch.Tensor) -> None:
    """A 2-D ``t`` whose rows' columns are adjacent (the row kernels' layout), else a clear error."""
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have unit column stride, got strides {t.stride()}")


def unit_columns(t: torch.Tensor) -> torch.Tensor:
    """``t``, or its contiguous copy where a row's columns are not adjacent: a gradient autograd
    hands a backward may be expanded (``.sum()``'s, stride 0), and the row kernels read rows."""
    return t.contiguous() if t.shape[1] > 1 and t.stride(1) != 1 else t


def check_rows_end(rows_end, device: torch.device) -> None:
    """``rows_end`` is None or an int32 tensor of one element on ``device``."""
    if rows_end is not None and (not isinstance(rows_end, torch.Tensor) or rows_end.dtype != torch.int32
                                 or rows_end.numel() != 1 or rows_end.device != device):
        raise ValueError(f"rows_end must be an int32 tensor of one element on {device}, got "
                         f"{getattr(rows_end, 'dtype', type(rows_end))} {tuple(getattr(rows_end, 'shape', ()))}")


def launch(kernel, args: tuple, rows: int, dtype: torch.dtype, **constexprs) -> None:
    """``kernel`` on ``rows`` rows of ``dtype``: one program per BLOCK_R of them, the tile's
    constexprs added to ``constexprs``."""
    kernel.run(*args, **run_kwargs((cdiv(rows, BLOCK_R),), dict(
        constexprs, BLOCK_R=BLOCK_R, BLOCK_H=BLOCK_H, INTERP_BF16=interp_bf16(dtype), num_warps=NUM_WARPS)))


def aot(kernel, dtype: torch.dtype, ints: dict[str, int], constexprs: dict,
        pointers: dict[str, str]) -> AotKernel:
    """:func:`launch`'s ahead-of-time description (:func:`kernels.triton_support.aot_launch`):
    the same tile on a GPU, where the interpreter's bf16 rounding does not apply."""
    return aot_launch(kernel, dtype, dict(BLOCK_R=BLOCK_R, BLOCK_H=BLOCK_H, num_warps=NUM_WARPS), ints,
                      dict(constexprs, INTERP_BF16=False), pointers)
