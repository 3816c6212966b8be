"""The OCP Microscaling (MX) scale rule that every MX format here shares (MXFP4, MXFP8).

OCP Microscaling Formats (MX) Specification v1.0: a block of 32 consecutive elements
along the reduction axis shares one e8m0 scale, a byte ``b`` meaning ``2^(b - 127)``
(byte 0xFF is NaN), chosen as ``floor(log2(amax)) - emax`` where ``2^emax`` is the
element format's largest binade. Elements are then ``x / 2^exponent`` in the element
format, saturating at its max.
"""
from __future__ import annotations

import torch

BLOCK = 32                      # elements per e8m0 scale
E8M0_BIAS = 127
E8M0_NAN = 0xFF
SCALE_RULES = ("ocp", "round_up")   # shared_exponent's floor rule, round_up_exponent's


def shared_exponent(amax: torch.Tensor, emax: int) -> torch.Tensor:
    """The shared exponent of blocks with these amaxes, for elements whose largest binade
    is ``2^emax`` (2 for e2m1, 8 for e4m3, 15 for e5m2): ``floor(log2 amax) - emax``,
    clamped to e8m0's range; an all-zero block gets the smallest (-127, byte 0)."""
    # floor(log2(amax)) exactly: frexp's exponent is floor(log2) + 1 for every amax > 0.
    exponent = (torch.frexp(amax).exponent - 1 - emax).clamp(-E8M0_BIAS, E8M0_BIAS)
    return torch.where(amax > 0, exponent, -E8M0_BIAS)


def round_up_exponent(amax: torch.Tensor, fmax: float) -> torch.Tensor:
    """The smallest exponent e with ``amax / 2^e <= fmax`` (``ceil(log2(amax / fmax))``),
    clamped to e8m0's range, as the quantize kernels compute it: ``amax / fmax`` divided in
    float32 (correctly rounded, not times a rounded reciprocal), then the exact ceil of the
    log2 of that float (frexp here, its bits in the kernel; subnormal quotients included); an
    all-zero block gets the smallest (-127, byte 0). The division cannot round a quotient
    above a power of two down onto it: fmax's 1.75 mantissa puts the next fp32 amax more
    than half an ulp above it, so no block saturates."""
    ratio = amax.float() / fmax
    mantissa, exponent = torch.frexp(ratio)               # ratio = mantissa 2^exponent, mantissa in [0.5, 1)
    ceil_log2 = exponent - (mantissa == 0.5).int()        # a power of two is its own ceiling
    return torch.where(ratio > 0, ceil_log2.clamp(-E8M0_BIAS, E8M0_BIAS), -E8M0_BIAS)


def e8m0_values(scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What e8m0 bytes stand for, 2^(byte - 127) (byte 0xFF: NaN), in float32 or float64
    (exact either way: byte 0 is float32's subnormal 2^-127)."""
    factor = torch.exp2(scales.to(dtype) - E8M0_BIAS)
    return torch.where(scales == E8M0_NAN, float("nan"), factor)
