"""v2 triton_tile: a program computes a BLOCK_M x BLOCK_N tile of C with ``tl.dot``.

Idea:
    Leave threads behind and program at the tile level. Each Triton program loads a
    BLOCK_M x BLOCK_K tile of A and a BLOCK_K x BLOCK_N tile of B per step of K and
    calls ``tl.dot``, accumulating in fp32 registers. The compiler maps ``tl.dot`` to
    the matrix cores: MFMA on CDNA (``v_mfma_f32_32x32x8_bf16`` on gfx942), wgmma on
    Hopper, and stages the operands through LDS in the layout MFMA wants.

Why faster:
    A 128x128 tile reuses each loaded element of A 128 times and of B 128 times
    (v1: 16), and MFMA does 32x32x8 multiply-adds per wavefront instruction instead
    of one per lane. Arithmetic intensity now grows with the tile size, so large
    GEMMs become compute bound.

Expected bound:
    Compute (matrix-core peak) for large square shapes, but well below it: the
    programs run in row-major order (poor L2 reuse of B), and with one pipeline
    stage each K step waits for its global loads before the MFMAs can start.

Limits:
    Any M, N, K and any strides (row- or column-major) through masked loads; fp32
    uses IEEE-precision dot (no TF32), fp16/bf16 accumulate in fp32 and round once.
    Offsets are int64, so operands of 2^31 elements or more are read right; the
    widening happens once before the K loop, which has no 64-bit multiply (checked
    on gfx942/gfx950 by ``tests/test_isa.py``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import backend as _backend
from .. import validate
from ..outputs import new_output
from ..registry import AotKernel, rung
from ..tuning import with_overrides
from .spec import aot_launch_settings
from ..triton_support import aot_launch, cdiv, interp_bf16, round_to_bf16

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@triton.jit
def _gemm_tile_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      INTERP_BF16: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
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
        # exercise begin: masks
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] + k0 < K) & (cols[None, :] < N), other=0.0)
        # exercise end
        if INTERP_BF16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32
        a_ptrs += a_step
        b_ptrs += b_step
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def config(backend: str) -> dict:
    """Tile sizes per backend: big tiles for matrix cores, small for the slow interpreter."""
    if backend == "interpreter":
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_warps=4, num_stages=1)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8 if backend == "hip" else 4,
                num_stages=1)


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None) -> list[AotKernel]:
    """An 8192^3 launch; ``overrides`` replaces settings, ``layout`` "NT" makes B K-contiguous."""
    ints, settings = aot_launch_settings(overrides)
    cfg = with_overrides(config(backend), settings)
    return [aot_launch(_gemm_tile_kernel, dtype, cfg, ints, constexprs={"INTERP_BF16": False})]


@rung(op="gemm", rung=2, name="triton_tile", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot)
def gemm_v2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    validate.matmul_operands(a, b, DTYPES)
    (m, k), n = a.shape, b.shape[1]
    c = new_output((m, n), a.dtype, a.device)
    cfg = config(_backend.current().name)
    grid = (cdiv(m, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"]))
    _gemm_tile_kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            c.stride(0), c.stride(1), INTERP_BF16=interp_bf16(a.dtype), **cfg)
    return c
