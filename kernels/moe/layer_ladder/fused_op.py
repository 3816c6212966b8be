"""The fused MoE rung (v3) as PyTorch custom ops, so ``torch.compile`` runs it: ``kernels::moe_fused``
(the forward, :func:`.v3_fused.fused_forward`, which also returns what the backward needs)
and ``kernels::moe_fused_backward`` (:func:`.v3_backward.fused_backward`), joined by
``register_autograd``, with fake implementations for tracing. ``torch.compile(fullgraph=True)``
sees two opaque nodes, no graph break, and runs v3's kernels forward and backward.
:class:`kernels.MoE` calls :func:`fused_experts` eagerly too.

Why not in the rung's file: a custom op's name is registered once per process, and the rung's
file is also the template of its exercise, which a learner's copy imports again (the rung
there is a plain ``autograd.Function`` over the same two functions).

Master weights (:func:`fused_experts` on weights of another dtype than x's): under autocast,
:class:`kernels.MoE` passes its
fp32 gate, up and down into the experts' autograd node, which casts them to x's dtype itself
(one cast each per forward, as autocast's, but not recorded by autograd) and whose backward
returns their gradients in their own dtype from the dW launches' fp32 sums
(:func:`kernels.moe.grouped_gemm.ops._grouped_gemm_dw_impl`'s ``dtype``), where autograd's
backward of recorded casts would get bf16 dW results, rounded to bf16's 8 bits, and run a cast
back per weight: three device ops fewer per layer per step. As :func:`kernels.gemm.linear.linear`
does for a Linear's weight: an eager call that needs a gradient runs the rung's
:class:`.v3_fused._FusedExperts`, which casts expert weights of another dtype than x's, a traced
one the custom op ``kernels::moe_fused_master_weight`` (casts inside, returns the casts for the
backward, which runs ``kernels::moe_fused_backward`` with ``wgrad_dtype``).
"""
from __future__ import annotations

from typing import Optional

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
def _moe_fused_fake(x, weights, ids, gate, up, down, save):
    (t, top_k), (groups, _, hidden) = ids.shape, gate.shape
    rows = t * top_k
    return (x.new_empty((t, down.shape[2])), x.new_empty((rows if save else 0, hidden)),
            x.new_empty((rows if save else 0, hidden)), x.new_empty((rows, hidden)),
            ids.new_empty((rows,), dtype=torch.int64), ids.new_empty((groups,), dtype=torch.int32))


@torch.library.custom_op("kernels::moe_fused_backward", mutates_args=())
def _moe_fused_backward(grad_out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor,
                        gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, g: torch.Tensor,
                        u: torch.Tensor, h: torch.Tensor, slots: torch.Tensor, offsets: torch.Tensor,
                        needs: list[bool], wgrad_dtype: Optional[torch.dtype] = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = fused_backward(grad_out, x, weights, gate, up, down, g, u, h, slots, offsets, needs, wgrad_dtype)
    return tuple(x.new_empty(0) if grad is None else grad for grad in grads)


@_moe_fused_backward.register_fake
def _(grad_out, x, weights, gate, up, down, g, u, h, slots, offsets, needs, wgrad_dtype=None):
    dtypes = (x.dtype, weights.dtype, *(wgrad_dtype or w.dtype for w in (gate, up, down)))
    return tuple(t.new_empty(t.shape if need else 0, dtype=dtype)
                 for t, need, dtype in zip((x, weights, gate, up, down), needs, dtypes))


def _save(ctx, inputs, output):
    """``kernels::moe_fused``'s and ``kernels::moe_fused_master_weight``'s: x, the routing weights,
    the expert weights the forward multiplied (for the master-weight op its last three outputs, the
    casts, which no gradient reaches, with the master weights' dtype for their gradients:
    ``wgrad_dtype``) and the forward's saved activations."""
    x, weights, _, gate, up, down, _ = inputs
    experts, ctx.op, ctx.wgrad_dtype = (gate, up, down), "kernels::moe_fused", None
    if len(output) > 6:   # the casts follow the forward's outputs
        experts, ctx.op, ctx.wgrad_dtype = output[6:], "kernels::moe_fused_master_weight", gate.dtype
        ctx.mark_non_differentiable(*experts)
    ctx.save_for_backward(x, weights, *experts, *output[1:6])


def _backward(ctx, grad_out, *_):
    needs = [ctx.needs_input_grad[i] for i in v3_fused.NEEDS]
    saved = ctx.saved_tensors
    if saved[5].shape[0] != saved[7].shape[0] and any(needs):
        raise RuntimeError(f"{ctx.op} ran with save=False, so it kept no pre-activations for a "
                           "backward: call fused_experts, which saves them when a gradient is needed")
    grads = _moe_fused_backward(grad_out, *saved, needs, ctx.wgrad_dtype)
    dx, dweights, dgate, dup, ddown = (grad if need else None for grad, need in zip(grads, needs))
    return dx, dweights, None, dgate, dup, ddown, None


_moe_fused.register_autograd(_backward, setup_context=_save)


def _saves(*tensors: torch.Tensor) -> bool:
    """Whether the forward keeps g and u: a gradient is needed."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _master_forward(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate: torch.Tensor,
                    up: torch.Tensor, down: torch.Tensor, save: bool
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                               torch.Tensor, torch.Tensor, torch.Tensor]:
    """``kernels::moe_fused``'s outputs for expert weights of another dtype than x's (master
    weights), then the three cast to x's dtype (new tensors: an output may not alias an input),
    which the backward's dX launches read."""
    casts = tuple(w.to(x.dtype, copy=True) for w in (gate, up, down))
    return (*v3_fused.fused_forward(x, weights, ids, *casts, save), *casts)


_moe_fused_master = torch.library.custom_op("kernels::moe_fused_master_weight", _master_forward, mutates_args=())


@_moe_fused_master.register_fake
def _(x, weights, ids, gate, up, down, save):
    return (*_moe_fused_fake(x, weights, ids, gate, up, down, save),
            *(torch.empty_like(w, dtype=x.dtype) for w in (gate, up, down)))


_moe_fused_master.register_autograd(_backward, setup_context=_save)


def fused_experts(x, weights, ids, gate, up, down) -> torch.Tensor:
    """:func:`.v3_fused.fused_experts` as the custom op ``kernels::moe_fused``, which saves g and
    u only when a gradient is needed; when nothing traces (:func:`kernels.eager.path`), the forward
    itself if no gradient is needed, else the rung's ``autograd.Function`` (same kernels forward
    and backward, a third of the custom op's dispatch cost). Expert weights of another dtype than
    x's (fp32 master weights under autocast) are cast to x's dtype inside the experts' node
    (``kernels::moe_fused_master_weight`` where traced), their gradients in their own dtype; an
    eager call that needs no gradient casts them and runs the forward (nothing to gain)."""
    how = eager.path(x, weights, ids, gate, up, down)
    if how == eager.PLAIN:
        if gate.dtype != x.dtype:
            gate, up, down = (w.to(x.dtype) for w in (gate, up, down))
        return v3_fused.fused_forward(x, weights, ids, gate, up, down, False)[0]
    if how == eager.AUTOGRAD:
        return v3_fused.fused_experts_autograd(x, weights, ids, gate, up, down)
    op = _moe_fused if gate.dtype == x.dtype else _moe_fused_master
    return op(x, weights, ids, gate, up, down, _saves(x, weights, gate, up, down))[0]
