"""A MoE layer's outputs and gradients from one forward, checked to the reassociation bound, as every EP test does."""
from __future__ import annotations

import torch

from workbench.check import relative_error
from workbench.harness.tolerances import reassociation_bound


def differs(got, want) -> str | None:
    """Why ``got`` is not ``want`` to the reassociation bound of its dtype (exactly, for
    integers), or None."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype} {tuple(got.shape)} against {want.dtype} {tuple(want.shape)}"
    if not got.is_floating_point():
        return None if torch.equal(got, want) else f"{got.tolist()} against {want.tolist()}"
    error = relative_error(got, want.double())[0]
    bound = reassociation_bound(got.dtype)
    return None if error <= bound else f"relative error {error:.3g} > {bound:.3g}"


def grads_of(layer, x, grad_out):
    return grads_per_dy(layer, x, [grad_out])[0]


def grads_per_dy(layer, x, grads_out):
    """(output, input gradient, parameter gradients) per output gradient in ``grads_out``, all
    from one forward, whose interpreted kernels so run once rather than once per output
    gradient: each backward starts from cleared gradients, all but the last keep the graph."""
    x = x.detach().clone().requires_grad_()
    out = layer(x)
    results = []
    for i, grad_out in enumerate(grads_out):
        x.grad = None
        layer.zero_grad()
        out.backward(grad_out, retain_graph=i < len(grads_out) - 1)
        results.append((out.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters()}))
    return results
