"""workbench.harness.fp8_accuracy: per recipe and GEMM, the error against float64 and the
overflow/underflow counts; workbench.train.fp8_parity and the FP8 training widget."""
from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

from workbench.harness import fp8_accuracy
from workbench.train import fp8_parity
from workbench.widgets import FP8TrainingComparison


@pytest.fixture(scope="module")
def rows():
    return {(r["recipe"], r["gemm"]): r for r in fp8_accuracy.gemm_error_rows(shape=(40, 24, 56))}


def test_current_scaling_never_overflows_and_errors_are_e4m3_sized(rows):
    for recipe in ("tensorwise", "rowwise"):
        for gemm in fp8_accuracy.GEMMS:
            row = rows[recipe, gemm]
            assert row["A_overflow"] == row["B_overflow"] == 0, row
            assert 0.005 < row["rel_error"] < 0.08 and row["finite"], row


def test_delayed_scales_from_smaller_steps_overflow_but_stay_finite(rows):
    forward = rows["delayed", "forward"]
    assert forward["A_overflow"] > 0 and forward["B_overflow"] > 0 and forward["finite"]
    assert forward["rel_error"] > rows["tensorwise", "forward"]["rel_error"]
    assert rows["delayed", "dgrad"]["A_overflow"] == 0          # dy: current scaling


def test_outlier_channels_cost_rowwise_less_than_tensorwise(rows):
    assert rows["rowwise", "forward"]["rel_error"] < rows["tensorwise", "forward"]["rel_error"]


def test_missing_kernels_are_a_row_not_a_number(rows):
    for recipe in ("blockwise", "mxfp8"):
        row = rows[recipe, "forward"]
        assert "rel_error" in row or "not in this installation" in row["note"]


def test_parity_table_and_widget_compare_each_recipe_with_high_precision():
    result = FP8TrainingComparison().set(preset="cpu-smoke", recipes=("tensorwise", "mxfp8"), steps=1).run()
    table = {r["run"]: r for r in result.parity}
    assert table[fp8_parity.HIGH]["rel_diff"] == 0
    assert table["fp8 tensorwise"]["goal"] == "reported" and table["fp8 tensorwise"]["meets_goal"] is None
    assert abs(table["fp8 tensorwise"]["rel_diff"]) < 0.01
    assert any("mxfp8" in note for note in result.notes) or "fp8 mxfp8" in table
    assert "not performance" in " ".join(result.notes) and "loss" in result.charts
