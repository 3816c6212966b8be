"""Launch configurations of v5's two backward kernels, tuned apart: dK/dV and dQ.

The same two steps as the forward's space (:mod:`.configs`), one table per kernel pair:

* :func:`candidates` is the space written down per target, kernel and head-dim class
  (``BLOCK_D`` 64 or 128, :data:`.configs.HEAD_DIMS`). Each config names its kernel
  (``KERNEL``: ``"dkdv"`` or ``"dq"``, a setting of the table, not of the kernel). The
  tiles are the split AMD's and Triton's tutorial backward kernels use: dK/dV keeps a
  wide key block (BLOCK_N) and streams narrow query blocks (BLOCK_M), dQ the other way
  round, so each program's accumulator (dK and dV, or dQ) is the large side (on Hopper
  dK/dV's key block is narrower, :data:`HOPPER_TILES`); on AMD 4 or
  8 warps, one or two stages, ``waves_per_eu`` 1 or 2, and 16x16 MFMAs only
  (``matrix_instr_nonkdim=16``); on sm90 two or three stages.
* :func:`space` is what survives compiling every candidate ahead of time with v5 (its
  kernel of the causal backward at the class's head dim, bf16): a config that spills
  VGPRs or SGPRs, uses scratch or needs more LDS than a workgroup gets is dropped, so it
  is never timed on a GPU. Its 8- and 16-bit LDS ops are recorded, not judged: the
  tuner's clock does. The table ships as ``tuned_space_backward.json`` beside this
  file, written by ``python -m workbench.isa.tune_space --op attention_backward --write``.

:func:`.configs.prune` then keeps, per shape, the few configs worth timing. The
interpreter has one small config per kernel and class, so nothing is timed on a CPU.
"""
from __future__ import annotations

from pathlib import Path

import torch
import triton

from .. import tuning
from .configs import HEAD_DIMS, head_class

KERNELS = ("dkdv", "dq")
TABLE = Path(__file__).with_name("tuned_space_backward.json")

# kernel -> (BLOCK_M, BLOCK_N) tiles, the prior first: (query rows, keys) per step.
TILES = {"dkdv": ((32, 128), (32, 64)), "dq": ((128, 32), (64, 32))}
# Hopper holds dK and dV in at most 255 registers per thread: at D = 128 every dK/dV
# candidate of TILES used scratch on sm90 (the table's first run), so its key blocks are narrower.
HOPPER_TILES = {"dkdv": ((32, 64), (32, 32)), "dq": TILES["dq"]}


def _cfg(kernel, bm, bn, d, warps, stages, **knobs) -> triton.Config:
    return triton.Config(dict(KERNEL=kernel, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, **knobs),
                         num_warps=warps, num_stages=stages)


def hip_candidates() -> list[triton.Config]:
    """MI300X/MI355X: per kernel and tile, the warps, stages and ``waves_per_eu``; 16x16 MFMAs."""
    return [_cfg(kernel, bm, bn, d, warps, stages, waves_per_eu=waves, matrix_instr_nonkdim=16)
            for kernel in KERNELS for d in HEAD_DIMS for bm, bn in TILES[kernel]
            for warps in (4, 8) for stages in (1, 2) for waves in (2, 1)]


def cuda_candidates() -> list[triton.Config]:
    """Hopper: cp.async pipelines of two or three stages."""
    return [_cfg(kernel, bm, bn, d, warps, stages) for kernel in KERNELS for d in HEAD_DIMS
            for bm, bn in HOPPER_TILES[kernel] for warps in (4, 8) for stages in (2, 3)]


def interpreter_configs() -> list[triton.Config]:
    """One small config per kernel and class: the backward launches them untimed."""
    return [_cfg(kernel, 32, 32, d, 4, 1) for kernel in KERNELS for d in HEAD_DIMS]


def candidates(target_name: str) -> list[triton.Config]:
    """The space written down for an ahead-of-time target ("gfx942", "gfx950", "sm90")."""
    return cuda_candidates() if target_name == "sm90" else hip_candidates()


def shipped() -> dict:
    """The ahead-of-time table: per target, the configs kept and dropped, with their resources."""
    return tuning.shipped(TABLE)


def space(backend: str, arch: str, d: int, kernel: str, dtype: torch.dtype | None = None) -> list[triton.Config]:
    """The configs of ``kernel`` at head dim ``d``'s class that the device's target keeps for
    ``dtype`` (:func:`kernels.tuning.section`), in candidate order."""
    pool = tuning.space(TABLE, backend, arch, candidates, interpreter_configs(), dtype)
    return [c for c in pool if c.kwargs["KERNEL"] == kernel and c.kwargs["BLOCK_D"] == head_class(d)]
