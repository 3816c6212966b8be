"""The weight gradient as a kernel: dw[g] (K, N) = x[rows of g]ᵀ · dy[rows of g].

The "transposed" grouped GEMM: the output tile is fixed in size (K x N per group) and
it is the *reduction* that varies, over however many rows the router gave the group.
One program per (K tile, N tile, group): it reads its group's row range from the
offsets on the device (two int32 loads, no host sync) and reduces over it with the
shared tile loop (:mod:`.tiles`), so an empty group's programs store zeros, which is
the gradient, and every element of dw is written by exactly one program. The range is
read as the forward reads it (:mod:`.schedule`: clamped to [0, T], empty when it
decreases), so offsets nobody checked cannot move the reduction outside x and dy.
Scalar loads keep the reduction's length uniform: the loop stays scalar control flow.

xᵀ is read in place through strides (x stays (T, K) in memory): its tile arrives with
K contiguous, the layout MFMA does not want for the reduction over rows, so the
compiler transposes it on its way through LDS; the ISA tests check the loop runs on
MFMA and LDS without spills on gfx942 and gfx950.

dw may have another dtype than x and dy: the kernel stores its fp32 sum as ``acc.to(dw's
dtype)``, so an fp32 dw of bf16 operands (the gradient of an fp32 master expert weight under
autocast, :mod:`kernels.moe.layer_ladder.fused_op`) gets the accumulator unrounded, with no cast
pass after. Compiled for gfx942 and gfx950, that launch keeps the bf16 dw's hot loop on MFMA,
spills nothing, uses no scratch and stores 16 bytes at a time (``tests/test_moe_master_weights.py``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import backend as _backend
from ...outputs import new_output
from ...registry import AotKernel
from ...triton_support import aot_launch, cdiv, interp_bf16, run_kwargs, stored_as
from .launch import config, dw_ints
from .schedule import clamped
from .tiles import reduce_tiles


@triton.jit
def _grouped_dw_kernel(x_ptr, dy_ptr, dw_ptr, offsets_ptr, T, K, N,
                       stride_xt, stride_xk, stride_dyt, stride_dyn,
                       stride_dwg, stride_dwk, stride_dwn,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       INTERP_BF16: tl.constexpr):
    group = tl.program_id(2)
    start = clamped(offsets_ptr + group - 1, group > 0, T)
    end = tl.maximum(clamped(offsets_ptr + group, True, T), start)
    ks = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)   # rows of dw[g]: K
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = start + tl.arange(0, BLOCK_K)                       # the reduction: the group's rows
    # int64 offsets: an operand of 2^31+ elements would wrap in i32.
    xt_ptrs = x_ptr + ks.to(tl.int64)[:, None] * stride_xk + rows.to(tl.int64)[None, :] * stride_xt
    dy_ptrs = dy_ptr + rows.to(tl.int64)[:, None] * stride_dyt + cols.to(tl.int64)[None, :] * stride_dyn
    acc = reduce_tiles(xt_ptrs, dy_ptrs, tl.cast(stride_xt, tl.int64) * BLOCK_K,
                       tl.cast(stride_dyt, tl.int64) * BLOCK_K, ks[:, None] < K, cols[None, :] < N,
                       end - start, BLOCK_M, BLOCK_N, BLOCK_K, INTERP_BF16)
    dw_ptrs = (dw_ptr + group.to(tl.int64) * stride_dwg + ks.to(tl.int64)[:, None] * stride_dwk
               + cols.to(tl.int64)[None, :] * stride_dwn)
    tl.store(dw_ptrs, stored_as(acc, dw_ptr, INTERP_BF16), mask=(ks[:, None] < K) & (cols[None, :] < N))


def launch(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, dw: torch.Tensor, cfg: dict) -> None:
    """dw (G, K, N) = the kernel's result, with tile settings ``cfg`` (v4 tunes them)."""
    (groups, k, n) = dw.shape
    grid = (cdiv(k, cfg["BLOCK_M"]), cdiv(n, cfg["BLOCK_N"]), groups)
    _grouped_dw_kernel.run(x, dy, dw, offsets, x.shape[0], k, n, *x.stride(), *dy.stride(), *dw.stride(),
                           **run_kwargs(grid, dict(INTERP_BF16=interp_bf16(x.dtype), **cfg)))


def grouped_dw(x: torch.Tensor, dy: torch.Tensor, offsets: torch.Tensor, groups: int) -> torch.Tensor:
    """dw (groups, K, N) for x (T, K), dy (T, N) and offsets already validated; one launch."""
    dw = new_output((groups, x.shape[1], dy.shape[1]), x.dtype, x.device)
    here = _backend.current()
    launch(x, dy, offsets, dw, config(here.name, here.arch))
    return dw


def aot(dtype: torch.dtype, backend: str, arch: str, cfg: dict | None = None, fp32_dw: bool = False) -> AotKernel:
    """The dW launch of :data:`.launch.AOT_SHAPE` with ``cfg`` (by default :func:`.launch.config`),
    for the ISA inspector; ``fp32_dw``: dw in fp32 (an fp32 master weight's gradient)."""
    pointers = {"offsets_ptr": "*i32", **({"dw_ptr": "*fp32"} if fp32_dw else {})}
    return aot_launch(_grouped_dw_kernel, dtype, cfg or config(backend, arch), dw_ints(),
                      constexprs={"INTERP_BF16": False}, pointers=pointers)
