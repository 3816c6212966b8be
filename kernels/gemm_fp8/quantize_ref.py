"""What :func:`kernels.gemm_fp8.quantize` computes, stated in PyTorch: the bit-exact reference.

Every granularity is one rule applied to a different group of elements of ``x`` (M, K):

* ``tensor``: one group; ``row``: one per row; ``block1x128``: 128 consecutive elements
  of a row (DeepSeek-V3's activation and gradient tiles); ``block128x128``: 128 x 128
  tiles (its weight blocks); ``mx32``: 32 consecutive elements of a row (OCP MX).
* fp32 scales (all but ``mx32``): ``scale = amax / fp8_max`` of the group (1 where the
  amax is 0), and ``q = saturate(x / scale)`` rounded to nearest even in the FP8 format.
* ``mx32``: an e8m0 scale byte per group, the OCP MX rule of
  :func:`kernels.microscaling.shared_exponent` (``floor(log2 amax)`` minus the
  element format's largest exponent, so the group's largest magnitude lands in
  ``[2^emax, 2^(emax+1))`` and may saturate at the format's max), and
  ``q = saturate(x * 2^-exponent)``; with ``scale_rule="round_up"`` the exponent is
  :func:`kernels.microscaling.round_up_exponent`'s instead (the smallest with
  ``amax / 2^exponent <= fp8_max``: nothing saturates), what the ``mxfp8`` training
  recipe takes (:mod:`kernels.fp8.recipes.mxfp8`).

Groups at the ragged end (K or M not a multiple of the group) are the elements that
exist: padding is not a value. The transposed copy (``transpose=True``) is the same rule
on ``x.T`` with groups along its own rows, i.e. along M of ``x``; for ``block128x128``
that is exactly ``q.T`` and ``scale.T``.
"""
from __future__ import annotations

import torch

from ..microscaling import BLOCK as MX_BLOCK, E8M0_BIAS, SCALE_RULES, e8m0_values, round_up_exponent, shared_exponent
from .formats import OPERAND_DTYPES

QUANT_DTYPES = OPERAND_DTYPES   # every FP8 format a scaled GEMM takes
MX_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)   # the OCP formats MXFP8 names
GRANULARITIES = ("tensor", "row", "block1x128", "block128x128", "mx32")
TILE = 128   # the block granularities' group edge


def group_shape(granularity: str, m: int, k: int) -> tuple[int, int]:
    """Rows x columns of one group of ``granularity`` in an (m, k) tensor."""
    return {"tensor": (max(m, 1), max(k, 1)), "row": (1, max(k, 1)), "block1x128": (1, TILE),
            "block128x128": (TILE, TILE), "mx32": (1, MX_BLOCK)}[granularity]


def scale_shape(granularity: str, m: int, k: int) -> tuple[int, ...]:
    """The scale tensor's shape: () for ``tensor``, else one entry per group (``row``: (m, 1)
    even for k = 0, a row of no elements having scale 1, as ``quantize_fp8`` gives it)."""
    if granularity == "tensor":
        return ()
    if granularity == "row":
        return (m, 1)
    gm, gk = group_shape(granularity, m, k)
    return (-(-m // gm), -(-k // gk))


def mx_emax(dtype: torch.dtype) -> int:
    """Exponent of the format's largest binade: 8 for e4m3fn (448), 15 for e5m2 (57344)."""
    return int(torch.finfo(dtype).max).bit_length() - 1


def group_amax(x: torch.Tensor, granularity: str) -> torch.Tensor:
    """amax of |x| per group, shaped :func:`scale_shape`; 0 for an empty tensor."""
    m, k = x.shape
    if granularity == "tensor":
        return x.abs().amax() if x.numel() else x.new_zeros(())
    gm, gk = group_shape(granularity, m, k)
    rows, cols = scale_shape(granularity, m, k)
    padded = torch.nn.functional.pad(x.abs(), (0, cols * gk - k, 0, rows * gm - m))   # |x| >= 0
    if padded.numel() == 0:
        return x.new_zeros((rows, cols))
    return padded.reshape(rows, gm, cols, gk).amax(dim=(1, 3))


def _expand(per_group: torch.Tensor, granularity: str, m: int, k: int) -> torch.Tensor:
    if per_group.dim() == 0:
        return per_group
    gm, gk = group_shape(granularity, m, k)
    return per_group.repeat_interleave(gm, 0)[:m].repeat_interleave(gk, 1)[:, :k]


def power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent in float32 for integer exponents in [-126, 127], built from its bits
    (exact; the kernel builds it the same way)."""
    return ((exponent.to(torch.int32) + 127) << 23).view(torch.float32)


def check_scale_rule(granularity: str, scale_rule: str) -> None:
    """``scale_rule`` names an e8m0 rule (:data:`kernels.microscaling.SCALE_RULES`), and
    ``"round_up"`` comes with ``mx32``, the one granularity of e8m0 scales."""
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"scale_rule must be one of {SCALE_RULES}, got {scale_rule!r}")
    if scale_rule != "ocp" and granularity != "mx32":
        raise ValueError(f"scale_rule {scale_rule!r} chooses mx32's e8m0 scales; granularity "
                         f"{granularity!r} has fp32 scales (amax / fp8_max, which never saturate)")


def mx_exponent(amax: torch.Tensor, dtype: torch.dtype, scale_rule: str = "ocp") -> torch.Tensor:
    """The shared exponent of MX blocks with these amaxes for elements in ``dtype``, by
    ``scale_rule``: the OCP floor rule or the round-up rule (module docstring)."""
    if scale_rule == "round_up":
        return round_up_exponent(amax, torch.finfo(dtype).max)
    return shared_exponent(amax, mx_emax(dtype))


def quantize_one(x: torch.Tensor, granularity: str, dtype: torch.dtype,
                 scale_rule: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` of a 2-D ``x`` for one granularity (no transposed copy); ``scale_rule``
    (``mx32`` only): ``"ocp"`` or ``"round_up"``."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    check_scale_rule(granularity, scale_rule)
    xf = x.float()
    m, k = xf.shape
    fmax = torch.finfo(dtype).max
    amax = group_amax(xf, granularity)
    if granularity == "mx32":
        exponent = mx_exponent(amax, dtype, scale_rule)
        y = xf * _expand(power_of_two(-exponent), granularity, m, k)
        scale = (exponent + E8M0_BIAS).to(torch.uint8)
    else:
        scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
        y = xf / _expand(scale, granularity, m, k)
    return y.clamp(-fmax, fmax).to(dtype), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, granularity: str,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values ``(q, scale)`` of :func:`quantize_one` stand for, in ``dtype``: each element
    times its group's scale in float32 (one rounding for the float32 scales, exact for
    ``mx32``'s powers of two), then rounded to ``dtype``. ``scale`` may come flattened
    (``row``'s (m,) for (m, 1))."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    m, k = q.shape
    factor = e8m0_values(scale) if granularity == "mx32" else scale.float()
    factor = factor.reshape(scale_shape(granularity, m, k))
    return (q.float() * _expand(factor, granularity, m, k)).to(dtype)


def quantize_reference(x: torch.Tensor, granularity: str, fp8_dtype: torch.dtype, *,
                       transpose: bool = False, scale_rule: str = "ocp") -> tuple[torch.Tensor, ...]:
    """What :func:`kernels.gemm_fp8.quantize` returns, computed with torch on any device."""
    q, scale = quantize_one(x, granularity, fp8_dtype, scale_rule)
    if not transpose:
        return q, scale
    q_t, scale_t = quantize_one(x.t(), granularity, fp8_dtype, scale_rule)
    return q, scale, q_t.contiguous(), scale_t
