"""Time kernels.comm rungs on local gloo ranks and fit the alpha-beta model to them.

These are CPU numbers: gloo over 127.0.0.1 on this machine's cores, useful for checking
the model's shape (does time grow as steps·alpha + volume·beta?) and for comparing the
rungs with the library, never as GPU performance. Every row says ``backend: gloo/CPU``.
With ``backend="nccl"`` the same rungs run one rank per GPU (``workbench comm --backend nccl``)
and the rows say ``nccl/GPU``.
Per size: one warm-up call, then ``repeats`` calls each started after a barrier; a row's
time is the median over calls of the slowest rank.
"""

import statistics
import time

import torch
import torch.distributed as dist

from . import collectives
from .cost_model import cost, fit
from .launch import run_local

BACKEND = "gloo/CPU"
# The model algorithm that each rung implements.
MODEL_ALGORITHM = {"ring": "ring", "ring_chunked": "ring", "pairwise": "pairwise",
                   "direct": "direct"}


def _call(collective, algorithm, p, numel):
    """A zero-argument function that runs one call on fresh fp32 buffers of ``numel``."""
    x = torch.randn(numel)
    kw = dict(algorithm=algorithm, validate=False)
    if collective == "all_reduce":
        return lambda: collectives.all_reduce(x, **kw)
    if collective == "reduce_scatter":
        out = torch.empty(numel // p)
        return lambda: collectives.reduce_scatter_tensor(out, x[:p * (numel // p)], **kw)
    if collective == "all_gather":
        out = torch.empty(p * (numel // p))
        return lambda: collectives.all_gather_into_tensor(out, x[:numel // p], **kw)
    out = torch.empty(p * (numel // p))
    return lambda: collectives.all_to_all_single(out, x[:p * (numel // p)], **kw)


def _time_all(rank, world, pairs, sizes, repeats, on_gpu=False):
    """times[pair][size][repeat] on this rank, for every (collective, algorithm) pair.

    ``on_gpu``: buffers on this rank's GPU, and the device drained before and after each
    call (NCCL/RCCL calls return before their kernels finish).
    """
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    if on_gpu:   # this process serves one rank: _call's buffers go to its GPU
        torch.set_default_device(f"cuda:{rank}")
    times = []
    for collective, algorithm in pairs:
        per_size = []
        for nbytes in sizes:
            run = _call(collective, algorithm, world, nbytes // 4)
            run()
            calls = []
            for _ in range(repeats):
                dist.barrier()
                sync()
                start = time.perf_counter()
                run()
                sync()
                calls.append(time.perf_counter() - start)
            per_size.append(calls)
        times.append(per_size)
    return times


def measure(pairs, world, sizes, repeats=5, timeout=120.0, backend="gloo"):
    """Rows ``{collective, algorithm, world, bytes, seconds, backend}`` per pair and size.

    ``pairs`` lists (collective, algorithm); all of them run in one launch of ``world``
    ranks, since starting the ranks costs more than timing a few sizes. ``backend``:
    ``"gloo"`` (CPU processes) or ``"nccl"`` (rank r on GPU r; NCCL, or RCCL on ROCm).
    """
    pairs, sizes = [tuple(p) for p in pairs], list(sizes)
    per_rank = run_local(_time_all, world, pairs, sizes, repeats, backend == "nccl",
                         timeout=timeout, backend=backend)
    label = BACKEND if backend == "gloo" else f"{backend}/GPU"
    rows = []
    for j, (collective, algorithm) in enumerate(pairs):
        for i, nbytes in enumerate(sizes):
            slowest = [max(rank[j][i][r] for rank in per_rank) for r in range(repeats)]
            rows.append(dict(collective=collective, algorithm=algorithm, world=world,
                             bytes=nbytes, seconds=statistics.median(slowest), backend=label))
    return rows


def fit_rows(rows):
    """Fit alpha and beta to measured rows of rungs the model knows (not ``library``)."""
    modelled = [r for r in rows if r["algorithm"] in MODEL_ALGORITHM]
    costs = [cost(r["collective"], MODEL_ALGORITHM[r["algorithm"]], r["world"], r["bytes"])
             for r in modelled]
    return fit(costs, [r["seconds"] for r in modelled])
