"""Recipes whose GEMMs are ``kernels.matmul_fp8``: scales per tensor or per row/column.

``matmul_fp8`` applies its scales to the fp32 accumulator once, in the epilogue, so a
scale must be constant along the reduction dimension: one per tensor, one per row of A
(``(M, 1)``) or one per column of B (``(1, N)``). :class:`ScaledGemmRecipe` places the
operands of each of a linear layer's three GEMMs in that form; a recipe picks the
granularity of A and of B ("tensor" or "row"/"col"), and the orientation follows from
the GEMM: the rows of A and the columns of B are the ones whose scale is pulled out of
the dot product. For rowwise that means a fresh quantization per GEMM:

==========  =================  ===============================================
GEMM        A (scaled per row)  B (scaled per column)
==========  =================  ===============================================
forward     x, along K          w.T: each output feature, along K
dgrad       dy, along N         w: each input feature, along N (the reduction)
wgrad       dy.T, along M       x: each input feature, along M (the tokens)
==========  =================  ===============================================
"""
from __future__ import annotations

import torch

from ..gemm_fp8.formats import quantize_fp8
from ..gemm_fp8.ops import matmul_fp8
from .recipe import Recipe


def scaled_gemm(a, a_granularity: str, b, b_granularity: str, fp8: torch.dtype, out_dtype: torch.dtype,
                scale_a=None, scale_b=None) -> torch.Tensor:
    """``a @ b`` with both operands quantized to ``fp8`` at the given granularities (or with the
    given scales), through ``kernels.matmul_fp8``."""
    a8, sa = quantize_fp8(a, fp8, a_granularity, scale=scale_a)
    b8, sb = quantize_fp8(b, fp8, b_granularity, scale=scale_b)
    return matmul_fp8(a8, b8, sa, sb, out_dtype=out_dtype)


class ScaledGemmRecipe(Recipe):
    """A recipe of ``matmul_fp8`` GEMMs: ``a_granularity`` for A, ``b_granularity`` for B."""

    a_granularity = "tensor"
    b_granularity = "tensor"

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None):
        return scaled_gemm(x, self.a_granularity, w.t(), self.b_granularity, fp8, out_dtype,
                           scale_x, scale_w)

    def dgrad(self, dy, w, fp8, out_dtype, scale_w=None):
        return scaled_gemm(dy, self.a_granularity, w, self.b_granularity, fp8, out_dtype,
                           scale_b=scale_w)

    def wgrad(self, dy, x, fp8, out_dtype, scale_x=None):
        return scaled_gemm(dy.t(), self.a_granularity, x, self.b_granularity, fp8, out_dtype,
                           scale_b=scale_x)
