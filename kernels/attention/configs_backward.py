"""Launch configurations of v5's two backward kernels, tuned apart: dK/dV and dQ.

The same two steps as the forward's space (:mod:`.configs`), one table per kernel pair:

* :func:`candidates` is the space written down per target, kernel and head-dim class
  (``BLOCK_D`` 64 or 128, :data:`.configs.HEAD_DIMS`). Each config names its kernel
  (``KERNEL``: ``"dkdv"`` or ``"dq"``, a setting of the table, not of the kernel). The
  tiles are the split AMD's and Triton's tutorial backward kernels use: dK/dV keeps a
  wide key block (BLOCK_N) and streams narrow query blocks (BLOCK_M), dQ the other way
  round, so each program's accumulator (dK and dV, or dQ) is the large side (on Hopper
  dK/dV's tiles differ, :data:`HOPPER_TILES`); on AMD 4 or 8 warps per tile
  and 2 on two tiles (:data:`HIP_TILES`: a square 32 x 32 one for dK/dV), one or two
  stages, ``waves_per_eu`` 1 or 2, and 16x16 MFMAs only (``matrix_instr_nonkdim=16``);
  on sm90 two or three stages.
* :func:`space` is what survives compiling every candidate ahead of time with v5 (its
  kernel of the causal backward at the class's head dim, bf16): a config that spills
  VGPRs or SGPRs, uses scratch or needs more LDS than a workgroup gets is dropped, so it
  is never timed on a GPU; so is one with 8- or 16-bit LDS ops where its kernel and head
  dim have a config without any (``workbench.isa.tune_space.clean_lds``). The kept configs
  come in the table's order, the prior first: no spills, then on AMD no narrow LDS ops and
  more waves/SIMD first, on sm90 ``wgmma`` products before ``mma.sync`` ones
  (``workbench.isa.tune_space.prior_first``). The table ships as
  ``tuned_space_backward.json`` beside this file, written by
  ``python -m workbench.isa.tune_space --op attention_backward --write``.

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

# AMD: kernel -> ((BLOCK_M, BLOCK_N), warp counts), in candidate order; (query rows, keys) per
# step. An operand that a product takes along its other dimension (dK/dV's Q and dO, BLOCK_M
# rows; dQ's K, BLOCK_N rows) is transposed in registers on its way into LDS only where each
# thread loads two or more of its rows (the TTGIR's ``in_thread_transpose``); with one (32 x 64
# on 4 or 8 warps: under 16 elements a thread) it crosses LDS an element at a time: 8-256
# ``ds_read_u16``/``ds_write_b16`` per kernel in each D = 64 compile of the 4- and 8-warp
# tiles on gfx942, and in the one-stage ones on gfx950 (2026-12-04). The 2-warp tiles give
# each thread two rows: at D = 64 their one-stage compiles on gfx942 have no such op and no
# spill (the table records every compile's count; the priors are proved clean by
# tests/test_attention_isa.py); their two-stage ones still have some.
HIP_TILES = {"dkdv": (((32, 128), (4, 8)), ((32, 64), (4, 8)), ((32, 32), (2,))),
             "dq": (((128, 32), (4, 8)), ((64, 32), (4, 8, 2)))}
# Hopper holds dK and dV in at most 255 registers per thread: at D = 128 every dK/dV
# candidate of the AMD tiles used scratch on sm90 (the table's first run), so its tiles are
# others. A 32-key block has no 64-row warpgroup shape and compiles to Ampere's mma.sync. The
# 16 x 128 tile on 8 warps (a warpgroup per 64 keys) multiplies with wgmma and, with 3 stages,
# compiles clean at D = 128, dense and packed (the table records each compile; with 2 stages
# the packed one uses scratch); the 32 x 64 tile uses scratch at D = 128 and is clean at D = 64.
HOPPER_TILES = {"dkdv": ((32, 64), (32, 32), (16, 128)), "dq": tuple(tile for tile, _ in HIP_TILES["dq"])}


def _cfg(kernel, bm, bn, d, warps, stages, **knobs) -> triton.Config:
    return triton.Config(dict(KERNEL=kernel, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, **knobs),
                         num_warps=warps, num_stages=stages)


def hip_candidates() -> list[triton.Config]:
    """MI300X/MI355X: per kernel and tile, the warps, stages and ``waves_per_eu``; 16x16 MFMAs."""
    return [_cfg(kernel, bm, bn, d, warps, stages, waves_per_eu=waves, matrix_instr_nonkdim=16)
            for kernel in KERNELS for d in HEAD_DIMS for (bm, bn), warp_counts in HIP_TILES[kernel]
            for warps in warp_counts for stages in (1, 2) for waves in (2, 1)]


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
    ``dtype`` (:func:`kernels.tuning.section`), in the table section's order (each group's
    prior first, ``tune_space.prior_first``)."""
    pool = tuning.space(TABLE, backend, arch, candidates, interpreter_configs(), dtype)
    return [c for c in pool if c.kwargs["KERNEL"] == kernel and c.kwargs["BLOCK_D"] == head_class(d)]
