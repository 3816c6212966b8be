"""rowwise: one scale per row of A and per column of B, for each of the three GEMMs.

Each operand is scaled along the reduction dimension of the GEMM it enters (the table
in :mod:`kernels.fp8.scaled_gemm`), so an outlier costs only its own row or column:
torchao's ``rowwise`` recipe. x, w and dy each need two orientations; the fused
quantize writes both from one read of the tensor (after its amax pass), and the forward
keeps the transposed copies of x and w for the backward instead of their high-precision
originals. Gradients in e4m3 (``grad_format``; ``"hybrid"`` takes e5m2).
"""
from __future__ import annotations

from ..recipe import register
from ..scaled_gemm import RowwiseRecipe


class Rowwise(RowwiseRecipe):
    name = "rowwise"
    summary = "per row of A and per column of B along each GEMM's reduction dim (x, w, dy in two orientations each)"
    kernels = ("quantize",)


register(Rowwise())
