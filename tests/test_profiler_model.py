"""The ladder profiler with the performance model: predicted numbers, labelled model, where
a time would be; beside measured ones when a GPU is here.

Predictions compile the rung ahead of time (seconds each, cold), so these tests share
one shape, one dtype and rungs v2/v3; the SIMT rungs cannot run bf16 and cost nothing.
"""
from __future__ import annotations

import pytest

pytest.importorskip("ipywidgets", reason="the notebook extra is not installed (e.g. on a bare GPU image)")

import torch

import kernels
import roofline
from workbench import model, results
from workbench.widgets import LadderProfiler, model_rows, profiler

SHAPE = (37, 29, 53)
SIMT = [r.label for r in kernels.variants("gemm") if r.kind == "simt"]
CEILINGS = {"gpu": "AMD Instinct MI300X", "date": "2026-11-30T00:00:00+00:00", "hbm_tbps": 4.1,
            "peak_tflops": {"bf16": 700.0}}


@pytest.fixture
def no_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)


@pytest.fixture
def fresh_predictions():
    """An empty prediction cache before and after: a fake prediction must not outlive its test."""
    model_rows.predicted.cache_clear()
    yield
    model_rows.predicted.cache_clear()


def _predict(rung: str, gpu: str = "MI300X"):
    return model.predict("gemm", rung, SHAPE, "bf16", gpu)


def test_without_gpu_or_recorded_rows_the_table_shows_the_models_numbers(no_recorded):
    result = LadderProfiler(op="gemm").set(rungs=[*SIMT, "v2", "v3"], shape=SHAPE, dtype="bfloat16",
                                           gpu="MI300X").run()
    assert result.source == "model"
    rows = {row["rung"]: row for row in result.table}
    v2, v3 = _predict("v2"), _predict("v3")
    intensity = result.model["intensity"]
    for label, p in (("v2", v2), ("v3", v3)):
        row = rows[label]
        assert row["ms"] == row["model_ms"] == pytest.approx(p.time_s * 1e3)
        assert row["tflops"] == pytest.approx(p.tflops) and row["bound"] == p.bound
        assert row["gbps"] == pytest.approx(kernels.spec("gemm").bytes_moved(SHAPE, torch.bfloat16) / p.time_s / 1e9)
        assert row["pct_of_roof"] == pytest.approx(roofline.percent_of_roof("MI300X", intensity, "bf16", p.tflops))
        assert row["source"] == "model" and row["gpu"] == "MI300X" and row["vs_ref"] is None
    assert rows["v2"]["vs_prev"] is None   # the SIMT rungs below have no prediction
    assert rows["v3"]["vs_prev"] == pytest.approx(v2.time_s / v3.time_s)
    for label in (*SIMT, "ref"):
        assert all(rows[label][k] is None for k in ("ms", "model_ms", "tflops", "bound", "vs_prev", "source"))

    uncovered = [n for n in result.notes if SIMT[0] in n]
    assert len(uncovered) == 1 and all(label in uncovered[0] for label in SIMT)
    assert uncovered[0].count("the model covers") == 1 and "v2" not in uncovered[0].split(":")[0]
    assert any("ref is a library call" in n and "vs_ref" in n for n in result.notes)

    points = result.charts["roofline"].to_dict()["layer"][3]["data"]["values"]
    assert {p["rung"]: (p["source"], p["tflops"]) for p in points} == {
        "v2": ("model", pytest.approx(v2.tflops)), "v3": ("model", pytest.approx(v3.tflops))}


def test_a_gpu_the_model_does_not_cover_keeps_dashes_and_says_why_once(no_recorded):
    result = LadderProfiler(op="gemm").set(rungs=["v2"], shape=SHAPE, dtype="bfloat16", gpu="B200").run()
    assert all(row[k] is None for row in result.table for k in ("ms", "model_ms", "bound"))
    why = [n for n in result.notes if "sm_100" in n]
    assert len(why) == 1 and "gfx942" in why[0] and "v2" in why[0]
    points = result.charts["roofline"].to_dict()["layer"][3]["data"]["values"]
    assert [p["rung"] for p in points] == ["attainable (model)"]


def test_measured_rows_get_the_models_time_beside_them(no_recorded, fake_gpu, fake_timer, monkeypatch):
    fake_gpu("hip", "gfx942", "AMD Instinct MI300X")
    fake_timer(ms=[0.4, 0.8])   # ref, then v2
    monkeypatch.setattr(profiler, "measure_ceilings", lambda: CEILINGS)
    result = LadderProfiler(op="gemm").set(rungs=["v2"], shape=SHAPE, dtype="bfloat16", gpu="MI300X").run()
    assert result.source == "measured"
    v2, ref = result.table
    assert (v2["ms"], v2["source"], v2["vs_ref"]) == (0.8, "measured", pytest.approx(0.5))
    assert v2["model_ms"] == pytest.approx(_predict("v2").time_s * 1e3) and v2["bound"] == _predict("v2").bound
    assert ref["ms"] == 0.4 and ref["model_ms"] is None and ref["bound"] is None
    assert not any("model_ms" in n and "come from" in n for n in result.notes)


def test_recorded_rows_get_the_models_time_beside_them(tmp_path, monkeypatch, make_row):
    monkeypatch.setattr(results, "_recorded_dir", lambda: tmp_path)
    results.save([make_row(rung=rung, shape="37x29x53", ms=ms) for rung, ms in (("ref", 0.4), ("v2", 0.8))],
                 tmp_path / "mi300x.json")
    result = LadderProfiler(op="gemm").set(rungs=["v2"], shape=SHAPE, dtype="bfloat16", gpu="MI300X").run()
    v2 = result.table[0]
    assert (result.source, v2["ms"], v2["vs_ref"]) == ("recorded", 0.8, pytest.approx(0.5))
    assert v2["model_ms"] == pytest.approx(_predict("v2").time_s * 1e3) and v2["bound"] == _predict("v2").bound


def test_model_times_beside_another_gpus_measurements_are_named(no_recorded, fake_gpu, fake_timer):
    fake_gpu("cuda", "sm_90", "NVIDIA H200")
    fake_timer(ms=[0.4, 0.8])
    result = LadderProfiler(op="gemm").set(rungs=["v2"], shape=SHAPE, dtype="bfloat16", gpu="MI300X").run()
    assert result.table[0]["model_ms"] == pytest.approx(_predict("v2").time_s * 1e3)
    assert any("model_ms" in n and "MI300X" in n and "come from NVIDIA H200" in n for n in result.notes)


def test_a_prediction_is_made_once_per_rung_shape_dtype_and_gpu(fresh_predictions, monkeypatch):
    calls = []

    def counted(*key):
        calls.append(key)
        return key
    monkeypatch.setattr(model, "predict", counted)
    for _ in range(2):
        model_rows.predicted("gemm", "v2", SHAPE, "bf16", "MI300X")
    model_rows.predicted("gemm", "v2", SHAPE, "bf16", "MI355X")
    assert calls == [("gemm", "v2", SHAPE, "bf16", "MI300X"), ("gemm", "v2", SHAPE, "bf16", "MI355X")]
