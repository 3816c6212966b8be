"""The dense building blocks: RMSNorm, rotary embedding, GQA attention, SwiGLU.

Written out in plain PyTorch (not ``torch.nn.RMSNorm``) so each is a few lines a
reader can check against the papers, and so the hot matmuls and attention go through
:mod:`.ops`, where the switch between PyTorch and the workbench kernels lives. The norm, the
rotary embedding and the dense SwiGLU name their fused kernel beside the formula it computes
(the ``norm``, ``rope`` and ``swiglu`` choices of :func:`.ops.resolve`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels as _kernels

from . import ops


class RMSNorm(torch.nn.Module):
    """``x / sqrt(mean(x²) + eps) * weight``, computed in fp32 (Zhang & Sennrich 2019);
    ``impl="workbench"``: ``kernels.rms_norm``, the same in one pass."""

    def __init__(self, dim: int, eps: float, impl: str = "torch"):
        super().__init__()
        self.eps, self.impl = eps, impl
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "workbench":
            return _kernels.rms_norm(x, self.weight, self.eps)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


def rope_tables(seq: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (seq, head_dim/2) of position p times frequency theta^(-2i/head_dim)."""
    freqs = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each pair (x[2i], x[2i+1]) of x (B, H, S, D) by its position's angle i.

    The interleaved pairing of RoFormer (Su et al. 2021); computed in fp32, returned in
    x's dtype so attention sees one dtype for q, k and v.
    """
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2).to(x.dtype)


class Attention(torch.nn.Module):
    """Causal self-attention with ``heads`` query heads sharing ``kv_heads`` key/value heads."""

    def __init__(self, cfg, impls: dict[str, str]):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.impl, self.rope = impls["attention"], _kernels.rope if impls["rope"] == "workbench" else apply_rope
        kv = cfg.kv_heads * cfg.head_dim
        self.q = ops.linear(impls["gemm"], cfg.dim, cfg.dim)
        self.k = ops.linear(impls["gemm"], cfg.dim, kv)
        self.v = ops.linear(impls["gemm"], cfg.dim, kv)
        self.o = ops.linear(impls["gemm"], cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        out = ops.attention(self.impl, self.rope(q, cos, sin), self.rope(k, cos, sin), v)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(torch.nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer 2020), the dense FFN: projections by ``impl``,
    the activation by ``act`` (``"workbench"``: ``kernels.moe.swiglu_op.swiglu``, one pass
    each way, rounded once from fp32 where torch rounds ``silu`` and the product apart)."""

    def __init__(self, dim: int, hidden: int, impl: str, act: str = "torch"):
        super().__init__()
        self.gate = ops.linear(impl, dim, hidden)
        self.up = ops.linear(impl, dim, hidden)
        self.down = ops.linear(impl, hidden, dim)
        self.fused = None
        if act == "workbench":   # imported here: Triton loads only for a model that runs it
            from kernels.moe.swiglu_op import swiglu
            self.fused = swiglu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate(x), self.up(x)
        if self.fused is not None:   # the kernel takes (rows, hidden)
            return self.down(self.fused(g.flatten(0, -2), u.flatten(0, -2)).view_as(g))
        return self.down(F.silu(g) * u)
