"""RMSNorm's forward and backward kernels (:mod:`kernels.norm.rms_norm_kernels`) as gfx942 and
gfx950 compile them, ahead of time in one fresh subprocess (:mod:`fresh_compiles`), with the
settings a call launches (:func:`~kernels.norm.rms_norm_kernels.settings`, shared by ``aot()``
and the launches; tests/test_aot_matches_calls.py checks the argument classes). Backs what the
module's docstring says of accesses, spills, atomics and waves per SIMD, at N = 1024 (the GPU
presets' model width) and 4096, and what :func:`~kernels.norm.rms_norm_kernels.settings`' docstring
says of the vector it did not pick."""
from __future__ import annotations

import pytest

from fresh_compiles import results
from kernels.norm import rms_norm_kernels
from layer_ladder_isa import ARCHS, accesses

WIDTHS = (1024, 4096)
COMPILE = """
import dataclasses

import torch
from workbench.isa import compile as isa_compile, parse as isa_parse
from kernels.norm.rms_norm_kernels import aot


def result(job):
    arch, n, backward, x_dtype, w_dtype, y_dtype, *variant = job
    residual = getattr(torch, variant[1]) if variant[:1] == ["residual"] else None
    launch = aot(getattr(torch, x_dtype), n, backward, getattr(torch, w_dtype), getattr(torch, y_dtype), residual)
    if variant == ["narrower"]:   # the vector of the narrower dtype: half the threads, twice the elements each
        launch = dataclasses.replace(launch, options=dict(launch.options, num_warps=launch.options["num_warps"] // 2))
    kernel = isa_compile.compile_aot(launch, ("hip", arch, 64))
    lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
    loop = {c: dict(v) for c, v in isa_parse.histograms(isa_parse.hot_loop(lines, "amdgcn"), "amdgcn").items() if v}
    return summary(kernel, atomics=sum("atomic" in (isa_parse.mnemonic(line) or "") for line in lines),
                   loop=loop if backward else None)
"""
DTYPES = (("bfloat16", "bfloat16", "bfloat16"), ("bfloat16", "float32", "bfloat16"),
          ("float32", "float32", "float32"), ("float32", "float32", "bfloat16"))
"""x's, the weight's and y's (dy's): one dtype; bf16 activations beside an fp32 master weight; an
fp32 residual stream normed in fp32; and the training step's under autocast (its residual stream
stays fp32, so its norms see fp32 x and weight, and write y in bf16, the dtype their matmuls read)."""
TRAINING = DTYPES[-1]
NARROWER = tuple((arch, 1024, backward, *TRAINING, "narrower") for arch in ARCHS for backward in (False, True))
RESIDUAL = ("residual", "bfloat16")
"""The fused residual add's launches (``aot``'s ``residual_dtype``) at the training step's dtypes: a
block's bf16 branch added to the fp32 residual stream, the backward with h's other gradient."""
JOBS = tuple((arch, n, backward, *dtypes) for arch in ARCHS for n in (*WIDTHS, rms_norm_kernels.MAX_N)
             for backward in (False, True) for dtypes in DTYPES) + NARROWER + tuple(
    (arch, n, backward, *TRAINING, *RESIDUAL) for arch in ARCHS for n in (*WIDTHS, rms_norm_kernels.MAX_N)
    for backward in (False, True))


def _compiled(arch, n, backward, dtypes, waves=rms_norm_kernels.WAVES_PER_SIMD, variant=()) -> dict:
    kernel = results(COMPILE, JOBS)[arch, n, backward, *dtypes, *variant]
    res = kernel["resources"]
    assert (kernel["atomics"], res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0, 0), kernel
    assert res["occupancy"] == waves, res
    return kernel


ACCESSES = {
    (False, "bfloat16", "bfloat16", "bfloat16"): (2, 1, 0, 1, 1),
    (False, "bfloat16", "float32", "bfloat16"): (3, 1, 0, 1, 3),
    (False, "float32", "float32", "float32"): (2, 1, 0, 1, 1),
    (False, "float32", "float32", "bfloat16"): (2, 0, 0, 1, 1),
    (True, "bfloat16", "bfloat16", "bfloat16"): (3, 3, 1, 0, 3),
    (True, "bfloat16", "float32", "bfloat16"): (4, 3, 1, 0, 5),
    (True, "float32", "float32", "float32"): (3, 2, 1, 0, 1),
    (True, "float32", "float32", "bfloat16"): (2, 2, 1, 0, 1),
}
"""Per (backward, x's dtype, the weight's, y's): 16-byte loads, 16-byte stores, narrower loads and
stores (8-byte ones are neither: :data:`TRAINING_GLOBAL` counts them), LDS writes (as many reads).
Forward: x, the weight and y 16 bytes a thread (an fp32 weight beside bf16 x in two loads), rstd a
4-byte store; bf16 y beside fp32 x 8 bytes a thread (4 elements, as x's 16 bytes). Backward: dy, x
and the weight loaded and dx stored 16 bytes a thread (bf16 dy beside fp32 x: 8 bytes), the
program's fp32 partial dweight stored in two (8 fp32 a thread beside 16-bit x; 4, one store, beside
fp32 x), rstd a 4-byte load. LDS: the row's sum across warps (4 bytes a thread) in both; beside
16-bit x, an fp32 weight's change from its load's layout (4 a thread) to the tile's (8), two 16-byte
writes and reads, and likewise the backward's partial row to its store's layout; nothing else beside
fp32 x (every tensor 4 a thread)."""
LOOP = {"global_load": {"buffer_load_dwordx4": 2, "buffer_load_dword": 1}, "global_store": {"buffer_store_dwordx4": 1},
        "lds_write": {"ds_write_b32": 1}, "lds_read": {"ds_read_b32": 1}}
"""The backward's loop over a program's rows, where dy has x's dtype: dy and x loaded and dx stored
16 bytes a thread, rstd's 4-byte load, the row sum's LDS write and read; the weight's loads and
the partial's LDS and stores are outside it, once per program."""
TRAINING_GLOBAL = {
    False: {"global_load": {"buffer_load_dwordx4": 2}, "global_store": {"buffer_store_dwordx2": 1, "buffer_store_dword": 1}},
    True: {"global_load": {"buffer_load_dwordx4": 2, "buffer_load_dwordx2": 1, "buffer_load_dword": 1},
           "global_store": {"buffer_store_dwordx4": 2}},
}
"""Every global access at the training step's dtypes: forward x and the weight 16 bytes a thread,
bf16 y 8 bytes, rstd 4; backward x and the weight 16 bytes, bf16 dy 8, rstd 4, dx and the fp32
partial row 16."""
TRAINING_LOOP = dict(LOOP, global_load={"buffer_load_dwordx4": 1, "buffer_load_dwordx2": 1, "buffer_load_dword": 1})
"""The same loop on the training step's fp32 x and bf16 dy: dy's load 8 bytes a thread."""


@pytest.mark.slow   # 64 AOT compiles in one fresh process
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("arch", ARCHS)
def test_rows_move_16_bytes_per_thread(arch, n, backward):
    """:data:`ACCESSES` and, backward, :data:`LOOP` (:data:`TRAINING_LOOP`), for every dtype
    triple; no VGPR or SGPR spills, no scratch, no atomics (dweight's sum is the partials'
    fixed-order add), 8 waves per SIMD."""
    for dtypes in DTYPES:
        kernel = _compiled(arch, n, backward, dtypes)
        wide_loads, wide_stores, narrow_loads, narrow_stores, lds = ACCESSES[backward, *dtypes]
        assert accesses(kernel) == dict(wide_loads=wide_loads, wide_stores=wide_stores, narrow_loads=narrow_loads,
                                        narrow_stores=narrow_stores, lds_writes=lds, lds_reads=lds), (dtypes, kernel["ops"])
        if dtypes == TRAINING:
            memory = TRAINING_GLOBAL[backward]
            assert {c: kernel["ops"][c] for c in memory} == memory, kernel["ops"]
        loop = TRAINING_LOOP if dtypes == TRAINING else LOOP
        assert not backward or kernel["loop"] == loop, (dtypes, kernel["loop"])


RESIDUAL_MEMORY = {
    False: {"global_load": {"buffer_load_dwordx4": 2, "buffer_load_dwordx2": 1},
            "global_store": {"buffer_store_dwordx4": 1, "buffer_store_dwordx2": 1, "buffer_store_dword": 1}},
    True: {"global_load": {"buffer_load_dwordx4": 3, "buffer_load_dwordx2": 1, "buffer_load_dword": 1},
           "global_store": {"buffer_store_dwordx4": 2, "buffer_store_dwordx2": 1}},
}
"""Every global access of the fused residual add at the training step's dtypes (fp32 x, weight, h,
dh and dx; bf16 residual, y, dy and db): forward x and the weight loaded and h stored 16 bytes a
thread, the bf16 residual loaded and y stored 8 (4 elements, as fp32's 16), rstd 4; backward x
(h), dh and the weight loaded 16 bytes a thread, dy 8, rstd 4, dx and the partial row stored 16,
db 8."""
RESIDUAL_LOOP = {"global_load": {"buffer_load_dwordx4": 2, "buffer_load_dwordx2": 1, "buffer_load_dword": 1},
                 "global_store": {"buffer_store_dwordx4": 1, "buffer_store_dwordx2": 1},
                 "lds_write": {"ds_write_b32": 1}, "lds_read": {"ds_read_b32": 1}}
"""Its backward's loop over rows: x and dh loaded and dx stored 16 bytes a thread, dy loaded and db
stored 8, rstd's 4-byte load, the row sum's LDS write and read; nothing else crosses LDS."""


@pytest.mark.slow
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_residual_add_moves_fp32_rows_16_bytes_and_bf16_rows_8_per_thread(arch, n, backward):
    """:data:`RESIDUAL_MEMORY` and, backward, :data:`RESIDUAL_LOOP`; LDS only for the row sum; no
    VGPR or SGPR spills, no scratch, no atomics, 8 waves per SIMD, as without the residual."""
    kernel = _compiled(arch, n, backward, TRAINING, variant=RESIDUAL)
    assert accesses(kernel)["lds_writes"] == accesses(kernel)["lds_reads"] == 1, kernel["ops"]
    memory = RESIDUAL_MEMORY[backward]
    assert {c: kernel["ops"][c] for c in memory} == memory, kernel["ops"]
    assert not backward or kernel["loop"] == RESIDUAL_LOOP, kernel["loop"]


NARROWER_MEMORY = {
    False: {"global_load": {"buffer_load_dwordx4": 4}, "global_store": {"buffer_store_dwordx4": 1, "buffer_store_dword": 1},
            "lds_write": {"ds_write_b128": 2, "ds_write_b32": 1}, "lds_read": {"ds_read_b128": 2, "ds_read_b32": 1}},
    True: {"global_load": {"buffer_load_dwordx4": 3, "buffer_load_dword": 1}, "global_store": {"buffer_store_dwordx4": 2},
           "lds_write": {"ds_write_b128": 2, "ds_write_b32": 1}, "lds_read": {"ds_read_b128": 2, "ds_read_b32": 1}},
}
"""The forward's memory ops, and the backward loop's, with the narrower dtype's vector at the
training step's dtypes, N = 1024: bf16 y stored (dy loaded) 16 bytes a thread, fp32 x and the
weight in two 16-byte loads each (dx in two stores), and two 16-byte LDS writes and reads a
thread beside the row sum's: an fp32 tile's change between its accesses' layout (4 a thread)
and the tile's (8)."""


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_the_narrower_dtypes_vector_would_cross_lds_in_the_loop(arch):
    """Why ``settings`` takes the wider dtype's 16 bytes: at the training step's dtypes (fp32 x,
    bf16 y), bf16's 8 elements a thread (half the warps) would move y and dy 16 bytes a thread,
    but change an fp32 tile between its 16-byte accesses' layout (4 a thread) and the tile's 8
    through LDS, in the forward and in the backward's loop, once per row: :data:`NARROWER_MEMORY`."""
    for backward in (False, True):
        kernel = results(COMPILE, JOBS)[arch, 1024, backward, *TRAINING, "narrower"]
        ops = kernel["loop"] if backward else kernel["ops"]
        assert {c: ops.get(c) for c in NARROWER_MEMORY[backward]} == NARROWER_MEMORY[backward], (backward, ops)


@pytest.mark.slow   # 64 AOT compiles in one fresh process
@pytest.mark.parametrize("arch", ARCHS)
def test_the_widest_row_compiles_without_spills(arch):
    """N = MAX_N (16 warps, 16 elements a lane per tensor), every dtype triple: no VGPR or SGPR
    spills, no scratch, no atomics; the forward at 8 waves per SIMD, the backward at 5, but at 4
    on gfx942 for the training step's fp32 x and bf16 dy, and on both with the fused residual
    add's (dh and db beside them)."""
    for dtypes in DTYPES:
        _compiled(arch, rms_norm_kernels.MAX_N, False, dtypes, waves=8)
        _compiled(arch, rms_norm_kernels.MAX_N, True, dtypes, waves=4 if (arch, dtypes) == ("gfx942", TRAINING) else 5)
    _compiled(arch, rms_norm_kernels.MAX_N, False, TRAINING, waves=8, variant=RESIDUAL)
    _compiled(arch, rms_norm_kernels.MAX_N, True, TRAINING, waves=4, variant=RESIDUAL)
