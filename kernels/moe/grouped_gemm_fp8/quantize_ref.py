"""What the grouped row-wise quantize kernels compute, stated in PyTorch: the bit-exact reference.

These are the plain passes :func:`.quantize.wgrad_operand` ran before
:mod:`.quantize_kernel` replaced them (a scatter amax, a gather of each token's scales, a
cast and a strided transposed copy), kept as the definition the tests hold the kernels to.
"""
from __future__ import annotations

import torch

from ...gemm_fp8.formats import cast, scale_of
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
