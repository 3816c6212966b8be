"""The fused MoE rung (v3) as PyTorch custom ops, so ``torch.compile`` runs it: ``kernels::moe_fused``
(the forward, :func:`.v3_fused.fused_forward`, which also returns what the backward needs)
and ``kernels::moe_fused_backward`` (:func:`.v3_backward.fused_backward`), joined by
``register_autograd``, with fake implementations for tracing. ``torch.compile(fullgraph=True)``
sees two opaque nodes, no graph break, and runs v3's kernels forward and backward.
:class:`kernels.MoE` calls :func:`fused_experts` eagerly too.

Why not in the rung's file: a custom op's name is registered once per process, and the rung's
file is also the template of its exercise, which a learner's copy imports again (the rung
there is a plain ``autograd.Function`` over the same two functions).
"""
from __future__ import annotations

import torch

from ... import eager
from . import v3_fused
from .v3_backward import fused_backward


@torch.library.custom_op("kernels::moe_fused", mutates_args=())
def _moe_fused(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate: torch.Tensor,
               up: torch.Tensor, down: torch.Tensor, save: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return v3_fused.fused_forward(x, weights, ids, gate, up, down, save)


@_moe_fused.register_fake
def _(x, weights, ids, gate, up, down, save):
    (t, top_k), (groups, _, hidden) = ids.shape, gate.shape
    rows = t * top_k
    return (x.new_empty((t, down.shape[2])), x.new_empty((rows if save else 0, hidden)),
            x.new_empty((rows if save else 0, hidden)), x.new_empty((rows, hidden)),
            ids.new_empty((rows,), dtype=torch.int64), ids.new_empty((groups,), dtype=torch.int32))


@torch.library.custom_op("kernels::moe_fused_backward", mutates_args=())
def _moe_fused_backward(grad_out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor,
                        gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, g: torch.Tensor,
                        u: torch.Tensor, h: torch.Tensor, slots: torch.Tensor, offsets: torch.Tensor,
                        needs: list[bool]
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = fused_backward(grad_out, x, weights, gate, up, down, g, u, h, slots, offsets, needs)
    return tuple(x.new_empty(0) if grad is None else grad for grad in grads)


@_moe_fused_backward.register_fake
def _(grad_out, x, weights, gate, up, down, g, u, h, slots, offsets, needs):
    return tuple(t.new_empty(t.shape if need else 0) for t, need in zip((x, weights, gate, up, down), needs))


def _save(ctx, inputs, output):
    x, weights, _, gate, up, down, _ = inputs
    ctx.save_for_backward(x, weights, gate, up, down, *output[1:])


def _backward(ctx, grad_out, *_):
    needs = [ctx.needs_input_grad[i] for i in v3_fused.NEEDS]
    saved = ctx.saved_tensors
    if saved[5].shape[0] != saved[7].shape[0] and any(needs):
        raise RuntimeError("kernels::moe_fused ran with save=False, so it kept no pre-activations for "
                           "a backward: call fused_experts, which saves them when a gradient is needed")
    grads = _moe_fused_backward(grad_out, *saved, needs)
    dx, dweights, dgate, dup, ddown = (grad if need else None for grad, need in zip(grads, needs))
    return dx, dweights, None, dgate, dup, ddown, None


_moe_fused.register_autograd(_backward, setup_context=_save)


def fused_experts(x, weights, ids, gate, up, down) -> torch.Tensor:
    """:func:`.v3_fused.fused_experts` as the custom op ``kernels::moe_fused``, which saves g and
    u only when a gradient is needed; when nothing traces (:func:`kernels.eager.path`), the forward
    itself if no gradient is needed, else the rung's ``autograd.Function`` (same kernels forward
    and backward, a third of the custom op's dispatch cost)."""
    how = eager.path(x, weights, ids, gate, up, down)
    if how == eager.PLAIN:
        return v3_fused.fused_forward(x, weights, ids, gate, up, down, False)[0]
    if how == eager.AUTOGRAD:
        return v3_fused.fused_experts_autograd(x, weights, ids, gate, up, down)
    save = torch.is_grad_enabled() and (x.requires_grad or weights.requires_grad or gate.requires_grad
                                        or up.requires_grad or down.requires_grad)
    return _moe_fused(x, weights, ids, gate, up, down, save)[0]
