"""v0 mx_one_launch: grouped GEMM v2's single launch, with MXFP8 tiles and their e8m0 scales
in ``tl.dot_scaled``.

Idea:
    ``grouped_gemm_fp8`` v0 with the scales moved into the K loop. Its schedule is grouped
    GEMM v2's: one launch over an upper bound of row tiles (cdiv(T, BLOCK_M) + G) times
    column tiles, each program finding its group and rows from the int32 offsets on the
    device (:mod:`kernels.moe.grouped_gemm.schedule`, no host sync). An MX scale changes
    every 32 elements along K, so it cannot wait for the epilogue: each K step loads the
    x tile, the expert's w tile and the BLOCK_K/32 scale bytes of each of their rows and
    columns and hands all four to ``tl.dot_scaled(x, sx, "e4m3", w, sw, "e4m3", acc)``
    with fp32 accumulation, as ``gemm_mxfp4`` v0 does for a dense GEMM. The e4m3 elements
    go in as their bytes. What Triton makes of it (AOT ISA, ``tests/test_grouped_gemm_mxfp8.py``):

    * gfx950 (CDNA4): ``v_mfma_scale_f32_16x16x128_f8f6f4``, an MFMA that reads the
      e4m3 operands and their scale bytes itself (a K step of 128 selects it,
      :mod:`.tile`). The operand tiles load 16 bytes at a time; the scales are fetched
      a byte at a time (``buffer_load_ubyte``) and pass through LDS in 8-bit accesses
      (``ds_write_b8``, ``ds_read_u8``).
    * gfx942 (CDNA3): no scaled MFMA; Triton emulates it, scaling the operands in
      registers and running ``v_mfma_f32_16x16x16_bf16``.

Why faster:
    Than dequantizing to bf16 and running grouped GEMM (``ref``): a byte per element plus
    a byte per 32 instead of two, and on gfx950 the FP8 matrix-core rate, with the block
    scales applied by the MFMA itself. Than ``grouped_gemm_fp8``: no faster, but finer
    scales (one per 32 elements, not one per token or channel), so an outlier costs the
    precision of 32 elements, not of a whole row.

Expected bound:
    Compute (FP8 matrix-core peak on gfx950) at many rows per expert; memory (every
    expert's weights and scales read once: bytes_moved / HBM bandwidth) at few (model).
    On gfx942, compute at the bf16 peak at best, plus the emulation's VALU work.

Limits:
    OCP e4m3fn elements only (no e5m2, no mixed formats). The scales are read in plain
    row-major order, a byte at a time, and staged through LDS byte by byte, not in the
    pre-shuffled layout the dense MX GEMM takes on gfx950 (:mod:`kernels.mx_preshuffle`):
    that layout packs 32-row stripes, and x's row tiles start at each group's first
    token, anywhere; its 8-scale chunks span 256 elements of K, two of this K step. Every
    K step is masked (no peeled tail). v2's schedule limits (G in one
    BLOCK_G vector, surplus programs, no L2 swizzle) and one fixed tile for every shape.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import backend as _backend
from ...outputs import new_output
from ...registry import AotKernel, rung
from ...triton_support import aot_launch, interp_bf16, pointer_type, round_to_bf16, run_kwargs
from ...tuning import with_overrides
from ..grouped_gemm import launch as grouped_launch
from ..grouped_gemm.schedule import group_tiles, locate
from ..grouped_gemm.v2_one_launch import grid
from . import dw, operands
from .tile import config
from .spec import DTYPES


@triton.jit
def _grouped_gemm_mxfp8_kernel(x_ptr, sx_ptr, w_ptr, sw_ptr, out_ptr, offsets_ptr, T, N, K, G,
                               stride_xt, stride_xk, stride_wg, stride_wk, stride_wn,
                               stride_ot, stride_on, stride_sxt, stride_sxk,
                               stride_swg, stride_swn, stride_swk,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               BLOCK_G: tl.constexpr, INTERP_BF16: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)   # the grid's column tile
    starts, ends, tiles, cum = group_tiles(offsets_ptr, G, T, BLOCK_M, BLOCK_G)   # v2's schedule
    group, start, end = locate(tl.program_id(0), starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    if group >= G:  # a surplus program of the upper-bound grid
        return
    rows = start + tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)          # elements along K
    kb = tl.arange(0, BLOCK_K // 32)    # their e8m0 scales, one per 32
    # int64 offsets: an operand of 2^31+ elements would wrap in i32
    r64, c64, g64 = rows.to(tl.int64), cols.to(tl.int64), group.to(tl.int64)
    x_ptrs = x_ptr + r64[:, None] * stride_xt + ks[None, :] * stride_xk
    w_ptrs = w_ptr + g64 * stride_wg + ks[:, None] * stride_wk + c64[None, :] * stride_wn
    sx_ptrs = sx_ptr + r64[:, None] * stride_sxt + kb[None, :] * stride_sxk
    sw_ptrs = sw_ptr + g64 * stride_swg + c64[:, None] * stride_swn + kb[None, :] * stride_swk
    row_ok, col_ok = rows[:, None] < end, cols[None, :] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        left = K - k0
        blocks = tl.cdiv(left, 32)   # K may end inside a scale block
        x = tl.load(x_ptrs, mask=row_ok & (ks[None, :] < left), other=0)
        w = tl.load(w_ptrs, mask=(ks[:, None] < left) & col_ok, other=0)
        # exercise begin: scaled_dot
        sx = tl.load(sx_ptrs, mask=row_ok & (kb[None, :] < blocks), other=0)
        sw = tl.load(sw_ptrs, mask=(cols[:, None] < N) & (kb[None, :] < blocks), other=0)
        acc = tl.dot_scaled(x, sx, "e4m3", w, sw, "e4m3", acc)
        # exercise end
        x_ptrs += tl.cast(stride_xk, tl.int64) * BLOCK_K
        w_ptrs += tl.cast(stride_wk, tl.int64) * BLOCK_K
        sx_ptrs += tl.cast(stride_sxk, tl.int64) * (BLOCK_K // 32)
        sw_ptrs += tl.cast(stride_swk, tl.int64) * (BLOCK_K // 32)
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    out_ptrs = out_ptr + r64[:, None] * stride_ot + c64[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok & col_ok)


def grouped_mm_mxfp8(x, sx, w, sw, offsets, out_dtype) -> torch.Tensor:
    """y (T, N) for operands already validated: one launch, no host sync."""
    (t, k), (groups, _, n) = x.shape, w.shape
    out = new_output((t, n), out_dtype, x.device)
    here = _backend.current()
    cfg = config(here.name, here.arch)
    _grouped_gemm_mxfp8_kernel.run(
        x.view(torch.uint8), sx, w.view(torch.uint8), sw, out, offsets, t, n, k, groups, *x.stride(),
        *w.stride(), *out.stride(), *sx.stride(), *sw.stride(), **run_kwargs(grid(t, n, groups, cfg), dict(
            BLOCK_G=triton.next_power_of_2(groups), INTERP_BF16=interp_bf16(out_dtype), **cfg)))
    return out


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list[AotKernel]:
    """The launches of a training step on grouped GEMM's :data:`AOT shape
    <kernels.moe.grouped_gemm.launch.AOT_SHAPE>`: the forward with K-contiguous experts
    (as :func:`.spec.quantize_weight` stores them) and a bf16 output; the backward's dX,
    this kernel on wᵀ (a (G, N, K) view of a (G, K, N) copy, contiguous along the
    reduction N, :mod:`.quantize`); the backward's dW (:mod:`.dw`). Scales row-major, one
    byte per 32 along each launch's reduction. ``overrides`` replaces settings of the tile
    (:mod:`.tile`) in all three."""
    cfg = with_overrides(config(backend, arch), overrides)
    fixed = {"INTERP_BF16": False, "BLOCK_G": triton.next_power_of_2(grouped_launch.forward_ints()["G"])}
    pointers = {"offsets_ptr": "*i32", "out_ptr": pointer_type(torch.bfloat16)}
    launches = []
    for transposed_w in (False, True):
        ints = grouped_launch.forward_ints(transposed_w=transposed_w)
        n, k, blocks = ints["N"], ints["K"], -(-ints["K"] // 32)
        ints.update(stride_wk=1, stride_wn=k, stride_sxt=blocks, stride_sxk=1, stride_swg=n * blocks,
                    stride_swn=blocks, stride_swk=1)
        launches.append(aot_launch(_grouped_gemm_mxfp8_kernel, torch.uint8, cfg, ints, fixed, pointers))
    return [*launches, dw.aot(cfg)]


@rung(op="grouped_gemm_mxfp8", rung=0, name="mx_one_launch", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot)
def grouped_gemm_mxfp8_v0(x: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, sw: torch.Tensor,
                          offsets: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
                          check_offsets: bool = True) -> torch.Tensor:
    """``check_offsets=False`` skips the host read that validates the offsets' values."""
    offsets = operands.check(x, sx, w, sw, offsets, out_dtype, check_values=check_offsets)
    return grouped_mm_mxfp8(x, sx, w, sw, offsets, out_dtype)
