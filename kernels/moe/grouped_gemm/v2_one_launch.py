"""v2 one_launch: every expert's tiles in a single launch, scheduled on the device.

Idea:
    v1 paid one launch per expert and a host read of the offsets to size them. v2
    launches once, with a grid known without looking at the offsets: each group adds
    at most one partial row tile, so cdiv(T, BLOCK_M) + G row tiles bound the work,
    times cdiv(N, BLOCK_N) column tiles. Each program then finds its own tile from
    the offsets, on the device: it loads the G ends (a BLOCK_G-wide vector), counts
    each group's row tiles, takes their running sum (``tl.cumsum``) and picks the
    group whose tile range holds its program id. Programs past the last real tile
    (at most G per column of tiles) return at once. The product itself is GEMM v4's
    loop (:mod:`.tiles`): MFMA through ``tl.dot`` with fp32 accumulation, operands
    staged through LDS in two pipeline stages, the ragged K step peeled.

    The backward runs on the same machinery: dx is this kernel again with wᵀ (a
    stride view) over the same offsets, and dw is the dW kernel of :mod:`.dw`, one
    launch over (K tile, N tile, group) with a reduction of the group's own length.
    Forward and backward alike: no ``.item()``, no ``.tolist()``, no host sync.

Why faster:
    One launch instead of G: all experts' tiles fill the CUs together, so the
    partial last wave is paid once per call, not once per expert (32 experts of
    1024 rows x 7168 columns in 128 x 128 tiles are 32 x 448 = 14336 tiles, 47.2
    waves on 304 CUs in one launch, against 32 launches of 1.47 waves each, every
    one ending half empty: reasoning, not a measurement). No CPU round trip, so it
    can be captured in a CUDA/HIP graph and overlaps the previous kernels.

    Against v1 per target, by the model (not a measurement), at the bench shapes: on
    MI300X faster or within 5 % at every one. On MI355X, H100 and H200 more than 5 %
    *slower*, bound by HBM, at DeepSeek-V3's balanced shapes, and on H100 also at
    DeepSeek-V3's skewed gate+up and Qwen3-MoE's three, on H200 at Qwen3-MoE's
    balanced down: a wave of v2 runs one column panel over nearly every row tile, so
    all of x comes from HBM once per panel, where v1's launches walk GEMM v3's grouped
    order and share x's rows (see Limits); faster or within 5 % elsewhere.

Expected bound:
    Compute (matrix-core peak) at large rows per expert, as GEMM v4; memory (every
    expert's weights read once) when experts get few rows, where the bound is
    bytes_moved / HBM bandwidth (model).

Limits:
    The schedule costs each program G int32 loads and a scan (cheap against a K
    loop, but G must fit one BLOCK_G vector: a few thousand experts at most).
    Surplus programs still launch and exit. Programs walk one column panel of w
    through every group's row tiles; there is no L2 swizzle or XCD remap (GEMM
    v3's ideas) and no persistent scheduling. One fixed tile for every shape.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import backend as _backend
from ... import validate
from ...outputs import new_output
from ...registry import AotKernel, rung
from ...triton_support import aot_launch, cdiv, interp_bf16, round_to_bf16
from . import dw
from .grads import differentiable
from .launch import config, forward_ints
from .schedule import group_tiles, locate
from .spec import DTYPES
from .tiles import reduce_tiles


@triton.jit
def _grouped_gemm_kernel(x_ptr, w_ptr, out_ptr, offsets_ptr, T, N, K, G,
                         stride_xt, stride_xk, stride_wg, stride_wk, stride_wn,
                         stride_ot, stride_on,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_G: tl.constexpr, INTERP_BF16: tl.constexpr):
    starts, ends, tiles, cum = group_tiles(offsets_ptr, G, T, BLOCK_M, BLOCK_G)
    group, start, end = locate(tl.program_id(0), starts, ends, tiles, cum, BLOCK_M, BLOCK_G)
    if group >= G:  # a surplus program of the upper-bound grid
        return
    rows = start + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # int64 offsets: an operand of 2^31+ elements would wrap in i32.
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_xt + ks.to(tl.int64)[None, :] * stride_xk
    w_ptrs = (w_ptr + group.to(tl.int64) * stride_wg + ks.to(tl.int64)[:, None] * stride_wk
              + cols.to(tl.int64)[None, :] * stride_wn)
    acc = reduce_tiles(x_ptrs, w_ptrs, tl.cast(stride_xk, tl.int64) * BLOCK_K,
                       tl.cast(stride_wk, tl.int64) * BLOCK_K, rows[:, None] < end,
                       cols[None, :] < N, K, BLOCK_M, BLOCK_N, BLOCK_K, INTERP_BF16)
    if INTERP_BF16:
        acc = round_to_bf16(acc)
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_ot + cols.to(tl.int64)[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < end) & (cols[None, :] < N))


def grid(t: int, n: int, groups: int, cfg: dict) -> tuple[int, int]:
    """Row tiles (an upper bound from T and G alone: no offsets read) x column tiles."""
    return cdiv(t, cfg["BLOCK_M"]) + groups, cdiv(n, cfg["BLOCK_N"])


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """out (T, N) for operands already validated: one launch, no host sync."""
    (t, k), (groups, _, n) = x.shape, w.shape
    out = new_output((t, n), x.dtype, x.device)
    here = _backend.current()
    cfg = config(here.name, here.arch)
    _grouped_gemm_kernel[grid(t, n, groups, cfg)](
        x, w, out, offsets, t, n, k, groups, *x.stride(), *w.stride(), *out.stride(),
        BLOCK_G=triton.next_power_of_2(groups), INTERP_BF16=interp_bf16(x.dtype), **cfg)
    return out


_differentiable = differentiable(grouped_mm, dw.grouped_dw)


def aot(dtype: torch.dtype, backend: str, arch: str) -> list[AotKernel]:
    """The forward, the backward's dX (wᵀ) and dW launches of :data:`.launch.AOT_SHAPE`."""
    cfg = config(backend, arch)
    fixed = {"INTERP_BF16": False, "BLOCK_G": triton.next_power_of_2(forward_ints()["G"])}
    i32 = {"offsets_ptr": "*i32"}
    return [aot_launch(_grouped_gemm_kernel, dtype, cfg, forward_ints(), fixed, i32),
            aot_launch(_grouped_gemm_kernel, dtype, cfg, forward_ints(transposed_w=True), fixed, i32),
            dw.aot(dtype, backend, arch)]


@rung(op="grouped_gemm", rung=2, name="one_launch", backends=("hip", "cuda", "interpreter"),
      dtypes=DTYPES, interpreter=True, kind="triton", aot=aot, backward=True)
def grouped_gemm_v2(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, *,
                    check_offsets: bool = True) -> torch.Tensor:
    """``check_offsets=False`` skips the host read that validates the offsets' values."""
    offsets = validate.grouped_gemm_operands(x, w, offsets, DTYPES, check_values=check_offsets)
    return _differentiable(x, w, offsets)
