"""RMSNorm's forward and backward kernels (:mod:`kernels.norm.rms_norm_kernels`) as gfx942 and
gfx950 compile them, ahead of time in one fresh subprocess (:mod:`fresh_compiles`), with the
settings a call launches (:func:`~kernels.norm.rms_norm_kernels.settings`, shared by ``aot()``
and the launches; tests/test_aot_matches_calls.py checks the argument classes). Backs what the
module's docstring says of accesses, spills, atomics and waves per SIMD, at N = 1024 (the GPU
presets' model width) and 4096."""
from __future__ import annotations

import pytest

from fresh_compiles import results
from kernels.norm import rms_norm_kernels
from layer_ladder_isa import ARCHS, accesses

WIDTHS = (1024, 4096)
COMPILE = """
import torch
from workbench.isa import compile as isa_compile, parse as isa_parse
from kernels.norm.rms_norm_kernels import aot


def result(job):
    arch, n, backward, x_dtype, w_dtype = job
    kernel = isa_compile.compile_aot(aot(getattr(torch, x_dtype), n, backward, getattr(torch, w_dtype)),
                                     ("hip", arch, 64))
    lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
    loop = {c: dict(v) for c, v in isa_parse.histograms(isa_parse.hot_loop(lines, "amdgcn"), "amdgcn").items() if v}
    return summary(kernel, atomics=sum("atomic" in (isa_parse.mnemonic(line) or "") for line in lines),
                   loop=loop if backward else None)
"""
DTYPE_PAIRS = (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "float32"))
"""x's and the weight's: one dtype; bf16 activations beside an fp32 master weight; the training
step's under autocast (its residual stream stays fp32, so its norms see fp32 x and weight)."""
JOBS = tuple((arch, n, backward, *pair) for arch in ARCHS for n in (*WIDTHS, rms_norm_kernels.MAX_N)
             for backward in (False, True) for pair in DTYPE_PAIRS)


def _compiled(arch, n, backward, pair, waves=rms_norm_kernels.WAVES_PER_SIMD) -> dict:
    kernel = results(COMPILE, JOBS)[arch, n, backward, *pair]
    res = kernel["resources"]
    assert (kernel["atomics"], res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0, 0), kernel
    assert res["occupancy"] == waves, res
    return kernel


ACCESSES = {
    (False, "bfloat16", "bfloat16"): (2, 1, 0, 1, 1),
    (False, "bfloat16", "float32"): (3, 1, 0, 1, 3),
    (False, "float32", "float32"): (2, 1, 0, 1, 1),
    (True, "bfloat16", "bfloat16"): (3, 3, 1, 0, 3),
    (True, "bfloat16", "float32"): (4, 3, 1, 0, 5),
    (True, "float32", "float32"): (3, 2, 1, 0, 1),
}
"""Per (backward, x's dtype, the weight's): 16-byte loads, 16-byte stores, narrower loads and
stores, LDS writes (as many reads). Forward: x, the weight and y 16 bytes a thread (an fp32
weight beside bf16 x in two loads), rstd a 4-byte store. Backward: dy, x and the weight loaded
and dx stored 16 bytes a thread, the program's fp32 partial dweight stored in two (8 fp32 a
thread beside 16-bit x; 4, one store, beside fp32 x), rstd a 4-byte load. LDS: the row's sum
across warps (4 bytes a thread) in both; beside 16-bit x, an fp32 weight's change from its load's
layout (4 a thread) to the tile's (8), two 16-byte writes and reads, and likewise the backward's
partial row to its store's layout."""
LOOP = {"global_load": {"buffer_load_dwordx4": 2, "buffer_load_dword": 1}, "global_store": {"buffer_store_dwordx4": 1},
        "lds_write": {"ds_write_b32": 1}, "lds_read": {"ds_read_b32": 1}}
"""The backward's loop over a program's rows, every dtype pair: dy and x loaded and dx stored 16
bytes a thread, rstd's 4-byte load, the row sum's LDS write and read; the weight's loads and the
partial's LDS and stores are outside it, once per program."""


@pytest.mark.slow   # 36 AOT compiles in a fresh process
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("arch", ARCHS)
def test_rows_move_16_bytes_per_thread(arch, n, backward):
    """:data:`ACCESSES` and, backward, :data:`LOOP`, for every dtype pair; no VGPR or SGPR
    spills, no scratch, no atomics (dweight's sum is the partials' fixed-order add), 8 waves
    per SIMD."""
    for pair in DTYPE_PAIRS:
        kernel = _compiled(arch, n, backward, pair)
        wide_loads, wide_stores, narrow_loads, narrow_stores, lds = ACCESSES[backward, *pair]
        assert accesses(kernel) == dict(wide_loads=wide_loads, wide_stores=wide_stores, narrow_loads=narrow_loads,
                                        narrow_stores=narrow_stores, lds_writes=lds, lds_reads=lds), (pair, kernel["ops"])
        assert not backward or kernel["loop"] == LOOP, (pair, kernel["loop"])


@pytest.mark.slow   # 36 AOT compiles in a fresh process
@pytest.mark.parametrize("arch", ARCHS)
def test_the_widest_row_compiles_without_spills(arch):
    """N = MAX_N (16 warps, 16 elements a lane per tensor), every dtype pair: no VGPR or SGPR
    spills, no scratch, no atomics; the forward at 8 waves per SIMD, the backward at 5."""
    for pair in DTYPE_PAIRS:
        _compiled(arch, rms_norm_kernels.MAX_N, False, pair, waves=8)
        _compiled(arch, rms_norm_kernels.MAX_N, True, pair, waves=5)
