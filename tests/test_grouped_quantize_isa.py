"""The grouped quantize kernels as gfx942 and gfx950 compile them (ahead of time; not
rungs, so a fresh subprocess compiles them, as tests/test_fp8_quantize_isa.py does for the
dense ones): the chunked amax launch, the per-group scale launch and the cast (which the
per-tensor operands run alone, with a stride-0 scale). Backs what
kernels/moe/grouped_gemm_fp8/quantize_kernel.py says of its loads, stores, the LDS
transpose of the FP8 tile and its registers."""
from __future__ import annotations

import pytest

from fresh_compiles import results

COMPILE = """
import torch
from kernels.moe.grouped_gemm_fp8 import quantize_kernel
from workbench.isa import compile as isa_compile, parse as isa_parse


def result(job):
    fp8, arch, per_tensor, amax, rows = job
    kernels = []
    for aot in quantize_kernel.aot(getattr(torch, fp8), per_tensor=per_tensor, amax=amax, rows=rows):
        kernel = isa_compile.compile_aot(aot, ("hip", arch, 64))
        lines = isa_parse.code_lines(kernel["asm"], "amdgcn")
        kernels.append(summary(kernel, valu=[isa_parse.mnemonic(line) for line in lines if "_f32" in line]))
    return kernels
"""


def _compiled_here() -> dict[tuple, list[dict]]:
    """Every compile this file reads, per (fp8, arch, per_tensor, amax, rows): :data:`TARGETS`, the
    delayed cast with its tile maxima, the per-group launches with the row-wise quantization beside
    and the one-scale casts (with and without tile maxima) with the row-major copy beside, per target,
    in one fresh subprocess (importing torch and the kernels there costs
    seconds, each compile a fraction of one)."""
    jobs = [(fp8, arch, per_tensor, False, False) for fp8, arch, per_tensor in TARGETS]
    jobs += [(fp8, arch, True, True, False) for fp8, arch in FORMATS]
    jobs += [(fp8, arch, per_tensor, amax, True) for fp8, arch in FORMATS
             for per_tensor, amax in ((False, False), (True, False), (True, True))]
    return results(COMPILE, tuple(jobs))


def compiled(fp8: str, arch: str, per_tensor: bool, amax: bool = False, rows: bool = False) -> list[dict]:
    return _compiled_here()[fp8, arch, per_tensor, amax, rows]


CONVERT = {"gfx942": "v_cvt_pk_fp8_f32", "gfx950": "v_cvt_scalef32_pk_fp8_f32"}
FORMATS = [("float8_e4m3fnuz", "gfx942"), ("float8_e4m3fn", "gfx950")]
TARGETS = [(fp8, arch, per_tensor) for fp8, arch in FORMATS for per_tensor in (False, True)]
IDS = [f"{arch}-{'per-tensor' if per_tensor else 'grouped'}" for _, arch, per_tensor in TARGETS]


@pytest.mark.slow   # three AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("fp8, arch, per_tensor", TARGETS, ids=IDS)
def test_wide_reads_of_x_wide_fp8_stores_and_no_spills(fp8, arch, per_tensor):
    """Per thread and 64 x 64 bf16 tile (256 threads), the amax launch reads x as two 16-byte
    loads (beside the group offsets) and stores only fp32 scales and its two partial maxima;
    the scale launch reads partial maxima and stores scales, 4 bytes a thread (64 threads,
    no LDS); the cast launch reads x as
    16-byte loads too (beside its scale rows and the group offsets) and writes its
    token-contiguous FP8 tile as one 16-byte store and no narrower global store; its
    transpose crosses lanes through 4 KiB of LDS, the FP8 tile, written and read a byte at
    a time (ds_write_b8, ds_read_u8: the narrow-LDS pattern of an 8-bit layout conversion,
    as the dense kernel's). No VGPR or SGPR spills, no scratch, at least 7 waves per SIMD.
    The per-tensor cast (scale strides 0, no amax launch) reads and writes alike, its one
    scale as 16 four-byte loads a thread (a row of 64 at stride 0)."""
    kernels = compiled(fp8, arch, per_tensor)
    *amaxes, cast = kernels
    assert len(kernels) == (1 if per_tensor else 3)
    for kernel in kernels:
        res = kernel["resources"]
        assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
        assert res["occupancy"] >= 7, res
        assert not kernel["ops"].get("matrix")
    if not per_tensor:
        amax, scales = amaxes
        assert amax["ops"]["global_load"]["buffer_load_dwordx4"] == 2
        assert set(amax["ops"]["global_load"]) <= {"buffer_load_dwordx4", "buffer_load_dword", "global_load_dword"}
        assert amax["ops"]["global_store"] == {"buffer_store_dword": 3}
        assert set(scales["ops"]["global_load"]) == {"buffer_load_dword"} and scales["lds"] == 0
        assert scales["ops"]["global_store"] == {"buffer_store_dword": 1}
    assert cast["ops"]["global_load"]["buffer_load_dwordx4"] >= 2
    if per_tensor:
        assert cast["ops"]["global_load"]["buffer_load_dword"] == 16
    assert cast["ops"]["global_store"] == {"buffer_store_dwordx4": 1}
    assert cast["lds"] == 64 * 64 and cast["ops"]["lds_read"]["ds_read_u8"] >= 16
    assert cast["ops"]["lds_write"]["ds_write_b8"] >= 8


@pytest.mark.slow
@pytest.mark.parametrize("fp8, arch, per_tensor", TARGETS, ids=IDS)
def test_divisions_are_correctly_rounded_and_the_cast_is_the_hardware_convert(fp8, arch, per_tensor):
    """Bit-exactness on a GPU needs the scale amax / fp8_max and x / scale rounded as torch
    rounds them: all three launches divide with the IEEE sequence (v_div_scale, v_div_fmas,
    v_div_fixup: one fixup per value, 16 per thread in the cast), not a bare reciprocal;
    the cast then converts its already rounded values with the hardware's packed FP8
    convert (two values an instruction)."""
    kernels = compiled(fp8, arch, per_tensor)
    cast = kernels[-1]
    for kernel in kernels:
        divisions = [op for op in kernel["valu"] if op.startswith("v_div_")]
        assert {"v_div_scale_f32", "v_div_fmas_f32", "v_div_fixup_f32"} <= set(divisions), kernel["valu"]
    assert cast["valu"].count("v_div_fixup_f32") == 16
    assert cast["valu"].count(CONVERT[arch]) == 8


@pytest.mark.slow   # one AOT compile per target in a fresh process (with the file's others)
@pytest.mark.parametrize("fp8, arch", FORMATS)
def test_the_delayed_cast_with_its_tile_maxima_keeps_no_spills_and_seven_waves(fp8, arch):
    """The per-tensor cast with a given scale that also writes its tile's max |t| (delayed
    scaling's expert weights): the loads and the FP8 store of the plain cast, one more
    4-byte store, no spills, at least 7 waves per SIMD."""
    plain, = compiled(fp8, arch, True)
    cast, = compiled(fp8, arch, True, amax=True)
    res = cast["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] >= 7, res
    assert cast["ops"]["global_load"] == plain["ops"]["global_load"]
    stores = dict(cast["ops"]["global_store"])
    assert stores.pop("buffer_store_dwordx4") == 1 and sum(stores.values()) == 1, cast["ops"]


@pytest.mark.slow   # two AOT compiles per target in a fresh process (with the file's others)
@pytest.mark.parametrize("fp8, arch", FORMATS)
def test_the_row_wise_quantization_beside_adds_one_store_a_launch_and_no_registers_that_cost_waves(fp8, arch):
    """The per-group launches with ``rows`` (quantize.token_operands: the wgrad operand and the
    row-wise token operand from the same two reads of x): the amax launch reads x as before and
    adds one 4-byte store a thread (each token's maximum per feature tile); the cast adds one
    4-byte load (the tile's row scales) and one 16-byte store of the row-major FP8 tile, and divides
    each value twice (two correctly rounded divisions, 32 fixups a thread, two packed converts per
    two values' each), with the plain launches' LDS, no spills and their waves per SIMD."""
    (amax, scales, cast), (plain_amax, plain_scales, plain_cast) = compiled(fp8, arch, False, rows=True), compiled(
        fp8, arch, False)
    for kernel, plain in ((amax, plain_amax), (scales, plain_scales), (cast, plain_cast)):
        res = kernel["resources"]
        assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
        assert res["occupancy"] == plain["resources"]["occupancy"], (res, plain["resources"])
        assert kernel["lds"] == plain["lds"]
    assert amax["ops"]["global_load"] == plain_amax["ops"]["global_load"]
    assert amax["ops"]["global_store"] == {"buffer_store_dword": 4}
    loads = dict(cast["ops"]["global_load"])
    loads["buffer_load_dword"] -= 1
    assert loads == plain_cast["ops"]["global_load"]
    assert cast["ops"]["global_store"] == {"buffer_store_dwordx4": 2}
    assert cast["ops"]["lds_read"] == plain_cast["ops"]["lds_read"]
    assert cast["valu"].count("v_div_fixup_f32") == 32 and cast["valu"].count(CONVERT[arch]) == 16


@pytest.mark.slow   # two AOT compiles per target in a fresh process (with the file's others)
@pytest.mark.parametrize("amax", [False, True], ids=["tensorwise", "delayed"])
@pytest.mark.parametrize("fp8, arch", FORMATS)
def test_the_one_scale_cast_with_its_row_major_copy_adds_one_store_and_nothing_else(fp8, arch, amax):
    """The per-tensor cast with ``rows`` (quantize.token_operands and quantize.weight_operands under
    tensorwise and delayed: both layouts of one cast): the same tile stored a second time, row-major,
    as one more 16-byte store a thread; the plain cast's loads (x as two 16-byte loads, the scale
    row), its one division per value (16 fixups a thread) and one packed convert per two values
    (both stores take the same bytes), its LDS transpose, no spills and its waves per SIMD."""
    cast, = compiled(fp8, arch, True, amax=amax, rows=True)
    plain, = compiled(fp8, arch, True, amax=amax)
    res = cast["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] == plain["resources"]["occupancy"] >= 7, (res, plain["resources"])
    assert cast["ops"]["global_load"] == plain["ops"]["global_load"]
    stores = dict(cast["ops"]["global_store"])
    stores["buffer_store_dwordx4"] -= 1
    assert stores == plain["ops"]["global_store"]
    assert (cast["lds"], cast["ops"]["lds_read"], cast["ops"]["lds_write"]) == (
        plain["lds"], plain["ops"]["lds_read"], plain["ops"]["lds_write"])
    assert cast["valu"].count("v_div_fixup_f32") == 16 and cast["valu"].count(CONVERT[arch]) == 8
