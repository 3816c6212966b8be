"""mxfp8: OCP microscaling, e4m3 elements with one e8m0 (power-of-two) scale per 32 along K.

Native on gfx950 (``tl.dot_scaled`` -> ``v_mfma_scale_f32_*_f8f6f4``) and Blackwell;
emulated elsewhere. Every GEMM quantizes both operands in groups of 32 along its own
reduction dimension, so each tensor needs one copy per orientation (x along K for the
forward and along M for wgrad; dy along N for dgrad and along M for wgrad; w along K
and along N): what ``quantize(..., transpose=True)`` writes in one pass. The kernels
are ``kernels.gemm_fp8.quantize(..., "mx32")`` and ``mx_matmul``; :attr:`needs` names
them while they are not installed. ``mx_matmul``'s B operand is passed as ``(K, N)``
with its scales as :func:`quantize` returns them for B's rows-as-groups layout
(``(N, K/32)``), the convention of ``kernels.matmul_mxfp4``.
"""
from __future__ import annotations

from ... import gemm_fp8
from ..recipe import Recipe, register


class MXFP8(Recipe):
    name = "mxfp8"
    summary = "e4m3 with an e8m0 scale per 32 elements along each GEMM's reduction dim"
    kernels = ("quantize", "mx_matmul")
    grad_dtype_note = "e4m3 for gradients too (the MX GEMM takes one element format here)"

    @staticmethod
    def _gemm(a, b_t, fp8, out_dtype):
        """``a (M, R) @ b_t (N, R).T``, both grouped by 32 along R."""
        a8, sa = gemm_fp8.quantize(a, "mx32", fp8)
        b8, sb = gemm_fp8.quantize(b_t, "mx32", fp8)
        return gemm_fp8.mx_matmul(a8, sa, b8.t(), sb, out_dtype)

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None):
        return self._gemm(x, w, fp8, out_dtype)

    def dgrad(self, dy, w, fp8, out_dtype, scale_w=None):
        return self._gemm(dy, w.t(), fp8, out_dtype)

    def wgrad(self, dy, x, fp8, out_dtype, scale_x=None):
        return self._gemm(dy.t(), x.t(), fp8, out_dtype)


register(MXFP8())
