"""Tile configurations per backend for the tuned GEMM rungs (v5 autotunes, v6 picks one).

Each backend's space is a function returning a list of :class:`triton.Config`, so the
interpreter never sees GPU tiles and no list lives in commented-out code. The first
config of each GPU space is the prior for a large GEMM (the one the ISA inspector
compiles); the rest cover wide, tall, small and decode (skinny M) shapes.

:func:`prune` drops configs that do not fit the shape before any benchmarking:
tiles much larger than M or N (their work would be mostly masked), and skinny-M
tiles when M is not a decode-sized batch (they reload B for every 16 rows).
"""
from __future__ import annotations

import triton

DECODE_M = 64      # M at or below this is a decode/skinny shape
SKINNY_BLOCK_M = 32  # tiles at or below this many rows are skinny-M configs


def _cfg(bm, bn, bk, warps, stages, group_m=8, **knobs) -> triton.Config:
    return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, **knobs),
                         num_warps=warps, num_stages=stages)


def hip_configs(arch: str = "gfx942") -> list[triton.Config]:
    """MI300X/MI355X: LDS-pipelined (2 stages), 16x16 MFMA unless noted, kpack=2 on gfx942.

    Every entry was AOT-compiled for gfx942 at bf16 without VGPR spills (see v5's docstring).
    """
    amd = dict(matrix_instr_nonkdim=16, kpack=2 if arch == "gfx942" else 1, waves_per_eu=2)
    wide = dict(amd, matrix_instr_nonkdim=32)  # 32x32 MFMA keeps 256x128 spill-free
    # Left out after AOT checks on gfx942: 128x256x64 (spills with either MFMA size),
    # 64x64x128 and 16x128x128 at 4 warps (spill under the 256-VGPR waves_per_eu=2 cap).
    return [
        _cfg(128, 128, 64, 8, 2, **amd),
        _cfg(256, 128, 64, 8, 2, **wide),
        _cfg(128, 64, 64, 4, 2, **amd),
        _cfg(64, 128, 64, 4, 2, **amd),
        _cfg(64, 64, 64, 4, 2, **amd),
        _cfg(32, 128, 64, 4, 2, **amd),
        _cfg(16, 128, 128, 8, 2, group_m=1, **amd),
    ]


def cuda_configs() -> list[triton.Config]:
    """Hopper: deeper cp.async/TMA pipelines (3-4 stages), wgmma-sized tiles."""
    return [
        _cfg(128, 128, 64, 8, 3),
        _cfg(128, 256, 64, 8, 3),
        _cfg(256, 128, 64, 8, 3),
        _cfg(128, 64, 64, 4, 4),
        _cfg(64, 128, 64, 4, 4),
        _cfg(64, 64, 64, 4, 5),
        _cfg(32, 128, 64, 4, 4),
        _cfg(16, 128, 128, 4, 4, group_m=1),
    ]


def interpreter_configs() -> list[triton.Config]:
    """One small config: the autotuner then launches it without benchmarking anything."""
    return [_cfg(32, 32, 32, 4, 2, group_m=2)]


def space(backend: str, arch: str = "gfx942") -> list[triton.Config]:
    if backend == "hip":
        return hip_configs(arch)
    if backend == "cuda":
        return cuda_configs()
    if backend == "interpreter":
        return interpreter_configs()
    raise ValueError(f"no GEMM config space for backend {backend!r}")


def _area(c: triton.Config) -> int:
    return c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"]


def prune(configs: list[triton.Config], m: int, n: int, k: int) -> list[triton.Config]:
    """The configs worth timing for an (m, n, k) GEMM; never empty.

    A tile may be at most the next power of two of its dimension (at least 16), and
    for M > DECODE_M skinny-M tiles go. If nothing survives (say N=1), the smallest
    tile stays. Order is kept, so ``prune(...)[0]`` is the prior for that shape.
    """
    fit = [c for c in configs
           if c.kwargs["BLOCK_M"] <= max(16, triton.next_power_of_2(m))
           and c.kwargs["BLOCK_N"] <= max(16, triton.next_power_of_2(n))]
    if m > DECODE_M:
        fit = [c for c in fit if c.kwargs["BLOCK_M"] > SKINNY_BLOCK_M]
    return fit or [min(configs, key=_area)]


def early_config_prune(configs, named_args, **kwargs):
    """``triton.autotune(prune_configs_by=...)`` hook: the shape comes from the launch."""
    return prune(configs, named_args["M"], named_args["N"], named_args["K"])


def as_dict(c: triton.Config) -> dict:
    """A config as one flat dict (tile constexprs, num_warps, num_stages, AMD knobs)."""
    return {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}


def with_overrides(cfg: dict, overrides: dict | None) -> dict:
    """``cfg`` with some settings replaced; an unknown name is an error, not a no-op."""
    unknown = set(overrides or ()) - set(cfg)
    if unknown:
        raise ValueError(f"config overrides {sorted(unknown)} are not settings of this rung; "
                         f"known: {sorted(cfg)}")
    return {**cfg, **(overrides or {})}
