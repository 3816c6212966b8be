"""The MoE feed-forward, and the one factory that picks its implementation.

``moe_ffn(cfg, "torch")`` is :class:`TorchMoE`, plain PyTorch; ``moe_ffn(cfg,
"workbench")`` is ``kernels.MoE`` with the same parameters. Everything else in the
model asks this factory, so the MoE op is chosen in exactly one place.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import kernels

from . import ops
from .layers import SwiGLU


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of x times their expert's w: the ``grouped_gemm`` op's PyTorch baselines.

    Eager: its ``ref``, ``torch._grouped_mm`` where torch takes the operands, else a loop
    of matmuls. Under ``torch.compile``: the loop (``v0``), because dynamo cannot trace
    ``ref``'s try-and-fall-back (its fake tensors refuse fp32 operands eager CPU takes).
    """
    rung = "v0" if torch.compiler.is_compiling() else "ref"
    return kernels.get("grouped_gemm", rung)(x, w, offsets)


class TorchMoE(torch.nn.Module):
    """Top-k routed SwiGLU experts plus always-on shared experts, in plain PyTorch.

    Routing: a bias-free linear router, softmax over all experts, the top ``top_k``
    probabilities renormalized to sum to one per token. Experts run as grouped GEMMs
    over the tokens sorted by expert (:func:`grouped_matmul`). Parameters:
    ``router.weight`` (E, dim), ``gate`` and ``up`` (E, dim, hidden), ``down``
    (E, hidden, dim); the ``shared_experts`` shared experts are one dense SwiGLU of width ``shared_experts * hidden`` (``shared``).

    After each call, ``aux_loss`` is the Switch Transformer load-balancing loss
    E · Σ_e f_e · P_e (f_e: fraction of routed slots that went to expert e, P_e: mean
    router probability of e), which is 1 for perfectly even routing, and
    ``expert_counts`` the routed slots per expert.
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, shared_experts: int = 0):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.router = torch.nn.Linear(dim, num_experts, bias=False)
        self.gate = torch.nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.up = torch.nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.down = torch.nn.Parameter(torch.empty(num_experts, hidden, dim))
        for w in (self.gate, self.up, self.down):   # nn.Linear's bound: 1/sqrt(fan_in)
            bound = 1 / math.sqrt(w.shape[1])
            torch.nn.init.uniform_(w, -bound, bound)
        self.shared = SwiGLU(dim, shared_experts * hidden, "torch") if shared_experts else None
        self.aux_loss = self.expert_counts = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.router(tokens).float(), dim=-1)
        weights, experts = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        order = experts.flatten().argsort(stable=True)       # slots sorted by expert
        counts = torch.bincount(experts.flatten(), minlength=self.num_experts)
        offsets = counts.cumsum(0).to(torch.int32)
        rows = tokens[order // self.top_k]
        gate, up, down = ops.autocast_operands(self.gate, self.up, self.down)
        rows, = ops.autocast_operands(rows)
        hidden = F.silu(grouped_matmul(rows, gate, offsets)) * grouped_matmul(rows, up, offsets)
        out_rows = grouped_matmul(hidden, down, offsets) * weights.flatten()[order, None].to(rows.dtype)
        out = out_rows.new_zeros(tokens.shape).index_add(0, order // self.top_k, out_rows)
        if self.shared is not None:
            out = out + self.shared(tokens)
        fraction = counts.float() / experts.numel()
        self.aux_loss = self.num_experts * (fraction * probs.mean(0)).sum()
        self.expert_counts = counts.detach()
        return out.reshape(x.shape[:-1] + (-1,))


def moe_ffn(cfg, impl: str) -> torch.nn.Module:
    """The MoE FFN of one layer: ``TorchMoE`` for "torch", ``kernels.MoE`` for "workbench"."""
    args = (cfg.dim, cfg.expert_hidden, cfg.experts, cfg.top_k)
    if impl == "workbench":
        try:
            cls = kernels.MoE
        except AttributeError:
            raise NotImplementedError(
                "kernels.MoE is not in this version of kernels: the workbench MoE op is "
                "missing; run the MoE on PyTorch with kernels={..., 'moe': 'torch'}") from None
        return cls(*args, shared_experts=cfg.shared_experts)
    return TorchMoE(*args, shared_experts=cfg.shared_experts)
