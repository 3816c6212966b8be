"""Recipes whose GEMMs are ``kernels.matmul_fp8``: scales per tensor or per row/column.

``matmul_fp8`` applies its scales to the fp32 accumulator once, in the epilogue, so a
scale must be constant along the reduction dimension: one per tensor, one per row of A
(``(M, 1)``) or one per column of B (``(1, N)``). The rows of A and the columns of B are
the ones whose scale is pulled out of the dot product, so for rowwise each GEMM needs
its operands scaled along its own reduction dimension:

==========  ==================  ===============================================
GEMM        A (scaled per row)  B (scaled per column)
==========  ==================  ===============================================
forward     x, along K          w.T: each output feature, along K
dgrad       dy, along N         w: each input feature, along N (the reduction)
wgrad       dy.T, along M       x: each input feature, along M (the tokens)
==========  ==================  ===============================================

:class:`PerTensorRecipe` (tensorwise, delayed): one scale serves both orientations, so
the forward's x8 and w8 are what the backward reads, as transposed views; the per-tensor
quantization is the fused ``kernels.gemm_fp8.quantize(..., "tensor")`` (an amax launch,
then the cast; a scale given from an amax history, delayed's for x, w and dy, skips the amax
launch, and the cast returns its tile maxima, whose max the history records), bit for bit
:func:`kernels.gemm_fp8.quantize_fp8`. Saved: x8 (M K bytes) and w8 (N K bytes) with two 4-byte scales.
:class:`RowwiseRecipe`: x and w are quantized once each by the fused
``kernels.gemm_fp8.quantize(..., "row", transpose=True)``, whose transposed copies, x.T
scaled along M and w.T scaled along N, are the operands dgrad and wgrad need; dy once the
same way in the backward. Saved: x.T in FP8 (M K bytes) and w.T (N K) with a 4-byte
scale per row (K of each).

The recipes quantize through :func:`kernels.gemm_fp8.quantize.quantize_checked` (the same op,
without its checks): x and w are checked by
:func:`kernels.fp8.fp8_linear` (or :meth:`~kernels.fp8.recipe.Recipe.gemms`), a given scale is a
layer's own or checked there, and dy is autograd's gradient of y (y's shape and dtype). A
forward is ``kernels::fp8_linear``'s implementation, which runs eagerly on real tensors (never
traced: the op's fake is), so its quantizations run their implementations without asking
(``direct=True``); a backward is traced under ``torch.compile`` and asks.
"""
from __future__ import annotations

from ..gemm_fp8.ops import matmul_fp8
from ..gemm_fp8.quantize import quantize_checked
from .recipe import Recipe, Saved


class ScaledGemmRecipe(Recipe):
    """A recipe of ``matmul_fp8`` GEMMs: one scale per tensor, or per row of A and per column
    of B, applied in the GEMM's epilogue."""


class PerTensorRecipe(ScaledGemmRecipe):
    """One scale per tensor: x, w and dy quantized once each; the backward reads views."""

    grad_format = "hybrid"
    grad_dtype_note = ("per-tensor scaling leaves a gradient's small values to its format's range: "
                        "e5m2 (hybrid), Transformer Engine's default for its per-tensor recipes")

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None, amax=False):
        x8, sx, *ax = quantize_checked(x, "tensor", fp8, scale=scale_x, amax=amax, direct=True)
        w8, sw, *aw = quantize_checked(w, "tensor", fp8, scale=scale_w, amax=amax, direct=True)
        y = matmul_fp8(x8, w8.t(), sx, sw, out_dtype=out_dtype)
        return (y, Saved(x8, sx, w8, sw)) + (((*ax, *aw),) if amax else ())   # the casts' tile maxima

    def backward(self, dy, saved, grad_fp8, dx_dtype, dw_dtype, need_dx=True, need_dw=True, scale_dy=None,
                 amax=False):
        """As :meth:`Recipe.backward`; ``scale_dy`` (delayed: from dy's amax history): dy cast with
        it, and with ``amax`` the tile maxima of that cast (their max dy's amax), returned third (as the
        forward's)."""
        dy8, sdy, *amax = quantize_checked(dy, "tensor", grad_fp8, scale=scale_dy, amax=amax)
        dx = matmul_fp8(dy8, saved.w, sdy, saved.w_scale, out_dtype=dx_dtype) if need_dx else None
        dw = matmul_fp8(dy8.t(), saved.x, sdy, saved.x_scale, out_dtype=dw_dtype) if need_dw else None
        return (dx, dw, *amax)


class RowwiseRecipe(ScaledGemmRecipe):
    """A scale per row of A and per column of B along each GEMM's reduction dimension."""

    operand_groups = dict.fromkeys(("forward", "dgrad", "wgrad"), ("row", "row"))
    saved_layout = ((True, "row"), (True, "row"))   # x.T along M, w.T along N
    grad_format = "e4m3"
    grad_dtype_note = ("a scale per row of dy already fits each row's range, so e4m3's extra "
                        "mantissa bit is worth more than e5m2's range (torchao's rowwise recipe)")

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None):
        x8, sx, xt8, sxt = quantize_checked(x, "row", fp8, transpose=True, direct=True)   # xt8: x.T along M
        w8, sw, wt8, swt = quantize_checked(w, "row", fp8, transpose=True, direct=True)   # wt8: w.T along N
        y = matmul_fp8(x8, w8.t(), sx, sw.t(), out_dtype=out_dtype)
        return y, Saved(xt8, sxt, wt8, swt)

    def backward(self, dy, saved, grad_fp8, dx_dtype, dw_dtype, need_dx=True, need_dw=True):
        dy8, sdy, *dyt = quantize_checked(dy, "row", grad_fp8, transpose=need_dw)
        dx = (matmul_fp8(dy8, saved.w.t(), sdy, saved.w_scale.t(), out_dtype=dx_dtype)
              if need_dx else None)
        dw = (matmul_fp8(dyt[0], saved.x.t(), dyt[1], saved.x_scale.t(), out_dtype=dw_dtype)
              if need_dw else None)
        return dx, dw
