"""``Float8MoE``: :class:`kernels.MoE` whose experts' three GEMMs and their gradients run in FP8.

What :func:`kernels.fp8.convert` makes of a ``kernels.MoE``: the same parameters (shared,
not copied: an optimizer made before the swap still updates them), the same routing,
and the experts as v2 of the ``moe`` ladder runs them (:mod:`.layer_ladder.v2_grouped`:
permute by expert, gate and up, SwiGLU, down, unpermute) with each of the three grouped
GEMMs on :func:`kernels.moe.grouped_gemm_fp8.grouped_gemm_fp8_train`: forward, dX and dW
as FP8 grouped GEMMs with fp32 accumulation, operands quantized by ``recipe`` along each
GEMM's reduction dimension (:mod:`.grouped_gemm_fp8.quantize`), the output gradients in
``grad_fp8_dtype`` (e4m3, or its family's e5m2: hybrid). Not v3's fused kernels: they
take bf16/fp32 operands and have no FP8 path.

Under ``"delayed"`` the layer keeps an amax history per operand of its GEMMs
(:data:`FP8_TENSORS`: the routed rows x, which gate and up share, SwiGLU's output hidden,
and the three expert weights) as buffers, and takes each per-tensor scale from it by the
dense delayed recipe's rule (:func:`kernels.fp8.recipes.delayed.history_scale`); those
buffers are in ``state_dict``, counted by :func:`kernels.fp8.warn_saturation` and
all-reduced across ranks with the Linears' (:mod:`kernels.fp8.amax_sync`).

What stays in high precision: the router (its logits in float32 unless ``convert`` was
told to make it FP8 too), the routing weights and the weighted sum over a token's
experts (float32, in :func:`kernels.moe.unpermute`), SwiGLU, and the shared experts
(parameters that no Linear holds, run as the ``MoE`` layer runs them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fp8.recipes.delayed import history_scale, history_state
from .grouped_gemm_fp8.quantize import check_recipe, element_format
from .grouped_gemm_fp8.training import grouped_gemm_fp8_train
from .grouped_gemm_mxfp8.training import check_format as check_mx_format
from .layer import MoE
from .permutation import permute, unpermute

FP8_TENSORS = ("x", "hidden", "gate", "up", "down")
"""The operands whose scales delayed scaling keeps a history of, in ``fp8_saturated``'s order."""


class Float8MoE(MoE):
    """A ``kernels.MoE`` with FP8 experts under ``recipe`` (one of
    :data:`kernels.moe.grouped_gemm_fp8.quantize.RECIPES`); built by :meth:`from_moe` (or
    :func:`kernels.fp8.convert`)."""

    fp8_tensors = FP8_TENSORS

    @classmethod
    def from_moe(cls, layer: MoE, recipe: str = "rowwise", fp8_dtype: torch.dtype | None = None,
                 grad_dtype: torch.dtype | None = None) -> "Float8MoE":
        """A Float8MoE holding ``layer``'s own Parameters and submodules (its router).
        ``fp8_dtype`` defaults to this GPU's e4m3 format, and to OCP float8_e4m3fn for
        "mxfp8" (MX has no fnuz form); ``grad_dtype``: the output gradients' FP8 format,
        default ``fp8_dtype`` (e4m3)."""
        if type(layer) is not MoE:
            raise TypeError(f"Float8MoE.from_moe takes a kernels.MoE, got {type(layer).__name__} "
                            "(the expert-parallel layer has no FP8 path)")
        check_recipe(recipe)
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)   # hooks of its own; the sizes, mode and registered state shared
        new.__dict__.update({key: value for key, value in vars(layer).items() if not key.startswith("_")})
        for own, theirs in ((new._parameters, layer._parameters), (new._buffers, layer._buffers),
                            (new._modules, layer._modules)):
            own.update(theirs)
        new.recipe, new.fp8_dtype = recipe, element_format(recipe, fp8_dtype)
        new.grad_fp8_dtype = grad_dtype or new.fp8_dtype
        if recipe == "mxfp8":
            check_mx_format(new.fp8_dtype)
        if recipe == "delayed":
            for name, buffer in history_state(FP8_TENSORS, layer.gate.device).items():
                new.register_buffer(name, buffer)
        return new

    def _scale(self, name: str, t: torch.Tensor) -> torch.Tensor | None:
        return history_scale(self, name, t) if self.recipe == "delayed" else None

    def experts(self, rows, weights, ids, gate, up, down) -> torch.Tensor:
        x_sorted, offsets, permutation = permute(rows, ids, gate.shape[0], check_ids=False)

        def mm(a, scale_a, w, name_w):
            return grouped_gemm_fp8_train(a, w, offsets, self.recipe, self.fp8_dtype, self.grad_fp8_dtype,
                                          scale_a, self._scale(name_w, w), check_offsets=False)

        scale_x = self._scale("x", x_sorted)    # once: gate and up share x (one history entry a step)
        hidden = F.silu(mm(x_sorted, scale_x, gate, "gate")) * mm(x_sorted, scale_x, up, "up")
        out = mm(hidden, self._scale("hidden", hidden), down, "down")
        return unpermute(out, permutation, weights, check_permutation=False)

    def extra_repr(self) -> str:
        name = lambda dtype: str(dtype).replace("torch.float8_", "")   # noqa: E731
        return (f"{super().extra_repr()}, recipe={self.recipe}, fp8={name(self.fp8_dtype)}, "
                f"grad={name(self.grad_fp8_dtype)}")
