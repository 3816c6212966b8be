"""FP8 formats per GPU, and amax quantization into them.

Two 8-bit float formats with 4 exponent and 3 mantissa bits exist, and a GPU's
matrix cores take only one of them natively:

* ``float8_e4m3fnuz`` on CDNA3 (gfx942, MI300X/MI325X): max 240, no negative zero,
  no inf; the bit pattern of -0 is the single NaN, so any overflow becomes NaN.
* ``float8_e4m3fn`` (OCP) on CDNA4 (gfx950, MI355X), NVIDIA Hopper/Blackwell and the
  CPU: max 448, NaN but no inf.

Gradients may take the 5-exponent-bit format of the same family (range over precision:
Transformer Engine's "hybrid" format, e4m3 forward and e5m2 backward): ``float8_e5m2``
(OCP, max 57344) beside e4m3fn, ``float8_e5m2fnuz`` (max 57344, fnuz rules) beside
e4m3fnuz. A scaled GEMM takes one operand of each format of one family
(:func:`same_family`): the FP8 MFMAs of gfx942 (``v_mfma_f32_16x16x32_fp8_fp8`` and its bf8 twins, one per operand format)
and gfx950 (``v_mfma_f32_16x16x128_f8f6f4`` with its ``cbsz``/``blgp`` format fields) mix them in
one instruction.

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
E5M2_OF = {torch.float8_e4m3fn: torch.float8_e5m2, torch.float8_e4m3fnuz: torch.float8_e5m2fnuz}
OPERAND_DTYPES = (*FP8_DTYPES, *E5M2_OF.values())   # what a scaled GEMM's A and B may be
FNUZ_ARCHS = ("gfx940", "gfx941", "gfx942")   # CDNA3: the fnuz variants only
GRANULARITIES = ("tensor", "row", "col")


def fp8_dtype(arch: str | None = None) -> torch.dtype:
    """The e4m3 format the matrix cores of ``arch`` (default: this machine) take natively."""
    arch = arch or _backend.current().arch
    return torch.float8_e4m3fnuz if arch.split(":")[0] in FNUZ_ARCHS else torch.float8_e4m3fn


def e4m3_of(dtype: torch.dtype) -> torch.dtype:
    """The e4m3 format of ``dtype``'s family (itself for an e4m3 format)."""
    return next((e4m3 for e4m3, e5m2 in E5M2_OF.items() if dtype in (e4m3, e5m2)), dtype)


def same_family(a: torch.dtype, b: torch.dtype) -> bool:
    """Whether a GEMM may multiply FP8 formats ``a`` and ``b``: both OCP or both fnuz."""
    return e4m3_of(a) == e4m3_of(b) and a in OPERAND_DTYPES and b in OPERAND_DTYPES


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
    if dtype not in OPERAND_DTYPES:
        raise TypeError(f"dtype must be one of {OPERAND_DTYPES}, got {dtype}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if granularity != "tensor" and x.dim() != 2:
        raise ValueError(f"granularity {granularity!r} needs a 2-D x, got shape {tuple(x.shape)}")
    xf = x.float()
    if scale is None:
        dims = tuple(range(xf.dim())) if granularity == "tensor" else ((1,) if granularity == "row" else (0,))
        scale = scale_of(amax_over(xf, dims), dtype)
        if granularity == "tensor":
            scale = scale.reshape(())
    return cast(xf, scale, dtype), scale.float()


def amax_over(xf: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """max |xf| over ``dims``, kept as size-1 dims; 0 for an empty slice (amax has no identity
    to reduce one to, and 0 means scale 1)."""
    if any(xf.shape[d] == 0 for d in dims):
        return xf.new_zeros([1 if d in dims else s for d, s in enumerate(xf.shape)], dtype=torch.float32)
    return xf.abs().amax(dim=dims, keepdim=True).float()


def scale_of(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The dequantization scale amax / (the format's max), 1 where the amax is 0."""
    return torch.where(amax > 0, amax / torch.finfo(dtype).max, torch.ones_like(amax))


def cast(xf: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """xf / scale, saturated to the format's range, in ``dtype``."""
    fmax = torch.finfo(dtype).max
    return (xf.float() / scale).clamp(-fmax, fmax).to(dtype)
