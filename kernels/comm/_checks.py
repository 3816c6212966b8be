"""Argument checks shared by the collectives: local ones, and the optional cross-rank one.

A ring built from point-to-point sends trusts every rank to agree on the message sizes.
If they do not, one rank waits for bytes that never come and the job hangs until the
process-group timeout, far from the mistake. Local checks (shapes, dtypes, contiguity,
split sizes) cost nothing and always run. The cross-rank check (``validate=True``, the
default) gathers a few integers per rank with the library's all-gather before the real
work (sizes, dtype, op, and the algorithm and chunk count, since ranks that run
different algorithms also wait for messages that never come), so a mismatch raises the
same ``ValueError`` on every rank instead of hanging. Its cost is one tiny library
collective, i.e. a latency term (about ``(p-1)·alpha`` on a ring), which matters only
for small messages: benchmarks pass ``validate=False``.
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


# What the agreement check can name: every rank holds these tuples alike.
OPS = tuple(_COMBINE)
DTYPES = tuple(sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str))


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


def agree(what, group, extra=(), **fields):
    """Raise the same ``ValueError`` on every rank unless all ranks passed equal ``fields``.

    A field is an int (a size, a count) or ``(value, choices)``: an algorithm name, op
    or dtype from a tuple every rank holds, sent as its index and named in the message.
    One small library all-gather carries them, and the ints of ``extra`` beside them
    (returned as a (world, len(extra)) tensor, for checks that relate ranks, such as
    split sizes), so this works even when the real payloads disagree in size or type.
    """
    names = list(fields)
    table = exchange([*(_code(fields[n]) for n in names), *extra], group)
    differ = [i for i in range(len(names)) if (table[:, i] != table[0, i]).any()]
    if differ:
        said = "; ".join(f"{names[i]}: " + ", ".join(
            f"{_named(fields[names[i]], code)} on rank {r}"
            for r, code in enumerate(table[:, i].tolist())) for i in differ)
        raise ValueError(f"{what}: ranks disagree on {said}")
    return table[:, len(names):]


def _code(field) -> int:
    if not isinstance(field, tuple):
        return int(field)
    value, choices = field
    return next(i for i, known in enumerate(choices) if value == known)


def _named(field, code: int) -> str:
    if not isinstance(field, tuple):
        return str(code)
    value = field[1][code]
    return repr(value) if isinstance(value, str) else str(value)


def exchange(values, group):
    """Every rank's list of ints (same length everywhere), as a (world, len) int64 tensor."""
    world = dist.get_world_size(group)
    mine = torch.tensor(values, dtype=torch.int64)
    everyone = torch.empty(world * len(values), dtype=torch.int64)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(everyone, mine, group=group)
    return everyone.view(world, len(values))
