"""v0 triton_dot_scaled: MX tiles (MXFP4, MXFP8) and their e8m0 scales go straight into ``tl.dot_scaled``.

Idea:
    Load a BLOCK_M x BLOCK_K/2 tile of packed A bytes, the BLOCK_K/2 x BLOCK_N tile of
    packed B bytes (B^T is stored K-contiguous, so the tile is a strided view of it)
    and the BLOCK_K/32 e8m0 scales of each row and column, and hand all four to
    ``tl.dot_scaled(a, sa, "e2m1", b, sb, "e2m1", acc)``, accumulating in fp32. Unlike
    the FP8 GEMM, the scales change every 32 elements along K, so they cannot wait for
    the epilogue: they are applied inside the dot. The same kernel takes MXFP8 (e4m3
    elements, one byte each: ``ELEMENTS="e4m3"``, ``PACK=1``; the ``float8_e4m3fn`` dtype
    of this rung, :func:`kernels.gemm_fp8.mx_matmul`). What Triton makes of it depends on
    the matrix cores (measured with the ISA inspector, ``tests/test_gemm_mxfp4.py``,
    ``tests/test_mxfp8.py``):

    * gfx950 (MI355X, CDNA4): ``v_mfma_scale_f32_16x16x128_f8f6f4``, an MFMA that reads
      the e2m1 (or e4m3) operands and one scale byte per 32 of them itself. Its scales come
      pre-shuffled (:mod:`kernels.mx_preshuffle`, AMD aiter's layout; ``PRESHUFFLED``): a K step's
      scales are BLOCK_K bytes per 32-row stripe, loaded two bytes per lane
      (``buffer_load_ushort``) and renamed in registers into the (rows, BLOCK_K/32) tile.
      Triton 3.9 still stages them through LDS (16-bit writes, 32-bit reads:
      ``ds_read_b32``): its AMD pipeliner loads straight into registers only a tile no two
      warps share (``bypassLDS``/``isCoalesced`` in triton-lang/triton's
      ``third_party/amd/lib/TritonAMDGPUTransforms/StreamPipeline.cpp``), and each warp
      shares its scales with the warps beside it. Row-major scales
      (the same kernel with ``PRESHUFFLED`` off, as other quantizers write them) cost a
      load per byte (``buffer_load_ubyte``) and 8-bit LDS reads (``ds_read_u8``), on
      ``v_mfma_scale_f32_32x32x64_f8f6f4``.
    * gfx942 (MI300X, CDNA3): no FP4 matrix core. Triton emulates: it unpacks e2m1
      to bf16, multiplies by the scales and runs ``v_mfma_f32_32x32x8_bf16``.
    * sm90 (Hopper): emulated the same way, on bf16 ``wgmma``.

    Programs run in grouped order (GROUP_M row tiles share each column tile of B in
    L2) with a software pipeline, as in ``gemm_fp8`` v1. Offsets are int64: an
    operand of 2^31 bytes or more would wrap int32 row offsets.

Why faster:
    Than dequantizing to bf16 and calling a bf16 GEMM (``ref`` here): A and B are a
    quarter of the bf16 bytes from HBM, and on gfx950 the FP4 matrix cores do twice
    the multiply-adds per cycle of the FP8 ones and four times the bf16 ones
    (MI355X datasheet peaks, ``roofline/specs/mi355x.yaml``). On gfx942 only the
    memory saving remains, and the unpacking costs VALU instructions in the loop.

Expected bound:
    Compute, at the MI355X fp4 peak, for large shapes on gfx950; memory for decode
    shapes (small M). On gfx942, compute at the bf16 peak at best, plus the unpacking.

Limits:
    MXFP4: K a multiple of 32 (one scale per 32; ``quantize_mxfp4`` pads); MXFP8: any K
    (the last scale block may be partial). A and B in the same element format with
    e8m0 scales (no mixed formats, no MXFP6, no NVFP4 e4m3 scales per 16).
    Any M, N and strides through masked loads; K-contiguous operands are the fast
    layout. Pre-shuffled scales need BLOCK_M and BLOCK_N multiples of 32 and BLOCK_K of
    256, and are read as they are only on gfx950 and in the interpreter
    (:func:`.launch.takes_preshuffled`); elsewhere they are unshuffled first. No XCD-aware
    program remapping yet.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..registry import rung
from ..triton_support import round_to_bf16
from . import launch
from .formats import DTYPES


@triton.jit
def _unshuffle(scales, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """A step's (ROWS/32, BLOCK_K) pre-shuffled scale bytes as the (ROWS, BLOCK_K/32) tile
    ``tl.dot_scaled`` takes: byte 64 d + 4 b + 2 c + a of a chunk is row 16 a + b and
    scale 4 c + d (:mod:`kernels.mx_preshuffle`). Only registers are renamed."""
    tiles = scales.reshape(ROWS // 32, BLOCK_K // 256, 4, 16, 2, 2)   # stripe, chunk, d, b, c, a
    return tiles.permute(0, 5, 3, 1, 4, 2).reshape(ROWS, BLOCK_K // 32)


@triton.jit
def _gemm_mxfp4_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K,
                       stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
                       stride_sam, stride_sak, stride_sbn, stride_sbk,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       GROUP_M: tl.constexpr, ELEMENTS: tl.constexpr, PACK: tl.constexpr,
                       INTERP_BF16: tl.constexpr, PRESHUFFLED: tl.constexpr):
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
    rows64, cols64 = rows.to(tl.int64), cols.to(tl.int64)
    kb = tl.arange(0, BLOCK_K // PACK)  # bytes: PACK elements each (2 e2m1, 1 e4m3)
    ks = tl.arange(0, BLOCK_K // 32)    # e8m0 scales: one per 32 elements
    a_ptrs = a_ptr + rows64[:, None] * stride_am + kb[None, :] * stride_ak
    b_ptrs = b_ptr + kb[:, None] * stride_bk + cols64[None, :] * stride_bn
    if PRESHUFFLED:   # a step's scales: BLOCK_K bytes of each 32-row stripe (kernels.mx_preshuffle)
        tl.static_assert(BLOCK_M % 32 == 0 and BLOCK_N % 32 == 0 and BLOCK_K % 256 == 0)
        stripes_m = pid_m * (BLOCK_M // 32) + tl.arange(0, BLOCK_M // 32)
        stripes_n = pid_n * (BLOCK_N // 32) + tl.arange(0, BLOCK_N // 32)
        kw = tl.arange(0, BLOCK_K)
        sa_ptrs = sa_ptr + stripes_m.to(tl.int64)[:, None] * stride_sam + kw[None, :] * stride_sak
        sb_ptrs = sb_ptr + stripes_n.to(tl.int64)[:, None] * stride_sbn + kw[None, :] * stride_sbk
    else:
        sa_ptrs = sa_ptr + rows64[:, None] * stride_sam + ks[None, :] * stride_sak
        sb_ptrs = sb_ptr + cols64[:, None] * stride_sbn + ks[None, :] * stride_sbk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_bytes = (K - k0) // PACK
        k_scales = tl.cdiv(K - k0, 32)  # an MXFP8 K may end inside a scale block
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (kb[None, :] < k_bytes), other=0)
        b = tl.load(b_ptrs, mask=(kb[:, None] < k_bytes) & (cols[None, :] < N), other=0)
        if PRESHUFFLED:
            chunks = tl.cdiv(K - k0, 256) * 256   # bytes of each stripe's chunks left along K
            sa = tl.load(sa_ptrs, mask=(stripes_m[:, None] < tl.cdiv(M, 32)) & (kw[None, :] < chunks), other=0)
            sb = tl.load(sb_ptrs, mask=(stripes_n[:, None] < tl.cdiv(N, 32)) & (kw[None, :] < chunks), other=0)
            acc = tl.dot_scaled(a, _unshuffle(sa, BLOCK_M, BLOCK_K), ELEMENTS,
                                b, _unshuffle(sb, BLOCK_N, BLOCK_K), ELEMENTS, acc)
        else:
            # exercise begin: scaled_dot
            sa = tl.load(sa_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < k_scales), other=0)
            sb = tl.load(sb_ptrs, mask=(cols[:, None] < N) & (ks[None, :] < k_scales), other=0)
            acc = tl.dot_scaled(a, sa, ELEMENTS, b, sb, ELEMENTS, acc)
            # exercise end
        a_ptrs += (BLOCK_K // PACK) * stride_ak
        b_ptrs += (BLOCK_K // PACK) * stride_bk
        step = BLOCK_K if PRESHUFFLED else BLOCK_K // 32   # 32 rows' scales per stripe, or one row's
        sa_ptrs += step * stride_sak
        sb_ptrs += step * stride_sbk

    if INTERP_BF16:
        acc = round_to_bf16(acc)
    c_ptrs = c_ptr + rows64[:, None] * stride_cm + cols64[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def aot(dtype: torch.dtype, backend: str, arch: str, overrides: dict | None = None):
    return launch.aot(_gemm_mxfp4_kernel, backend, arch, overrides, dtype)


@rung(op="gemm_mxfp4", rung=0, name="triton_dot_scaled", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot)
def gemm_mxfp4_v0(a_packed: torch.Tensor, a_scales: torch.Tensor, b_packed: torch.Tensor,
                  b_scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return launch.launch(_gemm_mxfp4_kernel, a_packed, a_scales, b_packed, b_scales, out_dtype)
