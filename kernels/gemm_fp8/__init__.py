"""Scaled FP8 GEMM ladder: C = (A s_a) @ (B s_b), the matmul of FP8 training and inference.

Importing this package registers the problem (:mod:`.spec`) and every rung, in ladder
order. :func:`fp8_dtype` and :func:`quantize_fp8` prepare operands for
:func:`kernels.matmul_fp8` (the public op, :mod:`.ops`). :func:`matmul_amax` and
:func:`matmul_to_fp8` go the other way: a GEMM whose epilogue returns C's amax, or C
already cast to FP8, for the next layer's quantization (:mod:`.epilogue`). The FP8
training kernels: :func:`quantize` (fused cast, amax and transposed copy, :mod:`.quantize`),
:func:`blockwise_matmul` (scales per 128 along K, rung v2, :mod:`.ops`) and
:func:`mx_matmul` (MXFP8 through ``tl.dot_scaled``, :mod:`kernels.gemm_mxfp4.ops`; resolved
on first use, since ``gemm_mxfp4`` imports this package's operand checks).
"""
from . import spec  # noqa: F401  (registers the op)
from . import ref, v0_triton_upcast, v1_triton_fp8_dot, v2_triton_blockwise  # noqa: F401
from .epilogue import matmul_amax, matmul_to_fp8
from .formats import FP8_DTYPES, fp8_dtype, quantize_fp8
from .ops import blockwise_matmul
from .quantize import quantize

__all__ = ["FP8_DTYPES", "blockwise_matmul", "fp8_dtype", "matmul_amax", "matmul_to_fp8", "mx_matmul",
           "quantize", "quantize_fp8"]


def __getattr__(name: str):
    if name == "mx_matmul":
        from ..gemm_mxfp4.ops import mx_matmul
        return mx_matmul
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
