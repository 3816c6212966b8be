"""ISA inspector: every Triton rung compiled ahead of time for gfx942, gfx950 and sm90.

Rungs come from the registry, so a new rung is covered without editing this file.
Each (rung, target, dtype) compiles once per session (the inspector caches reports).
"""
from __future__ import annotations

import re

import pytest
import torch
import triton.language as tl

import kernels
from workbench import isa
from workbench.isa import compile as isa_compile, occupancy as isa_occupancy, parse as isa_parse

from table_sections import TARGETS

AOT_RUNGS = [r for r in kernels.variants("gemm") if r.aot is not None]
TOP_RUNG = max(AOT_RUNGS, key=lambda r: r.rung)


def _params(min_rung: int) -> list:
    rungs = [pytest.param(r, id=r.label) for r in AOT_RUNGS if r.rung >= min_rung]
    return rungs or [pytest.param(None, marks=pytest.mark.skip(
        reason=f"no Triton GEMM rung numbered >= {min_rung} is registered yet"))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rung", _params(2))
def test_rungs_use_matrix_cores(rung, target, dtype):
    report = isa.inspect("gemm", rung.rung, target, dtype)
    prefixes = ("v_mfma",) if target.startswith("gfx") else ("wgmma.mma_async", "mma.sync")
    used = {k: v for k, v in report.matrix_instructions.items() if k.startswith(prefixes)}
    assert used, f"{rung.title} on {target}: no matrix instructions in {report.matrix_instructions}"
    assert re.search(r"(bf16|f16)", " ".join(used)), used  # 16-bit inputs, not an fp32 fallback


@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
@pytest.mark.parametrize("rung", _params(4))
def test_pipelined_rungs_stage_operands_through_lds(rung, target):
    report = isa.inspect("gemm", rung.rung, target)
    assert report.lds_bytes > 0 and report.lds_reads > 0, report.summary()


@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
@pytest.mark.parametrize("rung", _params(2))
def test_int64_offsets_stay_out_of_the_hot_loop(rung, target):
    """The rungs widen their offsets to int64 once, before the K loop: the loop itself
    has no 64-bit multiply (it only advances 64-bit pointers, as with int32 offsets)."""
    report = isa.inspect("gemm", rung.rung, target)
    ops = {isa_parse.mnemonic(line) or "" for line in report.hot_loop.splitlines()}
    wide = {op for op in ops if op.startswith(("v_mad_u64", "v_mad_i64", "v_mul_hi", "v_mul_lo",
                                               "s_mul_hi"))}
    assert report.hot_loop and not wide, wide


@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
def test_top_rung_does_not_spill(target):
    report = isa.inspect("gemm", TOP_RUNG.rung, target)
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()


@pytest.mark.parametrize("arch_vgprs, agprs, waves", [
    (64, 0, 8), (128, 0, 4), (170, 0, 2), (256, 0, 2), (257, 0, 1),
    (9, 32, 8),      # LLVM agpr-register-count.ll: TotalNumVgprs 44 -> Occupancy 8
    (128, 128, 2), (256, 256, 1),
])
def test_waves_per_simd_from_vgprs(arch_vgprs, agprs, waves):
    assert isa_occupancy.waves_per_simd_from_vgprs(arch_vgprs, agprs) == waves


def test_occupancy_limits():
    assert isa_occupancy.unified_vgprs(9, 32) == 44 and isa_occupancy.unified_vgprs(170, 0) == 170
    assert [isa_occupancy.waves_per_simd_from_sgprs(n) for n in (80, 100, 106)] == [8, 8, 7]
    assert isa_occupancy.waves_per_simd_from_lds(16384, 8, "gfx942") == 8
    assert isa_occupancy.waves_per_simd_from_lds(48 * 1024, 4, "gfx942") == 1
    assert isa_occupancy.waves_per_simd_from_lds(48 * 1024, 4, "gfx950") == 3
    occupancy = isa_occupancy.cdna("gfx942", 96, 0, 106, 48 * 1024, 4)
    assert (occupancy.value, occupancy.limited_by) == (1, "LDS")
    occupancy = isa_occupancy.cdna("gfx942", 166, 0, 106, 16384, 8, compiler=3)
    assert (occupancy.value, occupancy.agrees_with_compiler) == (2, True)  # 3 fit, 1 workgroup
    assert "whole workgroups" in occupancy.limited_by
    assert isa_occupancy.cdna("gfx942", 166, 0, 74, 16384, 8, waves_per_eu=2).limits[
        "waves_per_eu option"] == 2
    hopper = isa_occupancy.hopper(registers=255, shared_bytes=32768, num_warps=4)
    assert (hopper.value, hopper.limited_by) == (2, "registers")


@pytest.mark.parametrize("rung", _params(2))
def test_occupancy_agrees_with_compiler(rung):
    occupancy = isa.inspect("gemm", rung.rung, "gfx942").occupancy
    assert occupancy.compiler is not None and occupancy.agrees_with_compiler, occupancy


@pytest.mark.parametrize("target", TARGETS)
def test_hot_loop_is_the_matrix_loop(target):
    report = isa.inspect("gemm", TOP_RUNG.rung, target)
    lines = report.hot_loop.splitlines()
    assert lines, "no loop found"
    assert any(isa_parse.category(isa_parse.mnemonic(l) or "", report.dialect) == "matrix"
               for l in lines)
    back_edge = isa_parse.branch_target(lines[-1], report.dialect)
    assert back_edge and lines[0].startswith(back_edge + ":"), (lines[0], lines[-1])
    marked = report.highlighted_loop()
    # On Hopper wgmma reads its operands from shared memory through descriptors: the loop
    # holds async global->shared copies (G) but no explicit shared-memory loads (L).
    assert "\nM | " in marked and ("\nL | " if report.dialect == "amdgcn" else "\nG | ") in marked
    assert "<pre" in report._repr_html_() and "color" in report._repr_html_()


@pytest.mark.parametrize("target", TARGETS)
def test_listings_name_source_files_from_their_package_folder(target):
    """A listing shown in a notebook or a page names ``kernels/...`` and ``triton/...``, not the
    checkout or the virtual environment it was compiled in (committed notebook outputs named a
    CI clone's folders); the report's own text keeps the compiler's paths."""
    report = isa.inspect("gemm", TOP_RUNG.rung, target)
    shown = report._repr_html_() + report.highlighted_loop()
    files = re.findall(r'\.file\s+\d+\s+(&quot;|")([^&"]*)', shown)
    assert any(path.startswith("kernels/") for _, path in files), files
    assert not any(path.startswith("/") for _, path in files), files
    assert re.search(r'\.file\s+\d+\s+"/', report.asm), "the compiler's own text changed: nothing to shorten"


def test_a_branch_back_to_a_shared_tail_is_no_loop():
    """A backward branch makes a loop only if its label's code can reach it again: LLVM may
    place a tail of MFMAs that two paths share above a block that branches back to it, the
    tail ending in a jump past that block (v5's two-stage dQ kernel on gfx950: the
    inspector's hot loop was this 25-line tail, with 8 of the loop's 24 MFMAs)."""
    mfma = "\tv_mfma_f32_16x16x32_bf16 v[0:3], v[4:7], v[8:11], v[0:3]"
    tail = [".LBB0_1:", mfma, "\ts_branch .LBB0_3", ".LBB0_2:", "\ts_cmp_lg_u32 s2, 1",
            "\ts_cbranch_scc0 .LBB0_1", ".LBB0_3:", "\ts_endpgm"]
    loop = [".LBB0_4:", mfma, "\ts_add_i32 s0, s0, 1", "\ts_cmp_lt_i32 s0, s1", "\ts_cbranch_scc1 .LBB0_4"]
    assert isa_parse.hot_loop(tail, "amdgcn") == [] and isa_parse.matrix_loops(tail, "amdgcn") == []
    assert isa_parse.hot_loop(loop + tail, "amdgcn") == loop
    exits_by_jump = [".LBB0_4:", mfma, "\ts_cbranch_scc1 .LBB0_6", ".LBB0_5:", "\ts_branch .LBB0_4", ".LBB0_6:"]
    assert isa_parse.hot_loop(exits_by_jump, "amdgcn") == exits_by_jump[:5]   # a rotated loop still is one


@pytest.mark.parametrize("line, op, kind", [
    ("\tv_mfma_f32_32x32x8_bf16 v[0:15], v[16:17], v[18:19], v[0:15]", "v_mfma_f32_32x32x8_bf16", "matrix"),
    ("\tds_read_b128 v[2:5], v1 offset:256 ; comment", "ds_read_b128", "lds_read"),
    ("\tbuffer_load_dwordx4 v[0:3], v4, s[0:3], 0 offen", "buffer_load_dwordx4", "global_load"),
    ("\t@%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];", "ld.global.v4.b32", "global_load"),
    ("\tcp.async.cg.shared.global [ %r5 + 0 ], [ %rd2 + 0 ], 16;", "cp.async.cg.shared.global", "global_load"),
    ("\tcp.async.commit_group;", "cp.async.commit_group", None),
    (".LBB0_2:                                ; %loop", None, None),
    ("\t.loc\t1 55 13", None, None),
])
def test_instruction_classes(line, op, kind):
    assert isa_parse.mnemonic(line) == op
    if op:
        dialect = "ptx" if "." in op else "amdgcn"
        assert isa_parse.category(op, dialect) == kind


def test_instructions_take_the_innermost_line_of_the_file_asked_for():
    """The line table as Triton's AMD backend writes it: a Triton library frame (standard.py)
    charges the kernel line that called it; a .loc naming no frame of the file clears the line."""
    lines = ["\tv_mov_b32 v0, 0",
             "\t.loc\t1 111 9    ; k.py:111:9 @[ k.py:193:25 ]",
             "\tv_exp_f32_e32 v1, v2",
             "\t.loc\t2 314 12   ; standard.py:314:12 @[ k.py:112:25 @[ k.py:193:25 ] ]",
             "\tv_add_f32_e32 v1, v1, v2",
             ".Ltmp3:",
             "\tds_bpermute_b32 v3, v4, v1",
             "\t.loc\t2 287 12   ; standard.py:287:12",
             "\ts_nop 0"]
    assert isa_parse.by_source_line(lines, "k.py") == [
        ("v_mov_b32", None), ("v_exp_f32_e32", 111), ("v_add_f32_e32", 112), ("ds_bpermute_b32", 112),
        ("s_nop", None)]


@pytest.mark.parametrize("line, into_lds", [
    ("\tbuffer_load_dwordx4 v59, s[8:11], 0 offen lds", True),          # gfx950, tt.pointer_range
    ("\tglobal_load_lds_dwordx4 v[2:3], off", True),                    # gfx950, a 64-bit pointer
    ("\tbuffer_load_dwordx4 v[0:3], v4, s[0:3], 0 offen ; lds", False),  # into registers
    ("\tds_write_b128 v1, v[2:5]", False),
])
def test_loads_straight_into_lds_are_told_apart(line, into_lds):
    assert isa_parse.loads_into_lds(line) is into_lds


def test_registers_and_lds_are_read():
    amd = isa.inspect("gemm", TOP_RUNG.rung, "gfx942")
    assert amd.vgprs > 0 and amd.sgprs > 0 and amd.agprs is not None and amd.lds_bytes > 0
    nvidia = isa.inspect("gemm", TOP_RUNG.rung, "sm_90")
    assert nvidia.target == "sm90" and 0 < nvidia.vgprs <= 255 and "cubin" in nvidia.registers_source


def test_cuda_options_drop_amd_knobs():
    cuda, hip = isa_compile._option_fields("cuda"), isa_compile._option_fields("hip")
    knobs = {"waves_per_eu", "matrix_instr_nonkdim", "kpack"}
    assert knobs <= hip and not knobs & cuda and {"num_warps", "num_stages"} <= cuda


def test_interpreted_helpers_are_rebuilt_as_jit_functions():
    from triton.runtime.jit import JITFunction

    rebuilt = isa_compile._Rebuilder().jit(TOP_RUNG.aot(torch.bfloat16, "hip", "gfx942")[0].jit_fn)
    language = rebuilt.__globals__["tl"]
    assert isinstance(rebuilt, JITFunction) and isinstance(language.max, JITFunction)
    assert language.program_id is tl.program_id  # builtins stay the originals


def _copy_tile(x_ptr, n):
    tl.store(x_ptr + tl.arange(0, 16), tl.load(x_ptr + tl.arange(0, 16)))


def test_rebuild_finds_jit_arguments_where_triton_3_4_keeps_them():
    """Triton 3.4's interpreter functions have no ``kwargs``, only their rewriter does."""
    from triton.runtime.interpreter import InterpretedFunction

    interpreted = InterpretedFunction(_copy_tile, do_not_specialize=["n"])
    del interpreted.kwargs
    rebuilt = isa_compile._Rebuilder().jit(interpreted)
    assert rebuilt.do_not_specialize == ["n"]


@pytest.mark.parametrize("which, message", [("v0", "SIMT"), ("ref", "library")])
def test_non_triton_rungs_are_refused(which, message):
    with pytest.raises(ValueError, match=message):
        isa.inspect("gemm", which)


def test_bad_target_and_dtype():
    with pytest.raises(ValueError, match="gfx942, gfx950, sm90"):
        isa.inspect("gemm", TOP_RUNG.rung, target="gfx90a")
    with pytest.raises(TypeError, match="float64"):
        isa.inspect("gemm", TOP_RUNG.rung, dtype=torch.float64)


def test_compare_two_targets():
    rows = isa.compare(isa.inspect("gemm", 2, "gfx942"), isa.inspect("gemm", "triton_tile", "sm90"))
    by_metric = {row["metric"]: row for row in rows}
    target = list(by_metric["target"].values())
    assert len(target) == 3 and target[1:] == ["gfx942", "sm90"]
    assert all(len(row) == 3 for row in rows) and "occupancy" in by_metric
    assert isa.inspect_all("gemm", 2, "gfx942")[0] is isa.inspect("gemm", 2, "gfx942")  # cached


def test_clear_cache_recompiles():
    before = isa.inspect("gemm", TOP_RUNG.rung, "gfx942")
    isa.clear_cache()
    after = isa.inspect("gemm", TOP_RUNG.rung, "gfx942")
    assert after is not before and after.matrix_instructions == before.matrix_instructions


def test_default_dtype_is_bf16_or_the_targets_native_fp8():
    assert isa.default_dtype(kernels.get("gemm", 2), "gfx942") == torch.bfloat16
    fp8 = [r for r in kernels.variants("gemm_fp8", include_ref=False) if r.aot][-1]
    assert isa.default_dtype(fp8, "gfx942") == torch.float8_e4m3fnuz
    assert isa.default_dtype(fp8, "gfx950") == torch.float8_e4m3fn
    assert isa.default_dtype(fp8, "sm_90") == torch.float8_e4m3fn


@pytest.mark.parametrize("op,narrow", [
    ("ds_read_u16", True), ("ds_read_u16_d16_hi", True), ("ds_write_b16", True),
    ("ds_write_b16_d16_hi", True), ("ds_read_u8", True), ("ds_read_i8", True), ("ds_write_b8", True),
    ("ds_read_b32", False), ("ds_read_b64", False), ("ds_read2_b64", False), ("ds_write_b128", False),
    ("ds_read_b64_tr_b16", False), ("buffer_load_ushort", False)])
def test_narrow_lds_names_8_and_16_bit_lds_ops_only(op, narrow):
    """What the backward's table records as narrow_lds_ops: one 8- or 16-bit element per lane."""
    assert isa_parse.narrow_lds(op) is narrow


def test_one_launch_compiles_alone_and_reads_as_inspect_all_reads_it(monkeypatch):
    """inspect_launch compiles the rung's launch it names and nothing else (grouped GEMM v2 has
    three: forward, dX, dW), and reports it as inspect_all reports that launch; a launch the rung
    does not have is refused by the compile."""
    from workbench.isa import inspector

    inspector._reports.cache_clear()   # compiled here, not read from an earlier test's reports
    compiled, real = [], isa_compile.compile_rung
    monkeypatch.setattr(isa_compile, "compile_rung", lambda *a: compiled.append(real(*a)) or compiled[-1])
    every = isa.inspect_all("grouped_gemm", "v2", "gfx942")
    for launch, whole in enumerate(every):
        one = isa.inspect_launch("grouped_gemm", "v2", launch, "gfx942")
        assert len(compiled[-1]) == 1
        assert (one.kernel_name, one.asm, one.matrix_instructions) == (whole.kernel_name, whole.asm,
                                                                       whole.matrix_instructions)
    assert [len(kernels_) for kernels_ in compiled] == [3, 1, 1, 1]
    with pytest.raises(RuntimeError, match="IndexError"):
        isa.inspect_launch("grouped_gemm", "v2", 3, "gfx942")
