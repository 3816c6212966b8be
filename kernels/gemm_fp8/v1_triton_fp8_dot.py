"""v1 triton_fp8_dot: the FP8 tiles go straight into ``tl.dot``; the scales wait for the epilogue.

Idea:
    Hand ``tl.dot`` the FP8 tiles as loaded. Triton emits the FP8 matrix-core
    instruction, accumulating in fp32: ``v_mfma_f32_16x16x32_fp8_fp8`` on gfx942 (fnuz
    operands), ``v_mfma_f32_16x16x128_f8f6f4`` on gfx950 (OCP), ``wgmma.mma_async
    ... m64n256k32.f32.e4m3.e4m3`` on Hopper (at its prior's 256-wide tile). The scales are
    constant along K, so ``(A s_a) @ (B s_b) = s_a * (A @ B) * s_b``: they multiply the
    fp32 accumulator once per output element, per row and per column by broadcast (a
    per-tensor scale is read with stride 0). Programs take gemm v3's order
    (:mod:`.tile_order`: the XCD remap, then GROUP_M row tiles sharing each column tile of
    B in L2) with a software pipeline (two stages on AMD, three on Hopper).

    The tile is tuned as the bf16 GEMM's (:mod:`.configs`): per key (shape buckets, formats,
    operand layout, output dtype) the fastest of the configs that the ahead-of-time table
    keeps for the target and this kernel (none spills or uses 8/16-bit LDS ops where another
    does not; v2's binaries keep their own) and the shape's prune leaves, timed once with this
    launch (:func:`kernels.tuning.choice`); untimed, the prior: 256x128x128, 8 warps, 16x16
    MFMAs on AMD; 128x256x128, 8 warps on Hopper (194 registers, no stack frame).

Why faster:
    v0 converted every loaded element to fp16 and ran the fp16 matrix cores
    (``v_mfma_f32_16x16x16_f16`` on gfx942). The FP8 matrix cores do twice the
    multiply-adds per cycle of the fp16 ones on CDNA3, CDNA4 and Hopper (datasheet
    peaks), and the conversions leave the inner loop.

Expected bound:
    Compute (FP8 matrix-core peak) for large square shapes; memory bound for decode
    shapes (small M), where the bytes of B dominate.

Limits:
    A and B in FP8 formats of one family: e4m3 x e4m3, or e4m3 x e5m2 as FP8 backward
    GEMMs take a gradient (``tl.dot`` emits one mixed-format MFMA, e.g.
    ``v_mfma_f32_16x16x32_fp8_bf8`` on gfx942, pinned for v2 in
    ``tests/test_gemm_fp8_blockwise.py``); scales per tensor or per row/column only (no block-wise 1x128
    scales). Any M, N, K and strides through masked loads; K-contiguous operands are
    the fast layout. A key's first shape is timed; another shape of its buckets reuses the
    winner untimed.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..registry import rung
from ..triton_support import round_to_bf16
from . import launch
from .tile_order import program_tile
from .formats import native_dtypes


@triton.jit
def _gemm_fp8_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K,
                     stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     stride_sa, stride_sb,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr, INTERP_BF16: tl.constexpr):
    pid_m, pid_n = program_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M, NUM_XCDS)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # Offsets in int64: int arguments below 2^31 arrive as i32, and rows * stride_am
    # wraps for an operand of 2^31+ elements. Computed once here, not in the loop.
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + ks.to(tl.int64)[None, :] * stride_ak
    b_ptrs = b_ptr + ks.to(tl.int64)[:, None] * stride_bk + cols.to(tl.int64)[None, :] * stride_bn
    a_step = tl.cast(stride_ak, tl.int64) * BLOCK_K
    b_step = tl.cast(stride_bk, tl.int64) * BLOCK_K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] + k0 < K) & (cols[None, :] < N), other=0.0)
        # exercise begin: dot
        acc = tl.dot(a, b, acc)
        # exercise end
        a_ptrs += a_step
        b_ptrs += b_step

    scale_a = tl.load(sa_ptr + rows.to(tl.int64) * stride_sa, mask=rows < M, other=0.0)
    scale_b = tl.load(sb_ptr + cols.to(tl.int64) * stride_sb, mask=cols < N, other=0.0)
    acc = acc * scale_a[:, None] * scale_b[None, :]
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None):
    return launch.aot(_gemm_fp8_kernel, dtype, backend, arch, overrides)


@rung(op="gemm_fp8", rung=1, name="triton_fp8_dot", backends=("hip", "cuda", "interpreter"),
      dtypes=native_dtypes(), interpreter=True, kind="triton", aot=aot)
def gemm_fp8_v1(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return launch.launch(_gemm_fp8_kernel, a, b, scale_a, scale_b, out_dtype, rung="v1")
