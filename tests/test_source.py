"""Kernel source and rung-to-rung diffs come from the package, not from copies."""
from __future__ import annotations

import kernels
from workbench.learn.exercises.source import module_source
from workbench.views.source import previous_rung, rung_diff, rung_source, show_diff


def test_source_is_the_module_that_registers_the_rung():
    v2 = kernels.get("gemm", 2)
    assert "def _gemm_tile_kernel" in rung_source(v2) and "@rung(" in rung_source(v2)


def test_previous_rung_follows_ladder_order():
    ladder = kernels.variants("gemm", include_ref=False)
    assert previous_rung(ladder[0]) is None
    assert previous_rung(kernels.get("gemm", "ref")) is None
    for lower, higher in zip(ladder, ladder[1:]):
        assert previous_rung(higher) is lower


def test_diff_to_the_previous_rung_shows_what_changed():
    diff = rung_diff(kernels.get("gemm", 1))
    assert diff.startswith("--- kernels.gemm.v0_simt_naive.py")
    assert "+    a_tile = simt.shared.array" in diff     # the LDS idea of v1
    assert rung_diff(kernels.get("gemm", 0)) == ""
    assert "Idea:" not in diff and "Idea:" in rung_source(kernels.get("gemm", 1))  # code only


def test_diff_renders_as_coloured_html():
    rendered = show_diff("gemm", 1)._repr_html_()
    assert "#e6ffec" in rendered and "&lt;" not in rendered.split("<pre")[0]


def test_exercise_markers_stay_out_of_the_source_and_diffs():
    """A rung's exercise blocks are marked with comments; a reader sees neither them nor their diff."""
    for op in kernels.ops():
        for rung in kernels.variants(op, include_ref=False):
            assert "# exercise" not in rung_source(rung) and "# exercise" not in rung_diff(rung), rung.title
    assert "# exercise begin: rescale" in module_source(kernels.get("attention", "v2").module)
