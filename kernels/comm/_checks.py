"""Argument checks shared by the collectives: local ones, and the optional cross-rank one.

A ring built from point-to-point sends trusts every rank to agree on the message sizes.
If they do not, one rank waits for bytes that never come and the job hangs until the
process-group timeout, far from the mistake. Local checks (shapes, dtypes, contiguity,
split sizes) cost nothing and always run. The cross-rank check (``validate=True``, the
default) gathers a few integers per rank with the library's all-gather
before the real work, so a mismatch raises the same ``ValueError`` on every rank instead
of hanging. Its cost is one tiny library collective, i.e. a latency term (about
``(p-1)·alpha`` on a ring), which matters only for small messages: benchmarks pass
``validate=False``.
"""

import zlib

import torch
import torch.distributed as dist

# Ops the ring can apply elementwise; AVG is SUM followed by one division by p.
_COMBINE = {
    dist.ReduceOp.SUM: torch.add,
    dist.ReduceOp.AVG: torch.add,
    dist.ReduceOp.PRODUCT: torch.mul,
    dist.ReduceOp.MAX: torch.maximum,
    dist.ReduceOp.MIN: torch.minimum,
}


def combine_fn(op):
    """The elementwise function for ``op``; other ops are refused by name."""
    for known, fn in _COMBINE.items():
        if op == known:
            return fn
    raise ValueError(f"reduce op {op} is not supported by the ring (SUM, AVG, PRODUCT, MAX, MIN)")


def op_code(op) -> int:
    """A small int naming ``op`` the same way on every rank (for the agreement check)."""
    return next((i for i, known in enumerate(_COMBINE) if op == known), -1)


def is_avg(op) -> bool:
    return op == dist.ReduceOp.AVG


def tensor(name, value, contiguous=True):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if contiguous and not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous (point-to-point sends read flat memory)")
    return value


def same_dtype(output, input):
    if output.dtype != input.dtype:
        raise TypeError(f"output dtype {output.dtype} differs from input dtype {input.dtype}")


def reduce_dtype(tensor_, op):
    if is_avg(op) and not tensor_.is_floating_point():
        raise TypeError(f"AVG needs a floating-point tensor, got {tensor_.dtype}")


def algorithm(name, known):
    if name not in known:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(known)}")


def chunks(value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"chunks must be a positive int, got {value!r}")
    return value


def splits(name, sizes, rows, world):
    """Split sizes along dim 0: ``None`` means equal parts, which ``rows`` must allow."""
    if sizes is None:
        if rows % world:
            raise ValueError(f"{name} is None, so dim 0 ({rows}) must divide by the world size {world}")
        return [rows // world] * world
    sizes = [int(s) for s in sizes]
    if len(sizes) != world:
        raise ValueError(f"{name} has {len(sizes)} entries for a world of {world}")
    if any(s < 0 for s in sizes):
        raise ValueError(f"{name} has a negative size: {sizes}")
    if sum(sizes) != rows:
        raise ValueError(f"{name} sums to {sum(sizes)} but dim 0 has {rows} rows")
    return sizes


def dtype_code(dtype) -> int:
    return zlib.crc32(str(dtype).encode())


def agree(what, values, dtype, group):
    """Raise on every rank unless all ranks passed the same ``values`` and ``dtype``.

    ``values`` is a list of ints (sizes, op code); one small library all-gather carries
    them, so this works even when the real payloads disagree in size or type.
    """
    gathered = exchange([dtype_code(dtype), *values], group)
    rows = [tuple(r) for r in gathered.tolist()]
    if len(set(rows)) > 1:
        raise ValueError(f"{what}: ranks disagree on (dtype code, sizes...): {rows}")


def exchange(values, group):
    """Every rank's list of ints (same length everywhere), as a (world, len) int64 tensor."""
    world = dist.get_world_size(group)
    mine = torch.tensor(values, dtype=torch.int64)
    everyone = torch.empty(world * len(values), dtype=torch.int64)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(everyone, mine, group=group)
    return everyone.view(world, len(values))
