"""The ring: one driver for the reduce-scatter pass and the all-gather pass.

Why a ring: the p ranks form a cycle and at every step each rank sends one segment
(1/p of the message) to its right neighbour while receiving one from its left. A
reduce-scatter takes p-1 steps, an all-gather another p-1, so an all-reduce of n bytes
moves 2(p-1)/p · n bytes out of every rank. That is the lower bound for all-reduce
(every rank must send, and receive, all but its own 1/p share twice), so the ring is
bandwidth-optimal; its price is latency, 2(p-1) sequential steps where a tree needs
about 2·log2(p).

Pipelining (``chunks > 1``): each segment is cut into ``chunks`` pieces. A piece is
forwarded as soon as it has been received and combined, so the combine of piece k
overlaps the transfer of piece k+1, and the next step starts before the whole segment
has arrived. More pieces mean more messages (more per-message latency) for more overlap.

Reduction order (deterministic): segment j is accumulated starting at rank j+1 and going
around the ring, ``((x[j+1] + x[j+2]) + ...) + x[j]``, always as ``received op local``
in the tensor's own dtype. The library may sum in another order, so results agree with
it to floating-point tolerance, not bit for bit.
"""

import torch.distributed as dist


def bounds(numel, parts):
    """(start, stop) of ``parts`` near-equal segments; the first ``numel % parts`` get one more."""
    base, extra = divmod(numel, parts)
    edges = [0]
    for i in range(parts):
        edges.append(edges[-1] + base + (i < extra))
    return list(zip(edges[:-1], edges[1:]))


def _pieces(segment, chunks):
    """Non-empty sub-ranges of ``segment`` for pipelining (an empty segment has none)."""
    start, stop = segment
    # exercise begin: pieces
    return [(start + a, start + b) for a, b in bounds(stop - start, chunks) if b > a]
    # exercise end


def _peer(group, rank):
    return rank if group is None else dist.get_global_rank(group, rank)


def ring_pass(buf, segments, group, combine=None, chunks=1, tag_base=0):
    """One pass of p-1 steps over the flat tensor ``buf`` cut into ``segments``.

    ``combine=None`` is the all-gather pass: rank r starts owning segment r and ends with
    every segment. With a ``combine`` function it is the reduce-scatter pass: rank r ends
    with segment r combined over all ranks (other segments hold partial results).
    """
    p, rank = dist.get_world_size(group), dist.get_rank(group)
    if p == 1:
        return
    # exercise begin: ring
    left, right = _peer(group, (rank - 1) % p), _peer(group, (rank + 1) % p)
    shift = 0 if combine is None else 1

    def segment(step):
        """The segment this rank sends at ``step``: the one it received at step - 1."""
        return segments[(rank - step - shift) % p]
    # exercise end

    scratch = None if combine is None else buf.new_empty(max(b - a for a, b in segments))
    sends = []

    def send(piece, step, k):
        tag = tag_base + step * chunks + k
        sends.append(dist.isend(buf[piece[0]:piece[1]], right, group=group, tag=tag))

    for k, piece in enumerate(_pieces(segment(0), chunks)):
        send(piece, 0, k)
    for step in range(p - 1):
        incoming = segment(step + 1)
        posted = []
        for k, (a, b) in enumerate(_pieces(incoming, chunks)):
            target = buf[a:b] if combine is None else scratch[a - incoming[0]:b - incoming[0]]
            work = dist.irecv(target, left, group=group, tag=tag_base + step * chunks + k)
            posted.append(((a, b), k, target, work))
        for piece, k, target, work in posted:
            work.wait()
            # exercise begin: combine
            if combine is not None:
                local = buf[piece[0]:piece[1]]
                combine(target, local, out=local)
            # exercise end
            if step + 1 < p - 1:
                send(piece, step + 1, k)
    for work in sends:
        work.wait()
