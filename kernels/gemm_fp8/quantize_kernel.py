"""The fused FP8 quantize kernels: read x once, write q (and the transposed copy q_t) and scales.

The public op is :func:`kernels.gemm_fp8.quantize` (:mod:`.quantize`); this module launches.

Why a kernel: quantization is memory-bound (2 bytes read, 1 or 2 written per element of a
bf16 x) and runs on every activation, gradient and weight of an FP8 training step, so its
traffic decides whether the FP8 GEMM's win survives (:func:`bytes_moved`). The wgrad GEMM
needs x quantized along the *other* axis (its reduction runs over the tokens), so the
transposed copy is produced from the same tile in the same pass instead of a second
read of x.

One program owns a 128 x 128 tile of x (``TILE``): the block granularities' groups
(1x128, 128x128, MX's 1x32) and their transposed twins (128x1, 32x1) all lie inside a
tile, so their amax is a reduction over registers, and x is read once. ``tensor`` and
``row`` need an amax over the whole tensor or row, which no tile sees: they take two
passes, an amax pass and the cast pass, so x is read twice. ``tensor``'s amax pass
(:func:`_tensor_partials_kernel`) is a grid of at most ``PARTIALS`` (1024) programs, each
scanning every P-th tile and writing one partial max, and each program of the cast reduces
those partials itself (at most 4 KiB read against its tile's 32 KiB of bf16 x: 1/8,
1/16 of fp32) and computes the scale: two launches and no torch op per quantize, where a torch
reduction of per-tile maxima came between them before (and :func:`tensor_amax` /
:func:`tensor_scale` are the amax pass and one launch that reduces the partials, where a torch
reduction and :func:`.formats.scale_of`'s four torch ops were). ``row``'s amax pass
(:func:`_amax_kernel`, one max per row and tile column, and column and tile row) is reduced and
made scales by one small launch (:func:`_row_scales_kernel`): three device ops per quantize
(``tests/test_host_overhead_fp8.py``), where torch ops made
the scales before, each a launch on a GPU's host (:mod:`workbench.harness.device_ops`). No
atomics: the partials are reduced by whoever reads them, in any order (a max is exact), and an
atomic max would not save the second read: no element can be cast before its group's amax is known.

Division: every ``amax / fp8_max`` and ``x / scale`` is ``tl.math.div_rn``, IEEE round-to-nearest
on every target. Triton's ``/`` is that on AMD, but on NVIDIA it compiles to ``div.full.f32`` (up to
2 ulp off; a division by a constexpr to ``div.approx.f32``), so a scale could be an ulp off torch's,
and the round-up rule, which reads the quotient's bits, a whole binade off
(``tests/test_fp8_divisions.py`` compiles every FP8 scaling kernel for sm_90 and gfx942). So the
kernels give the CPU reference's bits on every GPU. torch itself, on a GPU, divides by a Python
float through its reciprocal (:func:`.formats.scale_of`'s ``amax / fp8_max``; PyTorch's
``aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu``: "may lose one bit of precision"), so the
PyTorch reference run on a GPU may differ from them by an ulp in a scale.

Rounding: the kernel rounds ``x / scale`` to the FP8 grid itself, in fp32 arithmetic
(:func:`kernels.triton_support.round_to_fp8`), and then converts a value the format holds exactly. The
hardware's conversion would round to nearest even too (on a GPU the convert is exact
here); Triton's interpreter does not (its fp32 -> fp8 conversion drops the carry of a
mantissa that rounds up into the next binade, and rounds ties away from zero), and the
CPU check is bit-exact against :mod:`.quantize_ref` only because of this. The rounding
costs a few integer and two fp32 adds per element in a memory-bound kernel.

What gfx942 and gfx950 make of it (Triton 3.9, ``tests/test_fp8_quantize_isa.py``): per
thread and tile, x read as four 16-byte buffer loads, q and q_t stored as two 16-byte stores
each, no spills; the transposed copy crosses lanes through 16 KiB of LDS, written two bytes
and read one byte at a time (16-bit LDS writes, 8-bit LDS reads), the narrow-LDS pattern of
an 8-bit layout conversion. Whether that LDS traffic or HBM bounds the kernel is for a GPU to say.
``mx32``'s round-up rule (``scale_rule="round_up"``, :func:`_round_up_exponent`: a division
by the format's max and a few integer operations on the quotient's bits, instead of the
amax's bits alone) compiles on gfx950 to the same loads, stores and LDS, with no spills.
Its scales written pre-shuffled (``PRESHUFFLED``, the mxfp8 recipe's on gfx950:
:mod:`kernels.mx_preshuffle`'s layout, so no shuffle runs before the GEMM) compile there
to the same loads, q stores and LDS, no spills and the same waves per SIMD; the scales are
still stored a byte at a time, by two more byte stores (the zeros of the half chunk past
the last tile, one per orientation).
The cast with a given scale and its tile's max (``AMAX``, delayed scaling's) adds one
4-byte store per program and a cross-warp max through 32 bytes of LDS: no spills, 8 waves
per SIMD on gfx942 as without it, 7 instead of 8 on gfx950 (per-row or per-column maxima
instead moved more through LDS and took more registers).
The casts after ``tensor``'s and ``row``'s amax pass (tensor's computing its one scale from the
amax, row's reading the scales :func:`_row_scales_kernel` made) run at 8 waves per SIMD with no
spills on both, with the transposed copy at 7 on gfx950; tensor's reduction of the partials costs
each thread two 4-byte loads (1024 partials over 512 lanes, beside x's four 16-byte ones) and a
cross-warp max through 32 bytes of LDS. tensor's amax pass reads x as four 16-byte buffer loads
per thread and tile of its loop, writes one 4-byte partial per program after a cross-warp max
through 32 bytes of LDS, and runs at 7 waves per SIMD, no spills, on both; with delayed scaling's
amax history as its ``unless`` (16 entries), one 4-byte load more per thread, the same waves.

Inputs must be finite: a NaN or inf in x gives an undefined scale for its group (checking
would cost a host sync per call); :func:`quantize_reference` states the finite semantics.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import plans
from ..mx_preshuffle import preshuffled_mask, preshuffled_offsets, preshuffled_shape
from ..outputs import new_output
from ..registry import AotKernel
from ..triton_support import (aot_launch, cdiv, fp8_grid, next_power_of_2, pointer_type, round_to_fp8,
                              run_args, run_kwargs)
from .quantize_ref import TILE, group_shape, mx_emax, scale_shape

NUM_WARPS = 8   # 512 threads per 128 x 128 tile: 32 fp32 values each


@triton.jit
def _mx_exponent(amax, EMAX: tl.constexpr):
    """floor(log2 amax) - EMAX clamped to [-127, 127] (amax 0 or subnormal: -127), from amax's
    exponent bits, as :func:`kernels.microscaling.shared_exponent`."""
    # exercise begin: e8m0
    binade = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    return tl.minimum(tl.maximum(binade - EMAX, -127), 127)
    # exercise end


@triton.jit
def _round_up_exponent(amax, FMAX: tl.constexpr):
    """ceil(log2(amax / FMAX)) clamped to [-127, 127] (amax 0: -127), the smallest exponent
    that saturates nothing, from the bits of the fp32 quotient, as
    :func:`kernels.microscaling.round_up_exponent`: its exponent field, one more where a
    mantissa bit is set (a normal quotient above its binade's power of two, or a subnormal
    one above 2^-127, half the smallest normal)."""
    bits = tl.math.div_rn(amax, FMAX).to(tl.int32, bitcast=True)
    field = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    up = (mantissa > 0) & ((field > 0) | (mantissa > 0x400000))
    return tl.minimum(field + up.to(tl.int32) - 127, 127)


@triton.jit
def _pow2(exponent):
    """2^exponent (integer in [-126, 127]) built from its bits: exact."""
    return ((exponent + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def quantized(y, FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr):
    """y saturated to +-FMAX and rounded to nearest even on the FP8 grid (still fp32): the
    cast every quantize kernel ends with (the grouped one too, :mod:`kernels.moe.grouped_gemm_fp8`)."""
    return round_to_fp8(tl.minimum(tl.maximum(y, -FMAX), FMAX), MANT, EMIN)


@triton.jit
def scale_of_amax(amax, FMAX: tl.constexpr):
    """The dequantization scale of a group whose largest |value| is ``amax``: amax / FMAX, 1
    for an all-zero group (:func:`kernels.gemm_fp8.formats.scale_of`'s rule; the grouped
    kernel's too, :mod:`kernels.moe.grouped_gemm_fp8.quantize_kernel`)."""
    return tl.where(amax > 0, tl.math.div_rn(amax, FMAX), 1.0)


@triton.jit
def max_of(maxima_ptr, count, BLOCK: tl.constexpr):
    """The max of the ``count`` floats at maxima_ptr (>= 0: maxima of |x|), 0 for none: BLOCK at
    a time, a lane's running max, one reduction across the lanes at the end (a max is exact in
    any order: bitwise any other reduction's). Delayed scaling's kernels reduce a cast's tile
    maxima with it (:mod:`kernels.fp8.history_ops`)."""
    i = tl.arange(0, BLOCK)
    running = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, count, BLOCK):
        running = tl.maximum(running, tl.load(maxima_ptr + start + i, mask=start + i < count, other=0.0))
    return tl.max(running)


@triton.jit
def _grouped_along_k(x, ax, BM: tl.constexpr, BK: tl.constexpr, G: tl.constexpr,
                     FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                     MX: tl.constexpr, EMAX: tl.constexpr, ROUND_UP: tl.constexpr):
    """Groups of 1 x G along the tile's second axis: (quantized tile, scale per group);
    MX's exponent by the OCP rule, or with ROUND_UP the round-up rule (``scale_rule``)."""
    amax = tl.max(tl.reshape(ax, (BM, BK // G, G)), axis=2)
    if MX:
        if ROUND_UP:
            exponent = _round_up_exponent(amax, FMAX)
        else:
            exponent = _mx_exponent(amax, EMAX)
        y = tl.reshape(x, (BM, BK // G, G)) * _pow2(-exponent)[:, :, None]
        scale = (exponent + 127).to(tl.uint8)
    else:
        # exercise begin: group_scale
        scale = tl.where(amax > 0, tl.math.div_rn(amax, FMAX), 1.0)
        y = tl.math.div_rn(tl.reshape(x, (BM, BK // G, G)), scale[:, :, None])
        # exercise end
    return tl.reshape(quantized(y, FMAX, MANT, EMIN), (BM, BK)), scale


@triton.jit
def _store_groups(s_ptr, scale, rows, groups, ROWS, GROUPS, stride_r, stride_g, last,
                  PRESHUFFLED: tl.constexpr):
    """A tile's scales (one per row of ``rows`` and group of ``groups``) of a (ROWS, GROUPS)
    tensor: row-major at (stride_r, stride_g), or with PRESHUFFLED in the pre-shuffled
    layout (:mod:`kernels.mx_preshuffle`; stride_r: its stripes'), padding included.
    A row or block past x's edge reads zeros, so its byte is 0 (amax 0 under either e8m0
    rule), the zero :func:`~kernels.mx_preshuffle.preshuffle` fills a partial stripe
    and chunk with; the ``last`` tile along the groups also writes the zeros of the half
    chunk past it (a tile holds half a chunk), so every byte is written and none twice."""
    if PRESHUFFLED:
        tl.store(s_ptr + preshuffled_offsets(rows, groups, stride_r), scale,
                 mask=preshuffled_mask(rows, groups, ROWS, GROUPS))
        if last:
            past = groups + groups.shape[0]
            tl.store(s_ptr + preshuffled_offsets(rows, past, stride_r), tl.zeros_like(scale),
                     mask=preshuffled_mask(rows, past, ROWS, GROUPS))
    else:
        tl.store(s_ptr + rows.to(tl.int64)[:, None] * stride_r + groups[None, :] * stride_g, scale,
                 mask=(rows[:, None] < ROWS) & (groups[None, :] < GROUPS))


@triton.jit
def _quantize_kernel(x_ptr, q_ptr, s_ptr, qt_ptr, st_ptr, amax_ptr, M, K,
                     stride_xm, stride_xk, stride_qm, stride_qk, stride_sm, stride_sk,
                     stride_qtk, stride_qtm, stride_stk, stride_stm,
                     FMAX: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr, EMAX: tl.constexpr,
                     MODE: tl.constexpr, G: tl.constexpr, MX: tl.constexpr, ROUND_UP: tl.constexpr,
                     TRANSPOSE: tl.constexpr, AMAX: tl.constexpr, FROM_AMAX: tl.constexpr,
                     PRESHUFFLED: tl.constexpr, PARTIALS: tl.constexpr, BLOCK: tl.constexpr):
    """MODE 0: one number per row of q read at s_ptr and per column of x (row of q_t) at st_ptr
    (tensor: one for all, stride 0), the scales; with FROM_AMAX (tensor) the amax pass's partial
    maxima at s_ptr instead (:func:`_tensor_partials_kernel`: min(tiles, PARTIALS) of them, the
    tiles being this grid's), which every program reduces to the tensor's amax and makes its scale
    (:func:`scale_of_amax`; q_t is then q.T), and the first program writes at amax_ptr (no
    pointer of its own: the cast without it keeps its arguments and occupancy,
    tests/test_fp8_quantize_isa.py);
    1: 1 x G groups (q) and G x 1 groups (q_t) found in the tile (MX: e8m0, by the round-up
    rule with ROUND_UP; with PRESHUFFLED both scale tensors pre-shuffled, :func:`_store_groups`);
    2: one G x G group.
    AMAX: also the tile's max |x| to amax_ptr[pid_m, pid_k] (a row-major grid of tiles)."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    cols = pid_k * BLOCK + tl.arange(0, BLOCK)
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    inside = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols64[None, :] * stride_xk,
                mask=inside, other=0.0).to(tl.float32)
    ax = tl.abs(x)
    if AMAX:
        tl.store(amax_ptr + pid_m * tl.num_programs(1) + pid_k, tl.max(ax))
    if MODE == 0:
        if FROM_AMAX:   # tensor: the scale of its amax, one number
            # the amax pass's count, as partial_count makes it on the host (one per tile of this grid,
            # at most PARTIALS); not an argument, whose value Triton specializes (1, multiples of 16):
            # more binaries per shape. tests/test_fp8_tensor_amax.py's cast test fails if they disagree
            partials = tl.minimum(tl.num_programs(0) * tl.num_programs(1), PARTIALS)
            one = scale_of_amax(max_of(s_ptr, partials, PARTIALS), FMAX)
            if pid_m == 0:
                if pid_k == 0:
                    tl.store(amax_ptr, one)
            q = quantized(tl.math.div_rn(x, one), FMAX, MANT, EMIN)
        else:
            scale = tl.load(s_ptr + rows64 * stride_sm, mask=rows < M, other=1.0)
            q = quantized(tl.math.div_rn(x, scale[:, None]), FMAX, MANT, EMIN)
    elif MODE == 1:
        q, scale = _grouped_along_k(x, ax, BLOCK, BLOCK, G, FMAX, MANT, EMIN, MX, EMAX, ROUND_UP)
        groups = pid_k * (BLOCK // G) + tl.arange(0, BLOCK // G)
        _store_groups(s_ptr, scale, rows, groups, M, tl.cdiv(K, G), stride_sm, stride_sk,
                      pid_k == tl.num_programs(1) - 1, PRESHUFFLED)
    else:
        amax = tl.max(tl.max(ax, axis=1), axis=0)
        scale = scale_of_amax(amax, FMAX)
        q = quantized(tl.math.div_rn(x, scale), FMAX, MANT, EMIN)
        tl.store(s_ptr + pid_m * stride_sm + pid_k * stride_sk, scale)
    tl.store(q_ptr + rows64[:, None] * stride_qm + cols64[None, :] * stride_qk,
             q.to(q_ptr.dtype.element_ty), mask=inside)
    if TRANSPOSE:
        if MODE == 0:
            if FROM_AMAX:   # the same one scale: q.T
                q_t = tl.trans(q)
            else:
                scale_t = tl.load(st_ptr + cols64 * stride_stk, mask=cols < K, other=1.0)
                q_t = tl.trans(quantized(tl.math.div_rn(x, scale_t[None, :]), FMAX, MANT, EMIN))
        elif MODE == 1:   # G x 1 groups of x are 1 x G groups of x.T
            q_t, scale_t = _grouped_along_k(tl.trans(x), tl.trans(ax), BLOCK, BLOCK, G,
                                            FMAX, MANT, EMIN, MX, EMAX, ROUND_UP)
            groups = pid_m * (BLOCK // G) + tl.arange(0, BLOCK // G)
            _store_groups(st_ptr, scale_t, cols, groups, K, tl.cdiv(M, G), stride_stk, stride_stm,
                          pid_m == tl.num_programs(0) - 1, PRESHUFFLED)
        else:             # the same group: q.T
            q_t = tl.trans(q)
        tl.store(qt_ptr + cols64[:, None] * stride_qtk + rows64[None, :] * stride_qtm,
                 q_t.to(qt_ptr.dtype.element_ty), mask=(cols[:, None] < K) & (rows[None, :] < M))


@triton.jit
def _amax_kernel(x_ptr, rows_ptr, cols_ptr, M, K, stride_xm, stride_xk,
                 stride_rm, stride_rk, stride_cm, stride_ck,
                 COLS: tl.constexpr, BLOCK: tl.constexpr):
    """The first pass of ``row``: per tile, the max |x| of each of its rows (and, with COLS, of
    each of its columns), reduced over tiles by :func:`_row_scales_kernel`."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_m * BLOCK + tl.arange(0, BLOCK)
    cols = pid_k * BLOCK + tl.arange(0, BLOCK)
    inside = (rows[:, None] < M) & (cols[None, :] < K)
    ax = tl.abs(tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm
                        + cols.to(tl.int64)[None, :] * stride_xk, mask=inside, other=0.0).to(tl.float32))
    tl.store(rows_ptr + rows * stride_rm + pid_k * stride_rk, tl.max(ax, axis=1), mask=rows < M)
    if COLS:
        tl.store(cols_ptr + pid_m * stride_cm + cols * stride_ck, tl.max(ax, axis=0), mask=cols < K)


@triton.jit
def _tensor_partials_kernel(x_ptr, partials_ptr, unless_ptr, M, K, stride_xm, stride_xk,
                            UNLESS: tl.constexpr, UNLESS_BLOCK: tl.constexpr, BLOCK: tl.constexpr):
    """The first pass of ``tensor``: program p of P writes at partials_ptr[p] the max |x| of the
    tiles p, p + P, p + 2P, ... (row-major), so a grid of P = min(tiles, PARTIALS) programs
    leaves P numbers, which the kernel that needs the amax reduces itself (:func:`max_of`,
    :func:`kernels.fp8.history_ops.scale`). UNLESS (0 for none): where any of the UNLESS numbers
    at unless_ptr (one masked load of UNLESS_BLOCK, :func:`_unless_constants`) is > 0 no tile is
    read (every partial 0): one number (the public :func:`tensor_amax`'s), or delayed scaling's
    amax history, whose entries are amaxes (>= 0), so that its max need not be reduced before."""
    p = tl.program_id(0)
    tiles_k = tl.cdiv(K, BLOCK)
    tiles = tl.cdiv(M, BLOCK) * tiles_k
    if UNLESS:   # none where an entry at unless_ptr is > 0
        i = tl.arange(0, UNLESS_BLOCK)
        tiles = tl.where(tl.max(tl.load(unless_ptr + i, mask=i < UNLESS, other=0.0)) > 0, 0, tiles)
    amax = tl.zeros((BLOCK, BLOCK), tl.float32)
    for t in range(p, tiles, tl.num_programs(0)):
        rows = (t // tiles_k) * BLOCK + tl.arange(0, BLOCK)
        cols = (t % tiles_k) * BLOCK + tl.arange(0, BLOCK)
        inside = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + cols.to(tl.int64)[None, :] * stride_xk,
                    mask=inside, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    tl.store(partials_ptr + p, tl.max(amax))


@triton.jit(do_not_specialize=["count"])   # count: a shape's (partial_count), one binary for all
def _tensor_amax_kernel(partials_ptr, out_ptr, count, FMAX: tl.constexpr, SCALE: tl.constexpr,
                        PARTIALS: tl.constexpr):
    """The amax pass's ``count`` partial maxima reduced to the tensor's amax, written at out_ptr
    as it is or, with SCALE, as its scale (:func:`scale_of_amax`): one program."""
    amax = max_of(partials_ptr, count, PARTIALS)
    if SCALE:
        amax = scale_of_amax(amax, FMAX)
    tl.store(out_ptr, amax)


@triton.jit
def _row_scales_kernel(rows_ptr, cols_ptr, s_ptr, st_ptr, M, K, TK, TM,
                       FMAX: tl.constexpr, COLS: tl.constexpr, BLOCK: tl.constexpr, BT: tl.constexpr):
    """``row``'s scales from the amax pass's maxima, one launch: per row of x the max of its TK
    tiles' maxima (rows_ptr: (M, TK) row-major), and with COLS per column of x the max of its
    TM tiles' (cols_ptr: (TM, K)), each made a scale (:func:`scale_of_amax`) and written to s_ptr
    (M) and st_ptr (K). Program i owns rows (and columns) [i BLOCK, (i + 1) BLOCK)."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    idx64 = idx.to(tl.int64)
    amax = tl.zeros((BLOCK,), tl.float32)
    for j in range(0, TK, BT):
        t = j + tl.arange(0, BT)
        part = tl.load(rows_ptr + idx64[:, None] * TK + t[None, :], mask=(idx[:, None] < M) & (t[None, :] < TK),
                       other=0.0)
        amax = tl.maximum(amax, tl.max(part, axis=1))
    tl.store(s_ptr + idx64, scale_of_amax(amax, FMAX), mask=idx < M)
    if COLS:
        amax_t = tl.zeros((BLOCK,), tl.float32)
        for i in range(0, TM):
            amax_t = tl.maximum(amax_t, tl.load(cols_ptr + i * K + idx64, mask=idx < K, other=0.0))
        tl.store(st_ptr + idx64, scale_of_amax(amax_t, FMAX), mask=idx < K)


def format_constants(dtype: torch.dtype) -> dict:
    """:func:`quantized`'s constexprs (and MX's EMAX) for an FP8 dtype."""
    info = torch.finfo(dtype)
    return dict(FMAX=float(info.max), **fp8_grid(dtype), EMAX=mx_emax(dtype))


# The most partial maxima tensor's amax pass leaves (:func:`_tensor_partials_kernel`'s programs): a
# chosen value (whether that many keeps HBM busy is for a GPU to measure), few
# enough that each cast program's read of all of them
# (at most 4 KiB) stays small against its tile (32 KiB of bf16 x: 1/8; 1/16 of fp32 x)
PARTIALS = 1024
_TENSOR_AMAX_WARPS = 4   # _tensor_amax_kernel's: one program reads the PARTIALS


def partial_count(m: int, k: int) -> int:
    """How many partial maxima tensor's amax pass leaves on x (m, k): one per tile, at most PARTIALS.
    The cast computes the same count from its grid (:func:`_quantize_kernel`'s FROM_AMAX), so the
    two must agree (``tests/test_fp8_tensor_amax.py``'s cast test fails where they do not)."""
    return min(cdiv(m, TILE) * cdiv(k, TILE), PARTIALS)


def _unless_constants(unless: int) -> dict:
    """The amax pass's constexprs for ``unless`` numbers (0: none): the count and the power of two
    of lanes that load them (Triton's vectors are powers of two; the lanes past the count masked)."""
    return dict(UNLESS=unless, UNLESS_BLOCK=max(next_power_of_2(unless), 1))


class _AmaxPass:
    """tensor's amax pass for one kind of x (shape, strides, dtype, device) and of ``unless``
    (its number of entries, 0 for none), its launch worked out once: a call allocates the partial
    maxima, (:func:`partial_count`,) float32, and launches; all 0 where an entry of the float32
    ``unless`` is > 0 on the device (x then not read)."""

    def __init__(self, x: torch.Tensor, unless: int):
        m, k = x.shape
        self.shape = (partial_count(m, k),)
        self.launch = run_args(_tensor_partials_kernel, 3, (m, k, *x.stride()), self.shape,
                               dict(**_unless_constants(unless), BLOCK=TILE, num_warps=NUM_WARPS))

    def __call__(self, x: torch.Tensor, unless: torch.Tensor | None = None) -> torch.Tensor:
        partials = new_output(self.shape, torch.float32, x.device)
        _tensor_partials_kernel.run(x, partials, partials if unless is None else unless,
                                    *self.launch[0], **self.launch[1])
        return partials


class _TensorAmax(_AmaxPass):
    """:func:`tensor_amax`'s or :func:`tensor_scale`'s launches for one kind of call: the amax
    pass and one launch that reduces its partials to x's amax (0-d float32), or with
    ``fp8_dtype`` to its scale; no torch op, no host sync."""

    def __init__(self, x: torch.Tensor, unless: int, fp8_dtype: torch.dtype | None):
        super().__init__(x, unless)
        fmax = 1.0 if fp8_dtype is None else format_constants(fp8_dtype)["FMAX"]
        self.reduce = run_args(_tensor_amax_kernel, 2, self.shape, (1,), dict(
            FMAX=fmax, SCALE=fp8_dtype is not None, PARTIALS=PARTIALS, num_warps=_TENSOR_AMAX_WARPS))

    def __call__(self, x: torch.Tensor, unless: torch.Tensor | None = None) -> torch.Tensor:
        partials = super().__call__(x, unless)
        out = new_output((), torch.float32, x.device)
        _tensor_amax_kernel.run(partials, out, *self.reduce[0], **self.reduce[1])
        return out


_AMAXES = plans.PlanCache()
_PASSES = plans.PlanCache()


def _entries(unless: torch.Tensor | None) -> int:
    return 0 if unless is None else unless.numel()


def _tensor_amax(x: torch.Tensor, unless: torch.Tensor | None, fp8_dtype: torch.dtype | None) -> torch.Tensor:
    key = (x.shape, x.stride(), x.dtype, x.device, _entries(unless), fp8_dtype)
    return _AMAXES(key, _TensorAmax, x, _entries(unless), fp8_dtype)(x, unless)


def tensor_partials(x: torch.Tensor, unless: torch.Tensor | None = None) -> torch.Tensor:
    """tensor's amax pass alone: the partial maxima of a 2-D x, (:func:`partial_count`,) float32
    on x's device (none for an empty x), whose max is max |x|, for a kernel that reduces them with
    what else it reads (delayed scaling's scale, :func:`kernels.fp8.history_ops.scale`, reduces them
    with the amax history: one launch, where the partials' own reduction would be a second).
    ``unless`` (float32, contiguous, any number of numbers on x's device): where any is > 0 the
    pass reads nothing and every partial is 0. One launch, no host sync."""
    if x.numel() == 0:
        return new_output((0,), torch.float32, x.device)
    key = (x.shape, x.stride(), x.dtype, x.device, _entries(unless))
    return _PASSES(key, _AmaxPass, x, _entries(unless))(x, unless)


def tensor_amax(x: torch.Tensor, unless: torch.Tensor | None = None) -> torch.Tensor:
    """max |x| of a 2-D x (0-d float32 on x's device, 0 for an empty x; no host sync): two
    launches, the amax pass and the reduction of its partials. ``unless`` (float32, one number on
    the device): where it is > 0 the amax pass reads nothing and the result is 0, so a caller that
    needs the amax only in a case the device knows reads x only then (delayed scaling's empty
    history: :func:`tensor_partials` with the history itself)."""
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return _tensor_amax(x, unless, None)


def tensor_scale(x: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """The per-tensor scale (a 0-d float32 on x's device, no host sync; 1 for an empty x) of
    x (M, K), :func:`.formats.scale_of`'s rule (by IEEE division, as every scale here): the amax
    pass and one launch that reduces its partials and makes the scale; what the per-tensor grouped operands cast
    with (:mod:`kernels.moe.grouped_gemm_fp8.quantize`)."""
    if x.numel() == 0:
        return torch.ones((), dtype=torch.float32, device=x.device)
    return _tensor_amax(x, None, fp8_dtype)


class _Cast:
    """:func:`launch`'s kernels for one kind of call: x's shape, strides, dtype and device and
    the call's options. Everything that follows from them (the grid, the scale layouts, every
    scalar and constexpr of the amax pass and of the cast, packed by position:
    :func:`kernels.triton_support.run_args`) is worked out once, by the first such call; a later
    one allocates and launches."""

    def __init__(self, x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype, transpose: bool,
                 given: bool, amax: bool, scale_rule: str, preshuffled: bool):
        m, k = x.shape
        self.shape, self.fp8_dtype, self.transpose, self.given, self.amax = (m, k), fp8_dtype, transpose, given, amax
        self.tensor = granularity == "tensor"
        self.per_number = granularity in ("tensor", "row")   # scales from the amax pass (or given)
        self.mode = 0 if self.per_number else 2 if granularity == "block128x128" else 1
        self.scale_dtype = torch.uint8 if granularity == "mx32" else torch.float32
        self.scale_shapes = scale_shape(granularity, m, k), scale_shape(granularity, k, m)
        if preshuffled:   # contiguous too: a stripe's bytes, then the next stripe's
            self.scale_shapes = tuple(preshuffled_shape(*shape) for shape in self.scale_shapes)
        self.tiles = tiles = tile_maxima_shape(m, k)
        if self.per_number:
            # row's (M, 1) and (K, 1) scales have stride 1; tensor's amax pass's partials are read
            # whole by every program (stride 0)
            per_row = int(granularity == "row")
            s_strides, st_strides = (per_row, 0), (per_row if transpose else 0, 0)
        else:   # new contiguous outputs
            s_strides = (self.scale_shapes[0][1], 1)
            st_strides = (self.scale_shapes[1][1], 1) if self.mode == 1 else (0, 0)
        q_t_strides = (m, 1) if transpose else (k, 1)   # no transpose: q_t is q
        self.cast = run_args(_quantize_kernel, 6, (m, k, *x.stride(), k, 1, *s_strides, *q_t_strides, *st_strides),
                             tiles, dict(MODE=self.mode, G=group_shape(granularity, m, k)[1] if self.mode else TILE,
                                         MX=granularity == "mx32", ROUND_UP=scale_rule == "round_up",
                                         TRANSPOSE=transpose, AMAX=amax,
                                         FROM_AMAX=self.tensor and not given, PRESHUFFLED=preshuffled,
                                         PARTIALS=PARTIALS, BLOCK=TILE, num_warps=NUM_WARPS,
                                         **format_constants(fp8_dtype)))
        if self.tensor and not given:   # the amax pass, whose partials the cast reduces
            self.partials = _AmaxPass(x, unless=0)
        elif self.per_number and not given:   # row's amax pass and scale launch
            self.cols = transpose   # the amax pass's maxima per column of x too
            self.maxima_shapes = (m, tiles[1]), (tiles[0], k) if self.cols else (1, 1)
            self.maxima = run_args(_amax_kernel, 3, (m, k, *x.stride(), tiles[1], 1, self.maxima_shapes[1][1], 1),
                                   tiles, dict(COLS=self.cols, BLOCK=TILE, num_warps=NUM_WARPS))
            self.row_scales = run_args(_row_scales_kernel, 4, (m, k, tiles[1], tiles[0]),
                                       (cdiv(max(m, k if self.cols else 0), TILE),),
                                       dict(FMAX=format_constants(fp8_dtype)["FMAX"], COLS=self.cols,
                                            **ROW_SCALES_SETTINGS))

    def _maxima(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """row's amax pass: max |x| per row and tile column (M, TK), and with the transposed copy
        per column and tile row (TM, K) (else the first again, which neither kernel reads as
        columns: one allocation fewer per call)."""
        row_max = torch.empty(self.maxima_shapes[0], dtype=torch.float32, device=x.device)
        col_max = (torch.empty(self.maxima_shapes[1], dtype=torch.float32, device=x.device) if self.cols
                   else row_max)
        _amax_kernel.run(x, row_max, col_max, *self.maxima[0], **self.maxima[1])
        return row_max, col_max

    def __call__(self, x: torch.Tensor, scale: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        (m, k), device = self.shape, x.device
        q = new_output((m, k), self.fp8_dtype, device)
        q_t = new_output((k, m), self.fp8_dtype, device) if self.transpose else q
        scale_t = None
        if self.given:
            read = read_t = scale
            written = new_output(self.tiles, torch.float32, device) if self.amax else scale   # the tile maxima
        elif self.tensor:       # the amax pass's partials, which every program of the cast reduces to
            read = read_t = self.partials(x)   # the amax, whose scale the first one writes
            scale = scale_t = written = new_output((), torch.float32, device)
        elif self.per_number:   # row: one launch makes the scales from the maxima, the cast reads them
            row_max, col_max = self._maxima(x)
            scale = read = read_t = written = new_output(self.scale_shapes[0], torch.float32, device)
            if self.transpose:
                scale_t = read_t = new_output(self.scale_shapes[1], torch.float32, device)
            _row_scales_kernel.run(row_max, col_max, scale, read_t, *self.row_scales[0], **self.row_scales[1])
        else:                   # the cast writes the scales it finds where it reads a given one
            scale = read = written = new_output(self.scale_shapes[0], self.scale_dtype, device)
            if self.mode == 1:
                scale_t = new_output(self.scale_shapes[1], self.scale_dtype, device)
            read_t = scale if scale_t is None else scale_t
        _quantize_kernel.run(x, q, read, q_t, read_t, written, *self.cast[0], **self.cast[1])
        if self.given:
            return ((q, q_t) if self.transpose else (q,)) + ((written,) if self.amax else ())
        if not self.transpose:
            return q, scale
        if self.mode == 2:
            scale_t = scale.t().contiguous()
        return q, scale, q_t, scale_t


_CASTS = plans.PlanCache()
_ROW_SCALES_BT = 32   # tile maxima per row read at once by _row_scales_kernel
# _row_scales_kernel's launch settings (the launch's and an AOT compile's)
ROW_SCALES_SETTINGS = dict(BLOCK=TILE, BT=_ROW_SCALES_BT, num_warps=4)


def launch(x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype,
           transpose: bool = False, scale: torch.Tensor | None = None,
           amax: bool = False, scale_rule: str = "ocp", preshuffled: bool = False) -> tuple[torch.Tensor, ...]:
    """Run the kernels of :func:`kernels.gemm_fp8.quantize` on a checked ``x`` (M, K);
    ``scale``: a checked float32 one-number scale of ``tensor`` given by the caller, which
    skips the amax launch (the result then holds no scales: (q,) or (q, q_t)); with it,
    ``amax``: the cast also writes each tile's max |x|, appended to the result as the tile
    maxima (:func:`tile_maxima_shape`, float32; none for an empty x), whose max is x's amax. ``scale_rule`` (checked):
    ``mx32``'s e8m0 rule, ``"ocp"`` or ``"round_up"``; ``preshuffled`` (``mx32``): both scale
    tensors in the layout of :mod:`kernels.mx_preshuffle`, written so by the cast.
    Device ops: ``tensor`` two launches (the amax pass, the cast, which reduces the pass's
    partials itself), ``row`` three (the amax pass, the scale launch, the cast), one for a
    given scale (``amax`` too: whoever needs the amax reduces the maxima), one for the others."""
    given = scale is not None
    if x.numel() == 0:
        return _empty(x, granularity, fp8_dtype, transpose, given, amax, preshuffled)
    key = (x.shape, x.stride(), x.dtype, x.device, granularity, fp8_dtype, transpose, given, amax, scale_rule,
           preshuffled)
    return _CASTS(key, _Cast, x, granularity, fp8_dtype, transpose, given, amax, scale_rule, preshuffled)(x, scale)


def tile_maxima_shape(m: int, k: int) -> tuple[int, int]:
    """The shape of the tile maxima a cast of x (m, k) with a given scale and ``amax`` writes:
    one per ``TILE`` x ``TILE`` tile, row-major (the custom op's fake makes the same)."""
    return cdiv(m, TILE), cdiv(k, TILE)


def _empty(x, granularity, fp8_dtype, transpose, given, amax, preshuffled) -> tuple[torch.Tensor, ...]:
    """:func:`launch`'s result for an empty x: no launch; scales 1 (MX: byte 0, pre-shuffled
    or not: every byte of either layout is a padding zero or a block of no elements)."""
    m, k = x.shape
    q = new_output((m, k), fp8_dtype, x.device)
    q_t = new_output((k, m), fp8_dtype, x.device) if transpose else q
    if given:   # no tile maxima: an empty x has no tiles
        maxima = (new_output(tile_maxima_shape(m, k), torch.float32, x.device),) if amax else ()
        return ((q, q_t) if transpose else (q,)) + maxima
    mx = granularity == "mx32"
    scale_dtype = torch.uint8 if mx else torch.float32
    shapes = scale_shape(granularity, m, k), scale_shape(granularity, k, m)
    if preshuffled:
        shapes = tuple(preshuffled_shape(*shape) for shape in shapes)
    scale = torch.ones(shapes[0], dtype=scale_dtype, device=x.device)
    scale_t = torch.ones(shapes[1], dtype=scale_dtype, device=x.device)
    if mx:   # amax 0: byte 0, as the MX rule gives an all-zero block
        scale, scale_t = scale.zero_(), scale_t.zero_()
    return (q, scale, q_t, scale_t) if transpose else (q, scale)


def bytes_moved(shape: tuple[int, int], x_dtype: torch.dtype, granularity: str,
                transpose: bool = False, given_scale: bool = False) -> float:
    """Minimum traffic of :func:`quantize`, the roofline's denominator: x read once (twice
    for ``tensor`` and ``row``, whose amax pass reads it again), q written once (and q_t), the
    scales written. For bf16 x and a block granularity: 3 bytes per element, 4 with q_t.
    ``given_scale`` (``tensor`` only: delayed scaling's cast, ``scale=`` and ``amax=True``):
    no amax pass, so x read once; the scale read instead of written, and the cast's by-product,
    one fp32 maximum per ``TILE`` x ``TILE`` tile, written and read back by the reduction that
    writes the amax."""
    if given_scale and granularity != "tensor":
        raise ValueError(f"a given scale is one per tensor: granularity 'tensor', got {granularity!r}")
    m, k = shape
    reads = 2 if granularity in ("tensor", "row") and not given_scale else 1
    copies = 2 if transpose else 1
    scale_bytes = 1 if granularity == "mx32" else 4
    scales = sum(math.prod(scale_shape(granularity, *s)) for s in ((m, k), (k, m))[:copies])
    tile_maxima = 2 * 4 * cdiv(m, TILE) * cdiv(k, TILE) + 4 if given_scale else 0
    return float(m * k * (reads * x_dtype.itemsize + copies) + scales * scale_bytes + tile_maxima)


def aot(granularity: str, fp8_dtype: torch.dtype, transpose: bool = True,
        x_dtype: torch.dtype = torch.bfloat16, amax: bool = False, scale_rule: str = "ocp",
        given_scale: bool = False, preshuffled: bool = False) -> AotKernel:
    """The cast pass as a GPU runs it on a contiguous 8192 x 8192 x, for an ahead-of-time
    compile (:func:`workbench.isa.compile.compile_aot`; not a rung, so not in the inspector);
    ``given_scale``: ``tensor``'s cast with a scale given by the caller (else ``tensor`` and
    ``row`` compute their scales from the amax pass's amaxes); ``amax``: with the tile maxima a
    given ``tensor`` scale's cast writes (delayed scaling's); ``scale_rule``: ``mx32``'s e8m0 rule;
    ``preshuffled``: ``mx32``'s scales written pre-shuffled (the mxfp8 recipe's on gfx950)."""
    size = 8192
    mode = 0 if granularity in ("tensor", "row") else 2 if granularity == "block128x128" else 1
    m_groups = scale_shape(granularity, size, size)
    m_groups = preshuffled_shape(*m_groups) if preshuffled else m_groups   # (stripes, a stripe's bytes)
    # the scale strides :func:`quantize` passes (0 where it broadcasts), since Triton
    # specializes a 1 as a constant and a 0 as divisible by 16: another binary
    per_row = int(granularity == "row")
    scales = (dict(stride_sm=m_groups[1], stride_sk=1) if mode else dict(stride_sm=per_row, stride_sk=0))
    scales_t = (dict(stride_stk=m_groups[1], stride_stm=1) if mode == 1 else
                dict(stride_stk=per_row if transpose else 0, stride_stm=0))
    ints = dict(M=size, K=size, stride_xm=size, stride_xk=1, stride_qm=size, stride_qk=1,
                stride_qtk=size, stride_qtm=1, **scales, **scales_t)
    scale = pointer_type(torch.uint8) if granularity == "mx32" else "*fp32"
    constexprs = dict(MODE=mode, G=group_shape(granularity, size, size)[1] if mode else TILE,
                      MX=granularity == "mx32", ROUND_UP=scale_rule == "round_up", TRANSPOSE=transpose, AMAX=amax,
                      FROM_AMAX=granularity == "tensor" and not (given_scale or amax), PRESHUFFLED=preshuffled,
                      PARTIALS=PARTIALS, **format_constants(fp8_dtype))
    return aot_launch(_quantize_kernel, fp8_dtype, dict(BLOCK=TILE, num_warps=NUM_WARPS), ints,
                      constexprs=constexprs,
                      pointers={"x_ptr": pointer_type(x_dtype), "s_ptr": scale, "st_ptr": scale,
                                "amax_ptr": "*fp32" if amax or mode == 0 else scale})


def amax_pass_aot(x_dtype: torch.dtype = torch.bfloat16, unless: int = 0) -> AotKernel:
    """``tensor``'s amax pass (:func:`_tensor_partials_kernel`) as a GPU runs it on a contiguous
    8192 x 8192 x (a grid of PARTIALS programs, 4 tiles each), for an ahead-of-time compile;
    ``unless``: the numbers it reads first (delayed scaling's: its amax history, HISTORY of them)."""
    size = 8192
    return aot_launch(_tensor_partials_kernel, x_dtype, dict(BLOCK=TILE, num_warps=NUM_WARPS),
                      dict(M=size, K=size, stride_xm=size, stride_xk=1), constexprs=_unless_constants(unless),
                      pointers={"partials_ptr": "*fp32", "unless_ptr": "*fp32"})
