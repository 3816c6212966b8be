"""Fixed expert capacity: how many token-slots an expert may take, and which slots it drops.

A compiled graph (XLA, a captured CUDA/HIP graph) or a fixed-size all-to-all needs every
expert's buffer sized before the routing is known. Switch Transformers (arXiv:2101.03961,
eq. 3) sizes it as the even share times a capacity factor C; with top-k routing there are
T·k slots, so capacity = ceil(C · T · k / E). Slots past an expert's capacity are dropped:
they skip the expert and the token keeps only its residual path. C = 1 drops every slot
above the mean load; a skewed routing needs C up to E/k (all of some expert's share) to drop
nothing, and the buffers cost C times the dropless work.

Which slots an expert keeps: the first ``capacity`` in token order (a token's k slots go
to k different experts, so within one expert slot order is token order), the order in
which the fixed-capacity exchange of :mod:`.ep_exchange` keeps them. GShard
(arXiv:2006.16668, Algorithm 1) instead fills every token's first choice before any
second choice.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch

from .routing import expert_counts


def expert_capacity(tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """ceil(capacity_factor · tokens · top_k / num_experts), in exact arithmetic.

    ``capacity_factor`` is read as the decimal it prints as, so 1.1 means 11/10: 1.1 times
    100 slots is 110, where float arithmetic gives 110.00000000000001 and a ceiling of 111.
    """
    for name, value, least in (("tokens", tokens, 0), ("top_k", top_k, 1), ("num_experts", num_experts, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) \
            or not capacity_factor > 0 or math.isinf(capacity_factor):
        raise ValueError(f"capacity_factor must be a finite number > 0, got {capacity_factor!r}")
    return math.ceil(Fraction(str(capacity_factor)) * tokens * top_k / num_experts)


def capacity_keep(ids: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Bool ``(T, top_k)``: True where slot (t, j) is within its expert's first ``capacity``
    slots in token order, False where it is dropped (``(~keep).sum()`` counts the drops)."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity must be an int >= 0, got {capacity!r}")
    counts = expert_counts(ids, num_experts)   # checks ids
    flat = ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    first = counts.cumsum(0) - counts           # each expert's first position in `order`
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(flat.numel(), device=flat.device) - first[flat[order]]
    return (rank < capacity).reshape(ids.shape)
