"""The interview deck's numbers, checked against sources other than the cards' prose.

A card that states a number in its question asserts it here; answers that come from the
documented MFMA layout, the bank model or the cost model are checked against an
independent derivation (closed forms, torch, the ISA report).
"""
from __future__ import annotations

import math

import pytest
import torch

import roofline
from workbench import isa
from workbench.isa import occupancy as occ
from workbench.learn.interview import attention_backward, distributed, fp8, gpus, mfma, occupancy, reduction, swizzle

pytestmark = pytest.mark.timeout(300)


def test_mfma_fragment_layout_and_compiled_register_widths():
    assert mfma.covers_once(16) and mfma.covers_once(32)
    assert mfma.c_element(16, 21, 3) == (7, 5) and mfma.c_element(32, 33, 5) == (8 + 4 + 1, 1)
    widths = {r["instruction"]: r["C registers per lane (compiled)"] for r in mfma.width_rows()}
    assert widths == {"v_mfma_f32_32x32x8_bf16": 16, "v_mfma_f32_16x16x16_bf16": 4}
    row = mfma.mfma_per_step()
    assert row["MFMAs per wave per K step (arithmetic)"] == row["MFMAs in the compiled hot loop"] == 32
    with pytest.raises(ValueError, match="m must be 16 or 32"):
        mfma.c_element(8, 0, 0)


def test_reduction_steps_and_cross_lane_instructions():
    assert (reduction.butterfly_steps(64), reduction.butterfly_steps(32)) == (6, 5) == (
        int(math.log2(64)), int(math.log2(32)))
    rows = {r["target"]: r for r in reduction.cross_lane_rows()}
    assert rows["gfx942"]["ds_bpermute_b32"] > 0 and rows["gfx950"]["ds_bpermute_b32"] == 0
    assert rows["gfx950"]["v_permlane16_swap_b32_e32"] > 0 and rows["gfx950"]["v_permlane32_swap_b32_e32"] > 0


def test_bank_model():
    assert swizzle.column_read(256) == 32 and swizzle.column_read(260) == 1 and swizzle.column_read(264) == 2
    degrees = {r["layout"]: r["conflict degree (ds_read_b128)"] for r in swizzle.swizzle_rows()}
    assert degrees["no swizzle"] == 8 and degrees["XOR the 16-byte chunk with row % 8"] == 1
    assert swizzle.conflict_degree([0] * 64, 4) == 1                   # one word for all: a broadcast
    with pytest.raises(ValueError, match="width must be 4, 8 or 16"):
        swizzle.conflict_degree([0], 2)


def test_occupancy_numbers_the_questions_state():
    stage3 = next(r for r in occupancy.v4_lds_by_stages() if r["num_stages"] == 3)
    assert stage3["LDS bytes"] == 64 * 1024
    assert isa.inspect("gemm", "v4", "gfx942", overrides={"num_stages": 3}).options["num_warps"] == 8
    assert [r["LDS bytes"] for r in occupancy.v4_lds_by_stages()] == [16384, 32768, 65536]
    assert occ.waves_per_simd_from_vgprs(128, 64) == 512 // 192 == 2
    assert occ.whole_workgroups(3, 8) == 2
    assert occupancy.dkdv().occupancy.value == 1


def test_attention_backward_identities():
    assert all(r["max |rowsum(dO∘O) - rowsum(P∘dP)|"] < 1e-12 for r in attention_backward.delta_rows())
    assert [r["products"] for r in attention_backward.product_rows()] == [5, 7]
    assert attention_backward.atomic_rows()[0]["elements that differ between orders"] > 0


def test_fp8_facts():
    finite, zero, top = fp8.byte_rows()
    assert finite["OCP value / fnuz value"] == [2.0] and finite["count"] == 252
    assert math.isnan(zero["fnuz"]) and top["fnuz"] == [240.0, -240.0]
    assert torch.tensor([448.0]).to(torch.float8_e4m3fn).view(torch.float8_e4m3fnuz).float().item() == 224.0
    eps = {r["format"]: r["eps"] for r in fp8.format_rows()}
    assert eps == {"float8_e4m3fnuz": 0.125, "float8_e5m2fnuz": 0.25, "float8_e4m3fn": 0.125, "float8_e5m2": 0.25}
    assert fp8.granularity_rows()[0]["ratio"] < 1.1 < fp8.granularity_rows()[-1]["ratio"]


def test_expert_parallel_rows_against_closed_forms():
    rows = distributed.routing_rows()[0]
    # expected distinct ranks of 8 experts out of 256 drawn without replacement, 32 per rank
    expected = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))
    assert rows["rows per token, naive"] == 8 and abs(rows["rows per token, dedup"] - expected) < 0.05
    times = {(r["latency"], r["algorithm"]): r["ms"] for r in distributed.all_to_all_rows()}
    assert times[("given", "pairwise")] - times[("given", "direct")] == pytest.approx(6 * distributed.ALPHA_S * 1e3)


def test_gpu_comparisons_from_the_specs():
    mi300x, h100, h200 = (roofline.spec(n) for n in gpus.RIVALS)
    assert [r["GPU"] for r in gpus.capacity_rows() if r["left after the weights"] >= gpus.KV_GB] == ["MI300X"]
    ratios = [r["MI300X / it, HBM"] for r in gpus.bandwidth_rows()]
    assert ratios == [round(mi300x.hbm_tbps / h100.hbm_tbps, 2), round(mi300x.hbm_tbps / h200.hbm_tbps, 2)]
