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


@pytest.mark.slow   # 36 AOT compiles in a fresh process
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("arch", ARCHS)
def test_forward_reads_and_writes_rows_16_bytes_per_thread(arch, n):
    """bf16 x and weight: x, the weight and y one 16-byte access each per thread; rstd one
    4-byte store; one 4-byte LDS write and read (the row's sum of squares across warps). An fp32
    weight beside bf16 x: two 16-byte loads of it, and its change of layout to the tile's
    (8 elements a thread) goes through LDS, two 16-byte writes and reads a thread, once per row.
    fp32 x and weight: 16 bytes of each a thread, nothing through LDS but the sum. No VGPR or SGPR
    spills, no scratch, no atomics, 8 waves per SIMD."""
    got = {pair: accesses(_compiled(arch, n, False, pair)) for pair in DTYPE_PAIRS}
    assert got == {
        ("bfloat16", "bfloat16"): dict(wide_loads=2, wide_stores=1, narrow_loads=0, narrow_stores=1,
                                       lds_writes=1, lds_reads=1),
        ("bfloat16", "float32"): dict(wide_loads=3, wide_stores=1, narrow_loads=0, narrow_stores=1,
                                      lds_writes=3, lds_reads=3),
        ("float32", "float32"): dict(wide_loads=2, wide_stores=1, narrow_loads=0, narrow_stores=1,
                                     lds_writes=1, lds_reads=1),
    }, got


@pytest.mark.slow   # 36 AOT compiles in a fresh process
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("arch", ARCHS)
def test_backward_reads_and_writes_rows_16_bytes_per_thread(arch, n):
    """bf16 x and weight: dy, x and the weight one 16-byte load each, dx one 16-byte store, and
    the program's fp32 partial dweight two (8 fp32 a thread), through LDS to the store's layout
    (two 16-byte writes and reads, once per program); rstd one 4-byte load per row; one 4-byte
    LDS write and read for the row's sum across warps. An fp32 weight: one more 16-byte load.
    fp32 x and weight: 16 bytes of each a thread, the partial stored in the tile's layout. No
    VGPR or SGPR spills, no scratch, no atomics (dweight's sum is the partials' fixed-order
    add), 8 waves per SIMD. The loop over a program's rows, every pair: dy and x loaded, dx
    stored, 16 bytes each, rstd's 4-byte load and the row sum's LDS write and read; the weight's
    loads and the partial's LDS and stores are outside it, once per program."""
    compiled = {pair: _compiled(arch, n, True, pair) for pair in DTYPE_PAIRS}
    for pair, kernel in compiled.items():
        assert kernel["loop"] == {"global_load": {"buffer_load_dwordx4": 2, "buffer_load_dword": 1},
                                  "global_store": {"buffer_store_dwordx4": 1},
                                  "lds_write": {"ds_write_b32": 1}, "lds_read": {"ds_read_b32": 1}}, (pair, kernel["loop"])
    got = {pair: accesses(kernel) for pair, kernel in compiled.items()}
    assert got == {
        ("bfloat16", "bfloat16"): dict(wide_loads=3, wide_stores=3, narrow_loads=1, narrow_stores=0,
                                       lds_writes=3, lds_reads=3),
        ("bfloat16", "float32"): dict(wide_loads=4, wide_stores=3, narrow_loads=1, narrow_stores=0,
                                      lds_writes=5, lds_reads=5),
        ("float32", "float32"): dict(wide_loads=3, wide_stores=2, narrow_loads=1, narrow_stores=0,
                                     lds_writes=1, lds_reads=1),
    }, got


@pytest.mark.slow   # 36 AOT compiles in a fresh process
@pytest.mark.parametrize("arch", ARCHS)
def test_the_widest_row_compiles_without_spills(arch):
    """N = MAX_N (16 warps, 16 elements a lane per tensor), every dtype pair: no VGPR or SGPR
    spills, no scratch, no atomics; the forward at 8 waves per SIMD, the backward at 5."""
    for pair in DTYPE_PAIRS:
        _compiled(arch, rms_norm_kernels.MAX_N, False, pair, waves=8)
        _compiled(arch, rms_norm_kernels.MAX_N, True, pair, waves=5)
