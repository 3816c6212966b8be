"""Where an expert-parallel dispatch sends rows, and how many bytes that costs.

Expert parallelism splits the E experts of an MoE layer contiguously over W ranks: rank
r owns experts ``[r·E/W, (r+1)·E/W)``. A token routed to k experts must reach every rank
that owns one of them. A naive dispatch sends one row per (token, expert) pair; a token
whose experts share a rank then crosses the wire several times with identical content.
A deduplicating dispatch sends one row per (token, destination rank) and lets the
receiver copy it to each local expert: DeepEP's normal kernels do that; its low-latency
kernels send one slot per (token, expert), as the naive count does.
:func:`dispatch_layout` counts both from the routing alone, with no process group, so
notebooks and cost models can price a routing (DeepSeek-V3: 256 experts, top-8, 8
ranks) before any rank exists.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _checks as check

# One float32 scale per row travels with kernels.comm's fp8 payload (DeepEP's fp8: one per 128 channels).
FP8_SCALE_BYTES = 4


@dataclass(frozen=True, eq=False)
class EPLayout:
    """The counts of one rank's routing ``topk_ids`` (T, K) over W ranks.

    All counts include the rows whose destination is the sending rank itself: on a GPU
    those stay local (a copy, not a network transfer), so a caller pricing the network
    alone subtracts ``rows_per_rank[own rank]`` (naive) or ``tokens_per_rank[own rank]``
    (dedup).
    """

    num_experts: int
    world_size: int
    tokens_per_rank: torch.Tensor   # (W,) int64: tokens with >= 1 expert on rank r
    tokens_per_expert: torch.Tensor  # (E,) int64: (token, k) slots routed to expert e
    rows_per_rank: torch.Tensor     # (W,) int64: (token, k) slots whose expert is on rank r
    is_token_in_rank: torch.Tensor  # (T, W) bool
    rows_naive: int                 # (token, expert) pairs, own rank included: T·K
    rows_dedup: int                 # (token, rank) pairs, own rank included

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.world_size

    def bytes(self, dim: int, dtype: torch.dtype, fp8: bool = False) -> dict[str, int]:
        """Payload bytes of the dispatch: ``dict(naive=, dedup=, saved=naive - dedup)``.

        A row is ``dim`` elements of ``dtype``, or with ``fp8`` one byte per element plus
        a float32 scale. Routing metadata (ids, weights) is not counted: it is K numbers
        per row against ``dim`` (thousands), and both dispatches need it.
        """
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ValueError(f"dim must be a non-negative int, got {dim!r}")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(dtype).__name__}")
        row = dim + FP8_SCALE_BYTES if fp8 else dim * dtype.itemsize
        naive, dedup = self.rows_naive * row, self.rows_dedup * row
        return dict(naive=naive, dedup=dedup, saved=naive - dedup)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def expert_split(num_experts, world_size) -> int:
    """Experts per rank; refuses a split that would leave ranks with unequal shares."""
    _positive_int("num_experts", num_experts)
    _positive_int("world_size", world_size)
    if num_experts % world_size:
        raise ValueError(f"num_experts ({num_experts}) must divide by world_size ({world_size}): "
                         "experts are split contiguously and evenly over the ranks")
    return num_experts // world_size


def checked_ids(topk_ids, num_experts, values: bool = True) -> torch.Tensor:
    """``topk_ids`` (T, K) of int32/int64 in [0, num_experts); -1 (DeepEP's "no expert") is refused.
    The range needs the values on the host (one read of the min and max); ``values=False``
    leaves it to the caller (:func:`check_id_range`), which may fold it into a read of its own."""
    check.tensor("topk_ids", topk_ids, contiguous=False)
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be 2-D (tokens, top_k), got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if values and topk_ids.numel():
        check_id_range(*torch.stack([topk_ids.min(), topk_ids.max()]).tolist(), num_experts)
    return topk_ids


def check_id_range(low: int, high: int, num_experts: int) -> None:
    """Refuse ids from ``low`` to ``high`` unless they lie in [0, num_experts)."""
    if low < 0 or high >= num_experts:
        raise ValueError(f"topk_ids must lie in [0, {num_experts}); found values from "
                         f"{low} to {high} (masked slots such as -1 are not supported)")


def device_counts(ids: torch.Tensor, num_experts: int, world_size: int) -> dict[str, torch.Tensor]:
    """:class:`EPLayout`'s tensors for int64 ``ids`` (T, K) in range, computed on their device
    with no host read (a scatter, where ``bincount`` sizes its output from the values)."""
    flat = ids.reshape(-1)
    tokens_per_expert = torch.zeros(num_experts, dtype=torch.int64, device=ids.device)
    tokens_per_expert.scatter_add_(0, flat, torch.ones_like(flat))
    in_rank = torch.zeros(ids.shape[0], world_size, dtype=torch.bool, device=ids.device)
    in_rank.scatter_(1, ids // (num_experts // world_size), True)
    return dict(tokens_per_rank=in_rank.sum(dim=0), tokens_per_expert=tokens_per_expert,
                rows_per_rank=tokens_per_expert.view(world_size, -1).sum(dim=1),
                is_token_in_rank=in_rank)


def dispatch_layout(topk_ids: torch.Tensor, num_experts: int, world_size: int) -> EPLayout:
    """Count the rows a dispatch of ``topk_ids`` (T, K) sends to each of ``world_size`` ranks."""
    expert_split(num_experts, world_size)
    ids = checked_ids(topk_ids, num_experts).long()
    counts = device_counts(ids, num_experts, world_size)
    return EPLayout(num_experts=num_experts, world_size=world_size, **counts,
                    rows_naive=ids.numel(), rows_dedup=int(counts["tokens_per_rank"].sum()))
