"""What the grouped quantize kernels compute, stated in PyTorch: the bit-exact reference.

These are the plain passes :mod:`.quantize` ran before :mod:`.quantize_kernel` replaced
them, kept as the definition the tests hold the kernels to: the row-wise wgrad operand (a
scatter amax, a gather of each token's scales, a cast and a strided transposed copy), and
the per-tensor recipes' wgrad operand and forward weight (an amax over the whole tensor
unless the scale is given, a cast, a padded or per-expert transposed copy).
"""
from __future__ import annotations

import torch

from ...gemm_fp8.formats import amax_over, cast, scale_of
from ...triton_support import cdiv
from .dw import ALIGN
from .quantize import group_of_rows


def wgrad_rowwise_reference(t: torch.Tensor, offsets: torch.Tensor, fp8: torch.dtype
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """x or dy (T, C) -> (fp8 (C, R) token-contiguous, R = T padded with zeros to a multiple
    of 16; scale (G, C): each feature's amax over the group's tokens / fp8 max, 1 where 0)."""
    (rows, cols), groups = t.shape, offsets.shape[0]
    ids = group_of_rows(offsets, rows)
    amax = torch.zeros((groups, cols), dtype=torch.float32, device=t.device).scatter_reduce_(
        0, ids[:, None].expand(rows, cols), t.abs().float(), "amax")
    scale = scale_of(amax, fp8)
    padded = torch.zeros((cols, cdiv(rows, ALIGN) * ALIGN), dtype=fp8, device=t.device)
    padded[:, :rows] = cast(t, scale.index_select(0, ids), fp8).t()
    return padded, scale


def per_tensor_scale(t: torch.Tensor, fp8: torch.dtype, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The 0-d scale: ``scale`` as given (delayed), else t's amax / fp8 max (1 where 0)."""
    if scale is not None:
        return scale.float().reshape(())
    return scale_of(amax_over(t.float(), tuple(range(t.dim()))), fp8).reshape(())


def wgrad_per_tensor_reference(t: torch.Tensor, offsets: torch.Tensor, fp8: torch.dtype,
                               scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x or dy (T, C) -> (fp8 (C, R) token-contiguous, R = T padded with zeros to a multiple
    of 16; the one scale, expanded to (G, C))."""
    rows, cols = t.shape
    scale = per_tensor_scale(t, fp8, scale)
    padded = torch.zeros((cols, cdiv(rows, ALIGN) * ALIGN), dtype=fp8, device=t.device)
    padded[:, :rows] = cast(t, scale, fp8).t()
    return padded, scale.expand(offsets.shape[0], cols)


def forward_weight_per_tensor_reference(w: torch.Tensor, fp8: torch.dtype, scale: torch.Tensor | None = None
                                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) -> (fp8 (G, K, N) stored K-contiguous, the one scale expanded to (G, N))."""
    g, _, n = w.shape
    scale = per_tensor_scale(w, fp8, scale)
    return cast(w, scale, fp8).transpose(1, 2).contiguous().transpose(1, 2), scale.expand(g, n)
