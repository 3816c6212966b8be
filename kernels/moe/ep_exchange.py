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

The plan (:func:`plans`) costs one all-to-all of the per-expert row counts, ``(W, C, E/W)``
int64 with equal splits, for all C chunks of a forward at once. Everything else about
the plan (which rows go where, the owner's order, its grouped GEMM offsets) is index
arithmetic on the device. What the payload exchange then needs decides the host syncs:

- Dropless (``capacity=None``): ``all_to_all_single`` takes its split sizes as host
  integers, so a variable-size exchange must read the row counts on the host. The plan
  reads them once per forward, for every chunk and both directions, in one
  ``.tolist()`` (:func:`_host_splits`, the only host read in this module; DeepEP's normal
  mode does the same in its notify step). The backward reuses them.
- Fixed capacity (``capacity=n``): each sender reserves ``n`` rows per destination rank
  per chunk, so every all-to-all has equal splits and nothing is read on the host
  (DeepEP's low-latency mode). Rows past the reserved ``n`` are dropped: a sender keeps,
  per destination, the first ``n`` of its slots in expert order and a dropped slot
  contributes zero to its token's output and gets zero gradient (Switch Transformer's
  capacity dropping). The owner computes only the valid rows: the padding sorts after
  them and the grouped GEMMs take device offsets whose last end is the valid count.
  :attr:`Plan.dropped` counts the dropped slots on the device.

Everything here moves rows by permutations (no sums), so it is exact in every dtype.

Why not :class:`kernels.comm.EPDispatcher`: the layer needs the payload all-to-all
issued asynchronously (``start`` / ``finish``), to pipeline chunks, and a plan without
host reads. The dispatcher's calls are synchronous, agree on a header through a host
all-gather, and differentiate through the experts' forward by autograd, call by call,
so with chunks an expert's weight gradient would be a sum of per-chunk grouped GEMMs,
not the single-process layer's one over all its rows; its ``dedup`` backward sums per
destination rank before the k-sum, another association than the single-process
layer's. The row order is the same as the dispatcher's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .routing import expert_counts


@dataclass
class Plan:
    """Where one chunk's token-slots go and come back.

    Sender: ``send_index[i]`` is the slot ``t·k + j`` of sent row i, or ``T·k`` (no slot:
    a padding row) where the capacity leaves a row empty or the slot was dropped.
    Owner: ``order[i]`` is the received row (source-major) that becomes row i of the
    expert-major rows, padding last; ``keys[i]`` that row's ``expert·W + source``
    (``E/W·W`` or more for padding); ``offsets`` the int32 ends of the local experts'
    valid rows. ``send``/``recv``: rows per peer as host ints (dropless), or None (equal
    splits of ``capacity`` rows). ``dropped``: this chunk's dropped slots, a device int64;
    ``slots``: its T·k.
    """
    send_index: torch.Tensor
    order: torch.Tensor
    keys: torch.Tensor
    offsets: torch.Tensor
    send: list[int] | None
    recv: list[int] | None
    dropped: torch.Tensor
    slots: int

    @property
    def rows(self) -> int:
        """Rows the owner receives (valid and padding)."""
        return self.order.shape[0]


def _host_splits(send: torch.Tensor, recv: torch.Tensor) -> tuple[list, list]:
    """The dropless exchange's one host read: rows to and from each peer, per chunk,
    ``([chunk][peer], [chunk][peer])``."""
    both = torch.stack([send.sum(-1), recv.sum(-1)]).transpose(1, 2)   # (2, C, W)
    send_rows, recv_rows = both.tolist()
    return send_rows, recv_rows


def _sender(ids: torch.Tensor, num_experts: int, world: int, capacity: int | None):
    """(send_index, dropped) of one chunk's ids: the sent rows' slots in (owner, expert,
    token, slot) order, each owner's block cut to ``capacity`` rows and padded to it."""
    flat = ids.reshape(-1).long()
    slots = flat.numel()
    experts, order = torch.sort(flat, stable=True)
    if capacity is None:
        return order, torch.zeros((), dtype=torch.int64, device=ids.device)
    owner = experts // (num_experts // world)
    first = torch.searchsorted(owner, owner)                       # each owner's first sorted row
    position = torch.arange(slots, device=ids.device) - first
    kept = position < capacity
    target = torch.where(kept, owner * capacity + position, world * capacity)
    index = torch.full((world * capacity + 1,), slots, dtype=torch.int64, device=ids.device)
    index.scatter_(0, target, torch.where(kept, order, slots))
    return index[:-1], (~kept).sum()


def _owner(counts: torch.Tensor, starts: torch.Tensor, rows: int):
    """(order, keys, offsets) of an owner's ``rows`` received rows, from ``counts`` (W, E/W),
    the valid rows per (source, local expert), and ``starts`` (W,), each source's first
    received row. Row p of source s's block belongs to the expert whose cumulative count
    first exceeds p; past the block's valid rows that is E/W: padding."""
    world, local = counts.shape
    row = torch.arange(rows, device=counts.device)
    source = torch.searchsorted(starts, row, right=True) - 1
    ends = counts.cumsum(1)[source]                                # (rows, E/W)
    expert = torch.searchsorted(ends, (row - starts[source]).unsqueeze(1), right=True).squeeze(1)
    key = expert * world + source
    order = torch.sort(key, stable=True).indices
    per_expert = torch.zeros(local + 1, dtype=torch.int64, device=counts.device)
    per_expert.scatter_add_(0, expert, torch.ones_like(expert))
    return order, key[order], per_expert[:local].cumsum(0).to(torch.int32)


def plans(ids_per_chunk: list[torch.Tensor], num_experts: int, group,
          capacity: int | None = None) -> list[Plan]:
    """One :class:`Plan` per chunk of ids ``(T_c, k)``, with one all-to-all of row counts
    for all chunks; dropless (``capacity=None``) with one host read, else none."""
    world = dist.get_world_size(group)
    local = num_experts // world
    senders = [_sender(ids, num_experts, world, capacity) for ids in ids_per_chunk]
    counts = torch.stack([expert_counts(ids, num_experts) for ids in ids_per_chunk])
    send = counts.view(len(ids_per_chunk), world, local).transpose(0, 1).contiguous()
    if capacity is not None:   # what arrives: each (chunk, owner) block cut to capacity rows
        ends = send.cumsum(-1).clamp(max=capacity)
        send = torch.cat([ends[..., :1], ends.diff(dim=-1)], dim=-1)
    recv = torch.empty_like(send)                       # recv[source, chunk, local expert]
    dist.all_to_all_single(recv, send, group=group)
    if capacity is None:
        send_rows, recv_rows = _host_splits(send, recv)
    result = []
    for c, (send_index, dropped) in enumerate(senders):
        if capacity is None:
            peers, rows = (send_rows[c], recv_rows[c]), sum(recv_rows[c])
            blocks = recv[:, c].sum(1)
            starts = blocks.cumsum(0) - blocks
        else:
            peers, rows = (None, None), world * capacity
            starts = torch.arange(world, device=recv.device) * capacity
        order, keys, offsets = _owner(recv[:, c], starts, rows)
        result.append(Plan(send_index, order, keys, offsets, *peers, dropped, ids_per_chunk[c].numel()))
    return result


def start(rows: torch.Tensor, plan: Plan, group, back: bool = False, per_row: int = 1):
    """Issue the all-to-all without waiting: returns (output, work); ``finish`` puts the
    output in order. ``rows``: at the sender, one row per ``per_row`` slots (x's tokens:
    ``per_row = k``; a gradient per slot: 1); ``back``, the owner's expert-major rows
    (padding included)."""
    if back:
        sent = torch.empty_like(rows)
        sent[plan.order] = rows                            # source-major, as received
        out_rows, in_splits, out_splits = plan.send_index.shape[0], plan.recv, plan.send
    else:
        padded = torch.cat([rows, rows.new_zeros((1, rows.shape[1]))])   # the padding's row
        sent = padded[plan.send_index // per_row]
        out_rows, in_splits, out_splits = plan.rows, plan.send, plan.recv
    out = rows.new_empty((out_rows, rows.shape[1]))
    work = dist.all_to_all_single(out, sent, out_splits, in_splits, group=group, async_op=True)
    return out, work


def finish(out: torch.Tensor, plan: Plan, back: bool = False) -> torch.Tensor:
    """The completed output of :func:`start`: expert-major rows at the owner, or, ``back``,
    ``(T·k, cols)`` rows at their slots at the sender (zero for a dropped slot)."""
    if not back:
        return out[plan.order]
    by_slot = out.new_zeros((plan.slots + 1, out.shape[1]))
    by_slot[plan.send_index] = out
    return by_slot[:-1]
