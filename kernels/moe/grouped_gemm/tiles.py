"""The tile product every grouped GEMM kernel runs: a sum of ``tl.dot`` over one
reduction of variable length.

The forward reduces over K (one expert's weight), the dW kernel over the rows of one
group, whose count is only known on the device. Both are the same loop, so it is
written once, as GEMM v4 writes its K loop: full BLOCK_R steps with only the
loop-invariant masks of the tile's rows and columns, so the hot loop compares nothing
against the length (the ISA tests check it), then the ragged last step, peeled, with
the reduction mask; two pipeline stages overlap the next step's loads with this one's
MFMAs. fp32 accumulation; fp32 operands use the IEEE dot (no TF32).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def operand(ptrs, mask, INTERP_BF16: tl.constexpr):
    """One operand tile, zero where masked; fp32 under the interpreter's bf16 workaround
    (:mod:`kernels.triton_support`)."""
    tile = tl.load(ptrs, mask=mask, other=0.0)
    if INTERP_BF16:
        tile = tile.to(tl.float32)
    return tile


@triton.jit
def reduce_tiles(a_ptrs, b_ptrs, a_step, b_step, a_rows, b_cols, length,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                 INTERP_BF16: tl.constexpr):
    """sum over r < length of a[:, r] * b[r, :] for a (BLOCK_M, BLOCK_R) and b (BLOCK_R,
    BLOCK_N) tile walking ``a_step`` / ``b_step`` (int64) elements per step. ``a_rows``
    (BLOCK_M, 1) and ``b_cols`` (1, BLOCK_N) mask the tile's edges; length 0 gives zeros."""
    rs = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    full = (length // BLOCK_R) * BLOCK_R
    for _ in range(0, full, BLOCK_R):
        acc = tl.dot(operand(a_ptrs, a_rows, INTERP_BF16), operand(b_ptrs, b_cols, INTERP_BF16),
                     acc, input_precision="ieee")
        a_ptrs += a_step
        b_ptrs += b_step
    if full < length:
        a = operand(a_ptrs, a_rows & (rs[None, :] + full < length), INTERP_BF16)
        b = operand(b_ptrs, (rs[:, None] + full < length) & b_cols, INTERP_BF16)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc
