"""Model FLOPs of a training step and MFU: the arithmetic, not a measurement.

Per token, a training step costs 6 · N_active (forward 2, backward 4 FLOPs per weight
of every matmul the token passes through) plus attention's two matmuls, QKᵀ and PV,
which have no weights: 4 · S · dim FLOPs per token and layer forward without a mask,
half of that with the causal mask, times 3 for forward and backward: 6 · L · S · dim.
N_active counts the matmul weights a token uses: projections, the dense FFNs, the
router, its top-k routed and the shared experts, the LM head; not the embedding
lookup, the norms, or the experts it was not routed to (PaLM's MFU, Chowdhery et al.
2022, appendix B, with the causal half).
"""
from __future__ import annotations

import roofline


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


def mfu(flops: float, seconds: float, gpu, dtype) -> float | None:
    """Achieved model FLOP/s over the GPU's dense peak for ``dtype`` (a fraction).

    ``gpu`` is a ``roofline`` spec or name. None for FP8: its peak assumes every matmul
    in FP8, which this model's mixed precision does not do, so the ratio would mislead.
    ``flops`` and ``seconds`` are per GPU (each data-parallel process has its own).
    """
    name = roofline.dtype_name(dtype)
    if name == "fp8":
        return None
    return flops / seconds / 1e12 / roofline.spec(gpu).peak(name)
