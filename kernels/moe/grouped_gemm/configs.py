"""Launch configurations of the grouped GEMM that v4 tunes: its persistent forward (also
the backward's dX) and the dW kernel share one space.

Two steps, one ahead of time and one per shape, as for the GEMM (:mod:`kernels.gemm.configs`):

* :func:`candidates` is the space written down per target: 128x128, 256x128, 128x256,
  256x256, 64x128, 128x64 and 64x64 tiles, 64 deep (the MFMA/wgmma-friendly depth of GEMM
  v4), 4 or 8 warps, and on AMD ``waves_per_eu`` 2 or 0 (no ``amdgpu-waves-per-eu`` attribute) with
  16x16 MFMAs and GEMM v4's ``kpack``; on sm90 three or four cp.async stages. Few
  candidates on purpose: each is compiled three times per target (below).
* :func:`space` is what survives compiling every candidate ahead of time with v4
  for the forward, the dX launch (the forward kernel on wᵀ: the weight's other
  layout) and the dW kernel, at bf16: a config that spills registers, uses scratch
  or needs more LDS / shared memory than a workgroup gets in *any* of the three is
  dropped, so it is never timed on a GPU. One table for the three kernels, not one
  each: the backward runs whatever the forward's space holds. It ships as
  ``tuned_space.json`` beside this file, written by
  ``python -m workbench.isa.tune_space --op grouped_gemm --write``; a test checks that
  it covers exactly :func:`candidates` and recompiles a sample of it.

:func:`prune` then keeps, for one problem, the few configs worth timing. The
interpreter has one small config, so nothing is ever timed on a CPU.
"""
from __future__ import annotations

from pathlib import Path

import torch
import triton

from ... import tuning
from ...gemm.v4_lds_pipeline import amd_options

TILE_SIZES = 4     # tile sizes timed per problem, at most
PER_TILE = 2       # configs timed per tile size, at most
TABLE = Path(__file__).with_name("tuned_space.json")
KERNELS = ("forward", "dx", "dw")   # the compiles of each candidate, v4's aot() order

# (BLOCK_M, BLOCK_N) and the warps tried, the prior first: GEMM v4's tile and warps.
# 256x256 is there to be pruned where it spills (on gfx942 at least with waves_per_eu=2).
TILES = (((128, 128), (8, 4)), ((256, 128), (8,)), ((128, 256), (8,)), ((256, 256), (8,)),
         ((64, 128), (4,)), ((128, 64), (4,)), ((64, 64), (4,)))


def _cfg(bm, bn, bk, warps, stages, **knobs) -> triton.Config:
    return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, **knobs),
                         num_warps=warps, num_stages=stages)


def hip_candidates(arch: str) -> list[triton.Config]:
    """MI300X/MI355X: two stages (Triton's AMD pipeliner), with ``waves_per_eu`` 2 and without."""
    knobs = amd_options(arch)
    return [_cfg(bm, bn, 64, warps, 2, **{**knobs, "waves_per_eu": waves})
            for (bm, bn), all_warps in TILES for warps in all_warps for waves in (2, 0)]


def cuda_candidates() -> list[triton.Config]:
    """Hopper: cp.async pipelines of three stages (four for the smaller tiles)."""
    return [_cfg(bm, bn, 64, warps, 3 if bm * bn > 128 * 64 else 4)
            for (bm, bn), all_warps in TILES for warps in all_warps]


def interpreter_configs() -> list[triton.Config]:
    """One small config (v2's interpreter tile): v4 then launches it without timing anything."""
    return [_cfg(32, 32, 32, 4, 1)]


def candidates(target_name: str) -> list[triton.Config]:
    """The space written down for an ahead-of-time target ("gfx942", "gfx950", "sm90")."""
    return cuda_candidates() if target_name == "sm90" else hip_candidates(target_name)


def space(backend: str, arch: str = "gfx942", dtype: torch.dtype | None = None) -> list[triton.Config]:
    """The candidates the device's target keeps for ``dtype`` in the shipped table
    (:func:`kernels.tuning.space`; float32 has a section of its own)."""
    return tuning.space(TABLE, backend, arch, candidates, interpreter_configs(), dtype)


def prune(configs: list[triton.Config], rows: int, cols: int) -> list[triton.Config]:
    """The configs worth timing for output tiles over ``rows`` x ``cols``: at most
    TILE_SIZES x PER_TILE, never empty.

    ``rows`` is the rows per group on average for the forward (T / G: the offsets are
    not read on the host) and K for dW; ``cols`` is N. A tile may be at most the next
    power of two of each (at least 16); of those the first TILE_SIZES sizes stay with
    their first PER_TILE configs; if none fits, the smallest tile stays. Order is
    kept, so ``prune(...)[0]`` is the prior for that problem.
    """
    fit = [c for c in configs if tuning.fits(c, rows, cols)]
    if not fit:
        return [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
    return tuning.per_tile(fit, list(dict.fromkeys(map(tuning.tile, fit)))[:TILE_SIZES], PER_TILE)
