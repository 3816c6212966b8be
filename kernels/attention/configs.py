"""Launch configurations of the attention forward (v3's kernel) that v4 tunes over.

Two steps, one ahead of time and one per shape, as for the GEMM (:mod:`kernels.gemm.configs`):

* :func:`candidates` is the space written down per target and head-dim class
  (``BLOCK_D`` 64: any D <= 64; 128: any larger D): three (BLOCK_M, BLOCK_N) tiles
  per class, 8 or 4 warps, and on AMD one or two stages (2 asks Triton's
  stream pipeliner to load K/V tile i+1 while tile i is multiplied),
  ``waves_per_eu`` 2, 1 or 0 (0: no ``amdgpu-waves-per-eu`` attribute) and 16x16 or
  32x32 MFMAs (``matrix_instr_nonkdim``); on sm90 two or three stages. 16x16 comes first: a
  wave of a 128-row tile split over 8 waves owns 16 rows, which 32x32 MFMAs cover
  only through 16-bit LDS traffic and more registers (``tests/test_attention_isa.py``).
* :func:`space` is what survives compiling every candidate ahead of time with v4
  (the causal forward at its head dim, bf16): a config that spills registers, uses
  scratch or needs more LDS than a workgroup gets is dropped, so it is never timed
  on a GPU; so is one with 8- or 16-bit LDS ops (``narrow_lds_ops``, recorded on AMD) where
  its head dim keeps a config without any (at bf16 89 of gfx942's 144 candidates, among
  them every 8-warp one at D = 64, and 55 of gfx950's; mostly 32x32 MFMAs; 2026-12-04). The
  table ships as ``tuned_space.json`` beside this file, written by
  ``python -m workbench.isa.tune_space --op attention --write``; a test checks that it
  covers exactly :func:`candidates` and recompiles a sample of it.

:func:`prune` then keeps, for one (S, S_k), the few configs worth timing. The
interpreter has one small config per class, so nothing is ever timed on a CPU.
"""
from __future__ import annotations

from pathlib import Path

import torch
import triton

from .. import tuning

HEAD_DIMS = (64, 128)  # the head-dim classes: the BLOCK_D a config is compiled and kept for
TIMED = 8              # configs timed per shape, at most
TABLE = Path(__file__).with_name("tuned_space.json")

# head-dim class -> (BLOCK_M, BLOCK_N) tiles and the warps tried first, the prior first.
# At D = 128 a program holds a 128-wide Q tile and O accumulator: a 64-wide key tile fits
# beside them at 2 waves/SIMD on gfx942 with 8 waves of 16x16 MFMAs.
TILES = {64: ((128, 64), (128, 32), (64, 64)),
         128: ((128, 64), (128, 32), (64, 64))}
WARPS = {64: (4, 8), 128: (8, 4)}


def head_class(d: int) -> int:
    """The head-dim class whose configs a head dim ``d`` runs."""
    return HEAD_DIMS[0] if d <= HEAD_DIMS[0] else HEAD_DIMS[1]


def _cfg(bm, bn, d, warps, stages, **knobs) -> triton.Config:
    return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=d, **knobs),
                         num_warps=warps, num_stages=stages)


def hip_candidates() -> list[triton.Config]:
    """MI300X/MI355X: per tile, the warps, stages, ``waves_per_eu`` and MFMA shapes."""
    return [_cfg(bm, bn, d, warps, stages, waves_per_eu=waves, matrix_instr_nonkdim=nonkdim)
            for d in HEAD_DIMS for bm, bn in TILES[d] for warps in WARPS[d]
            for stages in (2, 1) for waves in (2, 1, 0) for nonkdim in (16, 32)]


def cuda_candidates() -> list[triton.Config]:
    """Hopper: cp.async pipelines of two or three stages."""
    return [_cfg(bm, bn, d, warps, stages) for d in HEAD_DIMS for bm, bn in TILES[d]
            for warps in WARPS[d] for stages in (2, 3)]


def interpreter_configs() -> list[triton.Config]:
    """One small config per class: v4 then launches it without timing anything."""
    return [_cfg(32, 32, d, 4, 1) for d in HEAD_DIMS]


def candidates(target_name: str) -> list[triton.Config]:
    """The space written down for an ahead-of-time target ("gfx942", "gfx950", "sm90")."""
    return cuda_candidates() if target_name == "sm90" else hip_candidates()


def shipped() -> dict:
    """The ahead-of-time table: per target, the configs kept and dropped, with their resources."""
    return tuning.shipped(TABLE)


def space(backend: str, arch: str, d: int, dtype: torch.dtype | None = None) -> list[triton.Config]:
    """The configs of head dim ``d``'s class that the device's target keeps for ``dtype``
    (float32 has a section of its own, :func:`kernels.tuning.section`), in candidate order."""
    if backend == "interpreter":
        pool = interpreter_configs()
    elif backend in ("hip", "cuda"):
        pool = tuning.kept_space(TABLE, tuning.target(TABLE, backend, arch, dtype), candidates)
    else:
        raise ValueError(f"no attention config space for backend {backend!r}")
    return [c for c in pool if c.kwargs["BLOCK_D"] == head_class(d)]


def prune(configs: list[triton.Config], s: int, sk: int) -> list[triton.Config]:
    """The configs worth timing for S queries and S_k keys: at most TIMED, as unlike each
    other as the space allows (:func:`kernels.tuning.distinct`), so the timing compares
    4 and 8 warps, 1 and 2 stages, each ``waves_per_eu`` and MFMA shape and each tile
    rather than near-copies of the prior.

    BLOCK_M may be at most the next power of two of S and BLOCK_N of S_k (at least
    16). If none fits, the smallest tile stays. ``prune(...)[0]`` is the first config
    that fits: the prior for that shape.
    """
    fit = [c for c in configs if tuning.fits(c, s, sk)]
    if not fit:
        return [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]
    return tuning.distinct(fit, TIMED)
