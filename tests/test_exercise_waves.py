"""The gemm/v4-waves exercise states what the compiler shows about waves_per_eu.

Its text names compiled facts (v4's VGPRs with and without the option, the occupancy the
option costs, the compiler's own figure, the registers and spills a high floor forces), so
each is read from a gfx942 compile here and looked up in the text: a statement the compiler
no longer backs fails, as does a title or question that says the option buys occupancy.
"""
from __future__ import annotations

import pytest

from workbench import exercises, isa
from workbench.isa.occupancy import CDNA_VGPRS_PER_LANE, SIMDS_PER_CU

EXERCISE = exercises.get("gemm/v4-waves")
WORDS = " ".join([EXERCISE.title, EXERCISE.question, *EXERCISE.hints, EXERCISE.explain])


def _v4(waves_per_eu: int):
    return isa.inspect("gemm", "v4", "gfx942", overrides={"waves_per_eu": waves_per_eu})


def test_the_title_names_a_floor_and_a_ceiling_not_occupancy_bought():
    assert "floor and a ceiling" in EXERCISE.title and "buys" not in WORDS


def test_the_rung_s_option_lowers_occupancy_with_the_same_vgprs():
    shipped, free = isa.inspect("gemm", "v4", "gfx942"), _v4(0)
    waves = shipped.options["waves_per_eu"]
    assert f'amdgpu-waves-per-eu="{waves},{waves}"' in EXERCISE.question
    assert shipped.llvm_attributes["amdgpu-waves-per-eu"] == f"{waves},{waves}"
    assert shipped.vgprs == free.vgprs and f"{free.vgprs} VGPRs with or without it" in EXERCISE.question
    assert f"room for {free.occupancy.limits['VGPRs']} waves" in EXERCISE.question
    assert f"from {free.occupancy.value} to {shipped.occupancy.value}" in EXERCISE.question
    assert free.occupancy.value > shipped.occupancy.value


def test_at_three_the_registers_leave_room_and_whole_workgroups_round_down(tmp_path):
    asked = _v4(3)
    room = {n: _v4(n).occupancy.limits["VGPRs"] for n in (0, 2, 3)}
    assert set(room.values()) == {4} and "room for 4 waves at 0, 2 and 3 alike" in EXERCISE.hints[1]
    warps = asked.options["num_warps"]
    assert f"{warps} waves per workgroup on hip, {warps // SIMDS_PER_CU} per SIMD" in EXERCISE.hints[2]
    assert f"`; Occupancy: {asked.occupancy.compiler}`" in EXERCISE.explain
    assert f"round it down to {asked.occupancy.value}" in EXERCISE.explain
    assert asked.occupancy.value == _v4(2).occupancy.value == EXERCISE.answer()
    assert exercises.check(EXERCISE.key, answer=asked.occupancy.value,
                           progress_file=tmp_path / "progress.json").passed


def test_a_floor_above_what_the_registers_allow_forces_spills_and_buys_v4_nothing():
    forced = _v4(5)
    assert forced.vgprs <= CDNA_VGPRS_PER_LANE // 5 and forced.spills > 0
    assert f"at waves_per_eu=5 it is pressed into {forced.vgprs} VGPRs and spills" in EXERCISE.explain
    assert forced.occupancy.limited_by == "LDS" and forced.lds_bytes == 32 * 1024
    assert f"32 KiB of LDS still holds it at {forced.occupancy.value} waves" in EXERCISE.explain


@pytest.mark.parametrize("waves_per_eu", range(1, 9))
def test_v4_never_gains_occupancy_from_the_option(waves_per_eu):
    assert "v4 never gains" in EXERCISE.explain
    assert _v4(waves_per_eu).occupancy.value <= _v4(0).occupancy.value


def test_a_request_below_what_one_workgroup_implies_caps_nothing_as_in_the_compiler():
    """v4's 8 waves per workgroup spread over 4 SIMDs imply 2 per SIMD; LLVM drops a
    request of 1 (``getWavesPerEU``), so v4 keeps the occupancy it has without the option."""
    asked, free = _v4(1), _v4(0)
    assert asked.occupancy.value == free.occupancy.value == asked.occupancy.compiler
