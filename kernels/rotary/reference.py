"""The rotary embedding in plain PyTorch: the training model's (``workbench.train.layers``) and
what :func:`kernels.rope` computes in one launch. No Triton here: the model imports it whatever
its kernels."""
from __future__ import annotations

import torch


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
