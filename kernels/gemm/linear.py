"""``linear(x, weight, bias)``: ``nn.Linear``'s ``x @ weight.T + bias``, one autograd node where
only autograd watches.

Written as ``matmul(x, weight.t()) + bias`` it records three nodes per eager call that needs a
gradient: the transpose of the weight, the GEMM's Function and the bias add (which also allocates
a second output). torch's ``nn.Linear`` records one (``addmm``), and each node is host time
(``workbench bench overhead``). So an eager call (:func:`kernels.eager.path`) runs
:class:`_Linear`, whose forward transposes the weight, launches the GEMM's plan and adds the bias
into the GEMM's output in place, with grad mode off inside, and whose backward is the same
formulas as the three nodes': the GEMM's (:func:`kernels.gemm.ops._grads`), the transpose's
(the weight's gradient is the transpose of ``b``'s) and the add's (``bias`` gets ``grad_y``
summed to its shape, as autograd reduces a broadcast operand's gradient). The results and the
gradients are bitwise those of the three-node form, which a traced, transformed or autocast call
still runs (the custom op ``kernels::matmul`` and torch's add), as does a bias in another dtype
than ``x`` or of more than one dimension (the add would then broadcast the result itself).
"""
from __future__ import annotations

import torch

from .. import eager, plans
from . import ops


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x (..., K) @ weight (N, K).T + bias (N,)`` as :func:`kernels.matmul` and a bias add compute
    it (same checks and errors, same numbers), in one autograd node when called eagerly."""
    how = eager.path(x, weight, autocast=True) if bias is None else eager.path(x, weight, bias, autocast=True)
    if how != eager.CUSTOM_OP and (bias is None or bias.dim() <= 1 and bias.dtype == x.dtype):
        plan = _PLANS(plans.meta(x, weight), _checked, x, weight)
        if how == eager.AUTOGRAD:
            return _Linear.apply(x, weight, bias, plan)
        y = plan.compute(x, weight.t())
        return y if bias is None else y.add_(bias)
    y = ops.matmul(x, weight.t())
    if bias is None:
        return y
    return y + (bias if bias.dtype == y.dtype else bias.to(y.dtype))


_PLANS = plans.PlanCache()


def _checked(x: torch.Tensor, weight: torch.Tensor) -> ops._Plan:
    """:func:`kernels.matmul`'s checks of ``x`` and ``weight.t()``, kept by ``weight``'s metadata
    (the transpose's follows from it)."""
    return ops._Plan(x, weight.t())


class _Linear(torch.autograd.Function):
    """The three nodes of ``matmul(x, weight.t()) + bias`` as one (the module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, plan):
        ctx.save_for_backward(x, weight)
        ctx.flat = plan.flat
        ctx.bias_shape = None if bias is None else bias.shape
        y = plan.compute(x, weight.t())
        return y if bias is None else y.add_(bias)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_x, grad_wt = ops._grads(x, weight.t(), grad_y, needs[:2], ctx.flat)
        grad_bias = grad_y.sum_to_size(ctx.bias_shape) if needs[2] else None
        return grad_x, None if grad_wt is None else grad_wt.t(), grad_bias, None
