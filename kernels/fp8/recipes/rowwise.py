"""rowwise: one scale per row of A and per column of B, for each of the three GEMMs.

Each operand is scaled along the reduction dimension of the GEMM it enters (the table
in :mod:`kernels.fp8.scaled_gemm`), so an outlier costs only its own row or column:
torchao's ``rowwise`` recipe. x, w and dy are each quantized twice per step (once per
orientation): twice the quantization traffic of tensorwise, for a much smaller error
on activations with outlier channels or tokens.
"""
from __future__ import annotations

from ..recipe import register
from ..scaled_gemm import ScaledGemmRecipe


class Rowwise(ScaledGemmRecipe):
    name = "rowwise"
    summary = "per row of A and per column of B along each GEMM's reduction dim (x, w, dy twice each)"
    a_granularity = "row"
    b_granularity = "col"


register(Rowwise())
