"""v2 triton_blockwise: scales that change along K (DeepSeek-V3's 1x128 / 128x128 blocks) go on the accumulator inside the loop.

Idea:
    FP8 training recipes with fine-grained scaling (DeepSeek-V3 §3.3: 1 x 128 tiles for
    activations and gradients, 128 x 128 blocks for weights) give every 128 elements of
    K their own scales, so ``(A s_a) @ (B s_b)`` no longer factors into
    ``s_a * (A @ B) * s_b`` and v1's epilogue cannot apply them. Each K step of 128
    (one scale block) runs the FP8 matrix core on the raw tiles into a fresh fp32
    partial product, which is then scaled and added to the accumulator:
    ``acc += dot(a, b) * sa[:, None] * sb[None, :]`` with ``sa`` the step's scale per row
    of A and ``sb`` its scale per column of B (per column, or per 128 columns, of a
    128 x 128 block). Accumulation stays in fp32 across blocks. Scales constant along K
    (per tensor, per row/column) take v1's path, selected at compile time
    (``SCALES_ALONG_K``), so this rung serves every recipe and is the public op's. Program
    order and tuning are v1's (the XCD remap), keyed also by the scales' constexprs and
    strides; each binary (per-K-block scales with B's per 128 x 128 or per 128 x 1; scales
    constant along K per row and column, or per tensor) tunes among the configs its own
    compile keeps at the launch's operand layout (:mod:`.configs`): on Hopper the blockwise
    ones need a stack frame at every tile wider than 128 x 128, the others do not.

Why faster:
    Than dequantizing block-scaled operands to bf16 and running a bf16 GEMM: half the
    operand bytes and the FP8 matrix-core rate, with the scaling in registers. DeepSeek-V3
    applied the scales on the accumulator because its H800 tensor cores keep about 14
    bits of an FP8 product's sum; AMD's FP8 MFMAs accumulate in full fp32, so here the
    reason is only that the scales change along K.

Expected bound:
    Compute (FP8 matrix-core peak) for large shapes, less what the scaling costs: per K
    step each accumulator element takes a multiply-add by the product of its row's and
    column's scales, on the VALU, beside the MFMAs. The AOT compile of this rung's prior
    (256 x 128 x 128 tile, 8 waves; ``tests/test_gemm_fp8_blockwise.py`` pins the counts)
    has per wave and K step of 128, in the hot loop:

    * gfx942: 64 ``v_mfma_f32_16x16x32_fp8_fp8`` against 56 scaling VALU instructions
      (16 ``v_mul_f32`` for the scale products, 16 ``v_fma_f32`` and 24 packed
      ``v_pk_fma_f32`` for the 64 accumulator elements of a lane), under one per MFMA;
      the separate fp32 partial product costs registers: 252 VGPRs, 2 waves per SIMD.
    * gfx950: 16 ``v_mfma_f32_16x16x128_f8f6f4`` against 72 (16 ``v_mul_f32``, 48
      ``v_fma_f32``, 8 ``v_pk_fma_f32``): 4.5 per MFMA, since one CDNA4 MFMA does four
      gfx942 ones' K.

    Whether the VALU hides under the MFMAs is a question for the model and a GPU; no
    number here is measured. The ISA page's second launch is the rowwise recipe's (scales
    per row and column, constant along K): the same MFMAs, none of the scaling in the loop,
    and no more VGPRs (``test_v2_with_scales_constant_along_k_runs_v1s_loop``).

Limits:
    A and B in FP8 formats of one family, e4m3 or one e5m2 operand (a gradient): an
    e5m2 A compiles to ``v_mfma_f32_16x16x32_fp8_bf8`` on gfx942 and to the f8f6f4 MFMA
    with ``blgp:1`` on gfx950, the same count, no conversion (AOT, pinned by
    ``test_e5m2_times_e4m3_compiles_to_one_mixed_format_mfma``); scale blocks of 128 along K (``SCALE_K``), BLOCK_K
    dividing it. A's scales per 1 x 128, B's per 128 x 128 or 128 x 1 (or constant along K).
    Any M, N, K and strides through masked loads; a K that is not a multiple of 128 has
    a last, partial scale block.
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
def _gemm_fp8_blockwise_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K,
                               stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                               stride_sam, stride_sak, stride_sbk, stride_sbn,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr, SCALE_K: tl.constexpr,
                               GROUP_N: tl.constexpr,
                               SCALES_ALONG_K: tl.constexpr, INTERP_BF16: tl.constexpr):
    tl.static_assert(SCALE_K % BLOCK_K == 0, "a K step must not straddle two scale blocks")
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
    sa_ptrs = sa_ptr + rows.to(tl.int64) * stride_sam
    sb_ptrs = sb_ptr + (cols // GROUP_N).to(tl.int64) * stride_sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] + k0 < K) & (cols[None, :] < N), other=0.0)
        if SCALES_ALONG_K:
            # exercise begin: block_scales
            block = k0 // SCALE_K
            scale_a = tl.load(sa_ptrs + block * stride_sak, mask=rows < M, other=0.0)
            scale_b = tl.load(sb_ptrs + block * stride_sbk, mask=cols < N, other=0.0)
            acc += tl.dot(a, b) * (scale_a[:, None] * scale_b[None, :])
            # exercise end
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += a_step
        b_ptrs += b_step

    if not SCALES_ALONG_K:
        scale_a = tl.load(sa_ptrs, mask=rows < M, other=0.0)
        scale_b = tl.load(sb_ptrs, mask=cols < N, other=0.0)
        acc = acc * scale_a[:, None] * scale_b[None, :]
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None):
    return launch.aot_blockwise(_gemm_fp8_blockwise_kernel, dtype, backend, arch, overrides)


def plan(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
         out_dtype: torch.dtype = torch.bfloat16) -> launch.Plan:
    """The checked launch for operands of this metadata, called as ``plan(a, b, scale_a, scale_b)``
    (a public op keeps it: :mod:`kernels.plans`)."""
    return launch.plan_blockwise(_gemm_fp8_blockwise_kernel, a, b, scale_a, scale_b, out_dtype)


@rung(op="gemm_fp8", rung=2, name="triton_blockwise", backends=("hip", "cuda", "interpreter"),
      dtypes=native_dtypes(), interpreter=True, kind="triton", aot=aot, plan=plan)
def gemm_fp8_v2(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return launch.launch_blockwise(_gemm_fp8_blockwise_kernel, a, b, scale_a, scale_b, out_dtype)
