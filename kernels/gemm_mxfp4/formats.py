"""MXFP4: the OCP microscaling format with e2m1 elements and one e8m0 scale per 32.

The format (OCP Microscaling Formats (MX) Specification v1.0):

* e2m1 element: sign, 2 exponent bits (bias 1), 1 mantissa bit; magnitudes
  0, 0.5, 1, 1.5, 2, 3, 4, 6 (0.5 is the subnormal); no inf, no NaN; emax = 2.
* e8m0 scale: 8 exponent bits, no sign, no mantissa, bias 127: the value
  2^(byte - 127); byte 0xFF is NaN.
* A block of 32 consecutive elements along the reduction axis K shares one scale:
  the block means ``element * 2^(scale - 127)``.

Storage, as ``tl.dot_scaled`` takes it: two e2m1 codes per byte along K, the even
index in the low nibble; the scales as ``uint8``, one per 32 elements along K.
Nothing else is packed or swizzled.

Quantizing (the spec's conversion from float): the shared exponent is
``floor(log2(amax)) - emax`` of the block, so the block's largest magnitude lands in
[4, 8) and rounds to 4 or 6 (or saturates at 6); each element ``x / 2^exponent`` is
rounded to the nearest e2m1 value, ties to the even mantissa (2.5 -> 2, 3.5 -> 4,
5 -> 4, 0.25 -> 0), magnitudes beyond 6 saturate at 6.

Choices made here where the spec leaves them open: an all-zero block gets the
smallest scale (byte 0, what ``floor(log2 0)`` clamps to); a block holding NaN or
+-inf gets the NaN scale (e2m1 has no encoding for either, so the whole block
dequantizes to NaN); a K that is not a multiple of 32 is padded with zeros up to one
(zeros add nothing to a dot product, so a GEMM on the padded operands is the GEMM of
the unpadded ones); negative zero keeps its sign bit.
"""
from __future__ import annotations

import torch

from ..microscaling import BLOCK, E8M0_BIAS, E8M0_NAN, e8m0_values, shared_exponent
from ..mx_preshuffle import preshuffle

# The torch dtype that names the format in the registry, results and the roofline (its
# "fp4" roof). Tensors stay uint8: torch has almost no kernels for float4_e2m1fn_x2,
# and tl.dot_scaled takes the packed bytes and scales as uint8.
FORMAT = torch.float4_e2m1fn_x2
# MXFP8 with e4m3 elements (OCP), the rung's second format: elements stored as
# float8_e4m3fn, one per byte, with the same e8m0 scales per 32.
MXFP8 = torch.float8_e4m3fn
DTYPES = (FORMAT, MXFP8)
# dtype naming the format -> (tl.dot_scaled's element format, elements per stored byte)
ELEMENTS = {FORMAT: ("e2m1", 2), MXFP8: ("e4m3", 1)}
# Targets whose matrix cores take MX operands with their scales, so that ``tl.dot_scaled``
# is one scaled matrix instruction: gfx950's scaled MFMAs (the f8f6f4 family) and datacenter
# Blackwell's block-scaled MMAs. Elsewhere (gfx942, sm_90) Triton emulates it: it scales the
# operands in registers and runs the bf16 matrix cores, at bf16 speed at best.
NATIVE_ARCHS = ("gfx950", "sm_100", "sm_103")


def format_of(elements: torch.Tensor) -> torch.dtype:
    """The format stored elements are in: packed e2m1 come as uint8 bytes."""
    return FORMAT if elements.dtype == torch.uint8 else elements.dtype
EMAX = 2                        # exponent of e2m1's largest binade: 6 = 1.5 * 2^2
E2M1_MAX = 6.0
# e2m1 magnitudes by their 3-bit code (exponent, mantissa); bit 3 is the sign.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e2m1_table(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 16 values of the 4-bit codes 0..15 (codes 8..15 are the negatives)."""
    magnitudes = torch.tensor(E2M1_VALUES, dtype=dtype)
    return torch.cat([magnitudes, -magnitudes])


def round_to_e2m1(q: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 value to each element, ties to the even mantissa, saturating at +-6.

    Inside a binade the e2m1 values are ``k * step`` (step 0.5 below 2, 1 in [2, 4),
    2 in [4, 8)) and the mantissa bit is the parity of ``k``, so rounding ``q / step``
    half-to-even is round-to-nearest-even on the grid.
    """
    mag = q.abs()
    step = torch.where(mag < 2, 0.5, torch.where(mag < 4, 1.0, 2.0)).to(q.dtype)
    rounded = (torch.round(mag / step) * step).clamp(max=E2M1_MAX)
    return torch.where(torch.signbit(q), -rounded, rounded)


def _to_blocks(x: torch.Tensor, axis: int) -> torch.Tensor:
    """x with ``axis`` last, zero-padded to a multiple of BLOCK, as (..., blocks, BLOCK)."""
    moved = x.movedim(axis, -1)
    padded = torch.nn.functional.pad(moved, (0, -moved.shape[-1] % BLOCK))
    return padded.reshape(*padded.shape[:-1], padded.shape[-1] // BLOCK, BLOCK)   # -1: ambiguous if empty


def quantize_mxfp4(x: torch.Tensor, axis: int = -1, *,
                   preshuffled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` to MXFP4 in blocks of 32 along ``axis`` (the GEMM's K).

    Returns ``(packed, scales)``, both ``uint8`` with every other axis unchanged:
    ``packed`` has ``K_pad / 2`` entries along ``axis`` (two e2m1 codes per byte, even
    index in the low nibble), ``scales`` ``K_pad / 32`` (e8m0), where ``K_pad`` is K
    rounded up to a multiple of 32 (the padding is zeros). For a GEMM ``A @ B`` quantize
    A (M, K) along axis 1 and B's transpose (N, K) along axis 1: the kernels want both
    K-contiguous. ``preshuffled=True`` (a 2-D ``x``, ``axis`` its last) returns the scales
    in the layout gfx950's scaled MFMAs read without byte loads (:mod:`kernels.mx_preshuffle`).
    """
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to quantize along")
    if preshuffled and (x.dim() != 2 or axis not in (1, -1)):
        raise ValueError(f"preshuffled scales are for a 2-D x quantized along its last axis (a GEMM "
                         f"operand, K last); got {x.dim()}-D x and axis={axis}")
    blocks = _to_blocks(x.float(), axis)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    finite = torch.isfinite(blocks).all(dim=-1, keepdim=True)
    exponent = shared_exponent(amax, EMAX)
    q = round_to_e2m1(torch.ldexp(blocks, -exponent.float()).nan_to_num(0.0))
    magnitudes = torch.tensor(E2M1_VALUES, device=x.device)
    codes = torch.searchsorted(magnitudes, q.abs().contiguous()) | (torch.signbit(q).long() << 3)
    codes = codes.to(torch.uint8).flatten(-2)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = torch.where(finite, exponent + E8M0_BIAS, E8M0_NAN).to(torch.uint8).squeeze(-1)
    scales = scales.movedim(-1, axis).contiguous()
    return packed.movedim(-1, axis).contiguous(), preshuffle(scales) if preshuffled else scales


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, axis: int = -1,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values MXFP4 operands stand for, in ``dtype``, with ``K_pad`` along ``axis``.

    float32 holds every MXFP4 value except the largest scales' extremes (6 * 2^127 is
    inf in float32); float64 holds them all, which is what the GEMM reference uses.
    """
    for name, value in (("packed", packed), ("scales", scales)):
        if value.dtype != torch.uint8:
            raise TypeError(f"{name} must be uint8, got {value.dtype}")
    moved, scale = packed.movedim(axis, -1), scales.movedim(axis, -1)
    if moved.shape[-1] != scale.shape[-1] * BLOCK // 2 or moved.shape[:-1] != scale.shape[:-1]:
        raise ValueError(f"packed {tuple(packed.shape)} and scales {tuple(scales.shape)} do not "
                         f"match: along axis {axis} packed needs 16 bytes per scale")
    work = torch.float64 if dtype == torch.float64 else torch.float32   # exact powers of two
    codes = torch.stack([moved & 0xF, moved >> 4], dim=-1).flatten(-2).long()
    values = e2m1_table(work).to(packed.device)[codes].unflatten(-1, (-1, BLOCK))
    factor = e8m0_values(scale, work).unsqueeze(-1)
    return (values * factor).flatten(-2).movedim(-1, axis).to(dtype)
