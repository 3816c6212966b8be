"""RMSNorm's Triton kernels: the forward, the backward, and the backward's weight-gradient sum;
the first two also fuse the residual add that precedes a pre-norm model's norm (below).

Why one program holds whole rows: a row's rstd needs the sum of its squares before any y of it
can be written, so a program that loads the row once (BLOCK_N = N rounded up to a power of 2)
reads x once and writes y once; the backward likewise needs the row's ``Σ dy·w·x̂`` before dx.
The cost is a bound on N, :data:`MAX_N`: the row lives in one program's registers (16 warps,
16 elements a lane of each of x, dy and the accumulators on AMD's 64-lane waves), and at that
width the ISA test finds no spills on gfx942 and gfx950, the forward at 8 waves per SIMD and the
backward at 5 (4 on gfx942 for fp32 x with bf16 dy, and on both with the residual add's dh and
db); a wider row is refused rather than run uncompiled by any test.

y (and so dy) may have a dtype of its own (the caller's ``out_dtype``): the training step's
residual stream is fp32 and its norms write the bf16 its matmuls read. Each kernel computes in fp32
and rounds once, to the element type of the tensor it writes: y's in the forward, dx's (x's) in the
backward (and db's, the residual's: below), the weight's in the weight-gradient sum; the
interpreter's bf16 rounding by hand (``INTERP_BF16``) is on where a tensor a launch writes is
bf16, and :func:`~kernels.triton_support.stored_as` applies it to bf16 buffers only.

The settings (:func:`settings`, shared by the launches and :func:`aot`, so the ISA tests compile
what a call runs): BLOCK_N, the next power of 2 of N; BLOCK_R, rows per program, so that a program
of a narrow norm still moves :data:`ROW_ELEMENTS` elements (one program per row of 33 columns would
leave most of a wave's lanes idle); num_warps, so that each 64-lane wave's thread holds one 16-byte
vector of the rows' wider dtype (x's or y's) per tile (8 bf16/fp16 or 4 fp32 elements): the widest
global access, and no more lanes than that, or a thread would get 8 or 4 bytes and its loads would
narrow. Where x and y differ the narrower one moves 8 bytes a thread (:func:`settings` says why).
``tests/test_rms_norm_isa.py`` checks it on gfx942 and gfx950 at N = 1024 and 4096, for bf16 x,
weight and y, bf16 x and y with an fp32 weight, fp32 all three, and the training step's under
autocast (its residual stream stays fp32, the embedding's dtype: fp32 x and weight, bf16 y and dy):
forward and backward read and write x, y, dy and dx 16 bytes per thread, but the training step's
bf16 y and dy 8 bytes (4 elements, as fp32 x's 16); no spills, no scratch, no atomics,
:data:`WAVES_PER_SIMD` waves per SIMD; the backward's loop over rows moves only dy, x, rstd and dx.
What crosses LDS: each row's sum across warps (4 bytes a thread); an fp32 weight beside 16-bit x,
changed from its 16-byte load's layout (4 a thread) to the tile's (8 a thread), once per program;
the backward's fp32 partial row, changed to its store's layout, once per program; beside fp32 x
(bf16 y or not), nothing else.

The residual add (:func:`kernels.add_rms_norm`): with ``ADD`` the forward loads a residual b
(any float dtype) beside x, normalizes h = x + b, added in fp32, and stores h, as torch's sum of
fp32 x and b (the fused path's x is fp32; a 16-bit x is added by torch, which rounds h first);
with ``HAS_DH`` the backward adds h's gradient from its other consumer (the next residual add's:
every block's norm has one, the final norm none) to the norm's dx before its one rounding, and
with ``STORE_DB`` also stores that sum rounded to b's dtype, b's gradient (where it is x's
dtype, x's gradient serves both). Where h's two gradients would be added by autograd and b's
cast from fp32, passes of their own over the rows, the backward's loop moves dh in and db out
beside dx. The residual is never wider than fp32 x, so the tile is x's and y's as above:
``tests/test_rms_norm_isa.py`` compiles both launches at the training step's dtypes (fp32 x,
weight, h, dh and dx, bf16 b, y, dy and db) at N = 1024 and 4096: the fp32 rows move 16 bytes
a thread and the bf16 ones 8, LDS only for the row sum, no spills, no scratch, no atomics,
:data:`WAVES_PER_SIMD` waves per SIMD; at N = MAX_N the forward keeps 8 waves per SIMD, the
backward 4 on gfx942 and gfx950.

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
def _forward_kernel(x_ptr, b_ptr, w_ptr, y_ptr, h_ptr, rstd_ptr, R, N, stride_x, stride_b, stride_w, eps,
                    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, ADD: tl.constexpr, INTERP_BF16: tl.constexpr):
    """y = h·rstd·w in fp32, rounded once; rstd = rsqrt(mean(h²) + eps) kept for the backward. h is
    x, or with ``ADD`` x + b added in fp32 and stored (fp32, as torch's sum of fp32 x and b)."""
    cols = tl.arange(0, BLOCK_N)
    rows, live, mask = _rows_tile(tl.program_id(0) * BLOCK_R, R, N, BLOCK_R, BLOCK_N)
    x = _load(x_ptr, rows, stride_x, cols, mask)
    if ADD:
        x += _load(b_ptr, rows, stride_b, cols, mask)
        store_rows(h_ptr, rows, cols, N, 1, x, mask, INTERP_BF16)
    w = tl.load(w_ptr + cols * stride_w, mask=cols < N, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    tl.store(rstd_ptr + rows, rstd, mask=live)
    store_rows(y_ptr, rows, cols, N, 1, x * rstd[:, None] * w[None, :], mask, INTERP_BF16)


@triton.jit
def _backward_kernel(dy_ptr, x_ptr, w_ptr, rstd_ptr, dh_ptr, dx_ptr, db_ptr, partial_ptr, R, N,
                     stride_dy, stride_x, stride_dh, stride_w, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                     HAS_DH: tl.constexpr, STORE_DB: tl.constexpr, INTERP_BF16: tl.constexpr):
    """dx = rstd·(g - x̂·mean(g·x̂)) with g = dy·w and x̂ = x·rstd, plus dh (``HAS_DH``: the
    gradient x, the residual add's h, gets from its other consumer), rounded once; with
    ``STORE_DB`` the same sum rounded once more, to the residual's dtype (db); this program's
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
        if HAS_DH:
            dx += _load(dh_ptr, rows, stride_dh, cols, mask)
        store_rows(dx_ptr, rows, cols, N, 1, dx, mask, INTERP_BF16)
        if STORE_DB:
            store_rows(db_ptr, rows, cols, N, 1, dx, mask, INTERP_BF16)
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


def settings(n: int, x_dtype: torch.dtype, y_dtype: torch.dtype | None = None) -> dict:
    """The forward's and backward's tile and warps for rows of ``n`` elements of ``x_dtype`` whose
    y (and so dy) is ``y_dtype`` (x's by default); the module's docstring says why these.

    Where x and y differ (the training step's fp32 x and bf16 y), a thread holds the wider dtype's
    16 bytes (4 elements), so the 16-bit side moves 8 bytes a thread. The narrower dtype's 16 bytes
    (8 elements, half the warps) would move y and dy 16 bytes a thread, but Triton's fp32 accesses
    stay at 4 elements a thread, and an fp32 tile changes between that layout and the tile's 8
    through LDS: two 16-byte LDS writes and reads a thread in the forward and, once per row, in
    the backward's loop (``tests/test_rms_norm_isa.py`` compiles both). Per 8 elements of a row the backward's loop
    would issue 9 memory instructions (dy's load, x's two, dx's two stores, two LDS writes, two
    reads) where it issues 6 (two threads' dy, x and dx); a wave's 8-byte accesses still cover 512
    contiguous bytes."""
    block_n = next_power_of_2(max(n, 1))   # N = 0 launches nothing, but its plan has settings
    block_r = max(1, ROW_ELEMENTS // block_n)
    vector = 16 // max(x_dtype.itemsize, (y_dtype or x_dtype).itemsize)
    return dict(BLOCK_R=block_r, BLOCK_N=block_n,
                num_warps=min(MAX_WARPS, max(1, block_r * block_n // (vector * WAVE_LANES))))


def backward_programs(rows: int, tile: dict) -> int:
    """How many programs the backward runs, each with a row of partial sums: one per BLOCK_R
    rows up to :data:`PARTIAL_PROGRAMS`."""
    return min(cdiv(rows, tile["BLOCK_R"]), PARTIAL_PROGRAMS)


def stores_db(x_dtype: torch.dtype, residual_dtype: torch.dtype | None) -> bool:
    """Whether the backward writes the residual's gradient apart from dx (``STORE_DB``): where a
    residual was added and its dtype is not x's (of x's dtype, db is dx itself)."""
    return residual_dtype is not None and residual_dtype != x_dtype


def launches(rows: int, n: int, x_dtype: torch.dtype, w_dtype: torch.dtype, y_dtype: torch.dtype,
             residual_dtype: torch.dtype | None = None) -> dict:
    """``kernel.run``'s keyword arguments for the three launches on ``rows`` rows of ``n``, y (and
    dy) of ``y_dtype``, a residual of ``residual_dtype`` added to x first (None: none):
    ``forward``; ``backward``, a pair: without dh and with it (h's other gradient, which a call
    passes or not); ``dweight``; ``programs``, the backward's. A launch rounds by hand in the
    interpreter where a tensor it writes is bf16: y; dx (x's dtype) or db (the residual's);
    dweight (the weight's). One flag serves dx and db: :func:`~kernels.triton_support.stored_as`
    rounds only into a bf16 buffer."""
    tile = settings(n, x_dtype, y_dtype)
    programs = backward_programs(rows, tile)
    add = residual_dtype is not None
    backward = dict(tile, STORE_DB=stores_db(x_dtype, residual_dtype),
                    INTERP_BF16=interp_bf16(x_dtype) or interp_bf16(residual_dtype))
    return dict(forward=run_kwargs((cdiv(rows, tile["BLOCK_R"]),),
                                   dict(tile, ADD=add, INTERP_BF16=interp_bf16(y_dtype))),
                backward=tuple(run_kwargs((programs,), dict(backward, HAS_DH=has_dh)) for has_dh in (False, True)),
                dweight=run_kwargs((cdiv(n, DWEIGHT_SETTINGS["BLOCK_C"]),),
                                   dict(DWEIGHT_SETTINGS, INTERP_BF16=interp_bf16(w_dtype))),
                programs=programs)


def aot(dtype: torch.dtype = torch.bfloat16, n: int = 1024, backward: bool = False,
        weight_dtype: torch.dtype | None = None, out_dtype: torch.dtype | None = None,
        residual_dtype: torch.dtype | None = None) -> AotKernel:
    """The forward's (or ``backward``'s) launch on :data:`AOT_ROWS` contiguous rows of ``n``
    ``dtype`` elements (a weight of ``weight_dtype``, y and dy of ``out_dtype``, each ``dtype``'s by
    default), with :func:`settings`' tile, for an ahead-of-time compile
    (:func:`workbench.isa.compile.compile_aot`). With ``residual_dtype``, the fused residual add's
    launch, as a block's norm runs it: the forward adds a residual of that dtype and stores h (x's
    dtype); the backward adds dh (x's dtype) and stores db in the residual's dtype where it is
    not x's."""
    add = residual_dtype is not None
    pointers = {"w_ptr": pointer_type(weight_dtype or dtype), "rstd_ptr": "*fp32", "partial_ptr": "*fp32",
                "dy_ptr" if backward else "y_ptr": pointer_type(out_dtype or dtype),
                "db_ptr" if backward else "b_ptr": pointer_type(residual_dtype or dtype)}
    ints = dict(R=AOT_ROWS, N=n, stride_x=n, stride_w=1)
    tile = settings(n, dtype, out_dtype)
    if backward:
        return aot_launch(_backward_kernel, dtype, tile, dict(ints, stride_dy=n, stride_dh=n),
                          dict(HAS_DH=add, STORE_DB=stores_db(dtype, residual_dtype), INTERP_BF16=False), pointers)
    return aot_launch(_forward_kernel, dtype, tile, dict(ints, stride_b=n, eps=1e-5),
                      dict(ADD=add, INTERP_BF16=False), pointers)
