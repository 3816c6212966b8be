"""Moving token-slots to the rank that owns their expert and back, for the expert-parallel layer.

Rank r of W owns experts ``[r·E/W, (r+1)·E/W)``. A sender sorts its T·k token-slots by
expert (stable: the order of :func:`kernels.moe.permute`, expert then token then slot),
which also groups them by owner, and sends each owner its block with one
``all_to_all_single``. An owner receives its rows grouped by source rank and reorders
them expert-major, source-minor: for each local expert, source 0's rows, then source
1's, each in (token, slot) order. Since the single-process layer's token t of rank s is
token ``Σ_{s'<s} T_s' + t`` of the concatenated batch, that is exactly the order in
which the single-process layer sorts that expert's rows, so an owner's row tiles hold
the same rows as the single-process layer's tiles.

Everything here moves rows by permutations (no sums), so it is exact in every dtype.

Why not :class:`kernels.comm.EPDispatcher`: the layer needs the payload all-to-all
issued asynchronously (``start`` / ``finish``), to pipeline chunks, and a backward that
recomputes v2's path at the owner, as v3 does, and ships each slot's input row and
output gradient in one all-to-all. The dispatcher's calls are synchronous and
differentiate through the forward's rows (whose SwiGLU is v3's, not v2's, so its weight
gradient would not be the single-process layer's bits), and its ``dedup`` backward sums
per destination rank before the k-sum, another association than the single-process
layer's. The row order is the same as the dispatcher's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Plan:
    """Where one batch's token-slots go: ``slots[i]`` is the slot ``t·k + j`` of sent row i;
    ``send``/``recv`` the row counts per peer; ``order[i]`` the received row (source-major)
    that becomes expert-major row i; ``offsets`` the int32 row ends of the local experts."""
    slots: torch.Tensor
    send: list[int]
    recv: list[int]
    order: torch.Tensor
    offsets: torch.Tensor


def plans(ids_per_chunk: list[torch.Tensor], num_experts: int, group) -> list[Plan]:
    """One :class:`Plan` per chunk of ids ``(T_c, k)``, with one exchange of row counts for all."""
    world = dist.get_world_size(group)
    local = num_experts // world
    sorted_slots, counts = [], []
    for ids in ids_per_chunk:
        experts, slots = torch.sort(ids.reshape(-1).long(), stable=True)
        sorted_slots.append(slots)
        counts.append(torch.bincount(experts, minlength=num_experts))
    chunks = len(ids_per_chunk)
    send = torch.stack(counts).view(chunks, world, local).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)                       # recv[source, chunk, local expert]
    dist.all_to_all_single(recv, send, group=group)
    result = []
    for c, slots in enumerate(sorted_slots):
        blocks = recv[:, c]                                # (source, local expert)
        sources = torch.arange(world, device=blocks.device).repeat_interleave(local)
        experts = torch.arange(local, device=blocks.device).repeat(world)
        key = (experts * world + sources).repeat_interleave(blocks.reshape(-1))
        order = torch.sort(key, stable=True).indices
        offsets = torch.cumsum(blocks.sum(0), 0).to(torch.int32)
        result.append(Plan(slots, send[:, c].sum(1).tolist(), blocks.sum(1).tolist(),
                           order, offsets))
    return result


def start(rows: torch.Tensor, plan: Plan, group, back: bool = False):
    """Issue the all-to-all of ``rows`` (sender order; expert-major owner order when
    ``back``) without waiting: returns (output, work). ``finish`` puts the output in order."""
    if back:
        source_major = torch.empty_like(rows)
        source_major[plan.order] = rows
        rows, out_rows, in_splits, out_splits = source_major, sum(plan.send), plan.recv, plan.send
    else:
        out_rows, in_splits, out_splits = sum(plan.recv), plan.send, plan.recv
    out = rows.new_empty((out_rows, rows.shape[1]))
    work = dist.all_to_all_single(out, rows.contiguous(), out_splits, in_splits, group=group,
                                  async_op=True)
    return out, work


def finish(out: torch.Tensor, plan: Plan, back: bool = False) -> torch.Tensor:
    """The completed output of :func:`start`: expert-major rows at the owner, or, ``back``,
    ``(T·k, cols)`` rows at their slots at the sender."""
    if not back:
        return out[plan.order]
    by_slot = torch.empty_like(out)
    by_slot[plan.slots] = out
    return by_slot


def exchange(rows: torch.Tensor, plan: Plan, group, back: bool = False) -> torch.Tensor:
    """:func:`start` then wait then :func:`finish`."""
    out, work = start(rows, plan, group, back)
    work.wait()
    return finish(out, plan, back)
