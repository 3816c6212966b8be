"""Pre-shuffled e8m0 scales: the order in which a gfx950 scaled MFMA's lanes want them.

``v_mfma_scale_f32_16x16x128_f8f6f4`` reads one scale byte per lane for each operand:
lane ``l`` holds row ``l % 16`` of its 16-row tile and the ``l // 16``-th 32-element block
of the 128 K elements. Stored row-major (rows, K/32), the bytes a lane needs for two
row tiles and two K steps lie in four places, so a kernel fetches them a byte at a time
and Triton rearranges them through LDS in 8-bit accesses. Pre-shuffled, those four
bytes are one little-endian word, and a wave's 64 words are 256 consecutive bytes.

The layout, per stripe of 32 rows and chunk of 8 scales (256 K elements): row
``r = 16 a + b`` (a < 2, b < 16), scale ``s = 4 c + d`` (c < 2, d < 4) goes to byte
``64 d + 4 b + 2 c + a`` of the chunk; a stripe's chunks follow each other along K, so
a (rows, S) tensor becomes (ceil(rows / 32), 256 ceil(S / 8)), zero bytes filling the
partial stripe and chunk (e8m0 0 is 2^-127, never NaN; the kernel's masked elements
are zeros, so a padded scale multiplies nothing). This is the layout of AMD's aiter
MXFP4 GEMMs with pre-shuffled scales on gfx950 (ROCm/aiter,
``aiter/ops/triton/utils/shuffle.py``: ``_shuffle_scale_tile_gfx950`` with 32-row
stripes and 8-scale chunks; the kernel's inverse view in
``aiter/ops/triton/_triton_kernels/gemm/basic/gemm_afp4wfp4.py``, 2026-08).

A kernel that makes scales can write them in this layout itself (:func:`preshuffled_offsets`
and :func:`preshuffled_mask`; the MX quantize does, :func:`kernels.gemm_fp8.quantize` with
``preshuffled=True``), so no shuffle runs between it and the GEMM: ``tests/test_mx_preshuffle.py``
checks its bytes against :func:`preshuffle`'s.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

STRIPE = 32   # rows per stripe: two 16-row MFMA tiles
CHUNK = 8     # scales per chunk: two 128-element K steps of four 32-element blocks
_STRIPE, _CHUNK = tl.constexpr(STRIPE), tl.constexpr(CHUNK)   # the same, for the kernels


def preshuffled_shape(rows: int, blocks: int) -> tuple[int, int]:
    """The shape of the pre-shuffled form of (rows, blocks) scales."""
    return -(-rows // STRIPE), STRIPE * CHUNK * -(-blocks // CHUNK)


@triton.jit
def preshuffled_offsets(rows, blocks, stride_stripe):
    """Where scale ``blocks`` (1-D) of row ``rows`` (1-D) lies in a pre-shuffled tensor whose
    stripes are ``stride_stripe`` bytes apart: a (rows, blocks) tile of int64 offsets. Row
    16 a + b, scale 4 c + d of stripe t and chunk h: byte 256 h + 64 d + 4 b + 2 c + a of
    stripe t (module docstring), i.e. the chunk's bytes in (d, b, c, a) order."""
    r, s = rows % _STRIPE, blocks % _CHUNK
    a, b = r // (_STRIPE // 2), r % (_STRIPE // 2)
    c, d = s // (_CHUNK // 2), s % (_CHUNK // 2)
    in_chunk = ((d[None, :] * (_STRIPE // 2) + b[:, None]) * 2 + c[None, :]) * 2 + a[:, None]
    chunk = (blocks // _CHUNK) * (_STRIPE * _CHUNK)
    return (rows // _STRIPE).to(tl.int64)[:, None] * stride_stripe + (chunk[None, :] + in_chunk)


@triton.jit
def preshuffled_mask(rows, blocks, ROWS, BLOCKS):
    """Which of :func:`preshuffled_offsets`' (rows, blocks) tile lie in the pre-shuffled form
    of (ROWS, BLOCKS) scales: a stripe and a chunk it has, their padding included."""
    return ((rows < tl.cdiv(ROWS, _STRIPE) * _STRIPE)[:, None]
            & (blocks < tl.cdiv(BLOCKS, _CHUNK) * _CHUNK)[None, :])


def preshuffle(scales: torch.Tensor) -> torch.Tensor:
    """(rows, blocks) uint8 scales, one row per row of the operand, in the pre-shuffled
    layout (module docstring): a contiguous (ceil(rows/32), 256 ceil(blocks/8)) tensor."""
    rows, blocks = scales.shape
    stripes, width = preshuffled_shape(rows, blocks)
    if rows % STRIPE or blocks % CHUNK:   # a partial stripe or chunk: zero bytes fill it (two device ops)
        padded = scales.new_zeros(stripes * STRIPE, width // STRIPE)
        padded[:rows, :blocks] = scales
    else:
        padded = scales
    # (stripe, a, b, chunk, c, d) -> (stripe, chunk, d, b, c, a)
    chunks = width // (STRIPE * CHUNK)   # named, not -1: a view of no rows or no scales has no size to infer
    tiles = padded.reshape(stripes, 2, STRIPE // 2, chunks, 2, CHUNK // 2).permute(0, 3, 5, 2, 4, 1)
    return tiles.contiguous().view(stripes, width)


def unshuffle(shuffled: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """The (rows, blocks) row-major scales that :func:`preshuffle` made ``shuffled`` from."""
    stripes, width = shuffled.shape
    chunks = width // (STRIPE * CHUNK)
    tiles = shuffled.reshape(stripes, chunks, CHUNK // 2, STRIPE // 2, 2, 2)   # (stripe, chunk, d, b, c, a)
    plain = tiles.permute(0, 5, 3, 1, 4, 2).reshape(stripes * STRIPE, width // STRIPE)
    return plain[:rows, :blocks].contiguous()
