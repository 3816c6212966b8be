"""The FP8 grouped GEMM as a training op: ``grouped_gemm_fp8_train(x, w, offsets, recipe)``.

High-precision x (T, K) and expert weights w (G, K, N) in, ``x_g @ w[g]`` per group out
(in x's dtype), with the forward and both gradients computed by FP8 grouped GEMMs under
an FP8 training recipe (:data:`.quantize.RECIPES`): the MoE experts' GEMMs of
:func:`kernels.fp8.convert`. Per expert GEMM a training step runs three grouped
launches, each on operands quantized along its own reduction dimension
(:mod:`.quantize`):

* forward: the FP8 grouped GEMM (``kernels::grouped_gemm_fp8``, its best rung);
* dx = dy @ w[g]ᵀ: the same kernel on w[g]ᵀ (a stride view of the dgrad copy of w);
* dw[g] = x_gᵀ · dy_g: the FP8 dW kernel (:mod:`.dw`, ``kernels::grouped_gemm_fp8_dw``),
  whose reduction runs over each group's tokens (zero for an empty group).

So one backward is two grouped launches. x and w are saved in high precision and
quantized again by the backward in the orientation its GEMMs need (unlike the dense FP8
linear, :mod:`kernels.fp8.linear`, which keeps the forward's FP8 operands and quantizes
only dy). The op is the custom op
``kernels::grouped_gemm_fp8_train`` with a fake implementation and an autograd formula
whose backward calls the two custom ops above, so ``torch.compile(fullgraph=True)``
keeps the forward as one node and traces the backward without a graph break. dx comes
back in x's dtype, dw in w's. No host sync when the offsets are not checked.
"""
from __future__ import annotations

import torch

from ... import eager, validate
from ...gemm_fp8.formats import FP8_DTYPES
from ...gemm_fp8.operands import OUT_DTYPES
from . import dw as dw_kernel
from . import quantize
from .ops import _grouped_gemm_fp8_impl


def check_dw(xt, sx, dyt, sdy, offsets, out_dtype) -> None:
    """xt (K, R) and dyt (N, R) in one FP8 format, float32 sx (G, K) and sdy (G, N), int32
    offsets (G,) of token ends <= R."""
    validate.tensor("xt", xt, ndim=2, dtypes=FP8_DTYPES, allow_empty=True)
    validate.tensor("dyt", dyt, ndim=2, dtypes=FP8_DTYPES, allow_empty=True)
    validate.same_dtype(xt=xt, dyt=dyt)
    offsets = validate.index("offsets", offsets, ndim=1, dtypes=(torch.int32,))
    (k, r), (n, r_dy), g = xt.shape, dyt.shape, offsets.shape[0]
    if r != r_dy:
        raise ValueError(f"xt is {tuple(xt.shape)} (K, tokens) and dyt {tuple(dyt.shape)} (N, tokens): "
                         "the token counts differ")
    for name, scale, shape in (("sx", sx, (g, k)), ("sdy", sdy, (g, n))):
        validate.tensor(name, scale, dtypes=(torch.float32,), allow_empty=True)
        if tuple(scale.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(scale.shape)}; expected {shape}, one per group "
                             "and feature")
    validate.same_device(xt=xt, sx=sx, dyt=dyt, sdy=sdy, offsets=offsets)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of {OUT_DTYPES}, got {out_dtype}")


@torch.library.custom_op("kernels::grouped_gemm_fp8_dw", mutates_args=())
def _grouped_gemm_fp8_dw(xt: torch.Tensor, sx: torch.Tensor, dyt: torch.Tensor, sdy: torch.Tensor,
                         offsets: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if xt.numel() == 0 or dyt.numel() == 0 or offsets.numel() == 0:
        return torch.zeros((offsets.shape[0], xt.shape[0], dyt.shape[0]), dtype=out_dtype,
                           device=xt.device)
    return dw_kernel.grouped_dw_fp8(xt, sx, dyt, sdy, offsets.contiguous(), out_dtype)


@_grouped_gemm_fp8_dw.register_fake
def _(xt, sx, dyt, sdy, offsets, out_dtype):
    return xt.new_empty((offsets.shape[0], xt.shape[0], dyt.shape[0]), dtype=out_dtype)


def grouped_gemm_fp8_dw(xt: torch.Tensor, sx: torch.Tensor, dyt: torch.Tensor, sdy: torch.Tensor,
                        offsets: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """dw (G, K, N) with dw[g] = (xt[:, tokens of g] * sx[g, :, None]) @ (dyt[:, tokens of g] * sdy[g, :, None])ᵀ,
    fp32 accumulation: the FP8 weight gradient of an expert GEMM (:mod:`.dw`).

    Operands as :func:`.quantize.wgrad_operand` writes them: xt (K, R) and dyt (N, R)
    feature-major, R >= offsets[-1] tokens (the columns past it are ignored), scales
    float32 (G, K) and (G, N). An empty group's dw is zero.
    """
    check_dw(xt, sx, dyt, sdy, offsets, out_dtype)
    return _grouped_gemm_fp8_dw(xt, sx, dyt, sdy, offsets, out_dtype)


def _mx():
    """The MXFP8 recipe's forward and gradients (:mod:`kernels.moe.grouped_gemm_mxfp8.training`),
    imported on first use: that package imports this one's :mod:`.quantize`, so a module-level
    import would be a cycle."""
    from ..grouped_gemm_mxfp8 import training
    return training


def _train_impl(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, recipe: str,
                fp8_dtype: torch.dtype) -> torch.Tensor:
    if recipe == "mxfp8":
        return _mx().forward(x, w, offsets, fp8_dtype)
    x8, sx = quantize.tokens(x, recipe, fp8_dtype)
    w8, sw = quantize.forward_weight(w, recipe, fp8_dtype)
    return _grouped_gemm_fp8_impl(x8, sx, w8, sw, offsets, x.dtype)


_train = torch.library.custom_op("kernels::grouped_gemm_fp8_train", _train_impl, mutates_args=())


@_train.register_fake
def _(x, w, offsets, recipe, fp8_dtype):
    return x.new_empty((x.shape[0], w.shape[2]))


def _setup(ctx, inputs, output):
    x, w, offsets, recipe, fp8_dtype = inputs
    ctx.recipe, ctx.fp8_dtype = recipe, fp8_dtype
    ctx.save_for_backward(x, w, offsets)


def gradients(x, w, offsets, dy, recipe: str, fp8: torch.dtype, needs) -> tuple:
    """(dx, dw) of ``x_g @ w[g]`` for the output gradient dy, each None where ``needs`` says
    False: one FP8 grouped launch each."""
    if recipe == "mxfp8":
        return _mx().gradients(x, w, offsets, dy, fp8, needs)
    dx = dw = None
    if needs[0]:
        dy8, sdy = quantize.tokens(dy, recipe, fp8)
        wt8, swt = quantize.dgrad_weight(w, recipe, fp8)
        dx = torch.ops.kernels.grouped_gemm_fp8(dy8, sdy, wt8, swt, offsets, x.dtype)
    if needs[1]:
        ids = quantize.group_of_rows(offsets, x.shape[0])
        xt8, sxt = quantize.wgrad_operand(x, ids, w.shape[0], recipe, fp8)
        dyt8, sdyt = quantize.wgrad_operand(dy, ids, w.shape[0], recipe, fp8)
        dw = torch.ops.kernels.grouped_gemm_fp8_dw(xt8, sxt, dyt8, sdyt, offsets, w.dtype)
    return dx, dw


def _backward(ctx, dy):
    x, w, offsets = ctx.saved_tensors
    dx, dw = gradients(x, w, offsets, dy, ctx.recipe, ctx.fp8_dtype, ctx.needs_input_grad)
    return dx, dw, None, None, None


_train.register_autograd(_backward, setup_context=_setup)

IN_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def grouped_gemm_fp8_train(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, recipe: str = "rowwise",
                           fp8_dtype: torch.dtype | None = None, *, check_offsets: bool = True) -> torch.Tensor:
    """``x (T, K)`` rows grouped by expert, ``w (G, K, N)``, int32 ``offsets (G,)`` of row ends
    -> ``(T, N)`` in x's dtype, differentiable in x and w, every GEMM in FP8 by ``recipe``
    (``"rowwise"`` or ``"tensorwise"``, :mod:`.quantize`; ``"mxfp8"``: MXFP8 operands and
    kernels, :mod:`kernels.moe.grouped_gemm_mxfp8.training`).

    x and w share one of float32, bfloat16, float16; ``fp8_dtype`` is the e4m3 format (default
    this GPU's, :func:`kernels.gemm_fp8.fp8_dtype`; for ``"mxfp8"`` OCP float8_e4m3fn, the only
    one it takes). ``check_offsets`` as in
    :func:`kernels.grouped_gemm`. Empty operands and empty groups are legal (zeros, and zero
    gradients for an empty group's expert).
    """
    fp8_dtype = quantize.element_format(recipe, fp8_dtype)
    if fp8_dtype not in FP8_DTYPES:
        raise TypeError(f"fp8_dtype must be one of {FP8_DTYPES}, got {fp8_dtype}")
    quantize.check_recipe(recipe)
    if recipe == "mxfp8":
        _mx().check_format(fp8_dtype)
    offsets = validate.grouped_gemm_operands(x, w, offsets, IN_DTYPES, allow_empty=True,
                                             check_values=check_offsets)
    op = _train_impl if eager.direct(x, w, offsets) else _train
    return op(x, w, offsets, recipe, fp8_dtype)
