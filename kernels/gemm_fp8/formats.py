"""FP8 formats per GPU, and amax quantization into them.

Two 8-bit float formats with 4 exponent and 3 mantissa bits exist, and a GPU's
matrix cores take only one of them natively:

* ``float8_e4m3fnuz`` on CDNA3 (gfx942, MI300X/MI325X): max 240, no negative zero,
  no inf; the bit pattern of -0 is the single NaN, so any overflow becomes NaN.
* ``float8_e4m3fn`` (OCP) on CDNA4 (gfx950, MI355X), NVIDIA Hopper/Blackwell and the
  CPU: max 448, NaN but no inf.

torch's cast of a value beyond the format's max does not saturate for fnuz (it
gives NaN; the CPU e4m3fn cast happens to saturate, even inf), so :func:`quantize_fp8`
clamps first and both formats behave the same on every device. The scale it returns is the *dequant*
scale, the one ``torch._scaled_mm`` and :func:`kernels.matmul_fp8` take:
``x ~= x_fp8.float() * scale``.
"""
from __future__ import annotations

import torch

from .. import backend as _backend

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")   # CDNA3: the fnuz variants only
GRANULARITIES = ("tensor", "row", "col")


def fp8_dtype(arch: str | None = None) -> torch.dtype:
    """The e4m3 format the matrix cores of ``arch`` (default: this machine) take natively."""
    arch = arch or _backend.current().arch
    return torch.float8_e4m3fnuz if arch.split(":")[0] in FNUZ_ARCHS else torch.float8_e4m3fn


def native_dtypes() -> tuple[torch.dtype, ...]:
    """FP8 formats the kernels run here: both on the interpreter, the native one on a GPU
    (Triton only emulates the other one, and the library baseline rejects it)."""
    here = _backend.current()
    return FP8_DTYPES if here.is_interpreter else (fp8_dtype(here.arch),)


def quantize_fp8(x: torch.Tensor, dtype: torch.dtype | None = None,
                 granularity: str = "tensor",
                 scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale ``x`` so its largest magnitude maps to the format's max, clamp, cast.

    ``granularity`` picks one scale for the whole tensor (a 0-d tensor), one per row
    (``(M, 1)``, for the A operand) or one per column (``(1, N)``, for B). Returns
    ``(x_fp8, scale)`` with ``scale`` in float32. All-zero slices get scale 1, and so do
    empty ones (an empty ``x``, rows of no columns, columns of no rows).
    A given ``scale`` (delayed scaling: from an amax history rather than from ``x``)
    is used as it is; values it takes beyond the format's range saturate at +-max.
    """
    dtype = dtype or fp8_dtype()
    if dtype not in FP8_DTYPES:
        raise TypeError(f"dtype must be one of {FP8_DTYPES}, got {dtype}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if granularity != "tensor" and x.dim() != 2:
        raise ValueError(f"granularity {granularity!r} needs a 2-D x, got shape {tuple(x.shape)}")
    fmax = torch.finfo(dtype).max
    xf = x.float()
    if scale is None:
        scale = _amax_scale(xf, granularity, fmax)
    return (xf / scale).clamp(-fmax, fmax).to(dtype), scale.float()


def _amax_scale(xf: torch.Tensor, granularity: str, fmax: float) -> torch.Tensor:
    if granularity == "tensor":
        amax = xf.abs().amax() if xf.numel() else xf.new_zeros(())
    else:
        dim = 1 if granularity == "row" else 0
        if xf.shape[dim]:
            amax = xf.abs().amax(dim=dim, keepdim=True)
        else:   # amax has no identity to reduce an empty slice to; 0 means scale 1
            amax = xf.new_zeros(xf.shape[:dim] + (1,) + xf.shape[dim + 1:])
    return torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
