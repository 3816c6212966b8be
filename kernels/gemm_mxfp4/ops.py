"""The public MXFP4 GEMM: ``kernels.matmul_mxfp4(a_packed, a_scales, b_packed, b_scales)``.

``dequant(A) @ dequant(B^T).T`` with fp32 accumulation, for operands made by
:func:`kernels.gemm_mxfp4.quantize_mxfp4` (layout: :mod:`.operands`). It runs the
highest-numbered Triton rung of ``gemm_mxfp4`` that runs here
(:func:`kernels.gemm.ops.best_rung`), wrapped as the custom op ``kernels::matmul_mxfp4``
with a fake implementation, so ``torch.compile(fullgraph=True)`` keeps it in the graph; an
eager call that nothing traces runs the implementation itself (:func:`kernels.eager.direct`).

No autograd: as for FP8, a training recipe quantizes the gradients itself and calls
this op for the backward GEMMs.
"""
from __future__ import annotations

import torch

from .. import eager
from ..gemm.ops import best_rung
from . import operands
from .formats import FORMAT


def _matmul_mxfp4_impl(a_packed: torch.Tensor, a_scales: torch.Tensor, b_packed: torch.Tensor,
                       b_scales: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if a_packed.numel() == 0 or b_packed.numel() == 0:   # M, N or K is 0: as matmul_fp8
        return torch.zeros((a_packed.shape[0], b_packed.shape[0]), dtype=out_dtype, device=a_packed.device)
    return best_rung("gemm_mxfp4", FORMAT)(a_packed, a_scales, b_packed, b_scales, out_dtype=out_dtype)


_matmul_mxfp4 = torch.library.custom_op("kernels::matmul_mxfp4", _matmul_mxfp4_impl, mutates_args=())


@_matmul_mxfp4.register_fake
def _(a_packed, a_scales, b_packed, b_scales, out_dtype):
    return a_packed.new_empty((a_packed.shape[0], b_packed.shape[0]), dtype=out_dtype)


def matmul_mxfp4(a_packed: torch.Tensor, a_scales: torch.Tensor, b_packed: torch.Tensor,
                 b_scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A (M, K) @ B (K, N) in MXFP4, in ``out_dtype``; B is given as B^T (N, K).

    ``a_packed`` (M, K/2) and ``b_packed`` (N, K/2) hold two e2m1 codes per byte,
    ``a_scales`` (M, K/32) and ``b_scales`` (N, K/32) e8m0 exponents; all uint8:

        a_packed, a_scales = quantize_mxfp4(a, axis=1)        # a: (M, K)
        b_packed, b_scales = quantize_mxfp4(b.t(), axis=1)    # b: (K, N)

    Empty operands give what :func:`kernels.matmul` and :func:`kernels.matmul_fp8` give:
    an empty result for M = 0 or N = 0, zeros for K = 0.
    """
    operands.check(a_packed, a_scales, b_packed, b_scales, out_dtype, allow_empty=True)
    plain = eager.direct(a_packed, a_scales, b_packed, b_scales)
    return (_matmul_mxfp4_impl if plain else _matmul_mxfp4)(a_packed, a_scales, b_packed, b_scales, out_dtype)
