"""Measure the expert-parallel MoE layer's chunked pipeline on local gloo ranks.

A notebook cannot hand run_local a function it defines (the ranks import their function
by name), so the run lives here: each rank builds the same seeded layer, takes its
expert-parallel share, runs one warm-up forward and one recorded forward per chunk
count, and returns its events (:mod:`kernels.comm.overlap`) and wall time. The numbers
are measurements of *this* machine's CPUs (gloo over loopback, kernels in the Triton
interpreter wherever there is no GPU): they show how the pipeline behaves, never what a
GPU would do. With ``backend="nccl"`` (``workbench comm``, two GPUs or more) each
rank runs on its own GPU, the time is the median of ``repeats`` synchronized forwards,
the timeline comes from device events on the communication and compute streams, and the
numbers are that GPU node's. Each row says which clock its events came from
(:class:`kernels.comm.overlap.Timeline`).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

import kernels
from kernels.comm.launch import run_local
from kernels.comm.overlap import overlap_efficiency

from ..harness.check import relative_error


def _forward_seconds(layer, x, repeats: int) -> tuple[float, list, torch.Tensor]:
    """Median wall time of ``repeats`` forwards (synchronized on a GPU), the last one's events."""
    times = []
    for _ in range(repeats):
        if x.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = layer(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], layer.events, out


def _rank(rank, world, chunk_counts, tokens, dim, hidden, experts, top_k, seed, repeats):
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    torch.manual_seed(seed)
    full = kernels.MoE(dim, hidden, experts, top_k).to(device)
    x = torch.randn(tokens, dim, generator=torch.Generator().manual_seed(seed + 1 + rank)).to(device)
    runs = {}
    with torch.no_grad():
        for chunks in chunk_counts:
            ep = kernels.MoE.from_full(full, dist.group.WORLD, ep_chunks=chunks)
            ep(x)                                   # warm-up: compiles, the interpreter's first call
            ep.record_events = True
            seconds, events, out = _forward_seconds(ep, x, repeats)
            runs[chunks] = dict(seconds=seconds, events=events, out=out.cpu())
    return runs


def measure(world: int = 2, chunk_counts=(1, 4), tokens: int = 128, dim: int = 64,
            hidden: int = 64, experts: int = 4, top_k: int = 2, seed: int = 0,
            timeout: float = 300.0, backend: str = "gloo", repeats: int = 1) -> list[dict]:
    """One row per chunk count: ``chunks``, ``events`` (every rank's), ``clock`` (``"host"``:
    host timestamps, on gloo; ``"device"``: device events, on a GPU), ``efficiency``
    (overall) and ``efficiency_per_rank``, ``seconds_per_rank`` (the recorded forward's
    wall time) and ``output_difference`` (the largest relative error, over the ranks, of the
    output against the first chunk count's: chunking only regroups rows into other tiles, so
    on a GPU that is 0, and on the CPU within :func:`workbench.harness.tolerances.reassociation_bound`,
    see :mod:`kernels.moe.ep_layer`).
    ``tokens`` is per rank."""
    per_rank = run_local(_rank, world, tuple(chunk_counts), tokens, dim, hidden, experts,
                         top_k, seed, repeats, timeout=timeout, group_timeout=timeout,
                         backend=backend)
    first = chunk_counts[0]
    rows = []
    for chunks in chunk_counts:
        events = [e for runs in per_rank for e in runs[chunks]["events"]]
        rows.append(dict(
            chunks=chunks, events=events, clock=events[0]["clock"],
            efficiency=overlap_efficiency(events),
            efficiency_per_rank=[overlap_efficiency(events, r) for r in range(world)],
            seconds_per_rank=[runs[chunks]["seconds"] for runs in per_rank],
            output_difference=max(relative_error(runs[chunks]["out"], runs[first]["out"].double())[0]
                                  for runs in per_rank)))
    return rows
