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
``mx32``), by ``scale_rule``: the OCP floor rule (:func:`kernels.microscaling.shared_exponent`,
the default here) or the round-up rule (:func:`kernels.microscaling.round_up_exponent`, which
the training op takes from the ``mxfp8`` recipe, :mod:`.training`), on the device with no host
sync, each operand read once, bit for bit the plain passes. Where a dense layout fits, the dense fused op
:func:`kernels.gemm_fp8.quantize` (``mx32``) quantizes: the token operands (x (T, K), dy (T,
N), blocks of 32 along their rows) and dgrad's weight (w as G·K rows of N). The two operands
no dense layout gives are the grouped cast's transposed copies in its ``MX`` mode (one launch
each, :func:`kernels.moe.grouped_gemm_fp8.quantize_kernel.mx_launch`, the custom op
``kernels::grouped_quantize_mxfp8``): the forward's weight (each expert's w[g]ᵀ,
K-contiguous: a copy per expert that no 2-D view of w is; each expert a problem of K tokens
in one group) and the wgrad operands, for which each group's tokens are copied into a
token-contiguous buffer at a start rounded up to a multiple of 32 (zeros between), so no
32-token block straddles two groups (:mod:`.dw` says why). The kernel finds each block's
scale in its tile and writes the padding's zeros itself: the copy is not zeroed first, and
t is read once. ``tests/test_grouped_quantize_mxfp8.py`` keeps the plain passes these
replaced as their reference.
"""
from __future__ import annotations

import torch

from ... import eager
from ...gemm_fp8.quantize import quantize as quantize_fused
from ...microscaling import BLOCK
from ...triton_support import cdiv
from ..grouped_gemm_fp8 import quantize_kernel


def _transposed_impl(t: torch.Tensor, offsets: torch.Tensor, ends: torch.Tensor, fp8: torch.dtype,
                     rows: int, scale_rule: str = "ocp") -> list[torch.Tensor]:
    return list(quantize_kernel.mx_launch(t, offsets, ends, fp8, rows, scale_rule))


_transposed = torch.library.custom_op("kernels::grouped_quantize_mxfp8", _transposed_impl, mutates_args=())


@_transposed.register_fake
def _(t, offsets, ends, fp8, rows, scale_rule="ocp"):
    batch, _, cols = t.shape
    return [t.new_empty((batch, cols, rows), dtype=fp8),
            t.new_empty((batch, cols, cdiv(rows, BLOCK)), dtype=torch.uint8)]


def _transposed_copy(t: torch.Tensor, offsets: torch.Tensor, ends: torch.Tensor, fp8: torch.dtype, rows: int,
                     scale_rule: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped cast's MX launch (:func:`kernels.moe.grouped_gemm_fp8.quantize_kernel.mx_launch`)
    on t (B, T, C), through the custom op wherever anything traces (the training op's backward
    under ``torch.compile``): (q (B, C, rows), scales (B, C, ceil(rows/32))). ``fp8``:
    float8_e4m3fn or float8_e5m2, the OCP formats MX names (the recipe takes e4m3fn)."""
    t, offsets, ends = t.detach(), offsets.contiguous(), ends.contiguous()   # flat arrays in the kernel
    impl = _transposed_impl if eager.direct(t, offsets, ends) else _transposed
    return tuple(impl(t, offsets, ends, fp8, rows, scale_rule))


def tokens(t: torch.Tensor, fp8: torch.dtype, scale_rule: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's x (T, K) or dgrad's dy (T, N): (fp8, scales (T, ceil(C/32))), blocks along C
    (the dense op's ``mx32``). ``scale_rule``, here and below: ``"ocp"`` or ``"round_up"``."""
    return quantize_fused(t.detach(), "mx32", fp8, scale_rule=scale_rule)


def forward_weight(w: torch.Tensor, fp8: torch.dtype, scale_rule: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) for the forward: (fp8 (G, K, N) K-contiguous, scales (G, N, ceil(K/32))), as
    :func:`.spec.quantize_weight`: each expert's w[g] a problem of K tokens in one group,
    unpadded (its offsets and padded ends both K)."""
    k = w.shape[1]
    one_group = torch.full((1,), k, dtype=torch.int32, device=w.device)
    q, scales = _transposed_copy(w, one_group, one_group, fp8, k, scale_rule)
    return q.transpose(1, 2), scales


def dgrad_weight(w: torch.Tensor, fp8: torch.dtype, scale_rule: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) for dx = dy @ w[g]ᵀ: (w[g]ᵀ as fp8 (G, N, K), a view of a contiguous
    (G, K, N), so N-contiguous; scales (G, K, ceil(N/32))), blocks along N."""
    g, k, n = w.shape
    q, scales = quantize_fused(w.detach().reshape(g * k, n), "mx32", fp8, scale_rule=scale_rule)
    return q.reshape(g, k, n).transpose(1, 2), scales.reshape(g, k, -(-n // BLOCK))


def _sizes(offsets: torch.Tensor) -> torch.Tensor:
    return torch.diff(offsets, prepend=offsets.new_zeros(1)).clamp(min=0)


def padded_ends(offsets: torch.Tensor) -> torch.Tensor:
    """Each group's end in the wgrad copy: the cumulative sum of its token count rounded up
    to a multiple of 32 (int32, on the device)."""
    return torch.cumsum(cdiv(_sizes(offsets), BLOCK) * BLOCK, 0, dtype=torch.int32)


def wgrad_operand(t: torch.Tensor, offsets: torch.Tensor, ends: torch.Tensor, fp8: torch.dtype,
                  scale_rule: str = "ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """x or dy (T, C) for dw[g] = x_gᵀ · dy_g: (fp8 (C, R) token-contiguous, scales (C, R/32)),
    group g's tokens at [ends[g-1], ends[g-1] + its size) and zeros up to ``ends[g]``
    (:func:`padded_ends`). R = T + 31·G rounded up to 32 bounds the padded count without
    reading the sizes on the host. Rows past offsets[-1] (unchecked offsets) belong to no
    group: they are not copied, and the positions after the last group's tokens are zeros.
    One launch (:func:`_transposed_copy`), every position and scale written by it."""
    (rows, _), groups = t.shape, offsets.shape[0]
    q, scales = _transposed_copy(t[None], offsets, ends, fp8, cdiv(rows + (BLOCK - 1) * groups, BLOCK) * BLOCK,
                                 scale_rule)
    return q[0], scales[0]
