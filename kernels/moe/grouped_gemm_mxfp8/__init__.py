"""MXFP8 grouped GEMM ladder: per group g, y[rows of g] = dequant(x_g, sx_g) @ dequant(w[g], sw[g]).

The MoE expert GEMM in OCP MXFP8: e4m3fn elements with one e8m0 scale byte per 32 of
them along the reduction dimension (:mod:`kernels.microscaling`), which ``tl.dot_scaled``
hands to gfx950's scaled MFMA. Importing this package registers the problem
(:mod:`.spec`) and every rung, in ladder order; :func:`kernels.grouped_gemm_mxfp8` is the
public op (:mod:`.ops`). Training runs it as the ``"mxfp8"`` recipe of the FP8 grouped
GEMM's training op (:mod:`kernels.moe.grouped_gemm_fp8.training`): forward and dX on the
v0 kernel, dW on :mod:`.dw`, operands quantized by :mod:`.quantize`.
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_one_launch  # noqa: F401
from .training import grouped_gemm_mxfp8_dw  # noqa: F401
