"""Pairwise and direct exchange for ``all_to_all_single``.

All-to-all has no reduction and no data to forward: every rank owes every other rank
one distinct block, so each byte crosses the network exactly once and no algorithm can
move less than ``(p-1)/p`` of a rank's data. The algorithms differ in scheduling only:

- ``pairwise``: p-1 rounds; in round s rank r sends to r+s and receives from r-s. Each
  rank has one send and one receive in flight, so no link or receiver is oversubscribed,
  at the price of p-1 latencies in sequence.
- ``direct``: post all p-1 sends and receives at once (one-shot). One latency, but every
  rank receives from everyone at the same time, which is good when the fabric is a full
  mesh (8x MI300X with Infinity Fabric, NVSwitch) and contention-prone otherwise.

Empty blocks (split size 0) are not sent at all; both sides know the sizes, so both skip.
"""

import torch.distributed as dist


def _blocks(tensor, sizes):
    edges = [0]
    for s in sizes:
        edges.append(edges[-1] + s)
    return [tensor[a:b] for a, b in zip(edges[:-1], edges[1:])]


def exchange(output, input, out_sizes, in_sizes, group, pairwise):
    """Move block j of ``input`` to rank j, block i of ``output`` from rank i."""
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    send, recv = _blocks(input, in_sizes), _blocks(output, out_sizes)
    recv[rank].copy_(send[rank])
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))

    def post(step):
        """Round ``step``'s receive and send (none for an empty block), not yet waited for."""
        works = []
        # exercise begin: peers
        to, frm = (rank + step) % p, (rank - step) % p
        if recv[frm].numel():
            works.append(dist.irecv(recv[frm], peer(frm), group=group))
        if send[to].numel():
            works.append(dist.isend(send[to], peer(to), group=group))
        # exercise end
        return works

    pending = []
    # exercise begin: schedule
    for step in range(1, p):
        pending += post(step)
        if pairwise:
            for work in pending:
                work.wait()
            pending = []
    for work in pending:
        work.wait()
    # exercise end
