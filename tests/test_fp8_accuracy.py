"""workbench.harness.fp8_accuracy: per recipe and GEMM, the error against float64 and the
overflow/underflow counts; workbench.train.fp8_parity and the FP8 side of TrainingComparison."""
from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

import torch

import kernels
from workbench.harness import fp8_accuracy
from workbench.train import fp8_parity
from workbench.widgets import TrainingComparison


@pytest.fixture(scope="module")
def rows():
    return {(r["recipe"], r["gemm"]): r for r in fp8_accuracy.gemm_error_rows(shape=(40, 24, 56))}


def test_operands_are_the_seeds_and_dy_is_heavy_tailed():
    """The report's numbers are reproducible: one seed, one set of tensors (dy was drawn from
    torch's global generator before, so every call differed). dy's tail is Student-t's: its
    kurtosis far above a normal's 3."""
    first, again, other = fp8_accuracy.operands(seed=0), fp8_accuracy.operands(seed=0), fp8_accuracy.operands(seed=1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["dy"], other["dy"])
    dy = fp8_accuracy.operands((512, 512, 8), seed=0)["dy"].double() / 1e-5
    assert abs(dy.median()) < 0.05 and (dy ** 4).mean() / (dy ** 2).mean() ** 2 > 6


def _installed(rows, recipe):
    if "note" in rows[recipe, "forward"]:
        pytest.skip(rows[recipe, "forward"]["note"])


@pytest.mark.parametrize("recipe", ("tensorwise", "rowwise", "blockwise", "mxfp8"))
def test_current_scaling_never_overflows_and_errors_are_e4m3_sized(rows, recipe):
    """The error is the recipe's own GEMMs' (the overflow counts are computed here, not by the
    recipe), so it is what shows scales that stopped reaching the GEMMs (the next test)."""
    _installed(rows, recipe)
    for gemm in fp8_accuracy.GEMMS:
        row = rows[recipe, gemm]
        assert row["A_overflow"] == row["B_overflow"] == 0, row
        assert 0.005 < row["rel_error"] < 0.08 and row["finite"], row


def test_the_bound_fails_blockwise_with_its_scales_dropped(rows, monkeypatch):
    """The bound above can fail: blockwise's casts with their bytes kept and every scale replaced
    by 1 put each GEMM off by the scales themselves."""
    _installed(rows, "blockwise")
    from kernels.fp8.recipes import blockwise
    cast = blockwise.quantize_checked

    def unscaled(*args, **kwargs):
        out = list(cast(*args, **kwargs))   # (q, scale) or (q, scale, q_t, scale_t)
        for i in range(1, len(out), 2):
            out[i] = torch.ones_like(out[i])
        return tuple(out)

    monkeypatch.setattr(blockwise, "quantize_checked", unscaled)
    dropped = fp8_accuracy.gemm_error_rows(["blockwise"], shape=(40, 24, 56))
    assert [r["gemm"] for r in dropped] == list(fp8_accuracy.GEMMS)
    assert all(r["rel_error"] > 0.5 for r in dropped), dropped


def test_delayed_scales_from_smaller_steps_overflow_but_stay_finite(rows):
    forward = rows["delayed", "forward"]
    assert forward["A_overflow"] > 0 and forward["B_overflow"] > 0 and forward["finite"]
    assert forward["rel_error"] > rows["tensorwise", "forward"]["rel_error"]
    for gemm in ("dgrad", "wgrad"):   # dy too: its scale from a history GROWTH times smaller
        assert rows["delayed", gemm]["A_overflow"] > 0 and rows["delayed", gemm]["finite"], rows["delayed", gemm]


def test_outlier_channels_cost_rowwise_less_than_tensorwise(rows):
    assert rows["rowwise", "forward"]["rel_error"] < rows["tensorwise", "forward"]["rel_error"]


def test_missing_kernels_are_a_row_not_a_number(rows):
    for recipe in ("blockwise", "mxfp8"):
        row = rows[recipe, "forward"]
        assert "rel_error" in row or "not in this installation" in row["note"]


def test_every_recipe_counts_overflow_and_underflow_of_both_operands(rows):
    """Blockwise's fp32 tile scales are current scaling too: no overflow."""
    installed = [r for r in kernels.fp8.names() if "note" not in rows[r, "forward"]]
    assert {"tensorwise", "delayed", "rowwise"} <= set(installed)   # matmul_fp8's: always here
    for recipe in installed:
        for gemm in fp8_accuracy.GEMMS:
            assert {"A_overflow", "A_underflow", "B_overflow", "B_underflow"} <= set(rows[recipe, gemm]), recipe
    _installed(rows, "blockwise")
    for gemm in fp8_accuracy.GEMMS:
        row = rows["blockwise", gemm]
        assert row["A_overflow"] == row["B_overflow"] == row["A_underflow"] == 0 and row["finite"], row


def test_mxfp8_rounds_its_scales_up_and_saturates_nothing(rows):
    """The recipe's round-up rule (the smallest power of two with amax / scale <= 448): no
    element of any operand of any GEMM past the max."""
    _installed(rows, "mxfp8")
    for gemm in fp8_accuracy.GEMMS:
        row = rows["mxfp8", gemm]
        assert row["A_overflow"] == row["B_overflow"] == 0 and row["finite"], row


def test_the_ocp_rule_saturates_what_it_says_and_costs_the_forward_accuracy(rows):
    """With the recipe's instance for the OCP rule, 2^(floor(log2 amax) - 8), which puts a group's
    largest |x| in [256, 512) for e4m3fn (max 448): the forward's A (x) overflows by as many
    elements as that rule, computed in float64 per group of 32 along K (not through the
    quantizer), gives; and the forward's error (x and w are seeded) exceeds round-up's."""
    _installed(rows, "mxfp8")
    ocp = fp8_accuracy.gemm_error_rows([kernels.fp8.get("mxfp8", "ocp")], shape=(40, 24, 56))[0]
    x = fp8_accuracy.operands((40, 24, 56))["x"].double()           # (M, K), K = 56: a ragged group
    groups = torch.nn.functional.pad(x.abs(), (0, 64 - 56)).reshape(40, 2, 32)
    exponent = torch.floor(torch.log2(groups.amax(dim=2, keepdim=True))) - 8
    saturating = int((groups / 2.0 ** exponent > 448 + 16).sum())   # past half an ulp above the max
    assert ocp["gemm"] == "forward" and saturating > 0 and ocp["A_overflow"] == saturating
    assert ocp["rel_error"] > rows["mxfp8", "forward"]["rel_error"]


def test_each_recipes_operand_groups_are_the_granularities_it_quantizes_with(monkeypatch):
    """``operand_groups`` (what the counts use) names the granularities the recipe's own
    forward and backward ask :func:`kernels.gemm_fp8.quantize` for (seen at its launch, which the
    recipes that quantize without its checks reach too: :mod:`kernels.fp8.scaled_gemm`)."""
    from kernels.gemm_fp8 import quantize_kernel
    asked, real = [], quantize_kernel.launch
    monkeypatch.setattr(quantize_kernel, "launch", lambda x, granularity, *a, **k:
                        asked.append(granularity) or real(x, granularity, *a, **k))
    t = fp8_accuracy.operands((40, 24, 56))
    for name in kernels.fp8.names():
        recipe = kernels.fp8.get(name)
        if recipe.needs:
            continue
        asked.clear()
        recipe.gemms(t["x"], t["w"], t["dy"], recipe.element_format())
        stated = {g for pair in recipe.operand_groups.values() for g in pair}
        assert stated == set(asked), (name, stated, asked)


def test_parity_table_and_widget_compare_each_recipe_with_high_precision():
    widget = TrainingComparison().set(preset="cpu-smoke", compare="fp8", recipes=("tensorwise",), steps=1,
                                      profile=False)
    assert all(p.disabled for p in widget.sets["B"].values()) and not widget.recipes.disabled
    result = widget.run()
    table = {r["run"]: r for r in result.fp8}
    assert list(result.rows)[0] == fp8_parity.HIGH and table[fp8_parity.HIGH]["rel_diff"] == 0
    assert table["fp8 tensorwise"]["goal"] == "reported" and table["fp8 tensorwise"]["meets_goal"] is None
    assert abs(table["fp8 tensorwise"]["rel_diff"]) < 0.01
    assert result.parity is None and "not performance" in " ".join(result.notes) and "loss" in result.charts
    assert {v["set"] for v in result.charts["loss"].to_dict()["data"]["values"]} == set(result.rows)
    shown = "".join(p for p in result.parts() if isinstance(p, str))
    assert "loss of each FP8 recipe against high precision" in shown


def test_the_fp8_side_refuses_an_unknown_mode_or_recipe():
    widget = TrainingComparison()
    assert widget.recipes.disabled and not any(p.disabled for p in widget.sets["B"].values())
    with pytest.raises(ValueError, match="compare must be one of"):
        widget.set(compare="bf16")
    with pytest.raises(Exception, match="fp9"):
        widget.set(recipes=("fp9",))


def test_a_recipe_without_its_kernels_is_reported_not_run(monkeypatch):
    import kernels
    recipe = kernels.fp8.get("rowwise")
    monkeypatch.setattr(type(recipe), "needs", "kernels.gemm_fp8.imaginary", raising=False)
    plan, skipped = TrainingComparison().set(compare="fp8", recipes=("rowwise",)).plan()
    assert list(plan) == [fp8_parity.HIGH] and skipped == {"fp8 rowwise": "needs kernels.gemm_fp8.imaginary"}
