"""Drop-ins for four torch.distributed collectives, each with an ``algorithm=`` rung.

Same names, arguments and semantics as ``torch.distributed`` (``all_reduce`` works in
place; output shapes and split sizes as there), plus:

- ``algorithm``: ``"library"`` calls torch.distributed itself (the ``ref`` rung, what
  every other rung is checked and timed against); ``"ring"`` / ``"ring_chunked"`` are
  built here from isend/irecv (see :mod:`kernels.comm.ring`); all-to-all has
  ``"pairwise"`` and ``"direct"`` (see :mod:`kernels.comm.all_to_all`).
- ``chunks``: pieces per ring segment for ``"ring_chunked"`` (pipelining).
- ``validate``: the cross-rank agreement check of :mod:`kernels.comm._checks` on sizes,
  dtype, op, ``algorithm`` and chunk count (on by default: one tiny extra collective, so
  a mismatch raises on every rank instead of hanging).

Only the synchronous form exists (no ``async_op``): the rungs are for study and timing.
"""

import math

import torch.distributed as dist

from . import _checks as check
from .all_to_all import exchange
from .ring import bounds, ring_pass

RING_ALGORITHMS = ("ring", "ring_chunked", "library")
ALL_TO_ALL_ALGORITHMS = ("pairwise", "direct", "library")
DEFAULT_CHUNKS = 4
# torch 2.13 renamed the tensor forms (*_single); the old names warn but still work.
_LIBRARY_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_LIBRARY_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _chunks(algorithm, chunks):
    check.algorithm(algorithm, RING_ALGORITHMS)
    return check.chunks(chunks) if algorithm == "ring_chunked" else 1


def _agree(what, group, dtype, algorithm, pieces, **sizes):
    """The ring collectives' cross-rank check: what ``validate=True`` compares."""
    check.agree(what, group, dtype=(dtype, check.DTYPES), algorithm=(algorithm, RING_ALGORITHMS),
                chunks=pieces, **sizes)


def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, *, algorithm="ring",
               chunks=DEFAULT_CHUNKS, validate=True):
    """Reduce ``tensor`` over all ranks, in place; any numel, including 0 and < p.

    Ring: reduce-scatter then all-gather over p near-equal segments (sizes differ by at
    most one element when numel is not a multiple of p).
    """
    check.tensor("tensor", tensor)
    pieces = _chunks(algorithm, chunks)
    combine = check.combine_fn(op)
    check.reduce_dtype(tensor, op)
    if validate:
        _agree("all_reduce", group, tensor.dtype, algorithm, pieces, numel=tensor.numel(),
               op=(op, check.OPS))
    if algorithm == "library":
        dist.all_reduce(tensor, op=op, group=group)
        return
    p = dist.get_world_size(group)
    flat = tensor.view(-1)
    segments = bounds(flat.numel(), p)
    ring_pass(flat, segments, group, combine=combine, chunks=pieces)
    # the first pass used tags 0 .. (p-1)·pieces - 1; the second starts after them
    ring_pass(flat, segments, group, chunks=pieces, tag_base=(p - 1) * pieces)
    if check.is_avg(op):
        flat.div_(p)


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, *,
                          algorithm="ring", chunks=DEFAULT_CHUNKS, validate=True):
    """Rank r gets block r of the reduction of ``input`` (p blocks of ``output.numel()``)."""
    check.tensor("output", output)
    check.tensor("input", input)
    check.same_dtype(output, input)
    pieces = _chunks(algorithm, chunks)
    combine = check.combine_fn(op)
    check.reduce_dtype(input, op)
    p, m = dist.get_world_size(group), output.numel()
    if input.numel() != p * m:
        raise ValueError(f"input has {input.numel()} elements; reduce_scatter_tensor needs "
                         f"world size x output = {p} x {m}")
    if validate:
        _agree("reduce_scatter_tensor", group, input.dtype, algorithm, pieces, output_numel=m,
               op=(op, check.OPS))
    if algorithm == "library":
        _LIBRARY_REDUCE_SCATTER(output, input, op=op, group=group)
        return
    work = input.reshape(-1).clone()  # the ring accumulates in place; input stays intact
    ring_pass(work, [(i * m, (i + 1) * m) for i in range(p)], group, combine=combine,
              chunks=pieces)
    rank = dist.get_rank(group)
    output.view(-1).copy_(work[rank * m:(rank + 1) * m])
    if check.is_avg(op):
        output.div_(p)


def all_gather_into_tensor(output, input, group=None, *, algorithm="ring",
                           chunks=DEFAULT_CHUNKS, validate=True):
    """Concatenate every rank's ``input`` into ``output`` (p x ``input.numel()`` elements)."""
    check.tensor("output", output)
    check.tensor("input", input)
    check.same_dtype(output, input)
    pieces = _chunks(algorithm, chunks)
    p, m = dist.get_world_size(group), input.numel()
    if output.numel() != p * m:
        raise ValueError(f"output has {output.numel()} elements; all_gather_into_tensor needs "
                         f"world size x input = {p} x {m}")
    if validate:
        _agree("all_gather_into_tensor", group, input.dtype, algorithm, pieces, input_numel=m)
    if algorithm == "library":
        _LIBRARY_ALL_GATHER(output, input, group=group)
        return
    flat, rank = output.view(-1), dist.get_rank(group)
    flat[rank * m:(rank + 1) * m].copy_(input.reshape(-1))
    ring_pass(flat, [(i * m, (i + 1) * m) for i in range(p)], group, chunks=pieces)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, *, algorithm="pairwise", validate=True):
    """Send block j of ``input`` (dim 0, ``input_split_sizes``) to rank j; uneven splits allowed."""
    check.tensor("output", output)
    check.tensor("input", input)
    check.same_dtype(output, input)
    check.algorithm(algorithm, ALL_TO_ALL_ALGORITHMS)
    if input.dim() == 0 or output.dim() == 0:
        raise ValueError("all_to_all_single needs tensors with at least one dimension")
    if output.shape[1:] != input.shape[1:]:
        raise ValueError(f"output rows {tuple(output.shape[1:])} differ from input rows "
                         f"{tuple(input.shape[1:])}")
    p = dist.get_world_size(group)
    ins = check.splits("input_split_sizes", input_split_sizes, input.shape[0], p)
    outs = check.splits("output_split_sizes", output_split_sizes, output.shape[0], p)
    if validate:
        _agree_splits(ins, outs, input, algorithm, group)
    if algorithm == "library":
        dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group)
        return
    exchange(output, input, outs, ins, group, pairwise=algorithm == "pairwise")


def _agree_splits(ins, outs, input, algorithm, group):
    """What rank i sends to rank j must be what j expects from i, with the same row shape."""
    p = len(ins)
    table = check.agree("all_to_all_single", group, [*ins, *outs],
                        dtype=(input.dtype, check.DTYPES), row_numel=math.prod(input.shape[1:]),
                        algorithm=(algorithm, ALL_TO_ALL_ALGORITHMS))
    sent, expected = table[:, :p], table[:, p:]
    if (sent != expected.T).any():
        raise ValueError("all_to_all_single: ranks disagree on split sizes (rank i's input split j "
                         "must be rank j's output split i): input splits per rank "
                         f"{sent.tolist()}, output splits per rank {expected.tolist()}")
