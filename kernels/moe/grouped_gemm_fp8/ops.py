"""The public FP8 grouped GEMM: ``kernels.grouped_gemm_fp8(x, sx, w, sw, offsets)``.

Semantics of ``torch._scaled_grouped_mm`` (row-wise scales, 2D x 3D with offsets): per
group g, ``(x[rows of g] * sx[rows of g, None]) @ (w[g] * sw[g])`` with fp32 accumulation
(see :mod:`.operands`). It runs the highest-numbered Triton rung of ``grouped_gemm_fp8``
that runs here and takes the format (:func:`kernels.gemm.ops.best_rung`, read at call
time), wrapped as the custom op ``kernels::grouped_gemm_fp8`` with a fake
implementation, so ``torch.compile(fullgraph=True)`` keeps it in the graph; an eager call
that nothing traces runs the implementation itself (:func:`kernels.eager.direct`).

No autograd, as ``kernels.matmul_fp8`` and ``torch._scaled_grouped_mm``: an FP8 recipe
quantizes the output gradient itself and calls FP8 GEMMs for dx and dw.
"""
from __future__ import annotations

import torch

from ... import eager
from ...gemm.ops import best_rung
from ...gemm_fp8.formats import e4m3_of
from . import operands


def scaled_grouped_op(op: str):
    """(implementation, custom op ``kernels::<op>`` with its fake) of a scaled grouped GEMM
    taking ``(x, sx, w, sw, offsets, out_dtype)``, validated: the best rung of ``op``
    (this one's and ``grouped_gemm_mxfp8``'s) for the e4m3 format of x's family (dX of the
    hybrid format hands it e5m2 output gradients)."""
    def impl(x: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, sw: torch.Tensor, offsets: torch.Tensor,
             out_dtype: torch.dtype) -> torch.Tensor:
        if x.numel() == 0 or w.numel() == 0:   # T, N, K or G is 0: empty, or zeros for K = 0
            return torch.zeros((x.shape[0], w.shape[2]), dtype=out_dtype, device=x.device)
        return best_rung(op, e4m3_of(x.dtype))(x, sx, w, sw, offsets, out_dtype, check_offsets=False)

    custom = torch.library.custom_op(f"kernels::{op}", impl, mutates_args=())

    @custom.register_fake
    def _(x, sx, w, sw, offsets, out_dtype):
        return x.new_empty((x.shape[0], w.shape[2]), dtype=out_dtype)
    return impl, custom


_grouped_gemm_fp8_impl, _grouped_gemm_fp8 = scaled_grouped_op("grouped_gemm_fp8")


def grouped_gemm_fp8(x: torch.Tensor, sx: torch.Tensor, w: torch.Tensor, sw: torch.Tensor,
                     offsets: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16, *,
                     check_offsets: bool = True) -> torch.Tensor:
    """``x (T, K)`` FP8 with rows grouped by expert, float32 ``sx (T,)`` per token,
    ``w (G, K, N)`` FP8, float32 ``sw (G, N)`` per expert channel, int32 ``offsets (G,)``
    of cumulative row ends -> ``(T, N)`` in ``out_dtype`` (bfloat16 by default). Or
    block scales, DeepSeek-V3's: ``sx (T, ceil(K/128))`` per token and 128 of K and
    ``sw (G, ceil(K/128), ceil(N/128))`` per expert and 128 x 128 block (:mod:`.operands`),
    applied per K block in the loop.

    x and w share the e4m3 format of :func:`kernels.gemm_fp8.fp8_dtype` (fnuz on gfx942,
    OCP elsewhere), or one of them is the e5m2 format of that family (an FP8 gradient,
    :data:`kernels.gemm_fp8.formats.E5M2_OF`); formats of two families are refused. Quantize with :func:`kernels.gemm_fp8.quantize_fp8` ("row" for x,
    "col" for each w[g]). Empty operands are legal as in ``kernels.grouped_gemm``: T = 0
    or N = 0 give an empty result, K = 0 zeros. ``check_offsets`` as in
    ``kernels.grouped_gemm``: False skips the host read that validates the offsets.
    """
    offsets = operands.check(x, sx, w, sw, offsets, out_dtype, allow_empty=True,
                             check_values=check_offsets)
    plain = eager.direct(x, sx, w, sw, offsets)
    return (_grouped_gemm_fp8_impl if plain else _grouped_gemm_fp8)(x, sx, w, sw, offsets, out_dtype)
