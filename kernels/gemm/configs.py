"""Tile configurations per backend for the tuned GEMM rungs (v5 autotunes, v6 tunes its own).

Two steps, one ahead of time and one per shape:

* :func:`candidates` is the space written down per target: tiles from 256x256 to
  decode-sized 16x128, BLOCK_K 64 for the largest tiles and 32/64/128 for smaller
  ones, GROUP_M 4/8/16 by tile height (1 for decode), 4 or 8 warps, and on AMD
  ``waves_per_eu`` 0 or 2, 16x16 or 32x32 MFMA (256-wide tiles) and kpack 1 or 2
  on gfx942 (gfx950 takes kpack 1 only).
* :func:`space` is what survives compiling every candidate ahead of time with v6's
  kernel (the rung users get) for the three operand layouts a training step runs
  (:data:`LAYOUTS`: "NN", ``a @ b`` of row-major tensors and a Linear's dgrad; "NT",
  ``torch.nn.Linear``'s K-contiguous weight, also with its bias epilogue; "TN", every
  weight gradient, ``x.t() @ grad_y``) at bf16: a config that spills registers (or needs
  more LDS / shared memory than a workgroup gets) in any of them is dropped, so it is
  never timed on a GPU. One table for all layouts, not one each: a config that spills in
  one layout would be a trap in another's bucket. float32 has a section of its own per
  target (``"gfx942:fp32"``, compiled at float32): its tiles need twice the LDS and
  registers, and most configs that fit bf16 spill or cannot launch at all. The table ships as ``tuned_space.json`` beside
  this file, written by ``python -m workbench.isa.tune_space --op gemm --write``; a test checks
  that it covers exactly :func:`candidates` and recompiles a sample of it.

:func:`prune` then keeps, for one (m, n, k), the few configs worth timing.
The interpreter has one small config, so nothing is ever timed on a CPU.
"""
from __future__ import annotations

from pathlib import Path

import torch
import triton

from .. import tuning

DECODE_M = 64      # M at or below this is a decode/skinny shape
SKINNY_BLOCK_M = 32  # tiles at or below this many rows are skinny-M configs
MIN_TILES = 32     # a tile size must give at least this many output tiles (if any does)
TILE_SIZES = 4     # tile sizes timed per shape, at most
PER_TILE = 4       # configs timed per tile size, at most
TABLE = Path(__file__).with_name("tuned_space.json")
LAYOUTS = ("NN", "NT", "TN")   # what a training step runs: dgrad, forward (nn.Linear), wgrad


def _cfg(bm, bn, bk, warps, stages, group_m=8, **knobs) -> triton.Config:
    return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, **knobs),
                         num_warps=warps, num_stages=stages)


def hip_candidates(arch: str = "gfx942") -> list[triton.Config]:
    """MI300X/MI355X: 2 stages, Triton's AMD pipeliner depth (v4)."""
    kpacks = (2, 1) if arch == "gfx942" else (1,)
    out = []
    for bm, bn in ((128, 256), (256, 128), (256, 256)):
        for warps in (8, 4):
            for waves in (2, 0):
                for nonkdim in (16, 32):
                    out.append(_cfg(bm, bn, 64, warps, 2, group_m=4, waves_per_eu=waves,
                                    matrix_instr_nonkdim=nonkdim, kpack=kpacks[0]))
    for bm, bn in ((128, 128), (128, 64), (64, 128)):
        for bk in (64, 128):
            for warps in (8, 4):
                for waves in (2, 0):
                    for kpack in kpacks if (bm, bn) == (128, 128) else kpacks[:1]:
                        out.append(_cfg(bm, bn, bk, warps, 2, waves_per_eu=waves,
                                        matrix_instr_nonkdim=16, kpack=kpack))
    for bk in (32, 64, 128):
        for waves in (2, 0):
            out.append(_cfg(64, 64, bk, 4, 2, group_m=16, waves_per_eu=waves,
                            matrix_instr_nonkdim=16, kpack=kpacks[0]))
    for bm, bn in ((16, 128), (32, 128), (16, 256)):  # decode: B is read once, A is tiny
        for bk in (64, 128):
            for waves in (2, 0):
                out.append(_cfg(bm, bn, bk, 4, 2, group_m=1, waves_per_eu=waves,
                                matrix_instr_nonkdim=16, kpack=kpacks[0]))
    return out


def cuda_candidates() -> list[triton.Config]:
    """Hopper: deeper cp.async/TMA pipelines (3-4 stages), wgmma-sized tiles."""
    return [
        _cfg(128, 256, 64, 8, 3, group_m=4),
        _cfg(256, 128, 64, 8, 3, group_m=4),
        _cfg(128, 256, 64, 4, 3, group_m=4),
        _cfg(256, 128, 64, 4, 3, group_m=4),
        _cfg(128, 128, 64, 8, 3),
        _cfg(128, 128, 64, 4, 4),
        _cfg(128, 128, 32, 4, 4),
        _cfg(128, 64, 64, 4, 4),
        _cfg(64, 128, 64, 4, 4),
        _cfg(64, 64, 64, 4, 4, group_m=16),
        _cfg(64, 64, 128, 4, 3, group_m=16),
        _cfg(32, 128, 64, 4, 4, group_m=1),
        _cfg(16, 128, 128, 4, 4, group_m=1),
        _cfg(16, 256, 128, 4, 3, group_m=1),
    ]


def interpreter_configs() -> list[triton.Config]:
    """One small config: the tuners then launch it without timing anything."""
    return [_cfg(32, 32, 32, 4, 2, group_m=2)]


def target(backend: str, arch: str, dtype: torch.dtype | None = None) -> str:
    """The table section a device reads for ``dtype`` (see :func:`kernels.tuning.target`)."""
    return tuning.target(TABLE, backend, arch, dtype)


def candidates(target_name: str) -> list[triton.Config]:
    """The space written down for an ahead-of-time target ("gfx942", "gfx950", "sm90")."""
    return cuda_candidates() if target_name == "sm90" else hip_candidates(target_name)


def shipped() -> dict:
    """The ahead-of-time table: per target, the configs kept and dropped, with their resources."""
    return tuning.shipped(TABLE)


def space(backend: str, arch: str = "gfx942", dtype: torch.dtype | None = None) -> list[triton.Config]:
    """The candidates of the device's target that the shipped table keeps for operands of
    ``dtype`` (float32 has its own section, :func:`kernels.tuning.section`), in candidate order."""
    if backend == "interpreter":
        return interpreter_configs()
    if backend not in ("hip", "cuda"):
        raise ValueError(f"no GEMM config space for backend {backend!r}")
    return list(tuning.kept_space(TABLE, target(backend, arch, dtype), candidates))


def _area(c: triton.Config) -> int:
    return c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]


def prune(configs: list[triton.Config], m: int, n: int, k: int) -> list[triton.Config]:
    """The configs worth timing for an (m, n, k) GEMM: at most TILE_SIZES x PER_TILE; never empty.

    A tile may be at most the next power of two of its dimension (at least 16); for
    M > DECODE_M skinny-M tiles go, for M <= DECODE_M only they stay (when one fits).
    Tile sizes that give fewer than MIN_TILES output tiles go when another size gives
    enough; of the rest the first TILE_SIZES sizes stay, with their first PER_TILE
    configs. If nothing fits (say N=1), the smallest tile stays. Order is kept, so
    ``prune(...)[0]`` is the prior for that shape.
    """
    fit = [c for c in configs if tuning.fits(c, m, n)]
    skinny = [c for c in fit if c.kwargs["BLOCK_M"] <= SKINNY_BLOCK_M]
    fit = (skinny or fit) if m <= DECODE_M else [c for c in fit if c not in skinny]
    if not fit:
        return [min(configs, key=_area)]
    sizes = list(dict.fromkeys(map(tuning.tile, fit)))
    enough = [(bm, bn) for bm, bn in sizes if -(-m // bm) * -(-n // bn) >= MIN_TILES]
    sizes = (enough or sorted(sizes, key=lambda s: s[0] * s[1]))[:TILE_SIZES]
    return tuning.per_tile(fit, sizes, PER_TILE)


def early_config_prune(configs, named_args, **kwargs):
    """``triton.autotune(prune_configs_by=...)`` hook: the shape comes from the launch."""
    return prune(configs, named_args["M"], named_args["N"], named_args["K"])
