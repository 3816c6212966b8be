"""The backward of a grouped GEMM, once for every rung and for the public op.

For out[rows of g] = x[rows of g] @ w[g]: dx is a grouped GEMM of the output gradient
with wᵀ (a stride view, no copy) over the same offsets, and dw[g] = x_gᵀ · dy_g, a GEMM
whose reduction runs over the group's rows (zero for an empty group). A rung brings
its forward kernel and its dW kernel; the formula is the same for all.
"""
from __future__ import annotations

from typing import Callable

import torch


def gradients(grouped_mm: Callable, grouped_dw: Callable, x, w, offsets, dy, needs) -> tuple:
    """(dx, dw, None) for the inputs (x, w, offsets), each None where ``needs`` says False."""
    dx = grouped_mm(dy, w.transpose(1, 2), offsets) if needs[0] else None
    dw = grouped_dw(x, dy, offsets, w.shape[0]) if needs[1] else None
    return dx, dw, None


def differentiable(grouped_mm: Callable, grouped_dw: Callable) -> Callable:
    """``f(x, w, offsets)``: ``grouped_mm`` forward, backward through :func:`gradients`. A call
    that needs no gradient (grad mode off, or neither x nor w requires one) runs ``grouped_mm``
    without ``autograd.Function.apply``: its Python dispatch would be host time for nothing, as
    it would save nothing and record no graph."""

    class GroupedGemm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, offsets):
            ctx.save_for_backward(x, w, offsets)
            return grouped_mm(x, w, offsets)

        @staticmethod
        def backward(ctx, dy):
            return gradients(grouped_mm, grouped_dw, *ctx.saved_tensors, dy, ctx.needs_input_grad)

    def call(x, w, offsets):
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return GroupedGemm.apply(x, w, offsets)
        return grouped_mm(x, w, offsets)

    return call
