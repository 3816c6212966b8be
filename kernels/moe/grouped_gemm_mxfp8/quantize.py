"""The MXFP8 operands of an MoE expert GEMM's three GEMMs: e4m3fn elements, an e8m0 scale
per 32 along each GEMM's own reduction dimension.

========  ======================  ==============================  ===========================
GEMM      reduces over            x-side operand, blocks along     w-side operand, blocks along
========  ======================  ==============================  ===========================
forward   K                       x: K                            w[g]: K (per output col)
dgrad     N (dx = dy @ w[g]ᵀ)     dy: N                           w[g]ᵀ: N (per input row)
wgrad     the group's tokens      xᵀ: tokens of g                 dyᵀ: tokens of g
========  ======================  ==============================  ===========================

The scale rule is the dense path's (:func:`kernels.gemm_fp8.quantize_ref.quantize_one`'s
``mx32``: :func:`kernels.microscaling.shared_exponent`), on the device with no host sync.
Where a dense layout fits, the dense fused op :func:`kernels.gemm_fp8.quantize` (``mx32``,
one read of the operand, bit for bit the plain pass) quantizes: the token operands (x
(T, K), dy (T, N), blocks of 32 along their rows) and dgrad's weight (w as G·K rows of N).
Two operands no dense layout gives stay plain PyTorch passes (``quantize_one`` and
:func:`.spec.quantize_weight`): the forward's weight (each expert's w[g]ᵀ, K-contiguous:
a copy per expert that no 2-D view of w is) and the wgrad operands, for which each group's
tokens are copied into a token-contiguous buffer at a start rounded up to a multiple of
32 (zeros between), so no 32-token block straddles two groups (:mod:`.dw` says why).
"""
from __future__ import annotations

import torch

from ...gemm_fp8.quantize import quantize as quantize_fused
from ...gemm_fp8.quantize_ref import quantize_one
from ...microscaling import BLOCK
from ...triton_support import cdiv
from ..grouped_gemm_fp8.quantize import group_of_rows
from .spec import quantize_weight


def tokens(t: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's x (T, K) or dgrad's dy (T, N): (fp8, scales (T, ceil(C/32))), blocks along C
    (the dense op's ``mx32``)."""
    return quantize_fused(t.detach(), "mx32", fp8)


def forward_weight(w: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) for the forward: (fp8 (G, K, N) K-contiguous, scales (G, N, ceil(K/32)))."""
    return quantize_weight(w.detach(), fp8)


def dgrad_weight(w: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) for dx = dy @ w[g]ᵀ: (w[g]ᵀ as fp8 (G, N, K), a view of a contiguous
    (G, K, N), so N-contiguous; scales (G, K, ceil(N/32))), blocks along N."""
    g, k, n = w.shape
    q, scales = quantize_fused(w.detach().reshape(g * k, n), "mx32", fp8)
    return q.reshape(g, k, n).transpose(1, 2), scales.reshape(g, k, -(-n // BLOCK))


def _sizes(offsets: torch.Tensor) -> torch.Tensor:
    return torch.diff(offsets, prepend=offsets.new_zeros(1)).clamp(min=0)


def padded_ends(offsets: torch.Tensor) -> torch.Tensor:
    """Each group's end in the wgrad copy: the cumulative sum of its token count rounded up
    to a multiple of 32 (int32, on the device)."""
    return torch.cumsum(cdiv(_sizes(offsets), BLOCK) * BLOCK, 0, dtype=torch.int32)


def wgrad_operand(t: torch.Tensor, offsets: torch.Tensor, ends: torch.Tensor, fp8: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x or dy (T, C) for dw[g] = x_gᵀ · dy_g: (fp8 (C, R) token-contiguous, scales (C, R/32)),
    group g's tokens at [ends[g-1], ends[g-1] + its size) and zeros up to ``ends[g]``
    (:func:`padded_ends`). R = T + 31·G rounded up to 32 bounds the padded count without
    reading the sizes on the host. Rows past offsets[-1] (unchecked offsets) belong to no
    group: they are copied as zeros, after the last group's tokens."""
    (rows, cols), groups = t.shape, offsets.shape[0]
    padded = t.new_zeros((cols, cdiv(rows + (BLOCK - 1) * groups, BLOCK) * BLOCK))
    if rows and groups:
        sizes = _sizes(offsets)
        shift = (offsets - sizes) - (ends - cdiv(sizes, BLOCK) * BLOCK)   # start minus padded start
        ids = group_of_rows(offsets, rows)
        row = torch.arange(rows, device=t.device)
        grouped = (row < offsets[-1])[:, None]
        padded.index_copy_(1, row - shift.long()[ids], torch.where(grouped, t.detach(), 0).t())
    return quantize_one(padded, "mx32", fp8)
