"""Data parallelism under ``torchrun``: FSDP2 (``fully_shard``), or DDP where it is missing.

Started by ``torchrun --nproc-per-node N``, each process reads its rank from the
environment torchrun sets and joins the group: NCCL (RCCL on ROCm) on GPUs, gloo on
the CPU, so the same code is tested with two CPU processes. A single process (no
``WORLD_SIZE`` or 1) is left alone.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:   # torch < 2.6: FSDP2 is not public; data parallel falls back to DDP
    fully_shard = None

PARALLEL = ("fsdp", "ddp")


def setup(gpu: bool) -> tuple[int, int, torch.device]:
    """Join the process group when started by torchrun: (rank, world size, this process's device)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if gpu else "gloo")
    return (dist.get_rank() if world > 1 else 0), world, device


def wrap(model: torch.nn.Module, world: int, how: str | None = None) -> torch.nn.Module:
    """Shard each block and then the rest with FSDP2 (``how="ddp"``, or no FSDP2: DDP).

    DDP without its buffer broadcast, which would send rank 0's buffers to every rank before
    each forward: the model's buffers are the RoPE tables, the same on every rank, and FP8
    delayed scaling's amax histories, which :mod:`kernels.fp8.amax_sync` reduces (MAX) itself
    in the forward's pre-hook, after DDP's broadcast had already replaced the other ranks'
    amaxes with rank 0's (``tests/test_fp8_training.py``, the two-rank test under DDP)."""
    if world == 1:
        return model
    how = how or ("fsdp" if fully_shard is not None else "ddp")
    if how not in PARALLEL:
        raise ValueError(f"parallel must be one of {PARALLEL}, got {how!r}")
    if how == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    if fully_shard is None:
        raise RuntimeError(f"FSDP2 (torch.distributed.fsdp.fully_shard) is not in torch {torch.__version__}")
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def mean(value: torch.Tensor, world: int) -> torch.Tensor:
    """The mean of a tensor over all processes, elementwise (gloo has no AVG, so SUM / world)."""
    if world == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total)
    return total / world
