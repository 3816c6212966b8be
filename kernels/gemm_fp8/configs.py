"""Tile configurations for the tuned FP8 GEMM rungs (v1, v2), pruned ahead of time per binary
and operand layout.

The space written down per target (:func:`candidates`) spans 128- and 256-wide tiles in M and N,
K steps of 64 and 128 (an FP8 element is one byte, so a K step of 128 is the bytes of bf16's 64;
on gfx950 a K step of 128 is what selects the 16x16x128 ``f8f6f4`` MFMA), 8 or 4 warps, and
on AMD 2 stages (Triton's AMD pipeliner depth), 16x16 or 32x32 MFMAs (``matrix_instr_nonkdim``)
and ``waves_per_eu`` 0 or 2; Hopper takes 3 stages. GROUP_M is 8 throughout.

The launches run five binaries, one table names each with what selects it (:data:`BINARIES`,
:class:`Binary`, :func:`binary`): v1's kernel; v2's with
DeepSeek-V3's per-K-block scales on the accumulator (``SCALES_ALONG_K`` True: the blockwise
recipe's GEMMs, ``blockwise_matmul`` with block scales), whose fp32 partial product beside the
accumulator makes it the heaviest in registers, twice, with B's scales per 128 x 128 block (the
forward's and dgrad's) and per 128 x 1 (``GROUP_N`` 1: the weight gradient's, a scale per
column, which on sm90 needs a stack frame even at 128x128x128); and v2's with scales constant along K
(``SCALES_ALONG_K`` False, v1's loop and epilogue: ``kernels.matmul_fp8`` and
``blockwise_matmul`` with such scales) twice, as the rowwise recipe passes them (per row and
column, unit strides Triton folds to constants) and as the tensorwise and delayed recipes do
(one scale each, stride 0, not folded: another epilogue, with other verdicts; on gfx950 a
config the rowwise binary keeps spills in it, on gfx942 one it drops does not).

Each binary is compiled at every operand layout its recipes' GEMMs run (:attr:`Binary.layouts`,
:data:`PARTS`; ``tests/test_gemm_fp8_tuning.py`` records them from real ``fp8_linear`` calls):
K-contiguous A and B ("NT", :func:`kernels.gemm.spec.layout`'s letters) for every forward and
the rowwise recipe's whole backward (its transposed copies), the per-tensor recipes' dgrad
("NN": B = w8) and wgrad ("TN": A = dy8.t()), the blockwise recipe's dgrad ("NN": B = w8, its
128 x 128 scales read along N); v1 (no recipe's) and the rowwise binary also at plain calls'
"NN" (row-major operands: the harness's default inputs, ``make_inputs``' layout "row", which its
checks and benchmark run, and ``kernels.matmul_fp8`` of a row-major b) and "TN" (A
transposed; with NT's B, the harness's "col" operands, TT). ``python -m
workbench.isa.tune_space --op gemm_fp8 --write`` compiles every candidate for gfx942, gfx950 and
sm90 at the target's e4m3 format (fnuz on gfx942, OCP e4m3fn elsewhere) as each binary at each
of its layouts and keeps, per binary and layout, the configs whose compile neither spills nor
overflows LDS (nor, on AMD, moves 8/16-bit elements through LDS where another config does not:
``tuned_space.json`` beside this file, a section per target split per ``binary:layout``,
:func:`part`): a launch tunes among what its own binary keeps at its own layout (the tuning
key holds both). Per layout, not one verdict for all layouts as the bf16 GEMM's table: a config
that fails only at a backward layout is never timed there and still is in the forward, whose
kept configs and prior (the ISA page's config) another layout's verdicts do not shrink. Of
the configs the NT compile keeps, on gfx942 7 of 40 spill in the blockwise dgrad's NN, 5 of 53
in the per-tensor dgrad's NN and 4 of 53 in its wgrad's TN, 4 and 3 of 52 in v1's and the
rowwise binary's NN and TN (which keep 16 and 10), and more move bytes one at a time through
LDS there; on gfx950 3 and 2 of 54 in the per-tensor NN and TN, 4 and 2 of 55 in v1's and the
rowwise NN and TN (51 and 53 kept), none in the blockwise NN; on sm90 each layout keeps what NT
keeps. A layout a binary was not compiled at tunes among the configs every layout it was
compiled at keeps (:func:`space`): for v1, the rowwise and the per-tensor binaries that is TT,
whose A lies as in TN and B as in NT. On sm90, where the blockwise binaries need a
stack frame at every tile wider than 128x128, the other three still get 128x256 and 256x128
tiles. Candidate order decides each part's prior, the untimed choice and the config an ISA
compile of the binary at that layout runs (:func:`.launch.aot_config`): on AMD 256x128x128, 8 warps, 16x16 MFMAs, the one config these rungs ran before they were tuned (on gfx942 the
blockwise weight-gradient binary spills there and every NN and TN part drops it: they take
the same tile with 4 warps, the blockwise NN with 32x32 MFMAs); on
Hopper 128x256x128, 8 warps, 3 stages where the part keeps it (all but the blockwise
binaries'), else the first it keeps.

Every part is compiled with e4m3 operands, one table for both formats a backward GEMM's A
takes: under ``grad_format="hybrid"`` (the per-tensor recipes' default, any recipe's through
``convert(..., grad_format=)``) dy is A in e5m2 of the same family, in the per-tensor NN and TN
parts, the rowwise NT part (its backward) and the blockwise NN and 128 x 1 NT parts, never B.
Compiled with A in e5m2, each config those parts keep and their first dropped one has the e4m3
compile's every figure a verdict or the prior reads (VGPRs, AGPRs, VGPR and SGPR spills, scratch,
LDS bytes, 8/16-bit LDS ops, occupancy) on gfx942, gfx950 and sm90 (compiled once, 2026-12-05;
``tests/test_gemm_fp8_formats.py`` records those parts from real calls and checks each part's
first and last kept configs and first dropped one). The rule: a
table compiled at one format stands for another only while that test holds for every part the
other runs; where a figure differs, the parts that format runs are compiled at it and a launch
tunes among their verdicts.

Per shape the bf16 GEMM's prune applies (:func:`kernels.gemm.configs.prune`): at most 16
configs are timed for a key, and its first is the shape's prior. The interpreter has one
small config, so nothing is timed on a CPU.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import triton

from .. import tuning
from ..gemm.configs import prune
from .operands import SCALE_K

TABLE = Path(__file__).with_name("tuned_space.json")
TILES = ((256, 128), (128, 256), (128, 128), (256, 256))   # the prior's tile first
GROUP_M = 8


class Binary(NamedTuple):
    """A binary the tuned rungs launch, named in :data:`BINARIES` by what selects it: its rung,
    and for v2 its scales, as A's and B's elements per scale along their (rows, columns), 0 for
    a whole dimension (one scale along it). They give v2's constexprs (:attr:`along_k`,
    :attr:`group_n`) and where the scales are constant along K whether their strides along M
    and N are 1 (:attr:`unit_strides`); the ahead-of-time compile passes such scales
    (:func:`.launch.scale_strides`)."""

    rung: str                         # "v1" or "v2"
    scales_a: tuple[int, int]         # A (M, K): (1, 0) per row, (1, 128) per 1 x 128, (0, 0) per tensor
    scales_b: tuple[int, int]         # B (K, N): (0, 1) per column, (128, 128), (128, 1), (0, 0) per tensor
    layouts: tuple[str, ...] = ("NT",)   # the operand layouts its launches run, compiled each ("NT" first: the ISA page's)

    @property
    def along_k(self) -> bool:
        """``SCALES_ALONG_K``: the kernel scales each K block in its loop, as its recipe's scales,
        which change every ``SCALE_K`` elements of K, need (a launch's own rule, also for one K
        block: :attr:`kernels.gemm_fp8.operands.BlockScales.along_k`)."""
        return bool(self.scales_a[1] or self.scales_b[0])

    @property
    def group_n(self) -> int:
        """``GROUP_N``: the columns of B one scale covers where B's change along K (128 or 1), else 1."""
        return self.scales_b[1] if self.along_k else 1

    @property
    def unit_strides(self) -> bool:
        """Scales per row of A and per column of B: strides 1 along M and N, which Triton folds."""
        return self.scales_a == (1, 0) and self.scales_b == (0, 1)

    def selects(self, rung: str, along_k: bool, unit_strides: bool, group_n: int) -> bool:
        """Whether a launch of ``rung`` with these scales runs this binary: v1's one whatever its
        scales; v2's by ``SCALES_ALONG_K``, then ``GROUP_N`` where the scales change along K,
        else whether their strides along M and N are 1."""
        if rung != self.rung:
            return False
        if rung == "v1":   # its kernel has no scale constexprs: one binary
            return True
        if along_k != self.along_k:
            return False
        return group_n == self.group_n if along_k else unit_strides == self.unit_strides


ROW, COLUMN, TENSOR, BLOCK = (1, 0), (0, 1), (0, 0), (SCALE_K, SCALE_K)
BINARIES = {   # the table's parts; each v2 binary's scales as its recipe's GEMMs pass them
    "v1": Binary("v1", ROW, COLUMN, ("NT", "NN", "TN")),              # no recipe's: calls' (the harness's NN)
    "v2_blockwise": Binary("v2", (1, SCALE_K), BLOCK, ("NT", "NN")),   # DeepSeek-V3's forward, dgrad (B = w)
    "v2_rowwise": Binary("v2", ROW, COLUMN, ("NT", "NN", "TN")),      # the rowwise recipe's three (NT copies); calls' NN, TN
    "v2_tensorwise": Binary("v2", TENSOR, TENSOR, ("NT", "NN", "TN")),   # tensorwise's, delayed's: views of x8, w8, dy8
    "v2_blockwise_128x1": Binary("v2", (1, SCALE_K), (SCALE_K, 1)),   # the blockwise recipe's wgrad
}
AOT = {"v1": ("v1",), "v2": ("v2_blockwise", "v2_rowwise")}   # the binaries a rung's ISA page compiles, main first


def part(which: str, layout: str) -> str:
    """The name of binary ``which`` at operand layout ``layout``: its verdicts' in the table, and
    the launch a tuner's :class:`kernels.tuning.Problem` names (``kernel``)."""
    return f"{which}:{layout}"


def parts(name: str) -> tuple[str, str]:
    """(binary, layout) of a :func:`part` name; a binary's name alone is its NT launch, the ISA page's."""
    which, _, layout = name.partition(":")
    return which, layout or "NT"


PARTS = {part(name, layout): (name, layout) for name, b in BINARIES.items() for layout in b.layouts}


def binary(rung: str, scales_along_k: bool = False, unit_strides: bool = True, group_n: int = SCALE_K) -> str:
    """The binary a launch of tuned ``rung`` ("v1", "v2") runs (:meth:`Binary.selects`): v2's
    depends on whether its scales change along K (``SCALES_ALONG_K``); where they do, on whether
    B's cover 128 columns (``group_n`` 128, 128 x 128 blocks) or one (128 x 1, the blockwise
    recipe's weight gradient); where they do not, on whether A's and B's are read at unit stride
    along M and N (``unit_strides``: per row and column, which Triton folds to constants) or
    not (per tensor: stride 0). v1 has one part whatever its strides."""
    found = [name for name, b in BINARIES.items() if b.selects(rung, scales_along_k, unit_strides, group_n)]
    if not found:
        raise ValueError(f"gemm_fp8 tunes rungs {' and '.join(AOT)}, not {rung!r}")
    return found[0]


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


def space(backend: str, arch: str, which: str, layout: str = "NT") -> list[triton.Config]:
    """The candidates of the device's target that the shipped table keeps for binary ``which``
    (:data:`BINARIES`) at operand ``layout`` (:func:`kernels.gemm.spec.layout`'s letters), in
    candidate order (:func:`kernels.tuning.space`; the interpreter: its one config). A layout
    the binary was not compiled at takes the configs every layout it was compiled at keeps. For
    v1, the rowwise and the per-tensor binaries (NT, NN, TN) that is TT (the harness's "col"),
    each of whose operands lies as in a compiled layout (A as TN's, B as NT's), and a config
    that fits all of them is the best evidence short of compiling it. The blockwise binaries'
    other layouts (TN, TT; the 128 x 1 one's NN), which no recipe runs, have an operand lying as
    in no compiled layout: there the intersection is a guess."""
    if which not in BINARIES:
        raise ValueError(f"gemm_fp8 binaries are {tuple(BINARIES)}, not {which!r}")
    compiled = BINARIES[which].layouts
    first, *others = [tuning.space(TABLE, backend, arch, candidates, interpreter_configs(), binary=part(which, name))
                      for name in ((layout,) if layout in compiled else compiled)]
    others = [[tuning.as_dict(c) for c in other] for other in others]
    return [c for c in first if all(tuning.as_dict(c) in other for other in others)]


def prior(backend: str, arch: str, m: int, n: int, k: int, which: str, layout: str = "NT") -> dict:
    """The untimed choice of binary ``which`` at operand ``layout`` for an (m, n, k) GEMM: the
    first config the per-shape prune keeps."""
    return tuning.as_dict(prune(space(backend, arch, which, layout), m, n, k)[0])
