"""Error rows (a case that failed on a GPU) in tables and charts: named, never drawn as numbers."""
from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

import kernels
from workbench import results
from workbench.views.rung import RungView
from workbench.widgets import LadderProfiler
from workbench.widgets.ladder_rows import error_notes, ladder_chart_rows

STAMP = "2026-11-01T10:00:00+00:00"
TRITON = [r.label for r in kernels.variants("gemm") if r.kind == "triton"]


def _failed(row, message="RuntimeError: out of LDS"):
    return dataclasses.replace(row, ms=None, tflops=None, gbps=None, ratio_to_ref=None,
                               status="error", error=message)


@pytest.fixture
def shipped(tmp_path, monkeypatch, make_row):
    """Recorded rows of one MI300X run at square 4096, ``rows(failing=...)`` of them errors."""
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    first, second = TRITON[:2]

    def rows(failing):
        run = [make_row(rung=label, name=kernels.get("gemm", label).name, ms=ms, timestamp=STAMP)
               for label, ms in (("ref", 0.4), (first, 0.8), (second, 0.5))]
        run = [_failed(r) if r.rung in failing else r for r in run]
        results.save(run, tmp_path / "mi300x.json")
        return run
    return rows


def test_profiler_names_a_failed_rung_and_draws_only_measured_ones(shipped):
    first, second = TRITON[:2]
    shipped(failing={second})
    result = LadderProfiler(op="gemm").set(rungs=[first, second], shape="square 4096",
                                           dtype="bfloat16", gpu="MI300X").run()
    rows = {row["rung"]: row for row in result.table}
    assert rows[second]["ms"] is None and rows[second]["vs_ref"] is None
    assert rows[first]["vs_ref"] == pytest.approx(0.4 / 0.8)
    assert any(f"{second} has no numbers" in n and "out of LDS" in n for n in result.notes)
    bars = result.charts["ladder"].to_dict()["data"]["values"]
    assert {v["rung"] for v in bars} == {"ref", first}
    points = result.charts["roofline"].to_dict()["layer"][3]["data"]["values"]
    assert {p["rung"] for p in points} == {"ref", first}


def test_profiler_without_a_measured_ref_gives_no_ratios_and_no_ladder_chart(shipped):
    first = TRITON[0]
    shipped(failing={"ref"})
    result = LadderProfiler(op="gemm").set(rungs=[first], shape="square 4096",
                                           dtype="bfloat16", gpu="MI300X").run()
    assert "ladder" not in result.charts and result.table[0]["vs_ref"] is None
    assert any("no measured ref row" in note for note in result.notes)


def test_chart_rows_and_notes_skip_and_name_error_rows(make_row):
    run = [make_row(rung="ref", ratio_to_ref=1.0), _failed(make_row(rung="v3"))]
    assert [r["rung"] for r in ladder_chart_rows(run, ["v3", "ref"], "measured")] == ["ref"]
    assert error_notes(run) == ["v3 has no numbers: it failed on AMD Instinct MI300X "
                                "(2026-11-30): RuntimeError: out of LDS"]


def test_rung_page_shows_a_recorded_error_with_its_message(make_row):
    rung = kernels.get("gemm", "v2")
    view = RungView(rung, "", None, [], None, "", recorded=[make_row(), _failed(make_row())])
    text = view._performance_text()
    assert "out of LDS" in text and "None" not in text
