"""RMSNorm's Triton kernels: the forward, the backward, and the backward's weight-gradient sum.

Why one program holds whole rows: a row's rstd needs the sum of its squares before any y of it
can be written, so a program that loads the row once (BLOCK_N = N rounded up to a power of 2)
reads x once and writes y once; the backward likewise needs the row's ``Σ dy·w·x̂`` before dx.
The cost is a bound on N, :data:`MAX_N`: the row lives in one program's registers (16 warps,
16 elements a lane of each of x, dy and the accumulators on AMD's 64-lane waves), and at that
width the ISA test finds no spills on gfx942 and gfx950, the forward at 8 waves per SIMD and the
backward at 5; a wider row is refused rather than run uncompiled by any test.

The settings (:func:`settings`, shared by the launches and :func:`aot`, so the ISA tests compile
what a call runs): BLOCK_N, the next power of 2 of N; BLOCK_R, rows per program, so that a program
of a narrow norm still moves :data:`ROW_ELEMENTS` elements (one program per row of 33 columns would
leave most of a wave's lanes idle); num_warps, so that each 64-lane wave's thread holds one 16-byte
vector of x's dtype per tile (8 bf16/fp16 or 4 fp32 elements): the widest global access, and no more
lanes than that, or a thread would get 8 or 4 bytes and its loads would narrow.
``tests/test_rms_norm_isa.py`` checks it on gfx942 and gfx950 at N = 1024 and 4096, for bf16 x and
weight, bf16 x with an fp32 weight, and fp32 both (what the training step's norms see under
autocast: its residual stream stays fp32, the embedding's dtype): forward and backward read and
write x, y, dy and dx 16 bytes per thread; no spills, no scratch, no atomics, :data:`WAVES_PER_SIMD`
waves per SIMD; the backward's loop over rows moves only dy, x, rstd and dx. What crosses LDS: each
row's sum across warps (4 bytes a thread); an fp32 weight beside 16-bit x, changed from its 16-byte
load's layout (4 a thread) to the tile's (8 a thread), once per program; the backward's fp32 partial
row, changed to its store's layout, once per program.

The weight gradient is deterministic: the backward's programs (at most :data:`PARTIAL_PROGRAMS`)
each sum ``dy·x̂`` over the rows they own (every PARTIAL_PROGRAMS-th block of BLOCK_R rows) in
fp32 into a row of their own of a (programs, N) fp32 buffer, and :func:`_dweight_kernel` adds
those rows in a fixed order: the same bits on every run of one shape, no atomics.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..registry import AotKernel
from ..triton_support import aot_launch, cdiv, interp_bf16, next_power_of_2, pointer_type, run_kwargs, store_rows

MAX_N = 16384
ROW_ELEMENTS = 1024
MAX_WARPS = 16
WAVE_LANES = 64                 # AMD's wave; an NVIDIA warp of 32 gets two vectors a thread
PARTIAL_PROGRAMS = 1024         # ~3 per CU on MI300X (304 CUs), 4 on MI355X (256); a few MB of partials
DWEIGHT_SETTINGS = dict(BLOCK_P=16, BLOCK_C=128, num_warps=4)
WAVES_PER_SIMD = 8
"""What gfx942 and gfx950 give the forward and the backward, bf16 at N = 1024 and 4096 (few
registers: a thread holds one vector per tensor); ``tests/test_rms_norm_isa.py`` asserts it."""
AOT_ROWS = 8192                 # a training step's tokens (a sequence of 8192, or 4 of 2048)


@triton.jit
def _rows_tile(start, R, N, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows ``start`` .. ``start + BLOCK_R`` (int64: R·N may pass 2^31), the live ones, and the
    tile's mask."""
    rows = start + tl.arange(0, BLOCK_R)
    live = rows < R
    mask = live[:, None] & (tl.arange(0, BLOCK_N) < N)[None, :]
    return rows.to(tl.int64), live, mask


@triton.jit
def _load(ptr, rows, stride, cols, mask):
    """A tile of rows with unit column stride, in fp32, 0 where ``mask`` is off."""
    return tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _forward_kernel(x_ptr, w_ptr, y_ptr, rstd_ptr, R, N, stride_x, stride_w, eps,
                    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, INTERP_BF16: tl.constexpr):
    """y = x·rstd·w in fp32, rounded once; rstd = rsqrt(mean(x²) + eps) kept for the backward."""
    cols = tl.arange(0, BLOCK_N)
    rows, live, mask = _rows_tile(tl.program_id(0) * BLOCK_R, R, N, BLOCK_R, BLOCK_N)
    x = _load(x_ptr, rows, stride_x, cols, mask)
    w = tl.load(w_ptr + cols * stride_w, mask=cols < N, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    tl.store(rstd_ptr + rows, rstd, mask=live)
    store_rows(y_ptr, rows, cols, N, 1, x * rstd[:, None] * w[None, :], mask, INTERP_BF16)


@triton.jit
def _backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dx_ptr, partial_ptr, R, N, stride_dy, stride_x, stride_w,
                     BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, INTERP_BF16: tl.constexpr):
    """dx = rstd·(g - x̂·mean(g·x̂)) with g = dy·w and x̂ = x·rstd, rounded once; this program's
    ``Σ dy·x̂`` over its rows into its row of the fp32 partials."""
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(w_ptr + cols * stride_w, mask=cols < N, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(tl.program_id(0) * BLOCK_R, R, tl.num_programs(0) * BLOCK_R):
        rows, live, mask = _rows_tile(start, R, N, BLOCK_R, BLOCK_N)
        dy = _load(dy_ptr, rows, stride_dy, cols, mask)
        rstd = tl.load(rstd_ptr + rows, mask=live, other=0.0)[:, None]
        x_hat = _load(x_ptr, rows, stride_x, cols, mask) * rstd
        g = dy * w[None, :]
        dx = (g - x_hat * (tl.sum(g * x_hat, axis=1) / N)[:, None]) * rstd
        store_rows(dx_ptr, rows, cols, N, 1, dx, mask, INTERP_BF16)
        dw += tl.sum(dy * x_hat, axis=0)
    tl.store(partial_ptr + tl.program_id(0) * N + cols, dw, mask=cols < N)


@triton.jit
def _dweight_kernel(partial_ptr, dw_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
                    INTERP_BF16: tl.constexpr):
    """dweight's BLOCK_C columns: the P partial rows added in a fixed order, rounded once."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    inside = (cols < N)[None, :]
    total = tl.zeros((BLOCK_P, BLOCK_C), tl.float32)
    for start in range(0, P, BLOCK_P):
        parts = start + tl.arange(0, BLOCK_P)
        total += tl.load(partial_ptr + parts[:, None] * N + cols[None, :],
                         mask=(parts < P)[:, None] & inside, other=0.0)
    store_rows(dw_ptr, tl.zeros((1,), tl.int64), cols, 0, 1, tl.sum(total, axis=0)[None, :], inside, INTERP_BF16)


def settings(n: int, dtype: torch.dtype) -> dict:
    """The forward's and backward's tile and warps for rows of ``n`` elements of ``dtype`` (the
    module's docstring says why)."""
    block_n = next_power_of_2(max(n, 1))   # N = 0 launches nothing, but its plan has settings
    block_r = max(1, ROW_ELEMENTS // block_n)
    vector = 16 // dtype.itemsize
    return dict(BLOCK_R=block_r, BLOCK_N=block_n,
                num_warps=min(MAX_WARPS, max(1, block_r * block_n // (vector * WAVE_LANES))))


def backward_programs(rows: int, tile: dict) -> int:
    """How many programs the backward runs, each with a row of partial sums: one per BLOCK_R
    rows up to :data:`PARTIAL_PROGRAMS`."""
    return min(cdiv(rows, tile["BLOCK_R"]), PARTIAL_PROGRAMS)


def launches(rows: int, n: int, x_dtype: torch.dtype, w_dtype: torch.dtype) -> dict:
    """``kernel.run``'s keyword arguments for the three launches on ``rows`` rows of ``n``:
    ``forward``, ``backward`` and ``dweight``; ``programs``, the backward's."""
    tile = settings(n, x_dtype)
    programs = backward_programs(rows, tile)
    rows_tile = dict(tile, INTERP_BF16=interp_bf16(x_dtype))
    return dict(forward=run_kwargs((cdiv(rows, tile["BLOCK_R"]),), rows_tile),
                backward=run_kwargs((programs,), rows_tile),
                dweight=run_kwargs((cdiv(n, DWEIGHT_SETTINGS["BLOCK_C"]),),
                                   dict(DWEIGHT_SETTINGS, INTERP_BF16=interp_bf16(w_dtype))),
                programs=programs)


def aot(dtype: torch.dtype = torch.bfloat16, n: int = 1024, backward: bool = False,
        weight_dtype: torch.dtype | None = None) -> AotKernel:
    """The forward's (or ``backward``'s) launch on :data:`AOT_ROWS` contiguous rows of ``n``
    ``dtype`` elements (a weight of ``weight_dtype``, ``dtype``'s by default), with
    :func:`settings`' tile, for an ahead-of-time compile (:func:`workbench.isa.compile.compile_aot`)."""
    pointers = {"w_ptr": pointer_type(weight_dtype or dtype), "rstd_ptr": "*fp32", "partial_ptr": "*fp32"}
    ints = dict(R=AOT_ROWS, N=n, stride_x=n, stride_w=1)
    if backward:
        return aot_launch(_backward_kernel, dtype, settings(n, dtype), dict(ints, stride_dy=n),
                          dict(INTERP_BF16=False), pointers)
    return aot_launch(_forward_kernel, dtype, settings(n, dtype), dict(ints, eps=1e-5),
                      dict(INTERP_BF16=False), pointers)
