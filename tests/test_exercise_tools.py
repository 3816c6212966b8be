"""The tools the GEMM exercises grade with: the ISA inspector on a learner's file, and the
trace of which tile each program writes."""
from __future__ import annotations

import importlib

import pytest
import torch

import kernels
from workbench import exercises, isa
from workbench.views.source import rung_diff
from workbench.learn.exercises import source, tiles


@pytest.mark.timeout(600)
def test_isa_compiles_a_learners_file_and_sees_its_edits(tmp_path):
    copy = tmp_path / "gemm_v4.py"
    copy.write_text(source.render("kernels.gemm.v4_lds_pipeline"))
    mine = isa.inspect("gemm", "v4", "gfx942", source=copy, overrides={"waves_per_eu": 3})
    package = isa.inspect("gemm", "v4", "gfx942", overrides={"waves_per_eu": 3})
    assert mine.matrix_instructions == package.matrix_instructions
    assert mine.occupancy.value == package.occupancy.value
    assert mine.options["waves_per_eu"] == 3 and "gemm_v4.py" in mine.rung
    # The same path, edited: v3's K-masked loop puts a vector compare back in the hot loop.
    copy.write_text(source.render("kernels.gemm.v4_lds_pipeline", exercises.get("gemm/v4").todo))
    edited = isa.inspect("gemm", "v4", "gfx942", source=copy)
    assert "v_cmp" in edited.hot_loop and "v_cmp" not in package.hot_loop


def test_isa_source_must_be_a_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a file"):
        isa.inspect("gemm", "v4", source=tmp_path / "missing.py")


@pytest.mark.timeout(300)
def test_traced_names_the_tile_of_each_program():
    rung = kernels.get("gemm", "v3")
    a, b = kernels.spec("gemm").make_inputs((40, 50, 8), torch.float32, seed=0)  # 2 x 2 tiles of 32
    with tiles.traced(importlib.import_module(rung.module), "_gemm_grouped_kernel") as order:
        c = rung.fn(a, b)
    assert order == [((0, 0),), ((1, 0),), ((0, 1),), ((1, 1),)]  # GROUP_M 2: down a column, then right
    torch.testing.assert_close(c, a @ b)                          # the launch still completes
    assert tiles.first_difference(order, [((0, 0),), ((0, 1),), ((1, 0),), ((1, 1),)]) == 1
    assert tiles.first_difference(order, order) is None


def test_rung_diffs_leave_the_exercise_markers_out():
    diff = rung_diff(kernels.get("gemm", "v3"))        # v2 and v3 both carry marked blocks
    assert "# exercise" not in diff
    assert "+    pid_m = first_m + (pid % group_size) % rows_in_group" in diff
    assert "for k0 in range(0, K, BLOCK_K)" not in diff   # the K loop is the same in both
