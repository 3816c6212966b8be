"""Auxiliary-loss-free load balancing (DeepSeek-V3, arXiv:2412.19437, section 2.1.2).

Instead of a loss whose gradient pulls the router toward balance (and away from what the
language loss wants), each expert carries a bias that :func:`kernels.moe.route` adds to the
scores it selects by, never to the weights. After each step the bias moves a fixed step
gamma against the expert's load error: down by gamma if the expert took more than the mean
load, up by gamma if less (the paper's "bias update speed"; 0.001 for most of DeepSeek-V3's
pre-training). The bias is not trained by gradient; it is state, like a BatchNorm
statistic, and the step size bounds how fast it can chase a shifting routing.
"""
from __future__ import annotations

import math

import torch

from .. import validate


def update_bias(bias: torch.Tensor, counts: torch.Tensor, gamma: float) -> torch.Tensor:
    """``bias + gamma · sign(mean(counts) - counts)``: a new bias, the inputs untouched.

    ``counts`` ``(E,)`` are the step's token-slots per expert
    (:func:`kernels.moe.expert_counts`, summed over the data-parallel ranks in training);
    an expert exactly at the mean keeps its bias.
    """
    validate.tensor("bias", bias, ndim=1, dtypes=(torch.float32, torch.float64), allow_empty=True)
    validate.tensor("counts", counts, ndim=1, allow_empty=True)
    if counts.shape != bias.shape:
        raise ValueError(f"counts has {counts.shape[0]} experts but bias has {bias.shape[0]}")
    validate.same_device(bias=bias, counts=counts)
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not gamma >= 0 \
            or math.isinf(gamma):
        raise ValueError(f"gamma must be a finite number >= 0, got {gamma!r}")
    load = counts.to(torch.float64)
    return bias + gamma * torch.sign(load.mean() - load).to(bias.dtype)
