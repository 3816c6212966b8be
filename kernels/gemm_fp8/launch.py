"""Launch plumbing shared by the Triton FP8 rungs: tile configs, the grid, AOT signatures.

The rungs differ only inside their ``@triton.jit`` kernel (the lesson); both kernels
take the same arguments, so the host side that fills them in lives here once.
"""
from __future__ import annotations

import torch

from .. import backend as _backend
from ..outputs import new_output
from ..registry import AotKernel
from ..triton_support import aot_launch, cdiv, interp_bf16, pointer_type, run_kwargs
from ..tuning import with_overrides
from . import operands

def config(backend: str) -> dict:
    """Tiles per backend; K tiles are wide because an FP8 element is one byte.

    hip: 256x128x128, two stages, 16x16 MFMA tiles (``matrix_instr_nonkdim``): fits
    gfx942's 64 KiB of LDS without register spills (AOT-checked), and on gfx950 a
    K step of 128 selects the CDNA4 ``v_mfma_f32_16x16x128_f8f6f4``. cuda: 128x256x128,
    three stages (144 KiB of Hopper shared memory). interpreter: small tiles, since
    each program costs ~1 ms.
    """
    if backend == "interpreter":
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, num_warps=4, num_stages=1)
    if backend == "hip":
        return dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=2,
                    matrix_instr_nonkdim=16)
    return dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=3)


def aot(kernel, dtype: torch.dtype, backend: str, overrides: dict | None = None,
        out_dtype: torch.dtype = torch.bfloat16) -> list[AotKernel]:
    """The launch the ISA inspector compiles: an 8192^3 GEMM with K-contiguous A and B
    (the layout FP8 matrix cores and hipBLASLt want) and per-row/per-column scales;
    ``overrides`` replaces settings of :func:`config`."""
    size = 8192
    ints = dict(M=size, N=size, K=size, stride_am=size, stride_ak=1, stride_bk=1, stride_bn=size,
                stride_cm=size, stride_cn=1, stride_sa=1, stride_sb=1)
    return [aot_launch(kernel, dtype, with_overrides(config(backend), overrides), ints,
                       constexprs={"INTERP_BF16": False},
                       pointers={"c_ptr": pointer_type(out_dtype), "sa_ptr": "*fp32", "sb_ptr": "*fp32"})]


def aot_blockwise(kernel, dtype: torch.dtype, backend: str, overrides: dict | None = None,
                  out_dtype: torch.dtype = torch.bfloat16) -> list[AotKernel]:
    """v2's launch for the ISA inspector: :func:`aot`'s 8192^3 GEMM with DeepSeek-V3's
    forward scales, A per 1 x 128 ((M, K/128), K-block-contiguous) and B per 128 x 128
    ((K/128, N/128)), so the compile shows the per-K-block scaling in the loop. B's scales
    lie as the blockwise recipe's forward passes them: the transpose of the weight's
    (N/128, K/128), unit stride along K (Triton folds that stride to a constant)."""
    size, blocks = 8192, 8192 // operands.SCALE_K
    ints = dict(M=size, N=size, K=size, stride_am=size, stride_ak=1, stride_bk=1, stride_bn=size,
                stride_cm=size, stride_cn=1, stride_sam=blocks, stride_sak=1, stride_sbk=1,
                stride_sbn=blocks)
    return [aot_launch(kernel, dtype, with_overrides(config(backend), overrides), ints,
                       constexprs={"INTERP_BF16": False, "SCALE_K": operands.SCALE_K,
                                   "GROUP_N": operands.SCALE_K, "SCALES_ALONG_K": True},
                       pointers={"c_ptr": pointer_type(out_dtype), "sa_ptr": "*fp32", "sb_ptr": "*fp32"})]


def plan_blockwise(kernel, a, b, scale_a, scale_b, out_dtype) -> "Plan":
    """:func:`launch`'s plan for v2, whose scales may change along K (:func:`operands.check_blockwise`)."""
    scales = operands.check_blockwise(a, b, scale_a, scale_b, out_dtype)
    return Plan(kernel, a, b, out_dtype,
                (scales.stride_sam, scales.stride_sak, scales.stride_sbk, scales.stride_sbn),
                dict(SCALE_K=operands.SCALE_K, GROUP_N=scales.group_n, SCALES_ALONG_K=scales.along_k))


def launch_blockwise(kernel, a, b, scale_a, scale_b, out_dtype) -> torch.Tensor:
    """:func:`launch` for v2 (:func:`plan_blockwise`)."""
    return plan_blockwise(kernel, a, b, scale_a, scale_b, out_dtype)(a, b, scale_a, scale_b)


def launch(kernel, a, b, scale_a, scale_b, out_dtype) -> torch.Tensor:
    """Check the operands, allocate C (poisonable) and run ``kernel`` over a 1-D grid."""
    plan = Plan(kernel, a, b, out_dtype, operands.check(a, b, scale_a, scale_b, out_dtype), {})
    return plan(a, b, scale_a, scale_b)


class Plan:
    """One launch of ``kernel`` on checked operands of one metadata, everything but the tensors
    decided (grid, scalars, settings): a call allocates C and launches. A public op keeps it
    (:mod:`kernels.plans`), so a repeated call skips the checks and the packing."""

    def __init__(self, kernel, a, b, out_dtype, scale_strides: tuple, constexprs: dict):
        (m, k), n = a.shape, b.shape[1]
        cfg = config(_backend.current().name)
        self.kernel, self.shape, self.out_dtype = kernel, (m, n), out_dtype
        self.grid = (cdiv(m, cfg["BLOCK_M"]) * cdiv(n, cfg["BLOCK_N"]),)
        # C is new_output's: contiguous, strides (N, 1)
        self.scalars = (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), n, 1, *scale_strides)
        self.kwargs = run_kwargs(self.grid, {"INTERP_BF16": interp_bf16(out_dtype), **constexprs, **cfg})

    def __call__(self, a, b, scale_a, scale_b) -> torch.Tensor:
        c = new_output(self.shape, self.out_dtype, a.device)
        self.kernel.run(a, b, c, scale_a, scale_b, *self.scalars, **self.kwargs)
        return c
