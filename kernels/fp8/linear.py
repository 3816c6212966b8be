"""The FP8 linear layer: forward, dgrad and wgrad through a recipe's scaled GEMMs.

``kernels::fp8_linear(x, w, recipe, fp8_dtype, out_dtype, scale_x, scale_w)`` is a
``torch.library`` custom op with a fake implementation and an autograd formula, as the
other public ops are (:mod:`kernels.gemm.ops`): ``torch.compile(fullgraph=True)`` keeps
it as one node, and its backward runs the recipe's dgrad and wgrad GEMMs, which call
``kernels::matmul_fp8`` (another custom op) under tracing. The operands stay in high
precision between forward and backward, and the backward quantizes them again in the
orientation its GEMMs need (for rowwise a different one than the forward's; the fused
quantize-with-transpose of the blockwise kernels is what would save that pass).

``dx`` comes back in x's dtype and ``dw`` in w's (fp32 master weights get an fp32
gradient, accumulated in fp32 by the GEMM).
"""
from __future__ import annotations

import math

import torch

from .. import autocast, eager, validate
from ..gemm_fp8.formats import FP8_DTYPES, fp8_dtype as native_fp8
from . import recipe as _recipes

IN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _impl(x: torch.Tensor, w: torch.Tensor, recipe: str, fp8_dtype: torch.dtype, out_dtype: torch.dtype,
          scale_x: torch.Tensor | None, scale_w: torch.Tensor | None) -> torch.Tensor:
    return _recipes.get(recipe).forward(x, w, fp8_dtype, out_dtype, scale_x, scale_w)


_fp8_linear = torch.library.custom_op("kernels::fp8_linear", _impl, mutates_args=())


@_fp8_linear.register_fake
def _(x, w, recipe, fp8_dtype, out_dtype, scale_x, scale_w):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=out_dtype)


def _setup(ctx, inputs, output):
    x, w, recipe, fp8_dtype, _, scale_x, scale_w = inputs
    ctx.recipe, ctx.fp8_dtype = recipe, fp8_dtype
    ctx.save_for_backward(x, w, scale_x, scale_w)


def _backward(ctx, dy):
    x, w, scale_x, scale_w = ctx.saved_tensors
    recipe = _recipes.get(ctx.recipe)
    dx = recipe.dgrad(dy, w, ctx.fp8_dtype, x.dtype, scale_w) if ctx.needs_input_grad[0] else None
    dw = recipe.wgrad(dy, x, ctx.fp8_dtype, w.dtype, scale_x) if ctx.needs_input_grad[1] else None
    return dx, dw, None, None, None, None, None


_fp8_linear.register_autograd(_backward, setup_context=_setup)


def fp8_linear(x: torch.Tensor, w: torch.Tensor, recipe: str = "rowwise", fp8_dtype: torch.dtype | None = None,
               out_dtype: torch.dtype | None = None, scale_x: torch.Tensor | None = None,
               scale_w: torch.Tensor | None = None) -> torch.Tensor:
    """``x (M, K) @ w (N, K).T`` with the GEMM and, under autograd, dgrad and wgrad in FP8.

    ``fp8_dtype``: the e4m3 format (default: this GPU's, :func:`kernels.gemm_fp8.fp8_dtype`);
    ``out_dtype``: default x's; ``scale_x``/``scale_w``: per-tensor scales decided by the
    caller (delayed scaling), else each GEMM computes its own.
    """
    fp8_dtype = fp8_dtype or native_fp8()
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    validate.tensor("x", x, ndim=2, dtypes=IN_DTYPES, allow_empty=True)
    validate.tensor("w", w, ndim=2, dtypes=IN_DTYPES, allow_empty=True)
    validate.same_device(x=x, w=w)
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x is {tuple(x.shape)} (M, K) and w {tuple(w.shape)} (N, K): K differs")
    needs = _recipes.get(recipe).needs
    if needs:
        raise NotImplementedError(f"FP8 recipe {recipe!r} needs {needs}")
    out_dtype = out_dtype or x.dtype
    op = _impl if eager.direct(x, w) else _fp8_linear
    return op(x, w, recipe, fp8_dtype, out_dtype, scale_x, scale_w)


class Float8Linear(torch.nn.Linear):
    """``torch.nn.Linear`` whose three GEMMs run in FP8 by ``recipe``; same parameters and keys.

    Built by :func:`kernels.fp8.convert` from an existing layer, sharing its parameters
    (an optimizer made before the swap still updates them). A recipe with state (delayed
    scaling) adds its buffers. Under ``torch.autocast`` the input is cast to the autocast
    dtype and the output is in it; the weight is quantized from its own (master) dtype.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: str = "rowwise",
                 fp8_dtype: torch.dtype | None = None, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._setup(recipe, fp8_dtype)

    def _setup(self, recipe: str, fp8_dtype: torch.dtype | None) -> None:
        self.recipe = _recipes.get(recipe).name
        self.fp8_dtype = fp8_dtype or native_fp8()
        for name, buffer in _recipes.get(recipe).state(self.weight.device).items():
            self.register_buffer(name, buffer)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, recipe: str = "rowwise",
                    fp8_dtype: torch.dtype | None = None) -> "Float8Linear":
        """A Float8Linear holding ``linear``'s own weight and bias Parameters."""
        new = cls.__new__(cls)
        torch.nn.Module.__init__(new)
        new.in_features, new.out_features = linear.in_features, linear.out_features
        new.weight, new.bias = linear.weight, linear.bias
        new._setup(recipe, fp8_dtype)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, = autocast.operands(x)
        flat = x.reshape(math.prod(x.shape[:-1]), x.shape[-1])   # not -1: K may be 0
        scale_x, scale_w = _recipes.get(self.recipe).scales(self, flat, self.weight)
        y = fp8_linear(flat, self.weight, self.recipe, self.fp8_dtype, x.dtype, scale_x, scale_w)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe}, fp8={str(self.fp8_dtype).replace('torch.', '')}"
