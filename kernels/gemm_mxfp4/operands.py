"""What an MXFP4 GEMM accepts, checked once for every rung and the public op.

``c = dequant(a_packed, a_scales) @ dequant(b_packed, b_scales).T``: A is (M, K) and
B^T is (N, K), both stored as (rows, K/2) bytes of packed e2m1 codes with (rows, K/32)
e8m0 scales, all uint8 (:mod:`.formats`). B comes transposed because that is the
layout the matrix cores read (K-contiguous per output column, like ``nn.Linear``'s
weight and ``torch._scaled_mm``'s column-major B); any strides are taken. K is twice
the packed width and must be a multiple of 32, one scale per 32 elements:
:func:`.formats.quantize_mxfp4` pads K with zeros to get there.

MXFP8 operands are the same with e4m3 elements stored one per byte as
``float8_e4m3fn`` (M, K) and (N, K); K is then any length, with ceil(K/32) scales per row
(the last block may be partial: ``quantize(x, "mx32", ...)`` makes them).

Either operand's scales may also come pre-shuffled (:mod:`kernels.mx_preshuffle`): then they are
(ceil(rows/32), 256 ceil(blocks/8)) instead of (rows, blocks), never a row-major shape
for K > 0 (256 ceil(blocks/8) > blocks), so the shape says which layout a tensor is in
(:func:`is_preshuffled`).
"""
from __future__ import annotations

import torch

from .. import validate
from ..gemm_fp8.operands import OUT_DTYPES
from .formats import BLOCK, ELEMENTS, FORMAT, format_of
from ..mx_preshuffle import preshuffled_shape, unshuffle


def is_preshuffled(scales: torch.Tensor, rows: int, k: int) -> bool:
    """Whether checked scales of ``rows`` rows of K = ``k`` elements are pre-shuffled."""
    return tuple(scales.shape) != (rows, -(-k // BLOCK))


def plain(scales: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """Checked scales in the row-major (rows, ceil(k/32)) layout, unshuffled if need be."""
    blocks = -(-k // BLOCK)
    return unshuffle(scales, rows, blocks) if is_preshuffled(scales, rows, k) else scales


def _scales(name: str, scales: torch.Tensor, rows: int, k: int, packed_name: str) -> None:
    expected = (rows, -(-k // BLOCK))
    shuffled = preshuffled_shape(*expected)
    if tuple(scales.shape) not in (expected, shuffled):
        raise ValueError(f"{name} has shape {tuple(scales.shape)}; {packed_name} holds {rows} "
                         f"rows of K = {k} elements, so it needs {expected} (one e8m0 scale "
                         f"per {BLOCK} elements), or {shuffled} pre-shuffled")


def check(a_packed, a_scales, b_packed, b_scales, out_dtype, allow_empty: bool = False) -> int:
    """Validate the operands; return K, the number of e2m1 elements per row.

    ``allow_empty``: the public op takes M, N or K = 0; a kernel launch does not."""
    element_dtypes = tuple(torch.uint8 if d == FORMAT else d for d in ELEMENTS)
    for name, value in dict(a_packed=a_packed, b_packed=b_packed).items():
        validate.tensor(name, value, ndim=2, dtypes=element_dtypes, allow_empty=allow_empty)
    for name, value in dict(a_scales=a_scales, b_scales=b_scales).items():
        validate.tensor(name, value, ndim=2, dtypes=(torch.uint8,), allow_empty=allow_empty)
    validate.same_device(a_packed=a_packed, a_scales=a_scales, b_packed=b_packed, b_scales=b_scales)
    validate.same_dtype(a_packed=a_packed, b_packed=b_packed)
    pack = ELEMENTS[format_of(a_packed)][1]
    if a_packed.shape[1] != b_packed.shape[1]:
        per_byte = "K/2" if pack == 2 else "K"
        raise ValueError(f"inner dimensions differ: a_packed is {tuple(a_packed.shape)} (M, {per_byte}), "
                         f"b_packed is {tuple(b_packed.shape)} (N, {per_byte})")
    k = pack * a_packed.shape[1]
    if pack == 2 and k % BLOCK:
        raise ValueError(f"a_packed and b_packed hold K = {k} elements per row; K must be a "
                         f"multiple of {BLOCK} (quantize_mxfp4 pads K with zeros)")
    _scales("a_scales", a_scales, a_packed.shape[0], k, "a_packed")
    _scales("b_scales", b_scales, b_packed.shape[0], k, "b_packed")
    if out_dtype not in OUT_DTYPES:   # the call only to refuse it: none on the hot path
        validate.dtype_choice("out_dtype", out_dtype, OUT_DTYPES)
    return k
