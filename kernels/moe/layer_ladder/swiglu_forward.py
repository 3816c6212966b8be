"""SwiGLU of the FP8 MoE layers' gate and up GEMM outputs in one pass: ``h = silu(g)·u``.

Per element, in fp32 from g and u (x's dtype) and rounded once to x's dtype: with
σ = sigmoid(g), ``h = g·σ·u``, with the σ(g) that :mod:`.swiglu_backward` recomputes from
the same g for dg and du. Torch's ``F.silu(g) * u`` rounds twice (silu(g) to x's dtype,
then the product), so h can differ from it in the last bit; what the FP8 layers quantize
for down's GEMM, and the amax that delayed scaling records of h, are these bits. Each of
g and u is read once and h written once: 2 reads and 1 write of x's dtype per element,
where torch's two passes read 3 and write 2.

Its callers: :mod:`kernels.moe.swiglu_op` (``kernels::swiglu``, ``Float8MoE``'s SwiGLU)
and the expert-parallel FP8 owner (:mod:`kernels.moe.ep_fp8_layer`), whose capacity
padding rows past the last expert's end it bounds on the device (``rows_end``): they read
nothing (the gate and up GEMMs left them unwritten) and their h is 0, what down's
quantization and h's amax then read there. (v3's fused rung computes SwiGLU in its gate/up
GEMM's epilogue instead.)

Tile, checks and launch are :mod:`.swiglu_rows`'s, shared with the backward.
``tests/test_moe_swiglu_isa.py`` compiles the launch (unbounded, as
``Float8MoE`` runs it, and the FP8 owner's bounded one) for gfx942 and gfx950: g and u read
and h written 16 bytes per thread in bf16, nothing narrower but the bound's one scalar
load, no LDS, no spills, 8 waves per SIMD.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...outputs import new_output
from ...registry import AotKernel
from ...triton_support import store_rows
from . import swiglu_rows
from .spec import AOT_SHAPE
from .swiglu_rows import check_rows, check_rows_end, col_block, launch, load_rows, row_block


@triton.jit
def _swiglu_forward_kernel(g_ptr, u_ptr, end_ptr, h_ptr, R, H, stride_g, stride_u,
                           BOUNDED: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
                           INTERP_BF16: tl.constexpr):
    rows, live, read = row_block(R, end_ptr, BOUNDED, BLOCK_R)   # past *end_ptr: g = u = 0, so h = 0
    for start in range(0, H, BLOCK_H):
        cols, mask, loaded = col_block(start, H, live, read, BLOCK_H)
        g = load_rows(g_ptr, rows, stride_g, cols, loaded)
        u = load_rows(u_ptr, rows, stride_u, cols, loaded)
        store_rows(h_ptr, rows, cols, H, 1, g * tl.sigmoid(g) * u, mask, INTERP_BF16)


def check(g, u, rows_end=None) -> None:
    """g and u as :func:`.swiglu_rows.check_rows` has them, ``rows_end`` as
    :func:`.swiglu_rows.check_rows_end`: what :func:`swiglu_forward` takes."""
    check_rows(g=g, u=u)
    check_rows_end(rows_end, g.device)


def swiglu_forward(g: torch.Tensor, u: torch.Tensor, rows_end: torch.Tensor | None = None, *,
                   checked: bool = False) -> torch.Tensor:
    """``h = silu(g)·u`` of two (R, H) tensors (:func:`check`), contiguous, in their dtype,
    rounded once from fp32. ``rows_end``: None, or an int32 tensor of one element on the
    device (the expert-parallel FP8 owner's ``offsets[-1:]``): the rows at or past it
    (capacity padding, which the gate and up GEMMs left unwritten) read nothing and get 0,
    with no host read of the bound. ``checked``: the caller ran :func:`check` on these
    arguments already (``kernels.moe.swiglu_op.swiglu`` does, before its dispatch), so it is
    not run twice."""
    if not checked:
        check(g, u, rows_end)
    rows, hidden = g.shape
    h = new_output((rows, hidden), g.dtype, g.device)
    if rows * hidden:
        launch(_swiglu_forward_kernel, (g, u, g if rows_end is None else rows_end, h, rows, hidden,
                                        g.stride(0), u.stride(0)), rows, g.dtype, BOUNDED=rows_end is not None)
    return h


def aot(dtype: torch.dtype = torch.bfloat16, bounded: bool = False) -> AotKernel:
    """The launch at :data:`.spec.AOT_SHAPE` (DeepSeek-V3's 32 local experts: R = T·k rows of
    hidden columns, contiguous), for an ahead-of-time compile
    (:func:`workbench.isa.compile.compile_aot`; not a rung, so not in the inspector):
    ``Float8MoE``'s, or with ``bounded`` the expert-parallel FP8 owner's with capacity
    (``rows_end`` given). Unbounded, g's pointer stands in for the bound's, as the call passes it."""
    t, _, hidden, _, top_k, _ = AOT_SHAPE
    ints = dict(R=t * top_k, H=hidden, stride_g=hidden, stride_u=hidden)
    return swiglu_rows.aot(_swiglu_forward_kernel, dtype, ints, dict(BOUNDED=bounded),
                           {"end_ptr": "*i32"} if bounded else {})
