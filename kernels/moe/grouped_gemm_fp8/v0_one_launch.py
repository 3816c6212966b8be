"""v0 fp8_one_launch: grouped GEMM v2's single launch, with FP8 tiles in ``tl.dot`` and the
scales in the epilogue.

Idea:
    Two ideas the project already has, joined. The schedule is grouped GEMM v2's: one
    launch over an upper bound of row tiles (cdiv(T, BLOCK_M) + G) times column tiles,
    and each program finds its group and rows from the int32 offsets on the device
    (:mod:`kernels.moe.grouped_gemm.schedule`, no host sync). The tile product is ``gemm_fp8`` v1's: the
    one-byte tiles go into ``tl.dot`` as loaded, on the FP8 matrix cores with fp32
    accumulation (``v_mfma_f32_16x16x32_fp8_fp8`` on gfx942 with fnuz operands,
    CDNA4's ``v_mfma_f32_16x16x128_f8f6f4`` on gfx950 with OCP ones), through grouped
    GEMM's shared K loop (:mod:`kernels.moe.grouped_gemm.tiles`: LDS, two stages, the
    ragged K step peeled). The scales are constant along K, so
    ``(x sx) @ (w[g] sw[g]) = sx * (x @ w[g]) * sw[g]``: the token scales of the tile's
    rows and the group's channel scales of its columns multiply the accumulator once,
    before the bf16 store.

    Block scales (DeepSeek-V3's recipe: x per token and 128 of K, w per expert and 128 x 128
    block, :mod:`.operands`) change along K and do not factor out; ``SCALE_K`` = 128 selects,
    at compile time, ``gemm_fp8`` v2's answer in the shared K loop: each K step's product
    goes into a fresh fp32 partial product that the step's block scales multiply before it
    is added (:func:`kernels.moe.grouped_gemm.tiles.accumulate`). A K step of 128 is one
    scale block; the ISA tests pin the scaling VALU beside the FP8 MFMAs in the hot loop.

Why faster:
    Than grouped GEMM v2 on bf16 operands: half the bytes of x and of every expert's
    weight from HBM, which bounds MoE layers whose experts get few tokens, and twice
    the multiply-adds per cycle of the bf16 matrix cores (datasheet peaks of CDNA3,
    CDNA4 and Hopper). Than the per-expert loop of ``torch._scaled_mm`` the baseline
    falls back to: one launch and no host read of the offsets, as v2 against v0.

Expected bound:
    Compute (FP8 matrix-core peak) at many rows per expert; memory (every expert's FP8
    weights read once: bytes_moved / HBM bandwidth) at few (model).

Limits:
    x and w share one e4m3 format (the target's: fnuz on gfx942, OCP elsewhere), or
    one of them is that family's e5m2 (dX of the hybrid format: ``tl.dot`` takes the
    two formats as they are, on gfx942's ``v_mfma_f32_16x16x32_fp8_bf8`` and gfx950's
    f8f6f4 MFMA with the e5m2 operand flagged in ``blgp``); scales row-wise (per token,
    per expert channel; a per-tensor scale is the same broadcast with stride 0) or in
    1 x 128 / 128 x 128 blocks, no other block size. The rung itself has no autograd, as
    ``gemm_fp8``; training runs it for the forward and dX and :mod:`.dw` for dW
    (:mod:`.training`). v2's schedule limits (G in one
    BLOCK_G vector, surplus programs, no L2 swizzle) and one fixed tile for every shape.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import backend as _backend
from ...gemm_fp8.formats import native_dtypes
from ...gemm_fp8.operands import SCALE_K
from ...outputs import new_output
from ...registry import AotKernel, rung
from ...triton_support import aot_launch, cdiv, interp_bf16, pointer_type, round_to_bf16, run_kwargs
from ..grouped_gemm import launch as grouped_launch
from ..grouped_gemm.tiles import reduce_tiles
from ..grouped_gemm.schedule import group_tiles, locate
from ..grouped_gemm.v2_one_launch import grid
from . import dw, operands


@triton.jit
def _epilogue_scales(acc, sx_ptr, sw_ptr, rows, cols, end, N, r64, g64, c64, stride_sx, stride_swg,
                     stride_swn):
    """acc times the row-wise scales: each row's token scale and the expert's column scales."""
    # exercise begin: scales
    scale_x = tl.load(sx_ptr + r64 * stride_sx, mask=rows < end, other=0.0)
    scale_w = tl.load(sw_ptr + g64 * stride_swg + c64 * stride_swn, mask=cols < N, other=0.0)
    acc = acc * scale_x[:, None] * scale_w[None, :]
    # exercise end
    return acc


@triton.jit
def _grouped_gemm_fp8_kernel(x_ptr, sx_ptr, w_ptr, sw_ptr, out_ptr, offsets_ptr, T, N, K, G,
                             stride_xt, stride_xk, stride_wg, stride_wk, stride_wn,
                             stride_ot, stride_on, stride_sx, stride_sxk, stride_swg, stride_swk,
                             stride_swn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, BLOCK_G: tl.constexpr,
                             SCALE_K: tl.constexpr, INTERP_BF16: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)   # the grid's column tile
    starts, ends, tiles, cum = group_tiles(offsets_ptr, G, T, BLOCK_M, BLOCK_G)   # v2's schedule
    group, start, end = locate(tl.program_id(0), starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    if group >= G:  # a surplus program of the upper-bound grid
        return
    rows = start + tl.arange(0, BLOCK_M)
    # int64 offsets, each widened once for its five uses: an operand of 2^31+ elements
    # would wrap in i32.
    r64, c64, k64 = rows.to(tl.int64), cols.to(tl.int64), tl.arange(0, BLOCK_K).to(tl.int64)
    g64 = group.to(tl.int64)
    x_ptrs = x_ptr + r64[:, None] * stride_xt + k64[None, :] * stride_xk
    w_ptrs = w_ptr + g64 * stride_wg + k64[:, None] * stride_wk + c64[None, :] * stride_wn
    # the scales of the tile's rows and columns (of its first K block when they change along K:
    # per 128 columns of a 128 x 128 weight block, the next block stride_sxk / stride_swk on)
    sx_ptrs = sx_ptr + r64 * stride_sx
    if SCALE_K > 0:
        sw_ptrs = sw_ptr + g64 * stride_swg + (c64 // SCALE_K) * stride_swn
    else:
        sw_ptrs = sw_ptr + g64 * stride_swg + c64 * stride_swn
    # FP8 operands: the interpreter's dot is exact on them, so no bf16 workaround there
    acc = reduce_tiles(x_ptrs, w_ptrs, tl.cast(stride_xk, tl.int64) * BLOCK_K,
                       tl.cast(stride_wk, tl.int64) * BLOCK_K, rows[:, None] < end,
                       cols[None, :] < N, K, BLOCK_M, BLOCK_N, BLOCK_K, False,
                       sx_ptrs[:, None], sw_ptrs[None, :], stride_sxk, stride_swk, SCALE_K)
    if SCALE_K == 0:   # scales constant along K: once, on the accumulator
        acc = _epilogue_scales(acc, sx_ptr, sw_ptr, rows, cols, end, N, r64, g64, c64, stride_sx,
                               stride_swg, stride_swn)
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    out_ptrs = out_ptr + r64[:, None] * stride_ot + c64[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < end) & (cols[None, :] < N))


def config(backend: str, arch: str = "gfx942") -> dict:
    """Grouped GEMM's tile, 128 deep on GPUs: an FP8 element is one byte, so a K step
    moves the bytes of bf16's 64, and on gfx950 a K step of 128 is what selects the
    16x16x128 CDNA4 instruction (as ``gemm_fp8``'s tile)."""
    cfg = grouped_launch.config(backend, arch)
    return cfg if backend == "interpreter" else {**cfg, "BLOCK_K": 128}


def grouped_mm_fp8(x, sx, w, sw, offsets, out_dtype) -> torch.Tensor:
    """y (T, N) for operands already validated: one launch, no host sync."""
    (t, k), (groups, _, n) = x.shape, w.shape
    out = new_output((t, n), out_dtype, x.device)
    here = _backend.current()
    cfg = config(here.name, here.arch)
    blocks = sx.dim() == 2   # per 1 x 128 of x and 128 x 128 of w (operands.check)
    sx_strides = sx.stride() if blocks else (sx.stride(0), 0)
    sw_strides = sw.stride() if blocks else (sw.stride(0), 0, sw.stride(1))
    _grouped_gemm_fp8_kernel.run(
        x, sx, w, sw, out, offsets, t, n, k, groups, *x.stride(), *w.stride(), *out.stride(),
        *sx_strides, *sw_strides, **run_kwargs(grid(t, n, groups, cfg), dict(
            BLOCK_G=triton.next_power_of_2(groups), SCALE_K=SCALE_K if blocks else 0,
            INTERP_BF16=interp_bf16(out_dtype), **cfg)))
    return out


def aot(dtype: torch.dtype, backend: str, arch: str, grad_dtype: torch.dtype | None = None) -> list[AotKernel]:
    """The launches of a training step on grouped GEMM's :data:`AOT shape
    <kernels.moe.grouped_gemm.launch.AOT_SHAPE>`, as grouped GEMM v2 lists its own: the forward
    with K-contiguous experts (w stored (G, N, K), the layout FP8 matrix cores and
    hipBLASLt want, as ``gemm_fp8``'s AOT launch and :mod:`.quantize` write it) and a bf16
    output; the
    backward's dX, this kernel on wᵀ (a (G, N, K) view of a (G, K, N) copy: contiguous
    along the reduction N); the backward's dW (:mod:`.dw`). Then the same three with the
    blockwise recipe's scales (``SCALE_K`` = 128, dW's ``SCALE_R`` = 128). ``grad_dtype``:
    the output gradient's FP8 format in dX and dW (default ``dtype``; the hybrid format's e5m2)."""
    fixed = {"INTERP_BF16": False, "BLOCK_G": triton.next_power_of_2(grouped_launch.forward_ints()["G"])}
    pointers = {"offsets_ptr": "*i32", "sx_ptr": "*fp32", "sw_ptr": "*fp32",
                "out_ptr": pointer_type(torch.bfloat16)}
    launches = {}
    for scale_k in (0, SCALE_K):
        for transposed_w, x_dtype in ((False, dtype), (True, grad_dtype or dtype)):   # forward, dX (x: dy)
            ints = grouped_launch.forward_ints(transposed_w=transposed_w)
            ints.update(stride_wk=1, stride_wn=ints["K"], **_aot_scale_strides(ints, scale_k, transposed_w))
            launches[scale_k, transposed_w] = aot_launch(
                _grouped_gemm_fp8_kernel, dtype, config(backend, arch), ints, {**fixed, "SCALE_K": scale_k},
                {**pointers, "x_ptr": pointer_type(x_dtype)})
    return [launches[0, False], launches[0, True], dw.aot(dtype, backend, arch, grad_dtype),
            launches[SCALE_K, False], launches[SCALE_K, True], dw.aot(dtype, backend, arch, grad_dtype, SCALE_K)]


def _aot_scale_strides(ints: dict, scale_k: int, transposed_w: bool) -> dict[str, int]:
    """Row-wise scales, or blockwise ones as :mod:`.quantize` writes them: sx (T, K/128)
    contiguous; sw (G, K/128, N/128) for the forward, for dX the (G, N/128, K/128) view of
    the dgrad copy's (G, K/128, N/128) scales."""
    if not scale_k:
        return dict(stride_sx=1, stride_sxk=0, stride_swg=ints["N"], stride_swk=0, stride_swn=1)
    kb, nb = cdiv(ints["K"], scale_k), cdiv(ints["N"], scale_k)
    if transposed_w:
        return dict(stride_sx=kb, stride_sxk=1, stride_swg=kb * nb, stride_swk=1, stride_swn=kb)
    return dict(stride_sx=kb, stride_sxk=1, stride_swg=kb * nb, stride_swk=nb, stride_swn=1)


@rung(op="grouped_gemm_fp8", rung=0, name="fp8_one_launch", backends=("hip", "cuda", "interpreter"),
      dtypes=native_dtypes(), interpreter=True, kind="triton", aot=aot)
def grouped_gemm_fp8_v0(x: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, sw: torch.Tensor,
                        offsets: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
                        check_offsets: bool = True) -> torch.Tensor:
    """``check_offsets=False`` skips the host read that validates the offsets' values."""
    offsets = operands.check(x, sx, w, sw, offsets, out_dtype, check_values=check_offsets)
    return grouped_mm_fp8(x, sx, w, sw, offsets, out_dtype)
