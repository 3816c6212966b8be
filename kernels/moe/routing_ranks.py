"""Load per expert-parallel rank: what the slowest rank of an all-to-all waits for.

With experts spread over W ranks, every rank computes the slots of its own experts, and the
combine all-to-all finishes when the busiest rank does. So the step pays max over ranks,
not the mean: max/mean is the EP imbalance (1 is perfect, W is every slot on one rank). A
placement groups experts on ranks; :func:`kernels.MoE` with ``ep_group`` uses the
contiguous one (rank r holds experts [r·E/W, (r+1)·E/W)). Grouping hot experts with cold
ones lowers the max, but never below the hottest expert's count: DeepSeek's EPLB
(github.com/deepseek-ai/EPLB) also replicates hot experts (not done here).
"""
from __future__ import annotations

import torch

from .. import validate


def contiguous_placement(num_experts: int, world: int) -> torch.Tensor:
    """The rank of each expert under the EP layer's split, int64 ``(num_experts,)``."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 1 \
            or not isinstance(num_experts, int) or num_experts % world:
        raise ValueError(f"num_experts={num_experts} must be divisible by world={world} >= 1")
    return torch.arange(num_experts) // (num_experts // world)


def greedy_placement(counts: torch.Tensor, world: int) -> torch.Tensor:
    """Experts on ranks, E/W each, heaviest first onto the least loaded rank with room.

    The longest-processing-time rule (Graham, 1969) under an equal expert count per rank,
    so each rank still holds the same weights' bytes. Ties go to the lowest expert id and
    the lowest rank, so the placement is deterministic.
    """
    validate.tensor("counts", counts, ndim=1, dtypes=(torch.int32, torch.int64))
    per_rank = contiguous_placement(counts.shape[0], world).bincount()[0].item()
    host = counts.cpu()
    load, room = [0] * world, [per_rank] * world
    placement = [0] * counts.shape[0]
    for expert in torch.sort(host, descending=True, stable=True).indices.tolist():
        rank = min((r for r in range(world) if room[r]), key=lambda r: load[r])
        placement[expert] = rank
        load[rank] += int(host[expert])
        room[rank] -= 1
    return torch.tensor(placement, dtype=torch.int64)


def rank_loads(counts: torch.Tensor, placement: torch.Tensor, world: int) -> torch.Tensor:
    """Token-slots per rank, int64 ``(world,)``: each expert's count summed onto its rank."""
    validate.tensor("counts", counts, ndim=1, dtypes=(torch.int32, torch.int64), allow_empty=True)
    validate.tensor("placement", placement, ndim=1, dtypes=(torch.int32, torch.int64),
                    allow_empty=True)
    if placement.shape != counts.shape:
        raise ValueError(f"placement has {placement.shape[0]} experts but counts has "
                         f"{counts.shape[0]}")
    if placement.numel() and not (0 <= int(placement.min()) and int(placement.max()) < world):
        raise ValueError(f"placement must hold ranks in [0, {world})")
    return torch.zeros(world, dtype=torch.int64, device=counts.device).scatter_add_(
        0, placement.to(counts.device).long(), counts.long())
