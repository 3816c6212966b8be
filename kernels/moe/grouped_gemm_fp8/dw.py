"""dW of the FP8 grouped GEMM: dw[g] (K, N) = (xt[:, rows of g] * sx[g]) @ (dyt[:, rows of g] * sdy[g])ᵀ.

Idea:
    The weight gradient reduces over the group's tokens, so for a row-wise recipe the
    scales must be constant along the tokens: one per (group, input feature) for x
    and one per (group, output feature) for dy, computed over the group's rows only
    (:mod:`.quantize`). Both operands arrive *transposed*, feature-major with the
    tokens contiguous (xt (K, R), dyt (N, R), R >= T), copied so after the cast
    (:func:`.quantize.wgrad_operand`): the reduction dimension is the contiguous one for both, the
    layout FP8 matrix cores take without a transpose, so no tile is transposed on its
    way through LDS (a transposed one-byte tile moves through LDS in 8- and 16-bit
    accesses, as the transposed copy of :mod:`kernels.gemm_fp8.quantize_kernel` does).
    One program per (K tile, N tile, group), as grouped GEMM's bf16 dW kernel
    (:mod:`kernels.moe.grouped_gemm.dw`); an empty group's programs store zeros.

    A group starts at any token, so its first element is not 16-byte aligned. The
    loop starts at the 16-aligned token at or below the group's start instead, and
    masks by value, not by address: the first and the last tile are loaded whole
    (bounded only by R, so the loads stay 16 bytes wide) and the tokens outside the
    group are zeroed in registers; every tile between them is loaded unmasked along
    the tokens. So the hot loop compares nothing against the group's bounds and loads
    16 bytes at a time (the ISA tests check both), and the scales multiply the fp32
    accumulator once, in the epilogue.

    The blockwise recipe's scales change along the tokens (DeepSeek-V3's 1 x 128 tiles of
    xᵀ and dyᵀ: one scale per 128 tokens and feature), so each tile's product is scaled
    before it is added (:func:`kernels.moe.grouped_gemm.tiles.accumulate`). The token
    blocks count from token 0, not from the group's start (:mod:`.quantize` says why),
    so with ``SCALE_R`` = 128 the loop starts at the 128-aligned token at or below the
    group's start instead of the 16-aligned one, and a tile is one 128-token block: it
    never straddles two scales, and the masking above keeps the neighbour group's tokens
    of a shared block out of the product.

Why faster:
    Than dequantizing to bf16 and running grouped GEMM's dW kernel: half the operand
    bytes and twice the matrix-core rate (FP8 MFMA), and no in-LDS transpose of x.

Expected bound:
    Compute (FP8 matrix-core peak) when groups hold many tokens; each program reads its
    group's tokens once per output tile, so few tokens per group make it bound by the
    dw store (G·K·N elements in w's dtype) and the launch (model).

Limits:
    xᵀ in e4m3 and dyᵀ in e4m3 or its family's e5m2 (the hybrid format; the mixed-format
    FP8 MFMA, no conversion). Row-wise (per group and feature), broadcast (per tensor) or
    per 128-token block (counted from token 0) and feature; no other block size, and up to
    127 tokens of the neighbour group loaded and masked per group start in that mode (16
    otherwise). One program per output tile and group however few rows the group has
    (an empty group's programs only store zeros); no split of a long reduction over
    programs (split-K) for the few-groups, many-tokens case. One fixed tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import backend as _backend
from ...outputs import new_output
from ...registry import AotKernel
from ...triton_support import aot_launch, cdiv, interp_bf16, pointer_type, round_to_bf16, run_kwargs
from ..grouped_gemm import launch as grouped_launch
from ..grouped_gemm.schedule import clamped
from ..grouped_gemm.tiles import accumulate

ALIGN = 16
"""Tokens per 16 bytes of an FP8 row: where the reduction of a group starts its loads."""


@triton.jit
def _tokens(ptrs, features, tokens, start, end, R):
    """One operand tile, loaded whole up to the padded length R (so its loads stay as wide as
    the layout allows) and zeroed in registers outside the group's tokens [start, end).
    ``features`` masks the tile's feature edge, ``tokens`` holds each element's token."""
    tile = tl.load(ptrs, mask=features & (tokens < R), other=0.0)
    return tl.where((tokens >= start) & (tokens < end), tile, tl.zeros_like(tile))


@triton.jit
def _next_block(sx_ptrs, sdy_ptrs, stride_sxg, stride_sdyg, SCALE_R: tl.constexpr):
    """The next tile's scales: the next token block's (blockwise), the group's own otherwise."""
    if SCALE_R > 0:
        sx_ptrs += stride_sxg
        sdy_ptrs += stride_sdyg
    return sx_ptrs, sdy_ptrs


@triton.jit
def _grouped_dw_fp8_kernel(xt_ptr, sx_ptr, dyt_ptr, sdy_ptr, dw_ptr, offsets_ptr, R, K, N,
                           stride_xk, stride_xr, stride_dyn, stride_dyr, stride_sxg, stride_sxk,
                           stride_sdyg, stride_sdyn, stride_dwg, stride_dwk, stride_dwn,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           ALIGN: tl.constexpr, SCALE_R: tl.constexpr, INTERP_BF16: tl.constexpr):
    # stride_sxg / stride_sdyg step the scales' outer index: the group (SCALE_R = 0) or the
    # SCALE_R-token block (blockwise: a tile is one block, starting at a block's first token)
    tl.static_assert(SCALE_R == 0 or (ALIGN == SCALE_R and SCALE_R == BLOCK_K))
    group = tl.program_id(2)
    start = clamped(offsets_ptr + group - 1, group > 0, R)
    end = tl.maximum(clamped(offsets_ptr + group, True, R), start)
    ks = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)    # rows of dw[g]: input features
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # its columns: output features
    base = (start // ALIGN) * ALIGN                               # 16-byte (or scale block) aligned
    rs = base + tl.arange(0, BLOCK_K)
    g64, k64, c64, r64 = group.to(tl.int64), ks.to(tl.int64), cols.to(tl.int64), rs.to(tl.int64)
    # A = xtᵀ's (K, tokens) tile and B = dyt's (tokens, N) tile, both token-contiguous (the
    # reduction dim, as the forward's K-contiguous w); int64 offsets: an operand of 2^31+
    # elements would wrap in i32.
    a_ptrs = xt_ptr + k64[:, None] * stride_xk + r64[None, :] * stride_xr
    b_ptrs = dyt_ptr + r64[:, None] * stride_dyr + c64[None, :] * stride_dyn
    a_step = tl.cast(stride_xr, tl.int64) * BLOCK_K
    b_step = tl.cast(stride_dyr, tl.int64) * BLOCK_K
    a_rows, b_cols = ks[:, None] < K, cols[None, :] < N
    if SCALE_R > 0:   # the scales of the first tile's token block; a block's later ones follow
        sx_ptrs = sx_ptr + (base // SCALE_R).to(tl.int64) * stride_sxg + k64[:, None] * stride_sxk
        sdy_ptrs = sdy_ptr + (base // SCALE_R).to(tl.int64) * stride_sdyg + c64[None, :] * stride_sdyn
    else:
        sx_ptrs = sx_ptr + g64 * stride_sxg + k64[:, None] * stride_sxk
        sdy_ptrs = sdy_ptr + g64 * stride_sdyg + c64[None, :] * stride_sdyn
    steps = tl.cdiv(end - base, BLOCK_K)     # 0 only for an empty group at an aligned token
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if steps > 0:   # the first tile: the tokens below start are the previous group's
        acc = accumulate(acc, _tokens(a_ptrs, a_rows, rs[None, :], start, end, R),
                         _tokens(b_ptrs, b_cols, rs[:, None], start, end, R), sx_ptrs, sdy_ptrs,
                         a_rows, b_cols, SCALE_R > 0)
    for _ in range(1, steps - 1):   # whole tiles of the group: nothing masked along the tokens
        a_ptrs += a_step
        b_ptrs += b_step
        sx_ptrs, sdy_ptrs = _next_block(sx_ptrs, sdy_ptrs, stride_sxg, stride_sdyg, SCALE_R)
        acc = accumulate(acc, tl.load(a_ptrs, mask=a_rows, other=0.0), tl.load(b_ptrs, mask=b_cols, other=0.0),
                         sx_ptrs, sdy_ptrs, a_rows, b_cols, SCALE_R > 0)
    if steps > 1:   # the last tile: the tokens from end on are the next group's
        a_ptrs += a_step
        b_ptrs += b_step
        sx_ptrs, sdy_ptrs = _next_block(sx_ptrs, sdy_ptrs, stride_sxg, stride_sdyg, SCALE_R)
        last = rs + (steps - 1) * BLOCK_K
        acc = accumulate(acc, _tokens(a_ptrs, a_rows, last[None, :], start, end, R),
                         _tokens(b_ptrs, b_cols, last[:, None], start, end, R), sx_ptrs, sdy_ptrs,
                         a_rows, b_cols, SCALE_R > 0)
    if SCALE_R == 0:   # scales constant along the tokens: once, on the accumulator
        acc = acc * tl.load(sx_ptrs, mask=a_rows, other=0.0) * tl.load(sdy_ptrs, mask=b_cols, other=0.0)
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    dw_ptrs = dw_ptr + g64 * stride_dwg + k64[:, None] * stride_dwk + c64[None, :] * stride_dwn
    tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty), mask=(ks[:, None] < K) & (cols[None, :] < N))


def config(backend: str, arch: str = "gfx942", scale_block: int = 0) -> dict:
    """The forward's FP8 tile (:func:`.v0_one_launch.config`): 128 tokens deep on GPUs, and
    one token block deep (128) wherever the scales change per ``scale_block`` tokens."""
    cfg = grouped_launch.config(backend, arch)
    return cfg if backend == "interpreter" and not scale_block else {**cfg, "BLOCK_K": scale_block or 128}


def grouped_dw_fp8(xt, sx, dyt, sdy, offsets, out_dtype: torch.dtype, scale_block: int = 0) -> torch.Tensor:
    """dw (G, K, N) in ``out_dtype`` for operands already validated (:func:`.training.check_dw`):
    one launch, no host sync. ``scale_block`` 0: scales per (group, feature); else per
    (``scale_block``-token block counted from token 0, feature), sx and sdy indexed
    [block, feature]."""
    (k, r), n, groups = xt.shape, dyt.shape[0], offsets.shape[0]
    dw = new_output((groups, k, n), out_dtype, xt.device)
    here = _backend.current()
    cfg = config(here.name, here.arch, scale_block)
    grid = (cdiv(k, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"]), groups)
    _grouped_dw_fp8_kernel.run(xt, sx, dyt, sdy, dw, offsets, r, k, n, *xt.stride(), *dyt.stride(),
                               *sx.stride(), *sdy.stride(), *dw.stride(), **run_kwargs(grid, dict(
                                   ALIGN=scale_block or ALIGN, SCALE_R=scale_block,
                                   INTERP_BF16=interp_bf16(out_dtype), **cfg)))
    return dw


def aot_ints(shape=grouped_launch.AOT_SHAPE) -> dict[str, int]:
    """Int arguments of the dW launch of ``shape``: xt (K, T) and dyt (N, T) token-contiguous
    (T a multiple of 16, as :mod:`.quantize` pads it), dw (G, K, N); scales per (group,
    feature), or per (``scale_block`` tokens, feature) as :func:`.quantize.wgrad_operand`
    writes them ([block, feature], feature-contiguous: the same strides)."""
    t, k, n, g, _ = shape
    return dict(R=t, K=k, N=n, stride_xk=t, stride_xr=1, stride_dyn=t, stride_dyr=1,
                stride_sxg=k, stride_sxk=1, stride_sdyg=n, stride_sdyn=1,
                stride_dwg=k * n, stride_dwk=n, stride_dwn=1)


def aot(dtype: torch.dtype, backend: str, arch: str, grad_dtype: torch.dtype | None = None,
        scale_block: int = 0) -> AotKernel:
    """The dW launch of grouped GEMM's AOT shape with an fp32 dw (master weights' gradient);
    dyᵀ in ``grad_dtype`` (default ``dtype``; the hybrid format's e5m2), the scales per group
    or per ``scale_block`` tokens."""
    pointers = {"offsets_ptr": "*i32", "sx_ptr": "*fp32", "sdy_ptr": "*fp32",
                "dw_ptr": pointer_type(torch.float32), "dyt_ptr": pointer_type(grad_dtype or dtype)}
    return aot_launch(_grouped_dw_fp8_kernel, dtype, config(backend, arch, scale_block), aot_ints(),
                      {"INTERP_BF16": False, "ALIGN": scale_block or ALIGN, "SCALE_R": scale_block}, pointers)
