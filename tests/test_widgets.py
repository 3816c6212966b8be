"""The notebook widgets, driven through their Python API as a headless notebook would.

On the interpreter a widget must never present an interpreter time as performance:
numbers come from recorded GPU rows (with GPU and date) or are labelled "model".
"""
from __future__ import annotations

import html

import pytest

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")
import torch

import kernels
import roofline
from kernels.registry import Rung
from workbench.isa import parse as isa_parse
from workbench import results
from workbench.check import CheckReport
from workbench.results import ResultRow
from workbench.widgets import CorrectnessChecker, IsaViewer, LadderProfiler
from workbench.widgets.controls import CHECK_CAP
from workbench.views.heatmap import pooled_error
from workbench.harness.table import html_table

SMALL = (37, 29, 53)
PERF = ("ms", "tflops", "gbps", "pct_of_roof", "vs_prev", "vs_ref")
TRITON = [r.label for r in kernels.variants("gemm") if r.kind == "triton"]


def _layer_names(spec: dict) -> list[str]:
    return [layer.get("name") for layer in spec["layer"]]


@pytest.fixture
def no_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    return tmp_path


def _row(rung: str, ms: float, stamp: str, gpu: str = "AMD Instinct MI300X",
         shape=(4096, 4096, 4096)) -> ResultRow:
    spec = kernels.spec("gemm")
    return ResultRow(op="gemm", rung=rung, name=kernels.get("gemm", rung).name,
                     shape="x".join(map(str, shape)), dtype="bfloat16", ms=ms,
                     tflops=spec.flops(shape) / ms / 1e9,
                     gbps=spec.bytes_moved(shape, torch.bfloat16) / ms / 1e6,
                     ratio_to_ref=0.0, gpu=gpu, backend="hip", arch="gfx942",
                     torch_version="2.13.0", triton_version="3.9.0", commit="test",
                     timestamp=stamp)


# --- ladder profiler -----------------------------------------------------------------------

def test_profiler_on_the_interpreter_checks_but_shows_no_times(no_recorded):
    result = LadderProfiler(op="gemm").set(rungs=[TRITON[0], "ref"], shape=SMALL,
                                           dtype="float32", gpu="MI300X").run()
    assert [row["rung"] for row in result.table] == [TRITON[0], "ref"]
    assert all(row["check"] == "pass" and row["checked_at"] == "37x29x53" for row in result.table)
    assert result.source == "model" != "measured"
    assert [row["source"] for row in result.table] == ["model", None]   # v2 predicted, ref not
    assert all(result.table[1][k] is None for k in PERF)
    assert any("No recorded GPU results" in note for note in result.notes)

    model, gpu = result.model, roofline.spec("MI300X")
    intensity = kernels.spec("gemm").flops(SMALL) / kernels.spec("gemm").bytes_moved(
        SMALL, torch.float32)
    assert model["source"] == "model" and model["intensity"] == pytest.approx(intensity)
    assert model["ridge"] == pytest.approx(gpu.ridge("fp32"))
    assert model["attainable_tflops"] == pytest.approx(roofline.attainable(gpu, intensity, "fp32"))
    assert "ladder" not in result.charts   # no measured or recorded numbers, no bars

    spec = result.charts["roofline"].to_dict()
    assert _layer_names(spec) == ["roofs", "ridges", "ridge_labels", "points", "point_labels"]
    points = spec["layer"][3]
    assert {"x", "y", "color", "shape", "tooltip"} <= set(points["encoding"])
    assert [v["source"] for v in points["data"]["values"]] == ["model"]


def test_profiler_caps_the_shape_it_runs_on_the_interpreter(no_recorded):
    cap = CHECK_CAP["interpreter"]
    result = LadderProfiler(op="gemm").set(rungs=[TRITON[0]], shape="square 1024",
                                           dtype="bfloat16").run()
    assert {row["checked_at"] for row in result.table} == {f"{cap}x{cap}x{cap}"}
    assert any(f"capped at {cap}" in note for note in result.notes)
    assert [row["source"] for row in result.table] == ["model", None]   # no interpreter time


def test_profiler_says_which_rungs_cannot_run_a_dtype(no_recorded):
    simt = [r for r in kernels.variants("gemm") if torch.bfloat16 not in r.dtypes][0]
    result = LadderProfiler(op="gemm").set(rungs=[simt.label], shape=SMALL, dtype="bfloat16").run()
    assert result.table[0]["check"] == "not run (no bfloat16)"
    assert result.table[-1]["rung"] == "ref"   # ref is in every table


def test_profiler_shows_recorded_rows_with_gpu_and_date(no_recorded):
    first, second = TRITON[:2]
    shipped = [_row("ref", 0.40, "2026-11-01T10:00:00+00:00"),
               _row(first, 0.80, "2026-11-01T10:00:00+00:00"),
               _row(second, 0.50, "2026-11-01T10:00:00+00:00"),
               _row(first, 9.00, "2026-10-01T10:00:00+00:00"),   # older run: ignored
               _row(first, 7.00, "2026-11-02T10:00:00+00:00", gpu="NVIDIA H200",
                    shape=(1024, 1024, 1024))]
    results.save(shipped, no_recorded / "mi300x.json")

    profiler = LadderProfiler(op="gemm").set(rungs=[first, second], shape="square 4096",
                                             dtype="bfloat16", gpu="MI300X")
    result = profiler.run()
    assert result.source == "recorded"
    rows = {row["rung"]: row for row in result.table}
    for label, ms in ((first, 0.80), (second, 0.50), ("ref", 0.40)):
        assert rows[label]["ms"] == ms
        assert rows[label]["gpu"] == "AMD Instinct MI300X" and rows[label]["date"] == "2026-11-01"
        assert rows[label]["source"] == "recorded"
        assert rows[label]["vs_ref"] == pytest.approx(0.40 / ms)
    assert rows[first]["vs_prev"] is None and rows["ref"]["vs_prev"] is None
    assert rows[second]["vs_prev"] == pytest.approx(0.80 / 0.50)
    intensity = result.model["intensity"]
    assert rows[second]["pct_of_roof"] == pytest.approx(
        roofline.percent_of_roof("MI300X", intensity, "bf16", rows[second]["tflops"]))
    assert any("AMD Instinct MI300X on 2026-11-01" in note for note in result.notes)
    assert rows[first]["check"] == "pass"   # checked here at the capped shape

    ladder = result.charts["ladder"].to_dict()
    assert [layer["name"] for layer in ladder["spec"]["layer"]] == ["bars", "ratios"]
    assert ladder["spec"]["layer"][0]["mark"]["type"] == "bar"
    points = result.charts["roofline"].to_dict()["layer"][3]["data"]["values"]
    assert {p["source"] for p in points} == {"recorded"} and {p["date"] for p in points} == {
        "2026-11-01"}

    other = profiler.set(gpu="H200").run()   # that GPU has no row at this shape
    assert other.source == "model"
    assert any("Recorded results exist for" in note for note in other.notes)

    no_ref = profiler.set(shape="square 1024").run()   # a recorded run without ref
    assert no_ref.source == "recorded" and "ladder" not in no_ref.charts
    assert [row["ms"] for row in no_ref.table] == [7.00, None, None]
    assert no_ref.table[0]["vs_ref"] is None


# --- controls and API stay in sync ---------------------------------------------------------

def test_profiler_api_writes_controls_and_run_reads_them(no_recorded):
    profiler = LadderProfiler(op="gemm")
    profiler.set(rungs=[TRITON[0]], shape="square 2048", dtype="float16", gpu="mi355x")
    assert [r.label for r in profiler.rungs.value] == [TRITON[0]]
    assert [s.value for s in profiler.shape.sliders] == [2048, 2048, 2048]
    assert profiler.shape.preset.value == "square 2048"
    assert (profiler.dtype.value, profiler.gpu.value) == ("float16", "MI355X")

    profiler.shape.sliders[2].value = 77            # a user drags a slider
    assert profiler.shape.preset.value == "custom"
    profiler.shape.preset.value = "square 1024"     # ... or picks a preset
    assert profiler.shape.value == (1024, 1024, 1024)
    profiler.shape.set(SMALL)
    profiler.dtype.value = "float32"
    profiler.button.click()                         # clicking reads the controls
    assert profiler.result.shape == SMALL and profiler.result.dtype == "float32"
    assert profiler.result.gpu == "MI355X" and profiler.status.value == ""
    shown = [next(iter(out["data"])) for out in profiler.output.outputs]
    assert shown[0] == "text/html" and "image/svg+xml" in shown   # a click fills the widget


def test_a_new_result_replaces_the_old_one_in_the_output_area(no_recorded):
    profiler = LadderProfiler(op="gemm").set(rungs=[TRITON[0]], shape=SMALL, dtype="float32")
    one = len(profiler.run().parts())
    profiler.run()
    assert len(profiler.output.outputs) == one
    profiler.set(shape=(9, 7, 5)).button.click()    # a click after a run: still one result
    assert len(profiler.output.outputs) == one
    captions = [o["data"]["text/html"] for o in profiler.output.outputs
                if "<caption>" in o["data"].get("text/html", "")]
    assert len(captions) == 2 and "9x7x5" in captions[0] and "37x29x53" not in captions[0]


def test_a_panel_displays_as_its_widget_with_a_static_copy_of_its_result(no_recorded):
    profiler = LadderProfiler(op="gemm").set(rungs=[TRITON[0]], shape=SMALL, dtype="float32")
    assert "not run yet" in profiler._repr_mimebundle_()["text/html"]
    profiler.run()
    shown = profiler._repr_mimebundle_()
    assert shown["application/vnd.jupyter.widget-view+json"]["model_id"] == profiler.widget.model_id
    assert not shown["text/plain"].startswith("VBox(")
    static = shown["text/html"]
    assert "<table>" in static and "<img alt=\"[chart: " in static
    assert 'src="data:image/svg+xml;base64,' in static


def test_charts_carry_a_text_form_that_names_them():
    from workbench.views.render import bundle
    chart = roofline.chart("MI300X", dtypes=["bf16"])
    drawn = bundle(chart)
    assert drawn["image/svg+xml"].lstrip().startswith("<svg")
    assert drawn["text/plain"].startswith("[chart: MI300X roofline.")


def test_choosing_another_op_reloads_rungs_dtypes_and_presets():
    profiler = LadderProfiler(op="gemm")
    profiler.set(op="gemm_fp8")
    assert [v for _, v in profiler.rungs.options] == kernels.variants("gemm_fp8")
    assert profiler.dtype.options == tuple(str(d).replace("torch.", "")
                                           for d in kernels.spec("gemm_fp8").dtypes)
    assert set(profiler.shape.preset.options) == {"custom", *kernels.spec("gemm_fp8").bench_shapes}


def test_a_failed_click_is_shown_not_raised():
    checker = CorrectnessChecker(op="gemm")
    simt = [r for r in kernels.variants("gemm") if torch.bfloat16 not in r.dtypes][0]
    checker.set(rung=simt.label, dtype="bfloat16")
    checker.button.click()
    assert "does not support bfloat16" in checker.status.value


# --- correctness checker --------------------------------------------------------------------

def _wrong(a, b):
    c = torch.matmul(a, b)
    c[3, 5] += 0.05 * c.abs().max()
    return c


def test_checker_passes_a_good_rung_and_maps_a_bad_one():
    checker = CorrectnessChecker(op="gemm").set(rung=TRITON[0], shape=SMALL, dtype="float32")
    good = checker.run()
    assert good.report.passed and good.table[0]["mismatches"] == 0

    wrong = Rung(op="gemm", rung=90, name="wrong", fn=_wrong, backends=frozenset({"interpreter"}),
                 dtypes=(torch.float32,), interpreter=True, kind="triton", module=__name__)
    bad = checker.set(rung=wrong).run()
    assert checker.rung.value is wrong
    assert not bad.report.passed and bad.report.worst_index == (3, 5)
    heat = bad.charts["error_map"].to_dict()
    assert heat["mark"]["type"] == "rect"
    assert {"x", "y", "color"} <= set(heat["encoding"])
    assert max(v["x_allowed"] for v in heat["data"]["values"]) > 1
    unpooled = max(pooled_error(bad.report, cells=64), key=lambda v: v["x_allowed"])
    assert (unpooled["row"], unpooled["col"]) == (3, 5)


def test_checker_table_scrolls_sideways_instead_of_being_cut():
    checker = CorrectnessChecker(op="gemm").set(rung=TRITON[0], shape=(9, 7, 5), dtype="float32")
    checker.run()
    table = checker.output.outputs[0]["data"]["text/html"]
    assert table.startswith("<div style='overflow-x:auto;max-width:100%'><table>")
    assert table.endswith("</table></div>") and "<th>worst_expected</th>" in table


def test_heat_map_pools_large_outputs_keeping_the_worst_element():
    error_map = torch.zeros(300, 200, dtype=torch.float64)
    error_map[250, 17] = 1.0
    report = CheckReport(op="gemm", rung="x", shape=(300, 200, 8), dtype="float32", passed=False,
                         error=1.0, baseline_error=0.0, allowed=0.5, mismatches=1, numel=60000,
                         worst_index=(250, 17), worst_value=None, worst_expected=None,
                         error_map=error_map)
    cells = pooled_error(report, cells=32)
    assert len(cells) == 32 * 32
    hot = [c for c in cells if c["error"] > 0]
    assert len(hot) == 1 and hot[0]["x_allowed"] == 2.0
    assert hot[0]["row"] <= 250 < hot[0]["row"] + 300 / 32 + 1


def test_static_table_shows_missing_numbers_as_a_dash():
    text = html_table([{"rung": "v2", "ms": None, "tflops": 1.5}], caption="c")
    assert "<td>–</td>" in text and "<td>1.5</td>" in text and "<caption>c</caption>" in text


# --- ISA viewer -----------------------------------------------------------------------------

def test_isa_viewer_shows_mfma_for_a_triton_rung_on_gfx942():
    pytest.importorskip("workbench.isa", reason="the ISA inspector is not in this tree yet")
    viewer = IsaViewer(op="gemm")
    assert all(r.kind == "triton" for _, r in viewer.rung.options)
    one = viewer.set(rung=TRITON[0], target="gfx942", dtype="bfloat16").run()
    assert one.table[0]["target"] == "gfx942"
    assert any(name.startswith("v_mfma") for name in one.reports[0].matrix_instructions)
    assert "v_mfma" in one.table[0]["matrix instructions"]

    two = viewer.set(compare_rung=TRITON[1]).run()
    assert len(two.reports) == 2 and len(two.table[0]) == 3   # metric + one column per rung
    assert viewer.set(compare_rung="").compare_rung.value is None


@pytest.mark.parametrize("target", ["gfx942", "sm90"])
def test_isa_viewer_shows_summary_and_hot_loops_and_folds_the_full_listing(target):
    viewer = IsaViewer(op="gemm").set(rung=TRITON[0], compare_rung=TRITON[-1], target=target)
    result = viewer.run()
    summary, loops, listings = result.parts()
    assert summary.startswith("<table><caption>ISA comparison") and "<pre" not in summary
    assert loops.count("<pre style='white-space:pre;overflow:auto;max-height:") == 2
    assert "min-width:0" in loops and "<details" not in loops   # each loop scrolls in its box
    assert listings.count("<details>") == 2 and listings.count("<summary>Full listing") == 2
    for report in result.reports:
        assert html.escape(report.hot_loop.splitlines()[-1]) in loops
        body = isa_parse.code_lines(report.asm, report.dialect)
        assert f"({len(body)} lines)" in listings and html.escape(body[0]) in listings
    assert len(viewer.output.outputs) == 3
    assert "Full listing" in viewer._repr_mimebundle_()["text/html"]


def test_isa_viewer_label_is_as_wide_as_its_text():
    viewer = IsaViewer(op="gemm")
    assert viewer.compare_rung.description == "compare with"
    assert viewer.compare_rung.style.description_width == "initial"   # not the 80 px default


def _skips_last_row(a, b):
    from kernels.outputs import new_output
    c = new_output((a.shape[0], b.shape[1]), a.dtype, a.device)
    c[:-1] = a[:-1] @ b
    return c


def test_heat_map_shows_unwritten_elements_as_far_over_the_bound():
    from workbench.views.heatmap import WRONG_PATTERN_X_ALLOWED
    lazy = Rung(op="gemm", rung=91, name="lazy", fn=_skips_last_row, backends=frozenset({"interpreter"}),
                dtypes=(torch.float32,), interpreter=True, kind="triton", module=__name__)
    result = CorrectnessChecker(op="gemm").set(rung=lazy, shape=(9, 7, 5), dtype="float32").run()
    cells = pooled_error(result.report, cells=64)
    assert {c["row"] for c in cells if c["x_allowed"] == pytest.approx(WRONG_PATTERN_X_ALLOWED)} == {8}
    assert result.charts["error_map"].to_json()   # finite numbers only: valid JSON for Vega


def test_measured_ceilings_are_only_drawn_for_the_gpu_that_is_here(no_recorded):
    if kernels.backend.current().is_interpreter:
        assert LadderProfiler._ceilings(roofline.spec("MI300X"), False, []) is None
    measured = {"gpu": "AMD Instinct MI300X", "date": "2026-11-30T00:00:00+00:00",
                "hbm_tbps": 4.1, "peak_tflops": {"bf16": 700.0}}
    result = LadderProfiler(op="gemm").set(rungs=["v2"], shape=(9, 7, 5), dtype="bfloat16").run()
    charts = LadderProfiler._charts(roofline.spec("MI300X"), [], ["v2", "ref"], result.model, "gemm",
                                    (9, 7, 5), torch.bfloat16, "model", measured)
    with_measured = charts["roofline"].to_json()
    without = LadderProfiler._charts(roofline.spec("MI300X"), [], ["v2", "ref"], result.model, "gemm",
                                     (9, 7, 5), torch.bfloat16, "model")["roofline"].to_json()
    assert "HBM 4.10 TB/s · measured" in with_measured and "4.10 TB/s" not in without


def test_isa_viewer_says_why_a_simt_rung_has_no_isa():
    simt = next(r for r in kernels.variants("gemm") if r.kind == "simt")
    viewer = IsaViewer(op="gemm").set(rung=simt.label)
    viewer.button.click()
    assert "SIMT Numba kernel" in viewer.status.value and "compiles Triton only" in viewer.status.value
    with pytest.raises(ValueError, match="SIMT Numba kernel"):
        viewer.run()
