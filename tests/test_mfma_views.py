"""Notebook 10's matrix-core sections (``workbench.views.mfma``), checked against the data
they read and against gfx942 compiles of GEMM v3 and v4 (cached by the ISA inspector)."""
from __future__ import annotations

import pytest

from workbench import isa
from workbench.views import mfma as mfma_views
from workbench.learn.interview import mfma as mfma_layout
from workbench.model import machine


def test_cycle_table_gives_the_spec_peak_on_gfx942_and_half_for_cdna3_shapes_on_gfx950():
    rows = mfma_views.instruction_rows()
    cdna3 = {r["instruction"] for r in rows if r["target"] == "gfx942"}
    assert cdna3 and {r["of spec peak"] for r in rows if r["target"] == "gfx942"} == {1}
    for r in (r for r in rows if r["target"] == "gfx950"):
        assert r["of spec peak"] == (0.5 if r["instruction"] in cdna3 else 1), r


def test_fragment_bytes_and_accumulator_registers_per_lane():
    big, small = mfma_views.fragment("v_mfma_f32_32x32x8_bf16"), mfma_views.fragment("v_mfma_f32_16x16x16_bf16")
    assert (big["A bytes/lane"], big["B bytes/lane"], big["MACs"]) == (8, 8, 8192)
    assert (small["A bytes/lane"], small["B bytes/lane"], small["MACs"]) == (8, 8, 4096)
    assert (big["operand bytes/MAC"], small["operand bytes/MAC"]) == (0.125, 0.25)
    assert (big["C fp32 registers/lane"], small["C fp32 registers/lane"]) == (16, 4)


@pytest.mark.parametrize("rung", ["v3", "v4"])
def test_accumulator_registers_are_what_the_compiled_mfma_writes(rung):
    (name, width), = mfma_layout.destination_widths(isa.inspect("gemm", rung, "gfx942")).items()
    assert width == mfma_views.fragment(name)["C fp32 registers/lane"]


def test_lds_bytes_per_mac_follow_the_wave_tile_not_the_instruction():
    v3, v4, v4_32 = mfma_views.gemm_rows()
    assert (v3["instruction"], v4["instruction"], v4_32["instruction"]) == (
        "v_mfma_f32_32x32x8_bf16", "v_mfma_f32_16x16x16_bf16", "v_mfma_f32_32x32x8_bf16")
    assert v4["matrix_instr_nonkdim"] == 16 and v4_32["matrix_instr_nonkdim"] == 32
    assert v3["LDS read bytes/MAC"] == v4["LDS read bytes/MAC"] == v4_32["LDS read bytes/MAC"] == 2 * (32 + 64) / (32 * 64)
    assert v4["operand bytes/MAC"] == 2 * v4_32["operand bytes/MAC"]


def test_accumulators_live_in_vgprs_below_accum_offset():
    for row in mfma_views.gemm_rows():
        assert row["AGPRs"] == 0 and row["accum_offset"] == -(-row["VGPRs"] // 4) * 4, row


def test_a_clock_is_applied_only_to_the_run_it_was_measured_in():
    rows = mfma_views.ceiling_rows()
    assert rows and all(r["source"] != "MAF2" or r["MFMA-load clock MHz"] == machine.load_clock_mhz(r["GPU"], r["dtype"])[0]
                        for r in rows)
    other = [r for r in rows if r["source"] != "MAF2"]
    assert other and all(r["MFMA-load clock MHz"] is None and r["of peak at load clock"] is None for r in other)


def test_a_name_that_is_not_a_dense_mfma_is_refused_by_name():
    with pytest.raises(ValueError, match="v_mfma_f32_32x32x8bf16"):
        mfma_views.fragment("v_mfma_f32_32x32x8bf16")
