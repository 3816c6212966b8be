"""MXFP4 GEMM ladder: C = A @ B with OCP microscaling operands (e2m1, e8m0 scale per 32).

Importing this package registers the problem (:mod:`.spec`) and every rung, in ladder
order. :func:`quantize_mxfp4` prepares operands for :func:`kernels.matmul_mxfp4` (the
public op, :mod:`.ops`); :func:`dequantize_mxfp4` gives the values they stand for.
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_triton_dot_scaled  # noqa: F401
from .formats import FORMAT, dequantize_mxfp4, quantize_mxfp4

__all__ = ["FORMAT", "dequantize_mxfp4", "quantize_mxfp4"]
