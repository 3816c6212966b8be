"""Projections of one x as one GEMM over their weights joined side by side.

Fused projections (attention's q, k and v; an MLP's gate and up; Megatron's ``linear_qkv`` and
``linear_fc1``) run this way: x is read (and, in FP8, quantized) once forward, and the backward runs
one dgrad GEMM where separate projections would run one each and add their gradients of x. The
joined weight costs one copy per call; each weight's gradient is a view of the joined one's.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


def joint_gemm(gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor,
               weights: Sequence[torch.Tensor], out_axis: int = 0) -> tuple[torch.Tensor, ...]:
    """``gemm(x, w)`` (``x @ w.T``) for each weight, as one ``gemm`` on the weights joined along
    their output features, its result split back into one output per weight (views).

    ``out_axis``: the axis of the stored weights that holds their output features: 0 for
    ``torch.nn.Linear``'s (N_i, K); 1 for weights kept as (K, N_i) (an MoE layer's shared experts),
    joined as they are stored (one (K, sum N_i)) and handed to ``gemm`` as its transposed view, so
    that the GEMM reads the joined weight in the layout it would read each one."""
    joint = torch.cat(weights, out_axis)
    y = gemm(x, joint if out_axis == 0 else joint.t())
    return y.split([w.shape[out_axis] for w in weights], dim=-1)
