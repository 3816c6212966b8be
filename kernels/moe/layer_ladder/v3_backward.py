"""The fused MoE rung's backward: per expert GEMM its dX and its dW, from what the forward saved.

The forward (:mod:`.v3_fused`) keeps, in x's dtype and in sorted order, the gate and up
pre-activations g and u and the SwiGLU output h (T·k, hidden) each, with the sorted
slots and the offsets; the backward then needs no forward GEMM. Per sorted row i
(slot s, token t = s // k, routing weight w), with dy = the output's gradient:

* down: the gradient of h·down[e] before weighting is dh = dy[t]·down[e]ᵀ (the dX launch,
  on the gathered dy rows), so the routing weight's gradient is h[i]·dh (an fp32 dot per
  row, no product of the forward kept) and h's gradient w·dh; ddown[e] is the dW launch
  Σ (w·h)ᵀ·dy over the expert's rows.
* SwiGLU, in fp32 from the saved g and u: dg = w·dh·u·σ(g)·(1 + g·(1 − σ(g))),
  du = w·dh·g·σ(g).
* gate and up: dW launches of x's rows gathered in sorted order against dg and du, dX
  launches of dg·gateᵀ and du·upᵀ; the two dX results are summed per token, both
  products of its k slots, in float32 by :func:`.slot_sum.slot_sum`.

What runs where: six grouped GEMM launches for three expert GEMMs
(:func:`kernels.grouped_gemm`'s custom ops, so the grouped GEMM's kernels and tuner), fewer
when some gradient is not needed; between down's dX and the rest, one Triton kernel
(:func:`.swiglu_backward.swiglu_backward`) reads dh, g, u, h and w once and writes dg, du,
the routing weights' gradient (fp32, one program per row block, so the same bits every
run) and w·h for down's dW, each in x's dtype, each only when a needed gradient reads it.
Torch itself runs no pass over (T·k, hidden): no fp32 temporary of that shape is made
(``tests/test_moe_swiglu_backward.py`` counts). The gathers of dy's and x's rows and the
scatter of the routing weights' gradient into slot order are torch's (:func:`fused_backward`).
All of it runs on rows already in sorted order (:func:`sorted_backward`), so the
expert-parallel layer (:mod:`kernels.moe.ep_layer`) runs it on the rows an owner received,
with the routing weight applied on the sender instead (w None: no w·h, h is down's operand).
"""
from __future__ import annotations

import torch

from ..permutation import _inverse
from .slot_sum import slot_sum
from .swiglu_backward import swiglu_backward


def sorted_backward(dy, rows, gate, up, down, g, u, h, offsets, w, needs, wgrad_dtype=None):
    """The three expert GEMMs' gradients over expert-major rows, from the saved g, u and h:
    ``(d_rows, dw_rows, dgate, dup, ddown)``, None where ``needs`` (for those five) says False.

    ``dy`` (R, dim): each row's output gradient before its routing weight ``w`` (R, 1) fp32,
    or None for weight 1 (the expert-parallel layer weights the gradient on the sender);
    ``rows`` (R, dim): the rows the gate and up GEMMs read (None if neither dgate nor dup is
    needed). ``d_rows``: the pair (dg·gateᵀ, du·upᵀ), both (R, dim), whose sum per row,
    or per token, is the input's gradient (summed by the caller, in its order);
    ``dw_rows`` (R,) fp32: each row's routing weight gradient h·(dy·downᵀ). Separate from
    :func:`fused_backward` so the expert-parallel layer's owners run the same launches on
    the rows they received. ``wgrad_dtype``: dgate, dup and ddown's dtype where it is not the
    operands' (fp32 master weights: the dW launches store their fp32 sums in it)."""
    groups = gate.shape[0]
    mm, dw = torch.ops.kernels.grouped_gemm, torch.ops.kernels.grouped_gemm_dw
    swiglu = needs[0] or needs[2] or needs[3]
    dh = mm(dy, down.transpose(1, 2), offsets) if swiglu or needs[1] else None
    dg, du, dw_rows, hw = swiglu_backward(dh, g, u, h, w, swiglu=swiglu, dw_rows=needs[1],
                                          weighted_h=needs[4] and w is not None)
    ddown = dw(h if hw is None else hw, dy, offsets, groups, wgrad_dtype) if needs[4] else None
    dgate = dw(rows, dg, offsets, groups, wgrad_dtype) if needs[2] else None
    dup = dw(rows, du, offsets, groups, wgrad_dtype) if needs[3] else None
    d_rows = (mm(dg, gate.transpose(1, 2), offsets), mm(du, up.transpose(1, 2), offsets)) if needs[0] else None
    return d_rows, dw_rows, dgate, dup, ddown


def fused_backward(grad_out, x, weights, gate, up, down, g, u, h, slots, offsets, needs, wgrad_dtype=None):
    """(dx, dweights, dgate, dup, ddown), None where ``needs`` (for those five) says False:
    :func:`sorted_backward` on the output gradient's and x's rows gathered in sorted order
    (the expert weights' gradients in ``wgrad_dtype`` if given)."""
    top_k = weights.shape[1]
    tokens = torch.div(slots, top_k, rounding_mode="floor")
    w = weights.reshape(-1).index_select(0, slots).float().unsqueeze(1)     # (T·k, 1), sorted order
    dy = grad_out.index_select(0, tokens)                                   # sorted order
    rows = x.index_select(0, tokens) if needs[2] or needs[3] else None
    d_rows, dw_rows, dgate, dup, ddown = sorted_backward(dy, rows, gate, up, down, g, u, h, offsets,
                                                         w, needs, wgrad_dtype)
    dx = dweights = None
    if needs[1]:
        dweights = torch.empty(slots.shape[0], dtype=torch.float32, device=x.device)
        dweights[slots] = dw_rows
        dweights = dweights.view(weights.shape).to(weights.dtype)
    if needs[0]:
        dx = slot_sum(d_rows[0], top_k, d_rows[1], rows=_inverse(slots))
    return dx, dweights, dgate, dup, ddown
