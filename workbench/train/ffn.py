"""The MoE feed-forward, and the one factory that picks its implementation.

``moe_ffn(cfg, "torch")`` is :class:`TorchMoE`, plain PyTorch; ``moe_ffn(cfg,
"workbench")`` is ``kernels.MoE`` with the same parameters. Everything else in the
model asks this factory, so the MoE op is chosen in exactly one place.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels
from kernels import autocast
from kernels.moe.reference import MoEReference, swiglu



def grouped_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of x times their expert's w: the ``grouped_gemm`` op's PyTorch baselines.

    Eager: its ``ref``, ``torch._grouped_mm`` where torch takes the operands, else a loop
    of matmuls. Under ``torch.compile``: ``torch._grouped_mm`` itself for bf16 operands (a
    training step's, under autocast), as compiled MoE code calls it; for other dtypes the loop
    (``v0``), because dynamo cannot trace ``ref``'s try-and-fall-back (the op's fake tensors
    take bf16 only, where eager CPU takes float32 too). ``ref`` would also validate the offsets
    on the host, and the loop reads them: each a graph break and a sync per GEMM. Not run on a
    GPU yet: where a ROCm torch's ``_grouped_mm`` refuses bf16 (eager ``ref`` falls back to the
    loop then), the compiled baseline raises torch's error instead.
    """
    if not torch.compiler.is_compiling():
        return kernels.get("grouped_gemm", "ref")(x, w, offsets)
    if x.dtype == w.dtype == torch.bfloat16:
        return torch._grouped_mm(x, w, offs=offsets)
    return kernels.get("grouped_gemm", "v0")(x, w, offsets)


class TorchMoE(MoEReference):
    """Top-k routed SwiGLU experts plus always-on shared experts, in plain PyTorch.

    The parameters (and their init) are :class:`kernels.moe.MoEReference`'s, so a state
    dict moves between this and ``kernels.MoE`` as it is: ``router.weight`` (E, dim),
    ``gate`` and ``up`` (E, dim, hidden), ``down`` (E, hidden, dim), and the shared
    experts as one SwiGLU over their concatenated hidden units (``shared_gate``,
    ``shared_up``, ``shared_down``). Only the compute differs from the reference's
    per-expert loop: the experts run as grouped GEMMs over the tokens sorted by expert
    (:func:`grouped_matmul`), what PyTorch MoE code does today. The router's logits are
    float32 under autocast too (``MoEReference.router_logits``), as ``kernels.MoE``'s
    and Megatron's fp32 router: both sides of the step's comparison route with the same math.

    After each call, ``aux_loss`` is the Switch Transformer load-balancing loss
    (:func:`kernels.moe.aux_loss`: 1 for perfectly even routing) and ``expert_counts``
    the routed slots per expert.
    """

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int, shared_experts: int = 0):
        super().__init__(dim, hidden, num_experts, top_k, shared_experts)
        self.aux_loss = self.expert_counts = None
        # the baselines' package imported now: its lazy import in a forward that dynamo traces
        # (kernels.get's first call) breaks the compiled baseline's graph there for good
        kernels.variants("grouped_gemm")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.router_logits(tokens)   # float32 under autocast too, as kernels.MoE's
        weights, experts = F.softmax(logits, dim=-1).topk(self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        slots = experts.flatten()
        order = slots.argsort(stable=True)       # slots sorted by expert
        # counts of a static shape: bincount's depends on the ids, a graph break under torch.compile
        counts = slots.new_zeros(self.num_experts).scatter_add_(0, slots, torch.ones_like(slots))
        offsets = counts.cumsum(0).to(torch.int32)
        rows = tokens[order // self.top_k]
        gate, up, down = autocast.operands(self.gate, self.up, self.down)
        rows, = autocast.operands(rows)
        hidden = F.silu(grouped_matmul(rows, gate, offsets)) * grouped_matmul(rows, up, offsets)
        out_rows = grouped_matmul(hidden, down, offsets) * weights.flatten()[order, None].to(rows.dtype)
        out = out_rows.new_zeros(tokens.shape).index_add(0, order // self.top_k, out_rows)
        if self.shared_experts:
            out = out + swiglu(tokens, self.shared_gate, self.shared_up, self.shared_down)
        self.aux_loss = kernels.moe.aux_loss(logits, experts)
        self.expert_counts = counts.detach()
        return out.reshape(x.shape[:-1] + (-1,))


def moe_ffn(cfg, impl: str) -> torch.nn.Module:
    """The MoE FFN of one layer: ``TorchMoE`` for "torch", ``kernels.MoE`` for "workbench"."""
    args = (cfg.dim, cfg.expert_hidden, cfg.experts, cfg.top_k)
    cls = kernels.MoE if impl == "workbench" else TorchMoE
    return cls(*args, shared_experts=cfg.shared_experts)
