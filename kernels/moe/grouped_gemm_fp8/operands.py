"""What an FP8 grouped GEMM accepts, checked once for every rung and the public op.

x (T, K) and w (G, K, N) in FP8 formats of one family (both e4m3, or one e5m2: the output
gradient of the hybrid format, as dX takes it), offsets as for ``grouped_gemm``, and float32
scales of one of two granularities, told apart by sx's rank:

* row-wise: sx (T,), one per token, and sw (G, N), one per expert and output channel
  (``torch._scaled_grouped_mm``'s row-wise 2D x 3D case);
* blockwise (DeepSeek-V3): sx (T, ceil(K/128)), one per token and 128 elements of K, and
  sw (G, ceil(K/128), ceil(N/128)), one per expert and 128 x 128 block, the layouts
  :func:`kernels.gemm_fp8.quantize` writes for ``block1x128`` and ``block128x128``.

A kernel reads them through strides, so views are taken as they are.
"""
from __future__ import annotations

import torch

from ... import validate
from ...gemm_fp8.formats import OPERAND_DTYPES
from ...gemm_fp8.operands import OUT_DTYPES, SCALE_K, check_family
from ...triton_support import cdiv


def _scale(name: str, scale, shape: tuple[int, ...], what: str, allow_empty: bool) -> None:
    validate.tensor(name, scale, dtypes=(torch.float32,), allow_empty=allow_empty)
    if tuple(scale.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(scale.shape)}; expected {shape}, {what}")


def check(x, sx, w, sw, offsets, out_dtype, allow_empty: bool = False,
          check_values: bool = True) -> torch.Tensor:
    """Validate the operands and return the offsets to launch with (packed); ``allow_empty``
    and ``check_values`` as in :func:`kernels.validate.grouped_gemm_operands` (the public op
    takes empty operands)."""
    validate.tensor("x", x, ndim=2, dtypes=OPERAND_DTYPES, allow_empty=allow_empty)  # name the
    validate.tensor("w", w, ndim=3, dtypes=OPERAND_DTYPES, allow_empty=allow_empty)  # non-FP8 one
    check_family(x=x, w=w)
    offsets = validate.grouped_gemm_operands(x, w, offsets, OPERAND_DTYPES, allow_empty, check_values,
                                             same_dtypes=False)
    (t, k), (g, _, n) = x.shape, w.shape
    if isinstance(sx, torch.Tensor) and sx.dim() == 2:
        kb, nb = cdiv(k, SCALE_K), cdiv(n, SCALE_K)
        _scale("sx", sx, (t, kb), f"one per row (token) of x and {SCALE_K} elements of K (a 2-D sx "
               "is a block scale)", allow_empty)
        _scale("sw", sw, (g, kb, nb), f"one per expert and {SCALE_K} x {SCALE_K} block of w (sx is a "
               "block scale)", allow_empty)
    else:
        _scale("sx", sx, (t,), "one per row (token) of x", allow_empty)
        _scale("sw", sw, (g, n), "one per expert and output column of w", allow_empty)
    validate.same_device(x=x, sx=sx, w=w, sw=sw)
    if out_dtype not in OUT_DTYPES:
        allowed = ", ".join(str(d).replace("torch.", "") for d in OUT_DTYPES)
        raise TypeError(f"out_dtype must be one of {allowed}, got {out_dtype}")
    return offsets
