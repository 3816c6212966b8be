"""Model FLOPs of a training step and MFU: the arithmetic, not a measurement.

Per token, a training step costs 6 · N_active (forward 2, backward 4 FLOPs per weight
of every matmul the token passes through) plus attention's two matmuls, QKᵀ and PV,
which have no weights: 4 · S · dim FLOPs per token and layer forward without a mask,
half of that with the causal mask, times 3 for forward and backward: 6 · L · S · dim.
N_active counts the matmul weights a token uses: projections, the dense FFNs, the
router, its top-k routed and the shared experts, the LM head; not the embedding
lookup, the norms, or the experts it was not routed to (PaLM's MFU, Chowdhery et al.
2022, appendix B, with the causal half).

With FP8 layers (``workbench train --fp8``) part of those FLOPs run on the FP8 matrix
cores: each FP8 Linear's three GEMMs, 6 · in · out per token, and an FP8 MoE layer's
routed experts (:class:`kernels.moe.fp8_layer.Float8MoE`, and the expert-parallel
:class:`kernels.moe.ep_fp8_layer.Float8ExpertParallelMoE`, whose ranks together run the same
GEMMs over the global batch), 6 · 3 · dim · expert_hidden per token and routed expert, and
per shared expert where those run in FP8 too (``fp8_shared_experts``) (:func:`fp8_step_flops`).
MFU then takes each FLOP at the peak of the unit that runs it (:func:`mfu`).
"""
from __future__ import annotations

import torch

import roofline
from kernels.fp8 import Float8Linear
from kernels.moe.fp8_experts import Float8Experts


def active_params(cfg) -> int:
    """Matmul weights one token passes through (see the module docstring)."""
    kv = cfg.kv_heads * cfg.head_dim
    attention = 2 * cfg.dim * cfg.dim + 2 * cfg.dim * kv
    dense = 3 * cfg.dim * cfg.ffn_hidden
    moe = cfg.dim * cfg.experts + (cfg.top_k + cfg.shared_experts) * 3 * cfg.dim * cfg.expert_hidden
    ffns = sum(moe if cfg.is_moe(i) else dense for i in range(cfg.layers))
    return cfg.layers * attention + ffns + cfg.dim * cfg.vocab


def flops_per_token(cfg) -> int:
    return 6 * active_params(cfg) + 6 * cfg.layers * cfg.seq * cfg.dim


def step_flops(cfg, world: int = 1) -> int:
    """Model FLOPs of one optimizer step over the global batch of ``world`` processes."""
    return flops_per_token(cfg) * cfg.batch * cfg.seq * world


def fp8_step_flops(model: torch.nn.Module, cfg, world: int = 1) -> int:
    """The part of :func:`step_flops` that the FP8 layers run: forward, dgrad and wgrad,
    2 · in · out FLOPs per token each, for each FP8 Linear and each FP8 MoE layer's gate, up
    and down of the top_k experts a token is routed to, and of its shared experts where they run
    in FP8 too (not its router)."""
    weights = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, Float8Linear))
    weights += sum((m.top_k + m.shared_experts * m.fp8_shared_experts) * 3 * m.dim * m.hidden
                   for m in model.modules() if isinstance(m, Float8Experts))
    return 6 * weights * cfg.batch * cfg.seq * world


def mfu(flops: float, seconds: float, gpu, dtype, fp8_flops: float = 0.0) -> float | None:
    """The time the step's model FLOPs need at the GPU's dense peaks, over ``seconds``.

    ``fp8_flops`` of ``flops`` run at the FP8 peak, the rest at ``dtype``'s: MFU is
    ``(fp8_flops / peak_fp8 + (flops - fp8_flops) / peak_dtype) / seconds``, which is
    the usual FLOP/s over peak when all FLOPs share one dtype. None when ``dtype`` itself
    is FP8: the FLOPs outside FP8 layers (attention, the kept layers) are not FP8.
    ``gpu`` is a ``roofline`` spec or name; ``flops`` and ``seconds`` are per GPU.
    """
    name = roofline.dtype_name(dtype)
    if name == "fp8":
        return None
    spec = roofline.spec(gpu)
    ideal_s = fp8_flops / (spec.peak("fp8") * 1e12) + (flops - fp8_flops) / (spec.peak(name) * 1e12)
    return ideal_s / seconds
