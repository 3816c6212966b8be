"""SwiGLU of an expert GEMM pair's outputs, ``h = silu(g)·u``, forward and backward each one Triton pass.

:class:`kernels.moe.fp8_layer.Float8MoE` runs gate, SwiGLU and down as three differentiable
steps (the FP8 grouped GEMMs are custom ops with their own backward). With ``F.silu(g) * u``
the forward was two torch elementwise passes over (T·k, hidden), each rounding to x's dtype,
and autograd took SwiGLU's derivative as three more: ``dh·u``, ``dh·silu(g)`` and
``silu_backward``. Here the forward is :func:`.layer_ladder.swiglu_forward.swiglu_forward`:
g and u read once, h computed in fp32 and rounded once, so it can differ from torch's two
roundings in the last bit (what down's GEMM quantizes and the amax that delayed scaling
records of h are these bits). The backward is the fused MoE rung's kernel
(:func:`.layer_ladder.swiglu_backward.swiglu_backward`, dg and du alone, weight 1): dh, g
and u read once, dg and du computed in fp32 from the σ(g) the forward used and rounded
once. No torch pass and no fp32 temporary over (T·k, hidden) either way; autograd keeps g,
u and h, where it kept g, silu(g) and u (h is kept by down's GEMM anyway).

``kernels::swiglu`` and ``kernels::swiglu_backward`` are custom ops with fakes, joined by
``register_autograd``, so ``torch.compile`` traces the layer and its backward without a graph
break; an eager call that nothing watches runs their implementations directly
(:func:`kernels.eager.direct`).
"""
from __future__ import annotations

import torch

from .. import eager
from .layer_ladder import swiglu_forward
from .layer_ladder.swiglu_backward import swiglu_backward
from .layer_ladder.swiglu_rows import unit_columns


def _forward_impl(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return swiglu_forward.swiglu_forward(g, u, checked=True)   # swiglu() checked them


_swiglu = torch.library.custom_op("kernels::swiglu", _forward_impl, mutates_args=())


@_swiglu.register_fake
def _(g, u):
    return torch.empty_like(g, memory_format=torch.contiguous_format)


def _backward_impl(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor,
                   h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dg, du, _, _ = swiglu_backward(dh, g, u, h, None, swiglu=True, dw_rows=False, weighted_h=False)
    return dg, du


_swiglu_backward = torch.library.custom_op("kernels::swiglu_backward", _backward_impl, mutates_args=())


@_swiglu_backward.register_fake
def _(dh, g, u, h):
    return (torch.empty_like(g, memory_format=torch.contiguous_format),
            torch.empty_like(u, memory_format=torch.contiguous_format))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output)


def _backward(ctx, dh):
    g, u, h = ctx.saved_tensors
    dh = unit_columns(dh)
    op = _backward_impl if eager.direct(dh, g, u, h) else _swiglu_backward
    return op(dh, g, u, h)


_swiglu.register_autograd(_backward, setup_context=_setup)


def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` of two (R, H) tensors of one dtype of :data:`.layer_ladder.spec.DTYPES`,
    each row's columns contiguous (the grouped GEMMs' outputs), rounded once from fp32,
    differentiable in both: the forward is :func:`.layer_ladder.swiglu_forward.swiglu_forward`,
    the backward :func:`.layer_ladder.swiglu_backward.swiglu_backward`."""
    swiglu_forward.check(g, u)   # the one check, before any dispatch: neither the fake nor _forward_impl checks
    op = _forward_impl if eager.direct(g, u) else _swiglu
    return op(g, u)
