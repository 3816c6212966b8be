"""The rotary-embedding kernel: each pair (x[..., 2i], x[..., 2i+1]) of x (B, H, S, D) rotated
by the angle of (position s, frequency i), forward and (by the negative angle) backward.

One program rotates :func:`settings`' ``BLOCK_ROWS`` rows of all D columns, a row being one
(b, s, h). Rows are numbered b, then s, then h (h fastest): in the training step's layout
(a (B, S, H, D) projection seen as (B, H, S, D) through ``transpose(1, 2)``) consecutive rows
are adjacent in memory, and a program's rows share few cos and sin rows. Each row is read
as it lies (its D columns contiguous, or any other stride: every stride is an argument, and
the JIT folds a unit one into a constant), so a thread loads its 16 contiguous bytes and
splits the interleaved pairs in registers (``reshape`` to (rows, D/2, 2), ``split``), rotates
them in fp32 and joins them back for one 16-byte store, rounded once to x's dtype. Offsets are
int64: B·S·H·D may pass 2^31.

``tests/test_rope_isa.py`` compiles the launch (bf16, the training step's layout, D = 64 and
128, both directions) for gfx942 and gfx950: a thread reads its 8 bf16 of x, and the 4 fp32 of
cos and of sin its pairs need, as one 16-byte load each and writes y as one 16-byte store,
nothing narrower; no LDS (the pairs never leave the thread), no spills, no scratch, 8 waves per
SIMD. ``tests/test_aot_matches_calls.py`` checks that this AOT launch specializes every
argument as a call's launch does.
"""
from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from ..outputs import new_output_like
from ..registry import AotKernel
from ..triton_support import aot_launch, cdiv, interp_bf16, next_power_of_2, run_args, store_rows

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
VECTOR_BYTES = 16   # the widest global load and store a thread issues, on AMD and NVIDIA alike
WAVE = 64           # threads in an AMD wave, which the tile is sized for
NUM_WARPS, MAX_WARPS = 4, 16


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, R, SH, H,
                 stride_xb, stride_xh, stride_xs, stride_xd,
                 stride_yb, stride_yh, stride_ys, stride_yd,
                 stride_cs, stride_ci, stride_ss, stride_si,
                 HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                 INVERSE: tl.constexpr, INTERP_BF16: tl.constexpr):
    HALF: tl.constexpr = BLOCK_D // 2
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = rows < R
    b = (rows // SH).to(tl.int64)
    s = ((rows % SH) // H).to(tl.int64)
    h = (rows % H).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    pairs = tl.arange(0, HALF)
    mask = live[:, None]
    pair_mask = live[:, None]
    if BLOCK_D != HEAD_DIM:   # D not a power of two: the tile's last columns lie past the row
        mask = mask & (cols[None, :] < HEAD_DIM)
        pair_mask = pair_mask & (pairs[None, :] < HEAD_DIM // 2)
    x_rows = b * stride_xb + h * stride_xh + s * stride_xs
    x = tl.load(x_ptr + x_rows[:, None] + cols.to(tl.int64)[None, :] * stride_xd, mask=mask, other=0.0)
    even, odd = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_ROWS, HALF, 2)))
    cos = tl.load(cos_ptr + s[:, None] * stride_cs + pairs[None, :] * stride_ci, mask=pair_mask, other=0.0)
    sin = tl.load(sin_ptr + s[:, None] * stride_ss + pairs[None, :] * stride_si, mask=pair_mask, other=0.0)
    if INVERSE:   # the backward: the rotation by the negative angle (negating is exact)
        sin = -sin
    y = tl.reshape(tl.join(even * cos - odd * sin, even * sin + odd * cos), (BLOCK_ROWS, BLOCK_D))
    y_rows = b * stride_yb + h * stride_yh + s * stride_ys
    store_rows(y_ptr, y_rows, cols, 1, stride_yd, y, mask, INTERP_BF16)


def settings(head_dim: int, dtype: torch.dtype) -> dict:
    """The launch's constexprs and warps for rows of ``head_dim`` columns of ``dtype``: the call's
    and the ahead-of-time compile's (one function, so the ISA shown is the binary that runs).

    BLOCK_D is D rounded up to a power of two (a tile's width; the columns past D are masked).
    The tile holds one 16-byte vector per thread of NUM_WARPS waves (2048 bf16 or 1024 fp32
    elements: BLOCK_ROWS = that / BLOCK_D, at least one row): the kernel does 6 flops per
    pair, so it is bound by memory, and a bigger tile would make no access wider, only fewer
    programs to spread over the CUs when B·S·H is small. A row wider than that tile (D past
    2048 in bf16) takes more warps, up to MAX_WARPS, rather than more registers a thread."""
    block_d = max(2, next_power_of_2(head_dim))
    vector = VECTOR_BYTES // dtype.itemsize
    warps = min(MAX_WARPS, max(NUM_WARPS, block_d // (vector * WAVE)))
    return dict(HEAD_DIM=head_dim, BLOCK_ROWS=max(1, warps * WAVE * vector // block_d), BLOCK_D=block_d,
                num_warps=warps)


def _arguments(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, y_strides: tuple) -> tuple:
    """The launch's int arguments after the four pointers: rows, S·H and H, then the strides."""
    b, h, s, _ = x.shape
    return (b * s * h, s * h, h, *x.stride(), *y_strides, *cos.stride(), *sin.stride())


def launcher(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool) -> Callable:
    """The call that rotates tensors of the metadata of these (checked) ``x``, ``cos`` and ``sin``
    (``inverse``: by the negative angle, the backward's dx from dy) into a new tensor laid out as
    ``torch.empty_like(x)`` lays it out (x's strides where x is dense); every argument of the
    launch is worked out here, once (:func:`kernels.triton_support.run_args`). An empty x
    launches nothing."""
    if x.numel() == 0:
        return lambda x, cos, sin: new_output_like(x)
    config = settings(x.shape[-1], x.dtype)
    y_strides = torch.empty_like(x, device="meta").stride()   # what new_output_like(x) will have
    rows = x.shape[0] * x.shape[1] * x.shape[2]
    args, kwargs = run_args(_rope_kernel, 4, _arguments(x, cos, sin, y_strides), (cdiv(rows, config["BLOCK_ROWS"]),),
                            dict(config, INVERSE=inverse, INTERP_BF16=interp_bf16(x.dtype)))

    def launch(x, cos, sin):
        y = new_output_like(x)
        _rope_kernel.run(x, cos, sin, y, *args, **kwargs)
        return y
    return launch


AOT_SHAPE = (4, 32, 2048)
"""B, H, S of the launch an AOT compile shows: gpu-dense-1b's query heads (batch 4, 32 heads,
2048 positions), in the training step's (B, S, H, D) memory."""


def aot(dtype: torch.dtype = torch.bfloat16, head_dim: int = 64, inverse: bool = False) -> AotKernel:
    """The launch at :data:`AOT_SHAPE` with rows of ``head_dim`` columns, x and y in the training
    step's layout, cos and sin contiguous, for an ahead-of-time compile
    (:func:`workbench.isa.compile.compile_aot`): :func:`settings`' tile, the GPU's bf16 rounding."""
    b, h, s = AOT_SHAPE
    x = torch.empty(b, s, h, head_dim, dtype=dtype, device="meta").transpose(1, 2)
    table = torch.empty(s, head_dim // 2, device="meta")
    names = list(_rope_kernel.arg_names)[4:]
    ints = dict(zip(names, _arguments(x, table, table, x.stride())))
    return aot_launch(_rope_kernel, dtype, settings(head_dim, dtype), ints,
                      dict(INVERSE=inverse, INTERP_BF16=False), {"cos_ptr": "*fp32", "sin_ptr": "*fp32"})
