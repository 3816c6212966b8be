"""What a scaled FP8 GEMM accepts, checked once for every rung and the public op.

The semantics are those of ``torch._scaled_mm``: ``c = (a * scale_a) @ (b * scale_b)``
with ``a`` (M, K) and ``b`` (K, N) in one FP8 format, and float32 scales that are
either one number (per tensor) or one per row of ``a`` (M, 1) / per column of ``b``
(1, N). A kernel reads a scale through a stride: 0 for a per-tensor scale, so one
epilogue serves both granularities.
"""
from __future__ import annotations

import torch

from .. import validate
from .formats import FP8_DTYPES

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _scale_stride(name: str, scale: torch.Tensor, length: int, per_shape: tuple[int, int],
                  axis: int) -> int:
    if scale.numel() == 1 and scale.dim() <= 2:
        return 0
    if tuple(scale.shape) == per_shape:
        return scale.stride(axis)
    kind = "row" if axis == 0 else "column"
    raise ValueError(f"{name} has shape {tuple(scale.shape)}; expected a single number "
                     f"(per tensor) or {per_shape} (one per {kind}, {length} of them)")


def check(a, b, scale_a, scale_b, out_dtype, allow_empty: bool = False) -> tuple[int, int]:
    """Validate the operands; return the element strides of scale_a and scale_b.

    ``allow_empty``: the public op takes M, N or K = 0 as ``torch._scaled_mm`` does;
    a kernel launch does not."""
    # each alone first, so that a dtype error names the non-FP8 one; then what they share
    validate.tensor("a", a, ndim=2, dtypes=FP8_DTYPES, allow_empty=allow_empty)
    validate.tensor("b", b, ndim=2, dtypes=FP8_DTYPES, allow_empty=allow_empty)
    validate.same_device(a=a, b=b)
    validate.same_dtype(a=a, b=b)
    validate.inner_dims(a, b)
    validate.tensor("scale_a", scale_a, dtypes=(torch.float32,), allow_empty=allow_empty)
    validate.tensor("scale_b", scale_b, dtypes=(torch.float32,), allow_empty=allow_empty)
    validate.same_device(a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    if out_dtype not in OUT_DTYPES:
        allowed = ", ".join(str(d).replace("torch.", "") for d in OUT_DTYPES)
        raise TypeError(f"out_dtype must be one of {allowed}, got {out_dtype}")
    (m, _), n = a.shape, b.shape[1]
    return (_scale_stride("scale_a", scale_a, m, (m, 1), 0),
            _scale_stride("scale_b", scale_b, n, (1, n), 1))
