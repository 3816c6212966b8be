"""The FP8 GEMM table's verdicts, compiled with e4m3 operands, hold for a gradient's e5m2 as A.

``kernels/gemm_fp8/tuned_space.json`` compiles every part at the target's e4m3 format (fnuz on
gfx942, OCP e4m3fn elsewhere), but under ``grad_format="hybrid"`` (the per-tensor recipes'
default, any recipe's through ``convert(..., grad_format=)``) a backward GEMM reads dy in e5m2
of that family as A. The parts those GEMMs run are recorded from real ``fp8_linear`` calls;
each one's first and last kept configs and its first dropped one, compiled with A in e5m2, have
on gfx942, gfx950 and sm90 the very resources the table stores for e4m3 (every figure a verdict
or the prior reads: VGPRs, AGPRs, VGPR and SGPR spills, scratch, LDS bytes, 8/16-bit LDS ops,
occupancy), so one table serves both formats (the rule in :mod:`kernels.gemm_fp8.configs`'
docstring). Every kept config of those parts and each part's first dropped one was compiled so
once (2026-12-05, all equal); the suite checks each part's prior on every target and its
last kept and first dropped configs on one target in turn (all three on all three targets took a
CPU minute of CI).
"""
from __future__ import annotations

import pytest
import torch

from kernels import tuning
from kernels.fp8.recipe import RECIPES
from kernels.gemm_fp8 import configs
from kernels.gemm_fp8.formats import E5M2_OF, fp8_dtype
from workbench import isa
from workbench.isa import tune_space

from fp8_recipe_launches import recipe_launches
from table_sections import TARGETS

ARCHS = {"gfx942": "gfx942", "gfx950": "gfx950", "sm90": "sm_90"}
# the parts a backward GEMM with dy as A runs (dgrad dy @ w, wgrad dy.T @ x) under some recipe
HYBRID = {"v2_tensorwise:NN", "v2_tensorwise:TN", "v2_rowwise:NT", "v2_blockwise:NN", "v2_blockwise_128x1:NT"}


def test_the_hybrid_gradients_run_these_parts():
    """dy in e5m2 is A of the per-tensor recipes' dgrad (NN) and wgrad (TN), of the rowwise
    recipe's transposed copies (NT) and of the blockwise recipe's dgrad (NN) and wgrad (128 x 1,
    NT); never B, and never a forward's part."""
    ran = set().union(*(recipe_launches(name, "hybrid") for name in RECIPES if "hybrid" in RECIPES[name].grad_formats))
    assert {configs.part(binary, layout) for binary, layout, a, _ in ran if "e5m2" in a} == HYBRID
    assert not [launched for launched in ran if "e5m2" in launched[3]]


def _entries(target: str, part: str) -> list[dict]:
    """The part's first kept config (its prior), and on one target in turn (by the part's place in
    sorted order) its last kept config and first dropped one: the edge of the kept list."""
    section = tuning.shipped(configs.TABLE)[target][part]
    if TARGETS[sorted(HYBRID).index(part) % len(TARGETS)] != target:
        return section["kept"][:1]
    return section["kept"][:1] + section["kept"][1:][-1:] + section["dropped"][:1]


def _e5m2(target: str) -> torch.dtype:
    return E5M2_OF[fp8_dtype(ARCHS[target])]


def test_the_e5m2_compile_reads_a_in_e5m2():
    """``"a_dtype"`` reaches the compile: its matrix instruction takes A in e5m2 (gfx942 names
    src0, B's tile, first: ``fp8_bf8``; gfx950's f8f6f4 MFMA marks its src1, A's, as bf8 with
    ``blgp:1``; sm90's wgmma names A's format first)."""
    for target in TARGETS:
        overrides = {"binary": "v2_tensorwise", "layout": "NN", "a_dtype": _e5m2(target)}
        report = isa.inspect("gemm_fp8", "v2", target, overrides=overrides)
        names = " ".join(report.matrix_instructions)
        assert {"gfx942": "fp8_bf8", "gfx950": "f8f6f4", "sm90": "e5m2.e4m3"}[target] in names, names
        assert ("blgp:1" in report.asm) == (target == "gfx950")


@pytest.mark.slow
@pytest.mark.parametrize("part", sorted(HYBRID))
@pytest.mark.parametrize("target", TARGETS)
def test_e5m2_a_compiles_to_the_resources_the_table_stores_for_e4m3(target, part):
    name, layout = configs.PARTS[part]
    for entry in _entries(target, part):
        overrides = {**entry["config"], "binary": name, "layout": layout, "a_dtype": _e5m2(target)}
        assert tune_space.measure("gemm_fp8", target, overrides, None, "v2") == entry[part], entry["config"]
