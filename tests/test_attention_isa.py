"""Attention's machine code, compiled ahead of time: what the docstrings and the notebook
claim about the top forward (v3) and backward (v5) kernels, on gfx942 and gfx950 (and v5's
backward on sm90: wgmma products, no scratch).

MFMA for every product: the hot loop's MFMAs, times their M·N·K and the waves of a
program, cover the multiply-adds of all the ``tl.dot`` products of one loop trip
(forward: QKᵀ and PV; dK/dV: Sᵀ, dPᵀ, dV, dK; dQ: S, dP, dQ), so none of them fell
back to vector FMAs. Each product of a trip is BLOCK_M x BLOCK_N x D (D = 128) in some
order: v3's 64 x 64 blocks, v5's priors per kernel.
"""
from __future__ import annotations

import inspect
import re

import pytest
import torch

from kernels.attention import v3_causal_lse, v4_amd_tuned, v5_backward
from workbench import isa
from workbench.isa import parse as isa_parse
from workbench.model import loop

TOP = [("v3", "_flash_fwd_lse_kernel"), ("v5", "_bwd_dkdv_kernel"), ("v5", "_bwd_dq_kernel")]


PRODUCTS = {"_flash_fwd_lse_kernel": 2, "_bwd_dkdv_kernel": 4, "_bwd_dq_kernel": 3}
BACKWARD = {"_bwd_dkdv_kernel": "dkdv", "_bwd_dq_kernel": "dq"}


def _macs_per_product(kernel: str, target: str) -> int:
    """BLOCK_M·BLOCK_N·D of the config the launch compiled (aot: D = 128)."""
    if kernel in BACKWARD:
        cfg = v5_backward.prior("hip", target, 128)[BACKWARD[kernel]]
    else:
        cfg = v3_causal_lse.config("hip", 128)
    return cfg["BLOCK_M"] * cfg["BLOCK_N"] * 128


def _report(label, kernel, target, dtype=torch.bfloat16):
    reports = {r.kernel_name: r for r in isa.inspect_all("attention", label, target, dtype)}
    return reports[kernel]


def _loop_ops(report) -> list[str]:
    return [m for m in map(isa_parse.mnemonic, report.hot_loop.splitlines()) if m]


@pytest.mark.parametrize("label,kernel,target", [
    pytest.param(label, kernel, target, id=f"{kernel}-{target}") for label, kernel in TOP for target in ("gfx942", "gfx950")])
def test_top_kernels_use_mfma_for_both_products_stage_through_lds_and_do_not_spill(label, kernel, target):
    report = _report(label, kernel, target)
    ops = _loop_ops(report)
    shapes = [re.match(r"v_mfma_f32_(\d+)x(\d+)x(\d+)_bf16", op) for op in ops]
    macs = sum(int(m[1]) * int(m[2]) * int(m[3]) for m in shapes if m)
    waves = report.options["num_warps"]
    assert macs * waves >= PRODUCTS[kernel] * _macs_per_product(kernel, target), report.matrix_instructions
    assert report.lds_bytes > 0 and any(op.startswith("ds_write") for op in ops)
    assert any(op.startswith("ds_read") for op in ops)
    assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
    assert report.occupancy.value >= 1 and report.occupancy.limited_by


def test_v1_spills_where_v2_does_not():
    """v1's docstring: holding the whole key row spills on gfx942 even at S_k = 256 (D = 128);
    gfx950 holds it. v2 spills on neither (its mask is one compare per score)."""
    v1 = {target: isa.inspect("attention", "v1", target) for target in ("gfx942", "gfx950")}
    assert v1["gfx942"].spills > 0 and (v1["gfx950"].spills, v1["gfx950"].vgprs) == (0, 188)
    for target in ("gfx942", "gfx950"):
        v2 = isa.inspect("attention", "v2", target)
        assert (v2.spills, v2.sgpr_spills, v2.scratch_bytes) == (0, 0, 0), v2.summary()


@pytest.mark.parametrize("label", ["v0", "v1", "v2", "v3", "v5"])
def test_every_rung_compiles_for_sm90(label):
    reports = isa.inspect_all("attention", label, "sm90")
    assert reports and all(r.asm for r in reports)


def _lds16(ops: list[str]) -> list[str]:
    """The loop's 16-bit LDS accesses (``ds_write_b16``, ``ds_write_b16_d16_hi``, ``ds_read_u16``...)."""
    return [op for op in ops if re.fullmatch(r"ds_(write_b16|read_[iu]16)(_d16(_hi)?)?", op)]


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_p_reaches_the_second_mfma_through_lds(target):
    """Notebook 02: 16-bit LDS stores in the forward loop change P's layout between products
    (v2's and v3's 64 x 64 tile of 32x32 MFMAs; v4's priors do without, below)."""
    for label in ("v2", "v3"):
        assert any(op.startswith("ds_write_b16") for op in _loop_ops(isa.inspect("attention", label, target)))


def _int_compares(ops: list[str]) -> list[str]:
    """Vector integer order compares: the causal and bounds masks (key <= row, key < S_k; the
    softmax's compares are on floats). Equality is no mask: gfx950's packed forward picks a
    load address by lane parity in its hot loop (``v_cmp_eq_u32 1, lane & 1``)."""
    return [op for op in ops if re.fullmatch(r"v_cmp_(lt|le|gt|ge)_[iu](32|64)(_e32|_e64)?", op)]


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("overrides", [None, {"VARLEN": True}], ids=["dense", "varlen"])
def test_forward_main_loop_carries_no_mask(target, overrides):
    """v3's docstring: the key tiles every row sees run in a loop without causal or bounds
    masks; the diagonal (and ragged) tiles run in a second, masked copy of the body. The hot
    loop is the unmasked one: no integer compare in it, and it holds half the kernel's MFMAs.
    Also where nothing about the lengths is known (VARLEN: EVEN is False)."""
    report = isa.inspect("attention", "v3", target, overrides=overrides)
    loop = _loop_ops(report)
    everything = [m for m in map(isa_parse.mnemonic, report.asm.splitlines()) if m]
    assert not _int_compares(loop) and _int_compares(everything)
    mfmas = [op for op in loop if op.startswith("v_mfma")]
    assert mfmas and 2 * len(mfmas) == sum(1 for op in everything if op.startswith("v_mfma"))


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
@pytest.mark.parametrize("overrides", [None, {"VARLEN": True}], ids=["dense", "varlen"])
def test_v4_priors_do_not_spill_and_keep_two_waves(target, overrides):
    """v4's docstring: the prior of each head-dim class (D = 128 and 64) compiles without
    spills, keeps two waves per SIMD and multiplies in the hot loop with 16x16 MFMAs, without
    16-bit LDS accesses or masks; at D = 128 it holds more LDS than v3 (its larger tiles,
    at one stage as at two: the next test). Also
    packed (``VARLEN``, ``kernels.flash_attention_varlen``: the lengths read on the device, so
    every key tile past the whole ones is bounds-masked), where at D = 128 on gfx942 a Kᵀ-tile
    load of K spilled a VGPR (v3's comment at ``k_ptrs``).
    (Every other config of the space, dense: ``tests/test_attention_tuning.py``.)"""
    v3 = isa.inspect("attention", "v3", target)
    reports = isa.inspect_all("attention", "v4", target, overrides=overrides)     # D = 128, then D = 64
    assert len(reports) == 2 and reports[0].lds_bytes > v3.lds_bytes
    for report in reports:
        ops = _loop_ops(report)
        assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()
        assert report.occupancy.value >= 2
        mfmas = [op for op in ops if op.startswith("v_mfma")]
        assert mfmas and all("_16x16x" in op for op in mfmas), report.matrix_instructions
        assert not _lds16(ops) and not _int_compares(ops)


def test_v4_second_stage_prefetches_into_registers_not_a_second_lds_buffer():
    """v4's docstring and notebook 02, gfx942: the priors' ``num_stages=2`` leaves the LDS
    as it is at one stage (the K/V prefetch waits in VGPRs, which grow); v4's LDS at
    D = 128 is twice v3's at either stage. ``waves_per_eu=2`` changes nothing there: the
    VGPRs already allow two waves per SIMD and no more."""
    v3 = isa.inspect("attention", "v3", "gfx942")
    for d in (128, 64):
        one, two, free = (isa.inspect_all("attention", "v4", "gfx942", overrides={"BLOCK_D": d, **more})[0]
                          for more in ({"num_stages": 1}, {}, {"waves_per_eu": 0}))
        assert (one.options["num_stages"], two.options["num_stages"], two.options["waves_per_eu"]) == (1, 2, 2)
        assert one.lds_bytes == two.lds_bytes and one.vgprs < two.vgprs, (one.summary(), two.summary())
        assert (free.vgprs, free.occupancy.value) == (two.vgprs, two.occupancy.value) == (free.vgprs, 2)
        if d == 128:
            assert two.lds_bytes == 2 * v3.lds_bytes


def test_v4_takes_16x16_mfmas_at_d128_because_32x32_go_through_16bit_lds_on_gfx942():
    """v4's docstring and the "attention/v4" question: at D = 128 the prior (a 128 x 64 tile,
    8 waves, two stages) runs 16x16 MFMAs with no 8- or 16-bit LDS access; with 32x32 ones the
    same launch also compiles without spilling at two waves per SIMD, but moves operands
    through LDS two bytes at a time in its hot loop."""
    shipped = isa.inspect_all("attention", "v4", "gfx942")[0]
    assert (shipped.options["num_warps"], shipped.options["num_stages"]) == (8, 2)
    assert all("_16x16x" in op for op in shipped.matrix_instructions), shipped.matrix_instructions
    wider = isa.inspect_all("attention", "v4", "gfx942", overrides={"matrix_instr_nonkdim": 32})[0]
    for report in (shipped, wider):
        assert (report.spills, report.sgpr_spills) == (0, 0) and report.occupancy.value >= 2, report.summary()
    assert shipped.narrow_lds_ops == 0 and _lds16(_loop_ops(wider)), wider.summary()


def _lines_of(fn) -> range:
    src, first = inspect.getsourcelines(fn.fn)
    return range(first, first + len(src))


def test_v4_keeps_p_in_registers_and_its_32x32_variant_sends_p_through_lds():
    """Notebook 02's "P in registers": in the prior's hot loop (gfx942, D = 128) every LDS
    store is a K or V tile's (``_load``'s lines) and P's bf16 rounding touches no LDS; with
    32x32 MFMAs its 16-bit stores and loads are at that rounding, two per P value a lane holds."""
    by_line = {}
    for name, overrides in (("16x16", None), ("32x32", {"matrix_instr_nonkdim": 32})):
        report = isa.inspect("attention", "v4", "gfx942", overrides=overrides)
        by_line[name] = isa_parse.by_source_line(report.hot_loop.splitlines(), "v3_causal_lse.py")
    load, rounding = _lines_of(v3_causal_lse._load), _lines_of(v3_causal_lse._bf16_by_bits)
    assert {line for op, line in by_line["16x16"] if op.startswith("ds_write")} <= set(load)
    assert not [op for op, line in by_line["16x16"] if line in rounding and op.startswith("ds_")]
    cfg = v4_amd_tuned.prior("hip", "gfx942", 128)
    per_lane = cfg["BLOCK_M"] * cfg["BLOCK_N"] // (cfg["num_warps"] * 64)
    narrow = [op for op, line in by_line["32x32"] if line in rounding and op in ("ds_write_b16_d16_hi", "ds_read_u16")]
    assert sorted(set(narrow)) == ["ds_read_u16", "ds_write_b16_d16_hi"] and len(narrow) == 2 * 2 * per_lane


def test_v4_exponentials_per_key_block_do_not_grow_with_the_head_dim():
    """Notebook 02's "exp against the matrix cores" (gfx942): per wave and key block, one
    v_exp_f32 per P value a lane holds plus one per row it holds (the rescale), at D = 128 and 64; per
    program the same count at both, while the MFMA cycles halve at D = 64."""
    per_program = {}
    for d in (128, 64):
        report = isa.inspect("attention", "v4", "gfx942", overrides={"BLOCK_D": d})
        cfg = v4_amd_tuned.prior("hip", "gfx942", d)
        exps = sum(1 for op in _loop_ops(report) if op.startswith("v_exp_f32"))
        p_per_lane = cfg["BLOCK_M"] * cfg["BLOCK_N"] // (cfg["num_warps"] * 64)
        rows_per_lane = cfg["BLOCK_M"] // cfg["num_warps"] // 16   # a 16x16 MFMA spreads a wave's rows over 16 lanes
        assert exps == p_per_lane + rows_per_lane, (d, exps, p_per_lane, rows_per_lane)
        per_program[d] = (exps * cfg["num_warps"], loop.mix(report.hot_loop, "gfx942").mfma_cycles * cfg["num_warps"])
    assert per_program[128][0] == per_program[64][0] and per_program[128][1] == 2 * per_program[64][1], per_program


# gfx942, bf16: (instructions, VGPRs, MFMAs) of each dense kernel, recorded at commit
# 7471117, before the kernels took VARLEN, and again when dK/dV took its S as Q Kᵀ (from
# 2815 instructions to 2392). The dense launch passes VARLEN=False and None offsets, and
# a positive scale SCALE_SIGN=1 (constexprs), so its code must not change by a single
# instruction (a runtime sign flip of Q had cost the forward 229 and dQ 226 instructions).
# Recorded again when the compile took the JIT's tt.pointer_range (buffer loads, issue 18),
# from (1873, 256, 48), (2392, 256, 96) and (1756, 255, 80): the binary the GPU runs.
# Recorded again for v5 when its kernels took their own tuned tiles (issue 18: dK/dV 32 x 128
# and dQ 128 x 32 with 16x16 MFMAs, Sᵀ = K Qᵀ, a masked diagonal loop beside an unmasked one),
# from (2120, 255, 96) and (1510, 256, 80); and for the forward when its key loop split in two
# (issue 18): an unmasked copy of the body and a masked one for the diagonal tiles, so twice
# the MFMAs in the code (not executed), and P rounded to bf16 in integer ops on gfx942; from
# (1827, 248, 48); and for the forward when it read K as rows, transposed on chip, instead of
# as a Kᵀ tile (issue 18: v4's D = 128 prior spilled a VGPR packed), from (2257, 256, 96);
# and for dQ when its prior became the 2-wave 64 x 32 tile on 4 warps (issue 18: the table puts
# more waves/SIMD first, ``tune_space.prior_first``), from (2039, 256, 192).
BEFORE_VARLEN = {"_flash_fwd_lse_kernel": (2302, 256, 96), "_bwd_dkdv_kernel": (3383, 256, 256),
                 "_bwd_dq_kernel": (1300, 208, 96)}


def _instructions(report) -> int:
    return sum(1 for line in report.asm.splitlines() if isa_parse.mnemonic(line))


@pytest.mark.parametrize("label,kernel", TOP, ids=[k for _, k in TOP])
def test_dense_kernels_compile_as_before_varlen(label, kernel):
    report = _report(label, kernel, "gfx942")
    counts = (_instructions(report), report.vgprs, sum(report.matrix_instructions.values()))
    assert counts == BEFORE_VARLEN[kernel], report.summary()


@pytest.mark.parametrize("label", ["v3", "v5"])
def test_varlen_kernels_keep_the_mfmas_and_do_not_spill(label):
    """v3's Limits: the packed kernels multiply as the dense ones do, without spilling."""
    dense = isa.inspect_all("attention", label, "gfx942")
    for report, packed in zip(dense, isa.inspect_all("attention", label, "gfx942", overrides={"VARLEN": True})):
        assert packed.matrix_instructions == report.matrix_instructions
        assert (packed.spills, packed.sgpr_spills, packed.scratch_bytes) == (0, 0, 0), packed.summary()


@pytest.mark.parametrize("target,overrides", [
    pytest.param(target, {**varlen, **d}, id=f"{target}-{'varlen' if varlen else 'dense'}{'-D64' if d else ''}")
    for target in ("gfx942", "gfx950") for d in ({}, {"BLOCK_D": 64}) for varlen in ({}, {"VARLEN": True})])
def test_backward_kernels_take_16x16_mfmas_move_no_narrow_elements_through_lds_and_do_not_spill(
        target, overrides):
    """v5's docstring (issue 18's bar): dK/dV and dQ, dense and packed, at D = 128 and at
    D = 64 (the head dim of both GPU training presets), as the JIT compiles their priors,
    multiply with 16x16 MFMAs in the hot loop, have no 8- or 16-bit LDS read or write
    anywhere (P and dS reach their products in registers) and spill nothing."""
    reports = isa.inspect_all("attention", "v5", target, overrides=overrides)
    assert [r.kernel_name for r in reports] == list(BACKWARD)
    for report in reports:
        mfmas = [op for op in _loop_ops(report) if op.startswith("v_mfma")]
        assert mfmas and all("_16x16x" in op for op in mfmas), report.matrix_instructions
        assert report.narrow_lds_ops == 0, report.summary()
        assert (report.spills, report.sgpr_spills, report.scratch_bytes) == (0, 0, 0), report.summary()


@pytest.mark.parametrize("overrides", [
    pytest.param({**varlen, **d}, id=f"{'varlen' if varlen else 'dense'}{'-D64' if d else ''}")
    for d in ({}, {"BLOCK_D": 64}) for varlen in ({}, {"VARLEN": True})])
def test_backward_kernels_take_wgmma_in_every_loop_and_use_no_scratch_on_sm90(overrides):
    """``configs_backward.HOPPER_TILES``: on sm90 dK/dV's and dQ's priors, dense and packed, at
    D = 128 and D = 64, multiply with warpgroup ``wgmma`` products in both loops with products
    (masked and unmasked) and nowhere with one warp's ``mma.sync`` (dK/dV's 32 x 32 tile, its
    D = 128 prior before, has no 64-row warpgroup shape), and use no scratch."""
    reports = isa.inspect_all("attention", "v5", "sm90", overrides=overrides)
    assert [r.kernel_name for r in reports] == list(BACKWARD)
    for report in reports:
        loops = isa_parse.matrix_loops(isa_parse.code_lines(report.asm, "ptx"), "ptx")
        products = [[op for op in map(isa_parse.mnemonic, loop) if op and isa_parse.category(op, "ptx") == "matrix"]
                    for loop in loops]
        assert len(loops) == 2 and all(ops and all(op.startswith("wgmma.mma_async") for op in ops)
                                       for ops in products), (report.kernel_name, report.options, products)
        assert (report.warp_products, report.scratch_bytes) == (0, 0), report.summary()


def _masking(ops: list[str]) -> tuple[int, int]:
    """(selects, per-lane integer compares): what a mask of index comparisons compiles to."""
    return (sum(op.startswith("v_cndmask") for op in ops),
            sum(bool(re.match(r"v_cmp\w*_[iu](?:16|32|64)", op)) for op in ops))


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_causal_backward_masks_only_the_diagonal_blocks(target):
    """v5's docstring: the causal kernels' unmasked loop (the blocks off the diagonal) compares
    and selects no more than the non-causal kernels' unmasked loop does (each kernel's loop with
    MFMAs that masks least: which of a kernel's two loops is the shorter, the inspector's hot
    loop, depends on the config); the causal compare lives in a second loop, over the diagonal
    blocks, with MFMAs of its own."""
    causal = isa.inspect_all("attention", "v5", target)
    full = isa.inspect_all("attention", "v5", target, overrides={"CAUSAL": False})
    for masked, unmasked in zip(causal, full):
        loops = [_unmasked_loop(report) for report in (masked, unmasked)]
        assert _masking(loops[0]) == _masking(loops[1]), masked.kernel_name
        loop_mfmas = sum(op.startswith("v_mfma") for op in loops[0])
        assert sum(masked.matrix_instructions.values()) >= 2 * loop_mfmas, masked.kernel_name


def _unmasked_loop(report) -> list[str]:
    """The mnemonics of the kernel's loop with MFMAs that compares and selects least."""
    loops = isa_parse.matrix_loops(report.asm.splitlines(), report.dialect)
    return min(([m for m in map(isa_parse.mnemonic, loop) if m] for loop in loops), key=_masking)


def test_k_is_read_as_rows_on_cdna3_only_and_gfx950_s_hot_loop_has_no_lane_permutes():
    """``launch.k_rows``: K is read as rows on CDNA3 (where that keeps the packed prior from
    spilling: the test above), and as a Kᵀ tile elsewhere; gfx950's hot loop then holds no
    ``ds_bpermute_b32`` (reading rows there was measured to add two, commit 5346b38)."""
    from kernels.attention.launch import k_rows
    assert k_rows("hip", "gfx942") and not k_rows("hip", "gfx950") and not k_rows("interpreter", "cpu")
    assert not any(op.startswith("ds_bpermute") for op in _loop_ops(isa.inspect("attention", "v4", "gfx950")))
