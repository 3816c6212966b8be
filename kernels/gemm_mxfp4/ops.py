"""The public MX GEMMs: ``kernels.matmul_mxfp4`` and ``kernels.gemm_fp8.mx_matmul`` (MXFP8).

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

from .. import eager, validate
from ..gemm.ops import best_rung
from . import operands
from .formats import MXFP8, format_of


def _matmul_mxfp4_impl(a_packed: torch.Tensor, a_scales: torch.Tensor, b_packed: torch.Tensor,
                       b_scales: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if a_packed.numel() == 0 or b_packed.numel() == 0:   # M, N or K is 0: as matmul_fp8
        return torch.zeros((a_packed.shape[0], b_packed.shape[0]), dtype=out_dtype, device=a_packed.device)
    rung = best_rung("gemm_mxfp4", format_of(a_packed))
    return rung(a_packed, a_scales, b_packed, b_scales, out_dtype=out_dtype)


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

    Either scale tensor may instead be pre-shuffled (:func:`kernels.mx_preshuffle.preshuffle`,
    the shape tells): the layout gfx950 reads without byte loads; elsewhere it is unshuffled.

    Empty operands give what :func:`kernels.matmul` and :func:`kernels.matmul_fp8` give:
    an empty result for M = 0 or N = 0, zeros for K = 0.
    """
    operands.check(a_packed, a_scales, b_packed, b_scales, out_dtype, allow_empty=True)
    plain = eager.direct(a_packed, a_scales, b_packed, b_scales)
    return (_matmul_mxfp4_impl if plain else _matmul_mxfp4)(a_packed, a_scales, b_packed, b_scales, out_dtype)


def mx_matmul(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """C = A·B in MXFP8: e4m3 elements (``float8_e4m3fn``) with e8m0 scales per 32 along K.

    ``a`` (M, K) with ``a_scale`` (M, ceil(K/32)); ``b`` (K, N) with ``b_scale``
    (N, ceil(K/32)): one row of scales per column of B, the layout :func:`kernels.matmul_mxfp4`
    takes for B^T and what :func:`kernels.gemm_fp8.quantize` returns for the (N, K) tensor
    B^T is (e.g. nn.Linear's weight); the scales are uint8 (e8m0)::

        a8, sa = quantize(x, "mx32", torch.float8_e4m3fn)        # x: (M, K)
        w8, sw = quantize(w, "mx32", torch.float8_e4m3fn)        # w: (N, K), sw: (N, K/32)
        y = mx_matmul(a8, sa, w8.t(), sw)                        # x @ w.T

    It runs the ``gemm_mxfp4`` rung's ``tl.dot_scaled`` kernel on the e4m3 elements (B as
    the strided view B^T (N, K), the layout that op takes): on gfx950 the scaled MFMA
    ``v_mfma_scale_f32_16x16x128_f8f6f4`` reads the scales itself; on gfx942 and Hopper Triton
    emulates (``tests/test_mxfp8.py``). Same custom op as :func:`kernels.matmul_mxfp4`.
    Either scale tensor may come pre-shuffled (:mod:`kernels.mx_preshuffle`).
    """
    validate.tensor("a", a, ndim=2, dtypes=(MXFP8,), allow_empty=True)
    validate.tensor("b", b, ndim=2, dtypes=(MXFP8,), allow_empty=True)
    return matmul_mxfp4(a, a_scale, b.t(), b_scale, out_dtype)
