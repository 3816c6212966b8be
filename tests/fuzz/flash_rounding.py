"""The error every flash-attention backward carries, as a baseline sample for the fuzz's rule.

A flash backward does not keep P; it takes Δ_i = Σ_d dO_id · O_id from the output it saved,
which is rounded to the input dtype, instead of Σ_j P_ij · dP_ij. In exact arithmetic the two
agree; with O rounded, dS = P ∘ (dP − Δ) is off by P · Σ_d dO_d · (round(O) − O)_d, and dQ and
dK sum that over a row or a column. Where dS cancels (a query that sees one key has dS = 0 in
exact arithmetic) that is a large part of a small gradient, and it is the algorithm's, not a
kernel's: FlashAttention-2, the Triton tutorial's kernel and this project's v5 all compute Δ
so. torch's samples (SDPA's math backend, its CPU flash kernel) may not show it: the math
backend keeps P, and one flash sample's rounding can be luckily small.

:func:`flash_rounding` computes the op in float64 with that one rounding (O rounded to the
input dtype before Δ), and returns the output and the gradients rounded to the input dtype:
its error against the float64 reference is that one rounding's (a kernel's float32 sums may
add to it or offset part of it), and the rule's bound, from the largest of its samples' errors,
then covers it (times the rule's factor, as for torch's samples).
"""
from __future__ import annotations

import math

import torch

from kernels.attention import spec as attn_spec


class _FlashRounding(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float | None):
        q64, k64, v64 = (t.detach().double() for t in (q, k, v))
        group = q.shape[1] // k.shape[1]
        k64, v64 = k64.repeat_interleave(group, dim=1), v64.repeat_interleave(group, dim=1)
        p = attn_spec.probabilities(q64, k64, causal, scale)
        out = p @ v64
        ctx.save_for_backward(q64, k64, v64, p, out)
        ctx.scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        ctx.group, ctx.dtype, ctx.kv_shape = group, q.dtype, k.shape
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, p, out = ctx.saved_tensors
        do = grad_out.double()
        delta = (do * out.to(ctx.dtype).double()).sum(-1, keepdim=True)   # the one flash rounding
        ds = p * (do @ v.transpose(-1, -2) - delta)
        dq = ctx.scale * ds @ k
        dk, dv = ctx.scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do

        def per_kv_head(t):   # sum the query heads that share a key head (none: no query heads)
            if not ctx.group:
                return t.new_zeros(ctx.kv_shape)
            return t.unflatten(1, (t.shape[1] // ctx.group, ctx.group)).sum(2)
        return dq.to(ctx.dtype), per_kv_head(dk).to(ctx.dtype), per_kv_head(dv).to(ctx.dtype), None, None


def flash_rounding(causal: bool, scale: float | None):
    """``(q, k, v) -> out``, differentiable: the sample described above, at ``scale`` (the scale
    the op takes, None for 1/√D)."""
    return lambda q, k, v: _FlashRounding.apply(q, k, v, causal, scale)
