"""The fused quantize kernel as gfx942 and gfx950 compile it (ahead of time; not a rung, so the
ISA inspector's helper does not take it: a fresh subprocess compiles it, since a process that
ran interpreted kernels cannot). Backs what kernels/gemm_fp8/quantize_kernel.py says of its
loads, stores and the LDS round trip of the transposed copy."""
from __future__ import annotations

import pytest

from fresh_compiles import results
from kernels.fp8.recipes.delayed import HISTORY   # the unless of delayed scaling's amax pass

COMPILE = """
import torch
from kernels.gemm_fp8 import quantize_kernel
from workbench.isa import compile as isa_compile


def result(job):
    granularity, fp8, arch, options = job
    aot = (quantize_kernel.amax_pass_aot(**dict(options)) if granularity == AMAX_PASS else
           quantize_kernel.aot(granularity, getattr(torch, fp8), **dict(options)))
    return summary(isa_compile.compile_aot(aot, ("hip", arch, 64)))
"""
AMAX_PASS = "tensor's amax pass"   # a job's "granularity" that compiles quantize_kernel.amax_pass_aot()
COMPILE = f"AMAX_PASS = {AMAX_PASS!r}\n" + COMPILE
WIDE = [("block1x128", "float8_e4m3fnuz", "gfx942", "ocp"), ("mx32", "float8_e4m3fn", "gfx950", "ocp"),
        ("mx32", "float8_e4m3fn", "gfx950", "round_up")]
MAXIMA = [("float8_e4m3fnuz", "gfx942", 0), ("float8_e4m3fn", "gfx950", 1)]
# the casts after the amax pass (tensor's computes its scale, row's reads the scale launch's), with
# the waves per SIMD the module docstring gives
TARGETS = (("float8_e4m3fnuz", "gfx942"), ("float8_e4m3fn", "gfx950"))
AMAX_PASS_CASTS = [(granularity, fp8, arch, transpose, 7 if arch == "gfx950" and transpose else 8)
                   for granularity in ("tensor", "row") for transpose in (False, True)
                   for fp8, arch in TARGETS]


def _wide_options(rule: str) -> dict:
    return {"scale_rule": rule} if rule != "ocp" else {}


def _preshuffled_options() -> dict:
    return dict(preshuffled=True, scale_rule="round_up")   # the mxfp8 recipe's cast on gfx950


def _unless_options(unless: int) -> dict:
    return {"unless": unless} if unless else {}


def _maxima_options(amax: bool) -> dict:
    return dict(transpose=False, given_scale=True, amax=amax)


def _compiled_here() -> dict[tuple, dict]:
    """Every compile this file reads, per (granularity, fp8, arch, options as sorted items), in
    one fresh subprocess (importing torch and the kernels there costs seconds, each compile a
    fraction of one)."""
    jobs = [(granularity, fp8, arch, tuple(sorted(_wide_options(rule).items())))
            for granularity, fp8, arch, rule in WIDE]
    jobs += [("tensor", fp8, arch, tuple(sorted(_maxima_options(amax).items())))
             for fp8, arch, _ in MAXIMA for amax in (False, True)]
    jobs += [(granularity, fp8, arch, (("transpose", transpose),))
             for granularity, fp8, arch, transpose, _ in AMAX_PASS_CASTS]
    jobs += [("mx32", "float8_e4m3fn", "gfx950", tuple(sorted(_preshuffled_options().items())))]
    jobs += [(AMAX_PASS, fp8, arch, tuple(sorted(_unless_options(unless).items())))
             for fp8, arch in TARGETS for unless in (0, HISTORY)]
    return results(COMPILE, tuple(jobs))


def compiled(granularity: str, fp8: str, arch: str, **options) -> dict:
    return _compiled_here()[granularity, fp8, arch, tuple(sorted(options.items()))]


@pytest.mark.slow
@pytest.mark.parametrize("granularity, fp8, arch, rule", WIDE)
def test_one_wide_read_of_x_two_wide_writes_and_an_lds_transpose(granularity, fp8, arch, rule):
    """Per thread and 128 x 128 bf16 tile (512 threads): x read as 4 x 16 bytes, q and q_t
    written as 2 x 16 bytes each; the transposed copy crosses lanes through 16 KiB of LDS,
    written two bytes and read one byte at a time (ds_write_b16 / ds_read_u8: Triton 3.9's
    layout conversion for an 8-bit tile, a narrow-LDS pattern). No spills. MX's round-up
    rule (``scale_rule``) compiles to the same accesses as the OCP one."""
    result = compiled(granularity, fp8, arch, **_wide_options(rule))
    res, ops = result["resources"], result["ops"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert ops["global_load"] == {"buffer_load_dwordx4": 4}
    assert ops["global_store"]["buffer_store_dwordx4"] == 4
    assert result["lds"] == 16384
    assert ops["lds_write"]["ds_write_b16"] >= 16 and ops["lds_read"]["ds_read_u8"] >= 32
    assert not ops.get("matrix")


@pytest.mark.slow   # AOT compiles in a fresh process (with the file's others)
def test_preshuffled_mx_scales_cost_two_byte_stores_and_nothing_else():
    """The mxfp8 recipe's cast on gfx950 writes its scales in the pre-shuffled layout the MX GEMM
    reads there: against the same cast writing them row-major, the same loads, q stores, LDS
    bytes and accesses, no spills, the same waves per SIMD; the scales still one byte per
    store, plus the two byte stores of the half chunks' zeros (kernels/gemm_fp8/quantize_kernel.py)."""
    plain = compiled("mx32", "float8_e4m3fn", "gfx950", scale_rule="round_up")
    shuffled = compiled("mx32", "float8_e4m3fn", "gfx950", **_preshuffled_options())
    res = shuffled["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] == plain["resources"]["occupancy"], (res, plain["resources"])
    assert shuffled["lds"] == plain["lds"]
    for kind in ("global_load", "lds_write", "lds_read"):
        assert shuffled["ops"][kind] == plain["ops"][kind], kind
    stores, before = shuffled["ops"]["global_store"], plain["ops"]["global_store"]
    assert stores["buffer_store_dwordx4"] == before["buffer_store_dwordx4"] == 4
    assert stores["buffer_store_byte"] == before["buffer_store_byte"] + 2, (stores, before)
    assert set(stores) == set(before) == {"buffer_store_dwordx4", "buffer_store_byte"}


@pytest.mark.slow   # two AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("fp8, arch, waves_lost", MAXIMA)
def test_the_tile_maxima_of_a_given_scales_cast_cost_one_store_and_no_spill(fp8, arch, waves_lost):
    """Delayed scaling's cast (``tensor``, a given scale, no transpose: the per-tensor
    recipes' x8 and w8) with the tile's max |x| written for the amax history: one more
    4-byte store per program, the same loads, no spills; the occupancy of the cast without
    it (8 waves per SIMD) on gfx942, one wave less on gfx950 (the cross-warp max's
    registers), as kernels/gemm_fp8/quantize_kernel.py says."""
    plain, with_amax = (compiled("tensor", fp8, arch, **_maxima_options(amax)) for amax in (False, True))
    for result in (plain, with_amax):
        res = result["resources"]
        assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert plain["resources"]["occupancy"] == 8
    assert with_amax["resources"]["occupancy"] == 8 - waves_lost, (plain, with_amax)
    assert with_amax["lds"] == 32 and plain["lds"] == 0
    assert with_amax["ops"]["global_load"] == plain["ops"]["global_load"]
    stores = {op: n for op, n in with_amax["ops"]["global_store"].items() if "dwordx" not in op}
    assert sum(stores.values()) - sum(n for op, n in plain["ops"]["global_store"].items()
                                      if "dwordx" not in op) == 1, (plain["ops"], with_amax["ops"])


@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("granularity, preshuffled", [("tensor", False), ("row", False), ("block1x128", False),
                                                      ("block128x128", False), ("mx32", False), ("mx32", True)])
def test_the_compiled_launch_takes_the_arguments_a_call_passes(granularity, preshuffled, transpose, monkeypatch):
    """Triton specializes an int argument equal to 1 as a constant and one divisible by 16 (0
    too) as such: the ahead-of-time launch must give each argument, the scale strides among
    them (0 where a scale is broadcast), the class a call of
    :func:`kernels.gemm_fp8.quantize` gives it, or the ISA above is another binary's. The
    call is recorded, not run."""
    import torch
    from kernels.gemm_fp8 import quantize_kernel
    from launch_classes import differences, recorded_launches

    size = 64 if granularity in ("tensor", "row") else 2048   # 16 scale blocks of 128 a side
    with recorded_launches(monkeypatch, stub=True) as launches:
        quantize_kernel.launch(torch.ones(size, size, dtype=torch.bfloat16), granularity, torch.float8_e4m3fn,
                               transpose=transpose, preshuffled=preshuffled)
    compiled_launch = quantize_kernel.aot(granularity, torch.float8_e4m3fn, transpose=transpose,
                                          preshuffled=preshuffled)
    [call] = [launch for launch in launches if launch[0] is compiled_launch.jit_fn]
    assert differences(call, compiled_launch, monkeypatch) == {}
    if granularity == "tensor":   # its amax pass too
        amax_pass = quantize_kernel.amax_pass_aot()
        [call] = [launch for launch in launches if launch[0] is amax_pass.jit_fn]
        assert differences(call, amax_pass, monkeypatch) == {}


def test_the_compiled_delayed_amax_pass_takes_the_arguments_a_call_passes(monkeypatch):
    """The amax pass with delayed scaling's history as its ``unless``
    (:func:`kernels.fp8.recipes.delayed.history_scale`'s), recorded, not run, against
    ``amax_pass_aot(unless=HISTORY)``, whose ISA test_tensors_amax_pass_reads_wide_and_keeps_seven_waves reads."""
    import torch
    from kernels.gemm_fp8 import quantize_kernel
    from launch_classes import differences, recorded_launches

    with recorded_launches(monkeypatch, stub=True) as launches:
        quantize_kernel.tensor_partials(torch.ones(64, 64, dtype=torch.bfloat16), torch.zeros(HISTORY))
    amax_pass = quantize_kernel.amax_pass_aot(unless=HISTORY)
    [call] = [launch for launch in launches if launch[0] is amax_pass.jit_fn]
    assert differences(call, amax_pass, monkeypatch) == {}


@pytest.mark.slow   # AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("granularity, fp8, arch, transpose, waves", AMAX_PASS_CASTS)
def test_the_casts_after_the_amax_pass_do_not_spill(granularity, fp8, arch, transpose, waves):
    """tensor's and row's casts, as the per-tensor and rowwise recipes launch them: no spills, and
    the occupancy kernels/gemm_fp8/quantize_kernel.py gives (8 waves per SIMD; with the transposed
    copy 7 on gfx950)."""
    res = compiled(granularity, fp8, arch, transpose=transpose)["resources"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] == waves, res


@pytest.mark.slow   # AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("fp8, arch", TARGETS)
@pytest.mark.parametrize("transpose", [False, True])
def test_the_tensor_cast_reduces_the_partials_with_two_loads_and_32_bytes_of_lds(fp8, arch, transpose):
    """Each program of tensor's cast reads all of the amax pass's partials: per thread two 4-byte
    loads (PARTIALS over 512 lanes) beside x's four 16-byte ones, and the cross-warp max through
    32 bytes of LDS (within the transposed copy's 16 KiB, which it reuses), no spills (the occupancy:
    test_the_casts_after_the_amax_pass_do_not_spill)."""
    from kernels.gemm_fp8 import quantize_kernel
    result = compiled("tensor", fp8, arch, transpose=transpose)
    assert result["ops"]["global_load"] == {"buffer_load_dwordx4": 4,
                                            "buffer_load_dword": quantize_kernel.PARTIALS // 512}
    assert result["lds"] == (16384 if transpose else 32)
    assert result["ops"]["lds_write"]["ds_write_b32"] == result["ops"]["lds_read"]["ds_read_b32"] == 1


@pytest.mark.slow   # AOT compiles in a fresh process (with the file's others)
@pytest.mark.parametrize("fp8, arch", TARGETS)
@pytest.mark.parametrize("unless", [0, HISTORY])
def test_tensors_amax_pass_reads_wide_and_keeps_seven_waves(fp8, arch, unless):
    """tensor's amax pass, as kernels/gemm_fp8/quantize_kernel.py says: per thread and tile of its
    loop four 16-byte buffer loads of x, one 4-byte store of the program's partial after a
    cross-warp max through 32 bytes of LDS, no spills or scratch, 7 waves per SIMD; with delayed
    scaling's history as its ``unless``, one 4-byte load more per thread and nothing else."""
    result = compiled(AMAX_PASS, fp8, arch, **_unless_options(unless))
    res, ops = result["resources"], result["ops"]
    assert (res["vgpr_spills"], res["sgpr_spills"], res["scratch_bytes"]) == (0, 0, 0), res
    assert res["occupancy"] == 7, res
    assert ops["global_load"] == {"buffer_load_dwordx4": 4, **({"buffer_load_dword": 1} if unless else {})}
    assert sum(ops["global_store"].values()) == 1 and result["lds"] == 32, (ops, result["lds"])
