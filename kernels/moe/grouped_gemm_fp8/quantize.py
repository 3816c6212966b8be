"""The FP8 operands of an MoE expert GEMM's three GEMMs, per recipe.

``y[rows of g] = x_g @ w[g]`` (x (T, K), w (G, K, N)) runs three grouped GEMMs in a
training step, each with its own reduction dimension, and a row-wise scale must be
constant along it (it multiplies the fp32 accumulator once, in the epilogue):

========  ======================  ==============================  ===========================
GEMM      reduces over            x-side operand, scale           w-side operand, scale
========  ======================  ==============================  ===========================
forward   K                       x: per token                    w[g]: per (g, output col)
dgrad     N (dx = dy @ w[g]ᵀ)     dy: per token                   w[g]ᵀ: per (g, input row)
wgrad     the group's tokens      xᵀ: per (g, input feature)      dyᵀ: per (g, output feature)
========  ======================  ==============================  ===========================

so w and the output gradient are each quantized twice per step and x twice (the dense
row-wise recipe quantizes x and w once each, with the fused kernel's transposed copy:
:mod:`kernels.fp8.recipes.rowwise`). The wgrad scales are
amaxes over each group's tokens only: an expert's gradient is not scaled by another
expert's outliers. ``tensorwise`` takes one scale per tensor (all experts' weights
share one), handed to the kernels broadcast (stride 0); each GEMM still gets its own
copy of the operand in the layout it reads (the same scale, a fresh pass).

Each operand is written in the layout its GEMM reads fastest: the reduction dimension
contiguous, as FP8 matrix cores take both operands (w (G, N, K)-contiguous for the
forward, (G, K, N) for dgrad; xᵀ and dyᵀ feature-major, token-contiguous, their token
count padded to a multiple of 16 so every feature's row starts 16-byte aligned).
Quantization here is plain PyTorch (an amax, a divide, a cast and a copy per operand,
on the device, no host sync): memory-bound passes that a fused kernel would do in one
(:mod:`kernels.gemm_fp8.quantize` does it for dense operands; not yet for groups).
"""
from __future__ import annotations

import torch

from ...gemm_fp8.formats import amax_over, cast, fp8_dtype, scale_of
from ...triton_support import cdiv
from .dw import ALIGN

RECIPES = ("tensorwise", "rowwise", "mxfp8")
"""The recipes the FP8 grouped GEMM trains with (blockwise and delayed: not yet); ``mxfp8``'s
operands and GEMMs are :mod:`kernels.moe.grouped_gemm_mxfp8`'s (:mod:`.training`)."""


def element_format(recipe: str, fp8: torch.dtype | None = None) -> torch.dtype:
    """``fp8``, else the recipe's default e4m3 format: OCP float8_e4m3fn for mxfp8 (MX has no
    fnuz form), this GPU's (:func:`kernels.gemm_fp8.fp8_dtype`) for the others."""
    return fp8 or (torch.float8_e4m3fn if recipe == "mxfp8" else fp8_dtype())


def check_recipe(recipe: str) -> None:
    if recipe not in RECIPES:
        raise ValueError(f"the FP8 grouped GEMM trains with the recipes {', '.join(RECIPES)}; "
                         f"got {recipe!r}")


def _scaled(t: torch.Tensor, dims, recipe: str, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in fp8, its scale broadcast to t's shape with size 1 along ``dims``): amax over
    ``dims`` for rowwise, over all of t for tensorwise."""
    scale = scale_of(amax_over(t.detach(), dims if recipe == "rowwise" else tuple(range(t.dim()))), fp8)
    shape = [1 if d in dims else s for d, s in enumerate(t.shape)]
    return cast(t, scale, fp8), scale.expand(shape)


def tokens(x: torch.Tensor, recipe: str, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's x or dgrad's dy (T, C): (fp8 (T, C), scale (T,)), scaled along C."""
    q, scale = _scaled(x, (1,), recipe, fp8)
    return q, scale.reshape(x.shape[0])


def forward_weight(w: torch.Tensor, recipe: str, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) for the forward: (fp8 (G, K, N) stored K-contiguous, scale (G, N)), along K."""
    q, scale = _scaled(w, (1,), recipe, fp8)
    return q.transpose(1, 2).contiguous().transpose(1, 2), scale[:, 0, :]


def dgrad_weight(w: torch.Tensor, recipe: str, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """w (G, K, N) for dx = dy @ w[g]ᵀ: (w[g]ᵀ as fp8 (G, N, K), a view of a contiguous
    (G, K, N), so N-contiguous; scale (G, K)), along N."""
    q, scale = _scaled(w, (2,), recipe, fp8)
    return q.contiguous().transpose(1, 2), scale[:, :, 0]


def group_of_rows(offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """The group of each of ``rows`` rows (int64, on the device); rows past the last end
    count to the last group (no kernel reads them)."""
    ids = torch.searchsorted(offsets, torch.arange(rows, dtype=offsets.dtype, device=offsets.device),
                             right=True)
    return ids.clamp_(max=max(offsets.shape[0] - 1, 0))


def wgrad_operand(t: torch.Tensor, ids: torch.Tensor, groups: int, recipe: str, fp8: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """x or dy (T, C) for dw[g] = x_gᵀ · dy_g: (fp8 (C, R) token-contiguous, R = T padded to
    a multiple of 16 with zeros, scale (G, C)); rowwise scales each feature by its amax
    over the group's tokens."""
    (rows, cols), device = t.shape, t.device
    if recipe == "rowwise":
        amax = torch.zeros((groups, cols), dtype=torch.float32, device=device).scatter_reduce_(
            0, ids[:, None].expand(rows, cols), t.detach().abs().float(), "amax")
        scale = scale_of(amax, fp8)
        q = cast(t, scale.index_select(0, ids), fp8)
    else:
        q, scale = _scaled(t, (0, 1), recipe, fp8)
        scale = scale.expand(groups, cols)
    padded = torch.empty((cols, cdiv(rows, ALIGN) * ALIGN), dtype=fp8, device=device)
    padded[:, :rows] = q.t()
    padded[:, rows:] = 0
    return padded, scale
