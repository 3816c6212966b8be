"""Scaled FP8 GEMM ladder: C = (A s_a) @ (B s_b), the matmul of FP8 training and inference.

Importing this package registers the problem (:mod:`.spec`) and every rung, in ladder
order. :func:`fp8_dtype` and :func:`quantize_fp8` prepare operands for
:func:`kernels.matmul_fp8` (the public op, :mod:`.ops`). :func:`matmul_amax` and
:func:`matmul_to_fp8` go the other way: a GEMM whose epilogue returns C's amax, or C
already cast to FP8, for the next layer's quantization (:mod:`.epilogue`).
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_triton_upcast, v1_triton_fp8_dot  # noqa: F401
from .epilogue import matmul_amax, matmul_to_fp8
from .formats import FP8_DTYPES, fp8_dtype, quantize_fp8

__all__ = ["FP8_DTYPES", "fp8_dtype", "matmul_amax", "matmul_to_fp8", "quantize_fp8"]
