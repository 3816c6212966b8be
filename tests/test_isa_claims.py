"""What the docstrings and notebooks say about generated code, compiled and checked.

Two kinds of check. A scan: every instruction name written in a kernel docstring or
comment (``kernels/``) or in a notebook's prose must occur in the machine code of
that op's rungs (``v_mfma_f32_32x32x8_bf16``, ``ds_read_b128``, ``wgmma``...),
compiled for gfx942, gfx950 and sm90; a renamed or invented instruction fails. And
one test per claim about *how* the code changes from rung to rung (v4's docstring: one
LDS tile per operand, no K compare in the loop, the MFMA shape per
``matrix_instr_nonkdim``...).
"""
from __future__ import annotations

import functools
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import kernels
from kernels.gemm import v2_triton_tile, v4_lds_pipeline
from kernels.registry import PACKAGES
from workbench import isa
from workbench.isa import parse as isa_parse

from isa_checks import converts_to_bf16, stores

ROOT = Path(__file__).resolve().parent.parent
INSTRUCTION = re.compile(r"\b(v_mfma\w*|v_cmp\w*|ds_(?:read|write)\w*|global_load\w*|buffer_load\w*"
                         r"|wgmma[\w.]*|tcgen05[\w.]*|mma\.sync[\w.]*)")


def _mentions(text: str) -> set[str]:
    return {m.rstrip(".") for m in INSTRUCTION.findall(text)}


@functools.lru_cache(maxsize=None)
def _mnemonics(op: str) -> frozenset[str]:
    """Every mnemonic in every kernel of every Triton rung of ``op``, on every target."""
    found = set()
    for rung in kernels.variants(op, include_ref=False):
        if rung.aot is None:
            continue
        for target in isa.TARGETS:
            for report in isa.inspect_all(op, rung.label, target):
                found |= {isa_parse.mnemonic(line) or "" for line in report.asm.splitlines()}
    return frozenset(found - {""})


def _occurs(name: str, mnemonics) -> bool:
    return any(m == name or m.startswith(name + "_") or m.startswith(name + ".") or
               (name in ("ds_write", "ds_read", "wgmma") and m.startswith(name)) for m in mnemonics)


SOURCES_NAMING_INSTRUCTIONS = [
    pytest.param(op, path, id=f"{op}/{path.name}")
    for op in kernels.ops()
    for path in sorted((ROOT / PACKAGES[op].replace(".", "/")).glob("*.py"))
    if _mentions(path.read_text())]


# Instructions a rung compiles to only with operands other than its own inputs' (the default
# compile above), each pinned by a test that compiles that case: name -> that test's file.
PINNED_ELSEWHERE = {"v_mfma_f32_16x16x32_fp8_bf8": "test_gemm_fp8_blockwise.py",   # e5m2 x e4m3 (FP8 gradients)
                    "v_mfma_f32_16x16x32_bf8_fp8": "test_gemm_fp8_blockwise.py",
                    "v_mfma_scale_f32_32x32x64_f8f6f4": "test_mx_preshuffle.py"}   # row-major MX scales


@pytest.mark.parametrize("op, path", SOURCES_NAMING_INSTRUCTIONS)
def test_instructions_named_in_kernel_sources_are_generated(op, path):
    missing = sorted(n for n in _mentions(path.read_text()) if not _occurs(n, _mnemonics(op))
                     and n not in PINNED_ELSEWHERE)
    assert not missing, f"{path.name} names {missing}, which no {op} rung compiles to"


def test_instructions_pinned_elsewhere_are_pinned_there():
    for name, test_file in PINNED_ELSEWHERE.items():
        assert f'"{name}"' in (ROOT / "tests" / test_file).read_text(), (name, test_file)


def test_instructions_named_in_notebook_prose_are_generated():
    everything = set().union(*(_mnemonics(op) for op in kernels.ops()))
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        missing = sorted(n for n in _mentions(prose) if not _occurs(n, everything))
        assert not missing, f"{notebook.name} names {missing}, which no rung compiles to"


def test_scan_catches_an_invented_instruction():
    assert _mentions("uses ``v_mfma_f32_64x64x4_bf16`` and ds_read_b128.") == {
        "v_mfma_f32_64x64x4_bf16", "ds_read_b128"}
    assert not _occurs("v_mfma_f32_64x64x4_bf16", _mnemonics("gemm"))
    assert _occurs("ds_read_b128", _mnemonics("gemm"))


# -- v4's docstring, claim by claim ---------------------------------------------------

def _loop_ops(report) -> list[str]:
    return [m for m in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if m]


def test_v4_doubles_the_lds_of_v3_and_drops_the_k_compare():
    v3, v4 = isa.inspect("gemm", "v3", "gfx942"), isa.inspect("gemm", "v4", "gfx942")
    assert v4.lds_bytes == 2 * v3.lds_bytes
    assert any(op.startswith("v_cmp_gt_i32") for op in _loop_ops(v3))
    assert not any(op.startswith("v_cmp") for op in _loop_ops(v4))



def _tile_bytes(rung: str) -> tuple[int, int]:
    """Bytes of one bf16 A tile and one B tile of ``rung``'s gfx942 config."""
    cfg = v2_triton_tile.config("hip") if rung == "v2" else v4_lds_pipeline.config("hip", "gfx942")
    return cfg["BLOCK_M"] * cfg["BLOCK_K"] * 2, cfg["BLOCK_K"] * cfg["BLOCK_N"] * 2


def test_lds_holds_one_tile_per_operand_until_three_stages():
    """Notebook 01 and v4's docstring, gfx942: at num_stages=1 (v2) A and B take turns in
    one allocation the size of one tile; at 2 (v4) each operand has one LDS tile, the
    prefetch waits in registers; a second LDS tile per operand appears at 3."""
    a_tile, b_tile = _tile_bytes("v4")
    assert _tile_bytes("v2") == (a_tile, b_tile) == (16384, 16384)
    assert isa.inspect("gemm", "v2", "gfx942").lds_bytes == max(a_tile, b_tile)
    lds = {stages: isa.inspect("gemm", "v4", "gfx942", overrides={"num_stages": stages}).lds_bytes
           for stages in (1, 2, 3)}
    assert lds == {1: max(a_tile, b_tile), 2: a_tile + b_tile, 3: 2 * (a_tile + b_tile)}
    # gfx950 loads straight into LDS: there the prefetch takes a second tile at two stages
    assert 2 * (a_tile + b_tile) < isa.inspect("gemm", "v4", "gfx950").lds_bytes == 67520


def test_v4_prefetches_into_registers_and_overwrites_its_one_lds_tile():
    """gfx942, num_stages=2: the loop issues the global loads of the next K step first,
    reads this step's operands out of LDS, waits at a barrier until every wave has read
    them, and only then writes the prefetched registers into the same LDS tile. The
    one-stage loops of v2, v3 and v4 store to LDS first."""
    def loop(rung, **overrides):
        return _loop_ops(isa.inspect("gemm", rung, "gfx942", overrides=overrides))

    assert isa_parse.prefetches_into_registers(loop("v4"))
    assert not any(map(isa_parse.prefetches_into_registers, (loop("v2"), loop("v3"), loop("v4", num_stages=1))))
    ops = loop("v4")
    assert ops.index("buffer_load_dwordx4") < ops.index("ds_read_b128")


def test_waves_per_eu_is_a_ceiling_that_costs_v4_half_its_waves():
    """waves_per_eu=2 does not cap v4's registers (the same VGPRs without it, few enough
    for 4 waves per SIMD): it lowers occupancy from 4 to 2 (``amdgpu-waves-per-eu="2,2"``)."""
    capped = isa.inspect("gemm", "v4", "gfx942")
    free = isa.inspect("gemm", "v4", "gfx942", overrides={"waves_per_eu": 0})
    assert capped.options["waves_per_eu"] == 2 and capped.vgprs == free.vgprs <= 128
    assert (free.occupancy.value, capped.occupancy.value) == (4, 2)


_LDS_LOADS = {1: "ubyte", 2: "ushort", 4: "dword", 12: "dwordx3", 16: "dwordx4"}


def _assembles(arch: str, instruction: str) -> bool:
    """Whether the AMD assembler Triton ships accepts ``instruction`` for ``arch``."""
    from triton.backends.amd.compiler import assemble_amdgcn

    source = (f'.amdgcn_target "amdgcn-amd-amdhsa--{arch}"\n.text\n.globl k\n.p2align 8\n'
              f".type k,@function\nk:\n  s_mov_b32 m0, 0\n  {instruction}\n  s_endpgm\n")
    try:
        return bool(assemble_amdgcn(source, arch, ""))
    except RuntimeError:
        return False


@pytest.mark.parametrize("arch, widths", [("gfx942", {1, 2, 4}), ("gfx950", {1, 2, 4, 12, 16})])
def test_global_to_lds_loads_per_lane_width(arch, widths):
    """Notebook 01: gfx942 loads from global memory straight into LDS at 1, 2 and 4 bytes
    per lane; gfx950 adds 12 and 16 (both the buffer and the global forms)."""
    accepted = {size for size, name in _LDS_LOADS.items()
                if _assembles(arch, f"buffer_load_{name} v0, s[0:3], 0 offen lds")
                and _assembles(arch, f"global_load_lds_{name} v[0:1], off")}
    assert accepted == widths

def test_gfx942_loads_into_lds_4_bytes_per_lane_where_gfx950_loads_16(monkeypatch):
    """Notebook 01: both targets can load from global memory straight into LDS. Triton 3.9
    does it by default on gfx950 only (16 bytes per lane); asked to on gfx942
    (TRITON_HIP_USE_ASYNC_COPY=1) it emits the 4-byte form, the widest gfx942 has."""
    from workbench.isa import compile as isa_compile

    gfx950 = isa.inspect("gemm", "v4", "gfx950").asm.splitlines()
    assert {line.split()[0] for line in gfx950 if isa_parse.loads_into_lds(line)} == {"buffer_load_dwordx4"}
    assert not any(map(isa_parse.loads_into_lds, isa.inspect("gemm", "v4", "gfx942").asm.splitlines()))
    monkeypatch.setenv("TRITON_HIP_USE_ASYNC_COPY", "1")
    isa_compile.stop()   # the helper process reads the environment when it starts
    try:
        (kernel,) = isa_compile.compile_rung("gemm", "v4", isa.TARGETS["gfx942"], "bfloat16")
    finally:
        monkeypatch.delenv("TRITON_HIP_USE_ASYNC_COPY")
        isa_compile.stop()
    direct = {line.split()[0] for line in kernel["asm"].splitlines() if isa_parse.loads_into_lds(line)}
    assert direct == {"buffer_load_dword"}

def _loads_into_lds(report) -> int:
    return sum(map(isa_parse.loads_into_lds, report.hot_loop.splitlines()))


@pytest.mark.parametrize("target, operand_read", [("gfx942", "ds_read_b128"), ("gfx950", "ds_read_b64_tr_b16")])
def test_v4_stages_through_lds_as_described(target, operand_read):
    """gfx942 writes its loads to LDS with ``ds_write_b128``; gfx950 loads straight into LDS."""
    report = isa.inspect("gemm", "v4", target)
    loop = _loop_ops(report)
    staged = "ds_write_b128" in loop if target == "gfx942" else _loads_into_lds(report) > 0
    assert staged and operand_read in loop, sorted(set(loop))


@pytest.mark.parametrize("rung, target, mfma", [
    ("v2", "gfx942", "v_mfma_f32_32x32x8_bf16"),     # nonkdim unset: the compiler picks 32x32
    ("v3", "gfx942", "v_mfma_f32_32x32x8_bf16"),
    ("v4", "gfx942", "v_mfma_f32_16x16x16_bf16"),    # matrix_instr_nonkdim=16
    ("v4", "gfx950", "v_mfma_f32_16x16x32_bf16"),
])
def test_mfma_shape_follows_matrix_instr_nonkdim(rung, target, mfma):
    assert set(isa.inspect("gemm", rung, target, torch.bfloat16).matrix_instructions) == {mfma}


def test_kpack_2_reads_operands_128_bits_at_a_time_on_gfx942():
    kpack2 = _loop_ops(isa.inspect("gemm", "v4", "gfx942"))
    kpack1 = _loop_ops(isa.inspect("gemm", "v4", "gfx942", overrides={"kpack": 1}))
    assert "ds_read_b128" in kpack2 and "ds_read2st64_b64" not in kpack2
    assert "ds_read2st64_b64" in kpack1 and "ds_read_b128" not in kpack1


def test_the_masked_loop_of_v3_is_pipelined_too():
    """Peeling the K tail is not what lets the pipeliner run: v3's masked loop at
    num_stages=2 doubles its LDS just the same."""
    one = isa.inspect("gemm", "v3", "gfx942")
    two = isa.inspect("gemm", "v3", "gfx942", overrides={"num_stages": 2})
    assert one.options["num_stages"] == 1 and two.lds_bytes == 2 * one.lds_bytes


def test_row_major_b_is_transposed_into_lds_on_gfx942():
    """v4's docstring: B row-major costs 8 ds_write_b32 per K step; K-contiguous B (the
    nn.Linear layout, "NT") is written like A, 16 bytes at a time (2 + 2 ds_write_b128)."""
    nn = Counter(_loop_ops(isa.inspect("gemm", "v4", "gfx942", overrides={"layout": "NN"})))
    nt = Counter(_loop_ops(isa.inspect("gemm", "v4", "gfx942", overrides={"layout": "NT"})))
    # Since the compile specializes pointers as the JIT does (buffer loads, issue 18) the NT
    # loop is unrolled twice: count per K step, whose MFMAs are the NN loop's.
    steps = nt["v_mfma_f32_16x16x16_bf16"] // nn["v_mfma_f32_16x16x16_bf16"]
    assert (nn["ds_write_b32"], nn["ds_write_b128"]) == (8, 2)
    assert (nt["ds_write_b32"], nt["ds_write_b128"] // steps) == (0, 4) and steps in (1, 2)


def test_row_major_b_is_read_with_the_transposing_lds_read_on_gfx950():
    nn = isa.inspect("gemm", "v4", "gfx950", overrides={"layout": "NN"})
    nt = isa.inspect("gemm", "v4", "gfx950", overrides={"layout": "NT"})
    assert "ds_read_b64_tr_b16" in _loop_ops(nn) and "ds_read_b64_tr_b16" not in _loop_ops(nt)
    assert _loads_into_lds(nn) and _loads_into_lds(nt)


@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
def test_v4_fits_two_waves_of_registers_without_spilling(target):
    report = isa.inspect("gemm", "v4", target)
    assert report.vgprs + (report.agprs or 0) <= 256 and (report.spills, report.sgpr_spills) == (0, 0)


# -- the scaled GEMMs' tile choices (kernels/gemm_fp8/launch.py, kernels/gemm_mxfp4/launch.py)

@pytest.mark.parametrize("rung, target, mfma", [
    ("v0", "gfx942", "v_mfma_f32_16x16x16_f16"),          # upcast: the fp16 matrix cores
    ("v1", "gfx942", "v_mfma_f32_16x16x32_fp8_fp8"),      # fnuz operands
    ("v1", "gfx950", "v_mfma_f32_16x16x128_f8f6f4"),      # OCP, the K=128 CDNA4 shape
])
def test_fp8_rungs_use_the_matrix_instruction_their_docstrings_name(rung, target, mfma):
    report = isa.inspect("gemm_fp8", rung, target)
    assert set(report.matrix_instructions) == {mfma}, report.summary()


@pytest.mark.parametrize("target, lds_kib", [("gfx942", 64), ("gfx950", 160)])
def test_fp8_tile_fits_lds_without_spills(target, lds_kib):
    report = isa.inspect("gemm_fp8", "v1", target)
    assert report.lds_bytes <= lds_kib * 1024
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()


def test_mxfp4_tiles_as_its_config_says():
    chosen = isa.inspect("gemm_mxfp4", "v0", "gfx950")
    assert (chosen.spills, chosen.sgpr_spills, chosen.scratch_bytes) == (0, 0, 0), chosen.summary()
    assert round(chosen.lds_bytes / 1024) == 70
    wider = isa.inspect("gemm_mxfp4", "v0", "gfx950", overrides={"BLOCK_M": 256})
    largest = isa.inspect("gemm_mxfp4", "v0", "gfx950", overrides={"BLOCK_M": 256, "BLOCK_N": 256})
    assert (wider.spills, wider.sgpr_spills) == (0, 0) and wider.lds_bytes <= 160 * 1024 and largest.spills > 0
    assert isa.inspect("gemm_mxfp4", "v0", "gfx942", overrides={"BLOCK_K": 256}).spills > 0


@pytest.mark.parametrize("arch, accepted", [("gfx942", False), ("gfx950", True)])
def test_the_lds_transpose_read_is_gfx950_only(arch, accepted):
    """Notebook 01: ds_read_b64_tr_b16, which v4's gfx950 loop reads B with, does not exist on gfx942."""
    assert _assembles(arch, "ds_read_b64_tr_b16 v[0:1], v2") is accepted


# -- notebook 00's register paragraph ---------------------------------------------------

_AGPR_OPERAND = re.compile(r"\ba\[?\d")


def test_agpr_alloc_0_is_a_floor_the_allocator_passes_when_256_vgprs_do_not_fit():
    """Notebook 00: Triton marks every kernel ``"amdgpu-agpr-alloc"="0"`` (it needs no AGPRs),
    a floor, not a ban. GEMM v4, well inside the 256 architectural VGPRs, gets none. Attention
    v5's dK/dV kernel needs more: all 256 VGPRs, AGPRs above ``accum_offset`` 256, MFMAs with
    AGPR operands, copies between the two halves, and one wave per SIMD."""
    v4 = isa.inspect("gemm", "v4", "gfx942")
    assert v4.llvm_attributes["amdgpu-agpr-alloc"] == "0" and v4.agprs == 0 and v4.vgprs < 256
    (dkdv,) = [r for r in isa.inspect_all("attention", "v5", "gfx942") if r.kernel_name == "_bwd_dkdv_kernel"]
    assert dkdv.llvm_attributes["amdgpu-agpr-alloc"] == "0"
    assert dkdv.vgprs == 256 and dkdv.agprs > 100 and dkdv.occupancy.value == 1, dkdv.summary()
    assert "\t\t.amdhsa_accum_offset 256" in dkdv.asm.splitlines()
    mfma_on_agprs = [line for line in dkdv.asm.splitlines()
                     if (isa_parse.mnemonic(line) or "").startswith("v_mfma") and _AGPR_OPERAND.search(line)]
    copies = [line for line in dkdv.asm.splitlines() if (isa_parse.mnemonic(line) or "").startswith("v_accvgpr")]
    assert mfma_on_agprs and copies


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_v6s_bias_epilogue_leaves_the_hot_loop_and_the_registers_as_they_are(target):
    """v6's docstring: nn.Linear's launch (NT, the prior config) with the bias epilogue has the
    hot loop, registers, spills and waves of the launch without, plus a few 8-byte bias loads."""
    plain, biased = (isa.inspect("gemm", "v6", target, torch.bfloat16, overrides={"layout": "NT", "HAS_BIAS": b})
                     for b in (False, True))

    def loop(report):
        return Counter(filter(None, map(isa_parse.mnemonic, report.hot_loop.splitlines())))

    assert loop(biased) == loop(plain)
    resources = ("vgprs", "agprs", "spills", "sgpr_spills", "scratch_bytes")
    assert [getattr(biased, r) for r in resources] == [getattr(plain, r) for r in resources]
    assert biased.occupancy.value == plain.occupancy.value
    extra = Counter(biased.global_loads) - Counter(plain.global_loads)
    assert extra and sum(extra.values()) <= 4 and all(name.endswith(("dwordx2", "dwordx4")) for name in extra), extra


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_v6s_split_tail_binary_runs_the_whole_tile_hot_loop(target):
    """v6's ``aot``: a launch with a split tail (SPLITS = 2, an integer argument, not the
    constant 1) is its own binary (``split_tail``); it keeps the whole-tile binary's hot loop,
    registers and waves, with no spill of either kind and no 8- or 16-bit LDS op."""
    whole, split = (isa.inspect("gemm", "v6", target, torch.bfloat16, overrides={"layout": "NT", "split_tail": tail})
                    for tail in (False, True))
    assert whole.kernel_name == split.kernel_name == "_gemm_persistent_kernel"
    assert whole.asm != split.asm   # another specialization, not the same binary twice

    def loop(report):
        return Counter(filter(None, map(isa_parse.mnemonic, report.hot_loop.splitlines())))

    assert loop(split) == loop(whole) and any(name.startswith("v_mfma") for name in loop(split))
    resources = ("vgprs", "agprs", "spills", "sgpr_spills", "scratch_bytes")
    assert [getattr(split, r) for r in resources] == [getattr(whole, r) for r in resources]
    assert split.spills == split.sgpr_spills == 0 and not split.narrow_lds_ops
    assert split.occupancy.value == whole.occupancy.value >= 2


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_v6s_fp32_c_stores_the_accumulator_as_it_is(target):
    """v6's docstring: the weight gradient's launch (TN, bf16 operands) into an fp32 C keeps the
    bf16 C's hot loop with its MFMAs, spills nothing in either kernel, stores 16 bytes at a time,
    C with twice the bytes of a bf16 C (the fix-up stores C alone; the main kernel C and its fp32
    partial tiles), and converts nothing to bf16 (seen on gfx950, which has an instruction for it)."""
    (main16, fix16), (main32, fix32) = (
        isa.inspect_all("gemm", "v6", target, torch.bfloat16, overrides={"layout": "TN", "fp32_c": fp32})
        for fp32 in (False, True))
    assert main32.kernel_name == "_gemm_persistent_kernel" and fix32.kernel_name == "_streamk_fixup_kernel"
    assert Counter(_loop_ops(main32)) == Counter(_loop_ops(main16))
    assert any(op.startswith("v_mfma") for op in _loop_ops(main32))
    for report in (main32, fix32):
        assert report.spills == report.sgpr_spills == report.scratch_bytes == 0, report.summary()
        assert set(stores(report)) == {16}, stores(report)
        assert not converts_to_bf16(report)
    assert converts_to_bf16(fix16) == (target == "gfx950")   # the check sees a bf16 C's conversion

    def stored(report):
        return sum(width * n for width, n in stores(report).items())

    c_bf16 = stored(fix16)
    assert stored(fix32) == 2 * c_bf16 and stored(main32) - stored(main16) == c_bf16
