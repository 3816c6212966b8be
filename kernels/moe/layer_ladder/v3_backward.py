"""The fused MoE rung's backward: per expert GEMM its dX and its dW, from what the forward saved.

The forward (:mod:`.v3_fused`) keeps, in x's dtype and in sorted order, the gate and up
pre-activations g and u and the SwiGLU output h (T·k, hidden) each, with the sorted
slots and the offsets; the backward then needs no forward GEMM. Per sorted row i
(slot s, token t = s // k, routing weight w), with dy = the output's gradient:

* down: the gradient of h·down[e] before weighting is dy[t]·down[e]ᵀ (the dX launch, on
  the gathered dy rows), so the routing weight's gradient is h[i]·(dy[t]·down[e]ᵀ)
  (an fp32 dot per row, no product of the forward kept) and dh = w·that; ddown[e] is
  the dW launch Σ (w·h)ᵀ·dy over the expert's rows.
* SwiGLU, in fp32 from the saved g and u: dg = dh·u·σ(g)·(1 + g·(1 − σ(g))), du = dh·g·σ(g).
* gate and up: dW launches of x's rows gathered in sorted order against dg and du, dX
  launches of dg·gateᵀ and du·upᵀ; the two dX results are summed per token, both
  products of its k slots, in float32 by :func:`.slot_sum.slot_sum`.

Six grouped GEMM launches for three expert GEMMs (:func:`kernels.grouped_gemm`'s custom
ops, so the grouped GEMM's kernels and tuner), fewer when some gradient is not needed.
"""
from __future__ import annotations

import torch

from ..permutation import _inverse
from .slot_sum import slot_sum


def fused_backward(grad_out, x, weights, gate, up, down, g, u, h, slots, offsets, needs):
    """(dx, dweights, dgate, dup, ddown), None where ``needs`` (for those five) says False."""
    top_k, groups = weights.shape[1], gate.shape[0]
    mm, dw = torch.ops.kernels.grouped_gemm, torch.ops.kernels.grouped_gemm_dw
    tokens = torch.div(slots, top_k, rounding_mode="floor")
    w = weights.reshape(-1).index_select(0, slots).float().unsqueeze(1)     # (T·k, 1), sorted order
    dy = grad_out.index_select(0, tokens)                                   # sorted order
    dx = dweights = dgate = dup = ddown = None
    if needs[4]:
        ddown = dw((h.float() * w).to(h.dtype), dy, offsets, groups)
    if not any(needs[i] for i in (0, 1, 2, 3)):
        return dx, dweights, dgate, dup, ddown
    dh = mm(dy, down.transpose(1, 2), offsets).float()
    if needs[1]:
        dweights = torch.empty(slots.shape[0], dtype=torch.float32, device=x.device)
        dweights[slots] = (h.float() * dh).sum(dim=1)
        dweights = dweights.view(weights.shape).to(weights.dtype)
    if not any(needs[i] for i in (0, 2, 3)):
        return dx, dweights, dgate, dup, ddown
    dh = dh * w
    gf, sig = g.float(), torch.sigmoid(g.float())
    dg = (dh * u.float() * sig * (1 + gf * (1 - sig))).to(x.dtype)
    du = (dh * gf * sig).to(x.dtype)
    if needs[2] or needs[3]:
        x_rows = x.index_select(0, tokens)
        dgate = dw(x_rows, dg, offsets, groups) if needs[2] else None
        dup = dw(x_rows, du, offsets, groups) if needs[3] else None
    if needs[0]:
        dx = slot_sum(mm(dg, gate.transpose(1, 2), offsets), top_k,
                      mm(du, up.transpose(1, 2), offsets), rows=_inverse(slots))
    return dx, dweights, dgate, dup, ddown
