"""dW of the MXFP8 grouped GEMM: dw[g] (K, N) = dequant(xt[:, tokens of g]) @ dequant(dyt[:, tokens of g])ᵀ.

Idea:
    The weight gradient reduces over each group's tokens, so its MX blocks run along the
    tokens: 32 consecutive tokens share one e8m0 scale per feature. A block that
    straddled two groups would scale one expert's gradient by another expert's
    outliers, and its scale would belong to neither group's reduction. So the operands
    come as :func:`.quantize.wgrad_operand` writes them: feature-major (xt (K, R), dyt
    (N, R), token-contiguous, the reduction dimension contiguous as MX matrix cores take
    both operands) with *each group's tokens padded with zeros to a multiple of 32*, so
    every group starts on a block boundary and owns its blocks; the padded group ends
    (``ends``, multiples of 32) replace the offsets. One program per (K tile, N tile,
    group), as ``grouped_gemm_fp8``'s dW kernel; its loop runs over the group's padded
    tokens with ``tl.dot_scaled``, and an empty group's programs store zeros. Whole tiles
    are loaded unmasked along the tokens, so 16 bytes at a time; the last, partial tile
    is loaded whole up to R and the next group's tokens are zeroed in registers (as
    ``grouped_gemm_fp8``'s dW kernel does), so its loads stay as wide.

    The padding costs at most 31 zero tokens per group in the copies (the copies exist
    anyway: the forward's operands are quantized along K, not along the tokens), and
    keeps the kernel free of per-block masking: the alternative, blocks aligned to
    absolute token positions, would make the first and last block of a group mix two
    groups' scales.

Why faster:
    Than dequantizing to bf16 and running grouped GEMM's dW kernel: a byte per element
    and a byte per 32 instead of two, and on gfx950 the FP8 matrix-core rate with the
    scales applied inside the MFMA.

Expected bound:
    Compute (FP8 matrix-core peak) when groups hold many tokens; the dw store (G·K·N
    elements in w's dtype) and the launch when they hold few (model).

Limits:
    Scales as the forward's: a byte at a time, through LDS in 8-bit accesses on gfx950
    (a group starts on a 32-token block, not on the 256-token chunk of the pre-shuffled
    layout, :mod:`kernels.mx_preshuffle`).
    One program per output tile and group however few tokens it has; no split-K. One
    fixed tile (:mod:`.tile`). The padded token count R is an upper bound (T + 31·G
    rounded up), since the host does not read the group sizes.
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
from .tile import config


@triton.jit
def _grouped_dw_mxfp8_kernel(xt_ptr, sxt_ptr, dyt_ptr, sdyt_ptr, dw_ptr, ends_ptr, R, K, N,
                             stride_xk, stride_xr, stride_sxk, stride_sxr,
                             stride_dyn, stride_dyr, stride_sdyn, stride_sdyr,
                             stride_dwg, stride_dwk, stride_dwn,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             INTERP_BF16: tl.constexpr):
    group = tl.program_id(2)
    # a multiple of 32 already; rounded down so the compiler knows it, and its loads stay wide
    start = (clamped(ends_ptr + group - 1, group > 0, R) // 32) * 32
    end = tl.maximum(clamped(ends_ptr + group, True, R), start)
    ks = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)     # rows of dw[g]: input features
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)   # its columns: output features
    rs = tl.arange(0, BLOCK_K)                                  # tokens of a step
    rb = tl.arange(0, BLOCK_K // 32)                            # their scale blocks
    k64, c64 = ks.to(tl.int64), cols.to(tl.int64)
    r64 = start.to(tl.int64) + rs
    b64 = (start // 32).to(tl.int64) + rb
    # A = xt's (K, tokens) tile, B = dytᵀ's (tokens, N) tile, scales per feature and block
    a_ptrs = xt_ptr + k64[:, None] * stride_xk + r64[None, :] * stride_xr
    b_ptrs = dyt_ptr + r64[:, None] * stride_dyr + c64[None, :] * stride_dyn
    sa_ptrs = sxt_ptr + k64[:, None] * stride_sxk + b64[None, :] * stride_sxr
    sb_ptrs = sdyt_ptr + c64[:, None] * stride_sdyn + b64[None, :] * stride_sdyr
    k_ok, n_ok = ks[:, None] < K, cols[None, :] < N
    s_ok = (cols[:, None] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, (end - start) // BLOCK_K):   # whole tiles: nothing masked along the tokens
        acc = tl.dot_scaled(tl.load(a_ptrs, mask=k_ok, other=0), tl.load(sa_ptrs, mask=k_ok, other=0), "e4m3",
                            tl.load(b_ptrs, mask=n_ok, other=0), tl.load(sb_ptrs, mask=s_ok, other=0), "e4m3",
                            acc)
        a_ptrs += tl.cast(stride_xr, tl.int64) * BLOCK_K
        b_ptrs += tl.cast(stride_dyr, tl.int64) * BLOCK_K
        sa_ptrs += tl.cast(stride_sxr, tl.int64) * (BLOCK_K // 32)
        sb_ptrs += tl.cast(stride_sdyr, tl.int64) * (BLOCK_K // 32)
    left = (end - start) % BLOCK_K   # a multiple of 32: whole scale blocks
    if left > 0:   # the last tile: loaded whole up to R (so as wide), the next group's tokens zeroed
        last = start + (end - start - left) + rs
        a = tl.load(a_ptrs, mask=k_ok & (last[None, :] < R), other=0)
        b = tl.load(b_ptrs, mask=(last[:, None] < R) & n_ok, other=0)
        a = tl.where(rs[None, :] < left, a, tl.zeros_like(a))
        b = tl.where(rs[:, None] < left, b, tl.zeros_like(b))
        sa = tl.load(sa_ptrs, mask=k_ok & (rb[None, :] * 32 < left), other=0)
        sb = tl.load(sb_ptrs, mask=s_ok & (rb[None, :] * 32 < left), other=0)
        acc = tl.dot_scaled(a, sa, "e4m3", b, sb, "e4m3", acc)
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    dw_ptrs = dw_ptr + group.to(tl.int64) * stride_dwg + k64[:, None] * stride_dwk + c64[None, :] * stride_dwn
    tl.store(dw_ptrs, acc.to(dw_ptr.dtype.element_ty), mask=k_ok & n_ok)


def grouped_dw_mxfp8(xt, sxt, dyt, sdyt, ends, out_dtype: torch.dtype) -> torch.Tensor:
    """dw (G, K, N) in ``out_dtype`` for operands already validated (:func:`.operands.check_dw`):
    one launch, no host sync."""
    (k, r), n, groups = xt.shape, dyt.shape[0], ends.shape[0]
    dw = new_output((groups, k, n), out_dtype, xt.device)
    here = _backend.current()
    cfg = config(here.name, here.arch)
    grid = (cdiv(k, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"]), groups)
    _grouped_dw_mxfp8_kernel.run(xt.view(torch.uint8), sxt, dyt.view(torch.uint8), sdyt, dw, ends, r, k, n,
                                 *xt.stride(), *sxt.stride(), *dyt.stride(), *sdyt.stride(), *dw.stride(),
                                 **run_kwargs(grid, dict(INTERP_BF16=interp_bf16(out_dtype), **cfg)))
    return dw


def aot(cfg: dict, shape=grouped_launch.AOT_SHAPE) -> AotKernel:
    """The dW launch of grouped GEMM's AOT shape with the tile ``cfg`` (:mod:`.tile`): xt (K, R)
    and dyt (N, R) token-contiguous, R = T + 32·G (a bound on the padded tokens), row-major
    scales, an fp32 dw (G, K, N) (master weights' gradient)."""
    t, k, n, g, _ = shape
    r = t + 32 * g
    ints = dict(R=r, K=k, N=n, stride_xk=r, stride_xr=1, stride_sxk=r // 32, stride_sxr=1,
                stride_dyn=r, stride_dyr=1, stride_sdyn=r // 32, stride_sdyr=1,
                stride_dwg=k * n, stride_dwk=n, stride_dwn=1)
    pointers = {"ends_ptr": "*i32", "dw_ptr": pointer_type(torch.float32)}
    return aot_launch(_grouped_dw_mxfp8_kernel, torch.uint8, cfg, ints, {"INTERP_BF16": False}, pointers)
