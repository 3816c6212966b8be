"""The public scaled FP8 GEMM: ``kernels.matmul_fp8(a, b, scale_a, scale_b, out_dtype)``.

Semantics of ``torch._scaled_mm``: ``(a * scale_a) @ (b * scale_b)`` with fp32
accumulation (see :mod:`.operands`). It runs the highest-numbered Triton rung of
``gemm_fp8`` that runs here and takes the FP8 format (:func:`kernels.gemm.ops.best_rung`),
wrapped as the custom op ``kernels::matmul_fp8`` with a fake implementation, so
``torch.compile(fullgraph=True)`` keeps it in the graph; an eager call that nothing traces
runs the implementation itself (:func:`kernels.eager.direct`).

No autograd: like ``torch._scaled_mm`` it defines no derivative for FP8 operands. An
FP8 training recipe quantizes the output gradient itself and calls this op for the
two backward GEMMs (e.g. ``grad_a = matmul_fp8(grad_fp8, b_fp8.t(), ...)``).
"""
from __future__ import annotations

import torch

from .. import eager
from ..gemm.ops import best_rung
from . import operands


def _matmul_fp8_impl(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                     out_dtype: torch.dtype) -> torch.Tensor:
    if a.numel() == 0 or b.numel() == 0:   # M, N or K is 0: what torch._scaled_mm returns
        return torch.zeros((a.shape[0], b.shape[1]), dtype=out_dtype, device=a.device)
    return best_rung("gemm_fp8", a.dtype)(a, b, scale_a, scale_b, out_dtype=out_dtype)


_matmul_fp8 = torch.library.custom_op("kernels::matmul_fp8", _matmul_fp8_impl, mutates_args=())


@_matmul_fp8.register_fake
def _(a, b, scale_a, scale_b, out_dtype):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


def matmul_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``(a * scale_a) @ (b * scale_b)`` for FP8 ``a`` (M, K) and ``b`` (K, N), in ``out_dtype``.

    Scales are float32: a single number (per tensor), or ``(M, 1)`` for ``a`` and
    ``(1, N)`` for ``b`` (per row / per column). Prepare operands with
    :func:`kernels.gemm_fp8.quantize_fp8` in :func:`kernels.gemm_fp8.fp8_dtype`.
    Empty operands give what ``torch._scaled_mm`` gives: an empty result, or zeros
    for K = 0.
    """
    operands.check(a, b, scale_a, scale_b, out_dtype, allow_empty=True)
    plain = eager.direct(a, b, scale_a, scale_b)
    return (_matmul_fp8_impl if plain else _matmul_fp8)(a, b, scale_a, scale_b, out_dtype)
