"""v0 triton_upcast: FP8 as a storage format only; the tiles are widened to fp16 for ``tl.dot``.

Idea:
    The first FP8 GEMM most people write: load the one-byte tiles, convert them to
    fp16 (exact: every e4m3 value, fnuz or OCP, is an fp16 value) and reuse the fp16
    GEMM, with the scales applied to the fp32 accumulator in the epilogue (per row and
    per column by broadcast, a per-tensor scale read with stride 0). Tiles, grouped
    program order and the two-stage pipeline are v1's, so the diff to v1 shows one
    idea: the FP8 matrix core.

Why faster:
    Than an fp16 GEMM on the same problem: A and B are half the bytes from HBM, which
    is what decode shapes (small M) are bound by.

Expected bound:
    Compute, at the fp16 matrix-core peak (half the FP8 peak), for large shapes; plus
    the conversion instructions in the inner loop.

Limits:
    As v1: one e4m3 format for A and B, per-tensor or per-row/column scales, any M, N,
    K and strides through masked loads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..registry import rung
from ..triton_support import round_to_bf16
from . import launch
from .formats import native_dtypes


@triton.jit
def _gemm_fp8_upcast_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K,
                            stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                            stride_sa, stride_sb,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, INTERP_BF16: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

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
        acc = tl.dot(a.to(tl.float16), b.to(tl.float16), acc)
        a_ptrs += a_step
        b_ptrs += b_step

    # exercise begin: scales
    scale_a = tl.load(sa_ptr + rows.to(tl.int64) * stride_sa, mask=rows < M, other=0.0)
    scale_b = tl.load(sb_ptr + cols.to(tl.int64) * stride_sb, mask=cols < N, other=0.0)
    acc = acc * scale_a[:, None] * scale_b[None, :]
    # exercise end
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None):
    return launch.aot(_gemm_fp8_upcast_kernel, dtype, backend, arch, overrides, prior=launch.V0_PRIOR)


@rung(op="gemm_fp8", rung=0, name="triton_upcast", backends=("hip", "cuda", "interpreter"),
      dtypes=native_dtypes(), interpreter=True, kind="triton", aot=aot)
def gemm_fp8_v0(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return launch.launch(_gemm_fp8_upcast_kernel, a, b, scale_a, scale_b, out_dtype)
