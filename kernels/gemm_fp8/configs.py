"""Tile configurations for the tuned FP8 GEMM rungs (v1, v2), pruned ahead of time per binary.

The space written down per target (:func:`candidates`) spans 128- and 256-wide tiles in M and N,
K steps of 64 and 128 (an FP8 element is one byte, so a K step of 128 is the bytes of bf16's 64;
on gfx950 a K step of 128 is what selects the 16x16x128 ``f8f6f4`` MFMA), 8 or 4 warps, and
on AMD 2 stages (Triton's AMD pipeliner depth), 16x16 or 32x32 MFMAs (``matrix_instr_nonkdim``)
and ``waves_per_eu`` 0 or 2; Hopper takes 3 stages. GROUP_M is 8 throughout.

The launches run five binaries (:data:`BINARIES`, :func:`binary`): v1's kernel; v2's with
DeepSeek-V3's per-K-block scales on the accumulator (``SCALES_ALONG_K`` True: the blockwise
recipe's GEMMs, ``blockwise_matmul`` with block scales), whose fp32 partial product beside the
accumulator makes it the heaviest in registers, twice, with B's scales per 128 x 128 block (the
forward's and dgrad's) and per 128 x 1 (``GROUP_N`` 1: the weight gradient's, a scale per
column, which on sm90 needs a stack frame even at 128x128x128); and v2's with scales constant along K
(``SCALES_ALONG_K`` False, v1's loop and epilogue: ``kernels.matmul_fp8`` and
``blockwise_matmul`` with such scales) twice, as the rowwise recipe passes them (per row and
column, unit strides Triton folds to constants) and as the tensorwise and delayed recipes do
(one scale each, stride 0, not folded: another epilogue, with other verdicts; on gfx950 a
config the rowwise binary keeps spills in it, on gfx942 one it drops does not). ``python -m workbench.isa.tune_space --op gemm_fp8 --write``
compiles every candidate for gfx942, gfx950 and sm90 at the target's e4m3 format (fnuz on
gfx942, OCP e4m3fn elsewhere) as each binary and keeps, per binary, the configs whose compile of
that binary neither spills nor overflows LDS (nor, on AMD, moves 8/16-bit elements through LDS
where another config does not: ``tuned_space.json`` beside this file, a section
per target split per binary): a launch tunes among its own binary's kept configs, so on sm90,
where the blockwise binaries need a stack frame at every tile wider than 128x128, the other
three still get 128x256 and 256x128 tiles. Candidate order decides each binary's
prior, the untimed choice: on AMD 256x128x128, 8 warps, 16x16 MFMAs, the one config these
rungs ran before they were tuned (gfx942's blockwise weight-gradient binary spills there and
takes the same tile with 4 warps); on Hopper 128x256x128, 8 warps, 3 stages where the binary
keeps it (all but the blockwise binaries), else the first it keeps.

Per shape the bf16 GEMM's prune applies (:func:`kernels.gemm.configs.prune`): at most 16
configs are timed for a key, and its first is the shape's prior. The interpreter has one
small config, so nothing is timed on a CPU.
"""
from __future__ import annotations

from pathlib import Path

import triton

from .. import tuning
from ..gemm.configs import prune

TABLE = Path(__file__).with_name("tuned_space.json")
TILES = ((256, 128), (128, 256), (128, 128), (256, 256))   # the prior's tile first
GROUP_M = 8
BINARIES = ("v1", "v2_blockwise", "v2_rowwise", "v2_tensorwise", "v2_blockwise_128x1")   # the table's parts


def binary(rung: str, scales_along_k: bool = False, unit_strides: bool = True, group_n: int = 128) -> str:
    """The binary a launch of tuned ``rung`` ("v1", "v2") runs. v2's depends on whether its
    scales change along K (``SCALES_ALONG_K``); where they do, on whether B's cover 128 columns
    (``group_n`` 128, 128 x 128 blocks) or one (128 x 1, the blockwise recipe's weight gradient);
    where they do not, on whether A's and B's are read at unit stride along M and N
    (``unit_strides``: per row and column, which Triton folds to constants) or not (per tensor:
    stride 0). v1 has one part whatever its strides."""
    if rung == "v1":
        return "v1"
    if rung == "v2" and scales_along_k:
        return "v2_blockwise" if group_n > 1 else "v2_blockwise_128x1"
    if rung == "v2":
        return "v2_rowwise" if unit_strides else "v2_tensorwise"
    raise ValueError(f"gemm_fp8 tunes rungs v1 and v2, not {rung!r}")


def _cfg(bm, bn, bk, warps, stages, **knobs) -> triton.Config:
    return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, **knobs),
                         num_warps=warps, num_stages=stages)


def hip_candidates() -> list[triton.Config]:
    """gfx942 and gfx950: the same space; the compile tells them apart."""
    return [_cfg(bm, bn, bk, warps, 2, matrix_instr_nonkdim=nonkdim, waves_per_eu=waves)
            for bm, bn in TILES for bk in (128, 64) for warps in (8, 4)
            for nonkdim in (16, 32) for waves in (0, 2)]


def cuda_candidates() -> list[triton.Config]:
    """Hopper: three stages, as the bf16 GEMM's large Hopper tiles; 128x256x128, 8 warps first
    (the widest tile v1 and the binaries with scales constant along K compile without a stack
    frame, tests/test_gemm_fp8_tuning.py; its speed is unmeasured)."""
    return [_cfg(bm, bn, bk, warps, 3) for bm, bn in ((128, 256), (256, 128), (128, 128), (256, 256))
            for bk in (128, 64) for warps in (8, 4)]


def interpreter_configs() -> list[triton.Config]:
    """One small config: each interpreted program costs ~1 ms, and nothing is timed."""
    return [triton.Config(dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=2), num_warps=4, num_stages=1)]


def candidates(target_name: str) -> list[triton.Config]:
    """The space written down for an ahead-of-time target ("gfx942", "gfx950", "sm90")."""
    return cuda_candidates() if target_name == "sm90" else hip_candidates()


def space(backend: str, arch: str, which: str) -> list[triton.Config]:
    """The candidates of the device's target that the shipped table keeps for binary ``which``
    (:data:`BINARIES`), in candidate order (:func:`kernels.tuning.space`; the interpreter: its
    one config)."""
    if which not in BINARIES:
        raise ValueError(f"gemm_fp8 binaries are {BINARIES}, not {which!r}")
    return tuning.space(TABLE, backend, arch, candidates, interpreter_configs(), binary=which)


def prior(backend: str, arch: str, m: int, n: int, k: int, which: str) -> dict:
    """The untimed choice of binary ``which`` for an (m, n, k) GEMM: the first config the
    per-shape prune keeps."""
    return tuning.as_dict(prune(space(backend, arch, which), m, n, k)[0])
