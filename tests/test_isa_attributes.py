"""The AMD knobs as LLVM receives them: a report carries the IR's "amdgpu-*" attributes,
which the assembly no longer shows (notebook 00 reads waves_per_eu and num_warps there)."""
from __future__ import annotations

from workbench import isa
from workbench.isa.compile import amdgpu_attributes


def test_attributes_are_read_from_the_ir():
    llir = 'attributes #0 = { "amdgpu-flat-work-group-size"="1,256" "amdgpu-waves-per-eu"="2,2" "other"="x" }'
    assert amdgpu_attributes(llir) == {"amdgpu-flat-work-group-size": "1,256", "amdgpu-waves-per-eu": "2,2"}
    assert amdgpu_attributes("") == {}


def test_waves_per_eu_becomes_a_floor_and_a_ceiling_and_num_warps_counts_64_lane_waves():
    report = isa.inspect("gemm", "v4", "gfx942")
    waves, warps = report.options["waves_per_eu"], report.options["num_warps"]
    assert report.llvm_attributes["amdgpu-waves-per-eu"] == f"{waves},{waves}"
    assert report.llvm_attributes["amdgpu-flat-work-group-size"] == f"1,{warps * 64}"
    assert isa.inspect("gemm", "v4", "sm90").llvm_attributes == {}
