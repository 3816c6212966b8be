"""Attention inputs with large, fp32-exact scores: the ladder's tests and the attention fuzz both need them."""
from __future__ import annotations

import torch

from kernels.attention import spec as attn_spec


def large_score_inputs(shape, largest: float, seed: int = 3):
    """fp32 q, k, v of ``shape`` whose scaled scores reach about ±``largest``, each row's
    sharing one large offset (q's first channel against a constant 64 in k's) plus a spread
    of some units from the other channels, so the softmax is far from one-hot. q and k are
    coarse (multiples of 1/4, small integers in the first channel), so every product and
    partial sum of q·kᵀ is exact in fp32 in any order: no BLAS kernel's rounding enters."""
    q, k, v, _ = attn_spec.make_inputs(shape, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-32, 33, q.shape, generator=gen) / 4.0
    k = torch.randint(-4, 5, k.shape, generator=gen) / 4.0
    reach = max(1, round(largest * q.shape[-1] ** 0.5 / 64))
    q[..., 0] = torch.randint(-reach, reach + 1, q.shape[:-1], generator=gen).float()
    k[..., 0] = 64.0
    return q, k, v
