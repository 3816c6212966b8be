"""The tile product every grouped GEMM kernel runs: a sum of ``tl.dot`` over one
reduction of variable length.

The forward reduces over K (one expert's weight), the dW kernel over the rows of one
group, whose count is only known on the device. Both are the same loop, so it is
written once, as GEMM v4 writes its K loop: full BLOCK_R steps with only the
loop-invariant masks of the tile's rows and columns, so the hot loop compares nothing
against the length (the ISA tests check it), then the ragged last step, peeled, with
the reduction mask; two pipeline stages overlap the next step's loads with this one's
MFMAs. fp32 accumulation; fp32 operands use the IEEE dot (no TF32).

Block-scaled FP8 operands (DeepSeek-V3's 1x128 and 128x128 scales) change their scales
along the reduction, so they cannot wait for the epilogue: with ``SCALE_R`` > 0 each
step's product goes into a fresh fp32 partial product that :func:`accumulate` scales by
its block's scales before adding it (as ``gemm_fp8`` v2 does); a step never straddles
two scale blocks (BLOCK_R divides SCALE_R).
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
def accumulate(acc, a, b, sa_ptrs, sb_ptrs, a_rows, b_cols, SCALED: tl.constexpr):
    """acc + a @ b; ``SCALED``: acc + (a @ b) * sa * sb with sa (BLOCK_M, 1) and sb (1, BLOCK_N)
    loaded from ``sa_ptrs`` / ``sb_ptrs`` under the tile's edge masks ``a_rows`` / ``b_cols``
    (the scales of the reduction block a and b lie in)."""
    if SCALED:
        scale_a = tl.load(sa_ptrs, mask=a_rows, other=0.0)
        scale_b = tl.load(sb_ptrs, mask=b_cols, other=0.0)
        acc += tl.dot(a, b) * (scale_a * scale_b)
    else:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@triton.jit
def reduce_tiles(a_ptrs, b_ptrs, a_step, b_step, a_rows, b_cols, length,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
                 INTERP_BF16: tl.constexpr, sa_ptrs=None, sb_ptrs=None, sa_step=0, sb_step=0,
                 SCALE_R: tl.constexpr = 0):
    """sum over r < length of a[:, r] * b[r, :] for a (BLOCK_M, BLOCK_R) and b (BLOCK_R,
    BLOCK_N) tile walking ``a_step`` / ``b_step`` (int64) elements per step. ``a_rows``
    (BLOCK_M, 1) and ``b_cols`` (1, BLOCK_N) mask the tile's edges; length 0 gives zeros.
    ``SCALE_R`` > 0: every SCALE_R elements of the reduction have their own scales, a's at
    ``sa_ptrs`` (BLOCK_M, 1) and b's at ``sb_ptrs`` (1, BLOCK_N) for the first block, the
    next block's ``sa_step`` / ``sb_step`` elements on."""
    tl.static_assert(SCALE_R % BLOCK_R == 0, "a step must not straddle two scale blocks")
    rs = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    full = (length // BLOCK_R) * BLOCK_R
    for r in range(0, full, BLOCK_R):
        acc = accumulate(acc, operand(a_ptrs, a_rows, INTERP_BF16), operand(b_ptrs, b_cols, INTERP_BF16),
                         scales_at(sa_ptrs, sa_step, r, SCALE_R), scales_at(sb_ptrs, sb_step, r, SCALE_R),
                         a_rows, b_cols, SCALE_R > 0)
        a_ptrs += a_step
        b_ptrs += b_step
    if full < length:
        a = operand(a_ptrs, a_rows & (rs[None, :] + full < length), INTERP_BF16)
        b = operand(b_ptrs, (rs[:, None] + full < length) & b_cols, INTERP_BF16)
        acc = accumulate(acc, a, b, scales_at(sa_ptrs, sa_step, full, SCALE_R),
                         scales_at(sb_ptrs, sb_step, full, SCALE_R), a_rows, b_cols, SCALE_R > 0)
    return acc


@triton.jit
def scales_at(ptrs, step, r, SCALE_R: tl.constexpr):
    """The scales of the block holding reduction element ``r`` (``ptrs`` itself when unscaled)."""
    if SCALE_R > 0:
        ptrs += (r // SCALE_R) * step
    return ptrs
