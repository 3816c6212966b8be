"""The dense building blocks: RMSNorm, rotary embedding, GQA attention, SwiGLU.

Written out in plain PyTorch (not ``torch.nn.RMSNorm``) so each is a few lines a
reader can check against the papers, and so the hot matmuls and attention go through
:mod:`.ops`, where the switch between PyTorch and the workbench kernels lives. The norm, the
rotary embedding and the dense SwiGLU name their fused kernel beside the formula it computes
(the ``norm``, ``rope`` and ``swiglu`` choices of :func:`.ops.resolve`). RoPE's two functions,
``rope_tables`` and ``apply_rope``, live beside their kernel (:mod:`kernels.rotary.reference`), so
that the host-overhead benchmark, below this package, can time the code the kernel replaces.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels as _kernels
from kernels import autocast as _autocast
from kernels.autocast import region_dtype
from kernels.rotary.reference import apply_rope, rope_tables   # RoPE's formula, beside its fused kernel

from . import ops


class RMSNorm(torch.nn.Module):
    """``x / sqrt(mean(x²) + eps) * weight``, computed in fp32 (Zhang & Sennrich 2019);
    ``impl="workbench"``: ``kernels.rms_norm``, the same in one pass, and with the residual add
    before it (:meth:`add`) ``kernels.add_rms_norm``.

    Under autocast the workbench norm writes y in the region's dtype (``out_dtype``), the dtype
    its matmuls cast to: the residual stream is fp32 there, so an fp32 y would be cast to bf16
    again by each GEMM that reads it (q, k and v's one; gate and up's one; the MoE layer's experts;
    the LM head), and autograd would cast each of their bf16 gradients back to fp32 in the
    backward, and the MoE layer, which returns its input's dtype, would return fp32: 13 device ops
    more per step at two blocks, measured (``tests/test_train_host_cost.py`` pins the step's count
    and checks the difference). The MoE router is the exception: it computes in float32
    (:func:`kernels.moe.routing.router_logits`), so it casts the bf16 y up, one cast each way.
    The gradients of the normed activations then add up in bf16 in autograd,
    as in bf16 training stacks, where fp32 y added them in fp32; the norm's own backward still
    computes in fp32 from that bf16 dy. ``kernels.MoE`` returns its input's dtype, so its routed and
    shared experts' outputs now add in bf16 too, before the fp32 residual add.
    ``impl="torch"`` is the eager baseline and keeps x's dtype."""

    def __init__(self, dim: int, eps: float, impl: str = "torch"):
        super().__init__()
        self.eps, self.impl = eps, impl
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.impl == "workbench":
            return _kernels.rms_norm(x, self.weight, self.eps, out_dtype=_out_dtype(x))
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)

    def add(self, x: torch.Tensor, branch: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h, self(h))`` for the residual stream ``h = x + branch`` (``branch`` None: x itself).
        Every residual add of a pre-norm model is followed by a norm of its sum, so the workbench
        side does both in one launch (``kernels.add_rms_norm``; its backward adds h's two
        gradients and casts the branch's in the norm's launch): 11 device ops fewer per step at
        two blocks, measured against torch's add before the norm (``tests/test_train_host_cost.py``):
        the adds forward, and backward the sums of h's two gradients (none for the final norm,
        whose h feeds nothing else) and the casts of the bf16 branches' gradients.
        The torch side runs the same ops as before, ``x + branch`` then the norm."""
        if branch is None:
            return x, self(x)
        if self.impl == "workbench":
            return _kernels.add_rms_norm(x, branch, self.weight, self.eps, out_dtype=_out_dtype(x))
        h = x + branch
        return h, self(h)


def _out_dtype(x: torch.Tensor) -> torch.dtype | None:
    """The workbench norm's y dtype: the autocast region's (see :class:`RMSNorm`), else x's (None)."""
    return region_dtype(x.device.type) if _autocast.active() else None   # one C call outside a region


class Attention(torch.nn.Module):
    """Causal self-attention with ``heads`` query heads sharing ``kv_heads`` key/value heads."""

    def __init__(self, cfg, impls: dict[str, str]):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.impl, self.rope = impls["attention"], _kernels.rope if impls["rope"] == "workbench" else apply_rope
        gemm, kv = impls["gemm"], cfg.kv_heads * cfg.head_dim
        self.q = ops.linear(gemm, cfg.dim, cfg.dim)
        self.k = ops.linear(gemm, cfg.dim, kv)
        self.v = ops.linear(gemm, cfg.dim, kv)
        self.o = ops.linear(gemm, cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = ops.side_by_side((self.q, self.k, self.v), x)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        out = ops.attention(self.impl, self.rope(q, cos, sin), self.rope(k, cos, sin), v)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(torch.nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer 2020), the dense FFN: projections by ``impl``
(gate and up as one GEMM, :func:`.ops.side_by_side`, as q, k and v are in :class:`Attention`),
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
        g, u = ops.side_by_side((self.gate, self.up), x)
        if self.fused is not None:   # the kernel takes (rows, hidden)
            return self.down(self.fused(g.flatten(0, -2), u.flatten(0, -2)).view_as(g))
        return self.down(F.silu(g) * u)
