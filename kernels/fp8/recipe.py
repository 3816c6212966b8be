"""What an FP8 training recipe is, and the one registry of them.

A linear layer ``y = x @ w.T`` runs three GEMMs per training step, and each one has a
reduction dimension along which a scale may be shared:

* forward ``y = x @ w.T``: reduces over K (in_features);
* dgrad ``dx = dy @ w``: reduces over N (out_features);
* wgrad ``dw = dy.T @ x``: reduces over M (tokens).

A recipe says, for each GEMM, how its two operands are quantized: one scale per tensor,
one per row/column, per block, and where that scale comes from (the tensor itself,
"current scaling", or earlier steps, "delayed"). A scale that varies along the
reduction dimension cannot be pulled out of the dot product, so a recipe with finer
scales needs a re-quantization of the same tensor for each orientation (rowwise: x is
scaled along K for the forward and along M for wgrad) or a GEMM that applies the scales
per K block inside its loop (blockwise, MXFP8).

Every recipe takes high-precision operands and returns the GEMM's result in
``out_dtype``; :mod:`kernels.fp8.linear` calls ``forward``/``dgrad``/``wgrad`` from the
custom op and its backward. Recipes register themselves here by name
(:func:`register`), one file each in :mod:`kernels.fp8.recipes`.
"""
from __future__ import annotations

import torch

from .. import gemm_fp8

RECIPES: dict[str, "Recipe"] = {}   # filled by kernels.fp8.recipes, in ladder order


class Recipe:
    """Base class: a name, what it does in one line, and its three GEMMs.

    ``grad_dtype_note`` says which FP8 format the gradients take and why (the
    workbench's ``matmul_fp8`` takes one e4m3 format for both operands: no e5m2).
    ``kernels``: the functions of :mod:`kernels.gemm_fp8` it calls beyond ``matmul_fp8``;
    ``needs`` names those not in this installation (None when all are).
    """

    name = ""
    summary = ""
    grad_dtype_note = ("gradients in e4m3, as the forward operands: kernels.matmul_fp8 takes "
                       "one e4m3 format (fnuz or OCP) for both operands, no e5m2")

    kernels: tuple[str, ...] = ()

    @property
    def needs(self) -> str | None:
        missing = [k for k in self.kernels if not hasattr(gemm_fp8, k)]
        return f"kernels.gemm_fp8.{' and '.join(missing)} (not in this installation)" if missing else None

    def state(self, device) -> dict[str, torch.Tensor]:
        """Buffers a layer keeps for this recipe (in its ``state_dict``); none by default."""
        return {}

    def scales(self, layer, x: torch.Tensor, w: torch.Tensor):
        """Scales for x and w decided outside the GEMM (delayed scaling), else (None, None)."""
        return None, None

    def forward(self, x, w, fp8, out_dtype, scale_x=None, scale_w=None) -> torch.Tensor:
        raise NotImplementedError

    def dgrad(self, dy, w, fp8, out_dtype, scale_w=None) -> torch.Tensor:
        raise NotImplementedError

    def wgrad(self, dy, x, fp8, out_dtype, scale_x=None) -> torch.Tensor:
        raise NotImplementedError


def register(recipe: Recipe) -> Recipe:
    if recipe.name in RECIPES:
        raise ValueError(f"FP8 recipe {recipe.name!r} is registered twice")
    RECIPES[recipe.name] = recipe
    return recipe


def names() -> tuple[str, ...]:
    """Every recipe, in ladder order (also those whose kernels are not installed)."""
    return tuple(RECIPES)


def get(name: str) -> Recipe:
    """The recipe called ``name``; a clear error for an unknown one."""
    if name not in RECIPES:
        raise ValueError(f"unknown FP8 recipe {name!r}; the recipes are {', '.join(RECIPES)}")
    return RECIPES[name]
