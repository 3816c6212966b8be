"""Scaled FP8 GEMM ladder: C = (A s_a) @ (B s_b), the matmul of FP8 training and inference.

Importing this package registers the problem (:mod:`.spec`) and every rung, in ladder
order. :func:`fp8_dtype` and :func:`quantize_fp8` prepare operands for
:func:`kernels.matmul_fp8` (the public op, :mod:`.ops`). The FP8 training kernels:
:func:`quantize` (fused cast, amax and transposed copy, :mod:`.quantize`).
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_triton_upcast, v1_triton_fp8_dot  # noqa: F401
from .formats import FP8_DTYPES, fp8_dtype, quantize_fp8
from .quantize import quantize

__all__ = ["FP8_DTYPES", "fp8_dtype", "quantize", "quantize_fp8"]
