"""The public MXFP8 grouped GEMM: ``kernels.grouped_gemm_mxfp8(x, sx, w, sw, offsets)``.

Per group g, ``dequant(x[rows of g], sx) @ dequant(w[g], sw[g])`` with fp32 accumulation
(operands: :mod:`.operands`). It runs the highest-numbered Triton rung of
``grouped_gemm_mxfp8`` that runs here (:func:`kernels.gemm.ops.best_rung`, read at call
time), wrapped as the custom op ``kernels::grouped_gemm_mxfp8`` with a fake
implementation (:func:`kernels.moe.grouped_gemm_fp8.ops.scaled_grouped_op`), so ``torch.compile(fullgraph=True)`` keeps it in the graph; an eager call
that nothing traces runs the implementation itself (:func:`kernels.eager.direct`).

No autograd, as ``kernels.grouped_gemm_fp8``: training quantizes the gradients itself
(the ``"mxfp8"`` recipe of :func:`kernels.moe.grouped_gemm_fp8.grouped_gemm_fp8_train`).
"""
from __future__ import annotations

import torch

from ... import eager
from ..grouped_gemm_fp8.ops import scaled_grouped_op
from . import operands


_grouped_gemm_mxfp8_impl, _grouped_gemm_mxfp8 = scaled_grouped_op("grouped_gemm_mxfp8")


def grouped_gemm_mxfp8(x: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, sw: torch.Tensor,
                       offsets: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
                       check_offsets: bool = True) -> torch.Tensor:
    """``x (T, K)`` float8_e4m3fn with rows grouped by expert, uint8 e8m0 ``sx (T, ceil(K/32))``,
    ``w (G, K, N)`` float8_e4m3fn, uint8 ``sw (G, N, ceil(K/32))``, int32 ``offsets (G,)`` of
    cumulative row ends -> ``(T, N)`` in ``out_dtype`` (bfloat16 by default).

    Quantize x with ``kernels.gemm_fp8.quantize(x, "mx32", torch.float8_e4m3fn)`` and w with
    :func:`kernels.moe.grouped_gemm_mxfp8.spec.quantize_weight`. Empty operands are legal as
    in ``kernels.grouped_gemm``: T = 0 or N = 0 give an empty result, K = 0 zeros.
    ``check_offsets`` False skips the host read that validates the offsets.
    """
    offsets = operands.check(x, sx, w, sw, offsets, out_dtype, allow_empty=True, check_values=check_offsets)
    plain = eager.direct(x, sx, w, sw, offsets)
    return (_grouped_gemm_mxfp8_impl if plain else _grouped_gemm_mxfp8)(x, sx, w, sw, offsets, out_dtype)
